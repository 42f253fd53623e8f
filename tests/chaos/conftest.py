from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from aivitals.chaos import ChaosRunner, FaultContext
from tests._tiers import needs

RUN_ENV = "AIVITALS_CHAOS_RUN"


@needs("a Debian package's binary")
def require_tool(name: str) -> str:
    """A binary the fault needs; skip when absent, but fail under CI."""
    path = shutil.which(name)
    if path is None:
        msg = f"{name} not installed (Debian package {name})"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)
    return path


@needs("root")
def require_root() -> None:
    if os.geteuid() != 0:
        msg = "network namespaces and nftables need root"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)


@pytest.fixture
def chaos_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "chaos-runs"
    monkeypatch.setenv("AIVITALS_CHAOS_DIR", str(root))
    return root


@pytest.fixture
def runner_factory(chaos_root: Path) -> Iterator[object]:
    made: list[ChaosRunner] = []

    def make(ctx: FaultContext | None = None, **kw: object) -> ChaosRunner:
        r = ChaosRunner(ctx or FaultContext(), root=chaos_root, handle_signals=False, **kw)  # type: ignore[arg-type]
        made.append(r)
        return r

    yield make
    for r in made:
        r.close()


def run_processes(run_id: str) -> list[int]:
    """Live processes carrying the run's marker."""
    out = []
    for p in psutil.process_iter(["pid"]):
        try:
            if p.environ().get(RUN_ENV) == run_id and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p.pid)
        except (psutil.Error, OSError):
            continue
    return out


def netns_names() -> list[str]:
    """The network namespaces; none without iproute2, where no fault can have made one."""
    if shutil.which("ip") is None:
        return []
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False)
    return [line.split()[0] for line in out.stdout.splitlines() if line.strip()]


def leftovers(run_id: str, root: Path) -> dict[str, object]:
    """Everything of the run that still exists (empty when clean)."""
    tag = run_id[-6:]
    found: dict[str, object] = {
        "netns": [n for n in netns_names() if tag in n],
        "processes": run_processes(run_id),
        "run_dir": (root / run_id).exists(),
        "temp_dirs": list(Path("/var/tmp").glob(f"aivitals-chaos-{run_id}-*")),
        "links": [link for link in os.listdir("/sys/class/net") if tag in link],
        "mounts": [
            line.split()[1]
            for line in Path("/proc/self/mounts").read_text().splitlines()
            if run_id in line
        ],
    }
    return {k: v for k, v in found.items() if v}


def assert_clean(run_id: str, root: Path, *, within: float = 5.0) -> None:
    """Nothing of the run is left; a few seconds are allowed for processes to exit."""
    deadline = time.monotonic() + within
    left = leftovers(run_id, root)
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = leftovers(run_id, root)
    assert not left, left
