"""The repository stands on its own: a copy of the tracked files, with nothing
beside it, collects the whole suite and replays the packaged trace.

A clone from anywhere has only what git tracks, so everything the tests, the
benchmarks and the package read must be tracked and found from inside the
tree (the team's reference shelf beside the development checkout is not).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

# Where nothing may reach outside the tree. Built from parts so this file does not match.
SCANNED = ("src", "tests", "benchmarks", ".ci", "Makefile")
OUTSIDE = re.compile(
    r"\.\./"
    + "shared"  # ../shared
    + r"|[/(]\s*[\"']"
    + "shared"
    + r"[\"']"  # parents[3] / "shared", Path("shared")
    + r"|\b"
    + "shared"
    + r"_dir\b"  # the old pytest fixture
    + r"|AIVITALS_"
    + "DATASETS"  # the old environment variable
)


def _tracked() -> list[str]:
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout: no list of tracked files to copy")
    out = subprocess.run(
        ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True, timeout=60
    ).stdout
    return [p for p in out.decode().split("\0") if p]


@pytest.fixture(scope="module")
def copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tracked files as they are in the working tree, alone in an empty folder."""
    dest = tmp_path_factory.mktemp("alone") / "aivitals"
    for rel in _tracked():
        src = REPO / rel
        if not src.is_file():  # deleted in the working tree, not yet committed
            continue
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dest / rel)
    assert sorted(p.name for p in dest.parent.iterdir()) == ["aivitals"]
    return dest


def _run(copy: Path, *argv: str, timeout: float) -> subprocess.CompletedProcess[str]:
    # PYTHONPATH first, so the copy's own package is imported, not the checkout's editable
    # install; no ambient dataset location either.
    env = {k: v for k, v in os.environ.items() if k not in ("AIVITALS_DATASETS", "NAB_DIR")}
    env["PYTHONPATH"] = str(copy / "src")
    env["HF_HUB_OFFLINE"] = "1"
    return subprocess.run(
        [sys.executable, *argv],
        cwd=copy,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_the_copy_imports_its_own_package(copy: Path) -> None:
    res = _run(copy, "-c", "import aivitals; print(aivitals.__file__)", timeout=60)
    assert res.returncode == 0, res.stderr
    assert Path(res.stdout.strip()).is_relative_to(copy / "src")


@pytest.mark.slow
def test_the_copy_collects_the_whole_suite(copy: Path) -> None:
    res = _run(copy, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", timeout=280)
    tail = (res.stdout + res.stderr)[-4000:]
    assert res.returncode == 0, tail
    assert "error" not in res.stdout.splitlines()[-1].lower(), tail
    # Nothing skipped at collection for a missing fixture or dataset.
    assert "skipped" not in res.stdout.splitlines()[-1], tail
    collected = int(re.search(r"(\d+) tests? collected", res.stdout).group(1))  # type: ignore[union-attr]
    assert collected > 500, tail


def test_the_copy_loads_the_packaged_trace(copy: Path) -> None:
    res = _run(
        copy, "-m", "aivitals.cli", "load", "--trace", "azure-conv", "--dry-run", timeout=120
    )
    assert res.returncode == 0, res.stdout + res.stderr
    # Every row of AzureLLMInferenceTrace_conv.csv, from the package's own data.
    assert "trace azure-conv: 19366 requests over 3501.7 s" in res.stdout, res.stdout


def test_nothing_reads_outside_the_repository() -> None:
    here = Path(__file__).resolve()
    hits: list[str] = []
    for top in SCANNED:
        root = REPO / top
        files = [root] if root.is_file() else sorted(root.rglob("*")) if root.is_dir() else []
        for path in files:
            if not path.is_file() or path == here or "__pycache__" in path.parts:
                continue
            if path.suffix in {".gz", ".pyc", ".png", ".json", ".csv", ".xml"}:
                continue  # data, not code that could read a path
            try:
                text = path.read_text("utf-8")
            except UnicodeDecodeError:
                continue
            for n, line in enumerate(text.splitlines(), start=1):
                if OUTSIDE.search(line):
                    hits.append(f"{path.relative_to(REPO)}:{n}: {line.strip()}")
    assert not hits, "paths outside the repository:\n" + "\n".join(hits)
