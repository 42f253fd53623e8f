"""The accuracy benchmark's test-set mode: ``test_stable`` as documented, the manifest
verified before anything is diagnosed, and nothing else reading the set."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from aivitals.validate._manifest import (
    MANIFEST_NAME,
    GitState,
    Manifest,
    ManifestError,
    write_manifest,
)
from aivitals.validate._runner import Poll, judge_polls
from tests._paths import REPO, load_script


@pytest.fixture(scope="module")
def bench() -> Any:
    return load_script("benchmarks/diagnosis_accuracy.py", "diagnosis_accuracy")


def _row(
    name: str,
    kind: str,
    matched: list[bool],
    *,
    event: bool = False,
    problems: tuple[str, ...] = (),
) -> dict[str, Any]:
    """A scored row as ``score_recording`` makes it from replayed polls: top1 is the
    last poll, ``stable`` validate's rule over all of them (a soak: healthy polls)."""
    polls = [Poll(5.0 * i, m, "x" if m else "", quiet=not m) for i, m in enumerate(matched)]
    row: dict[str, Any] = {"scenario": name, "kind": kind, "problems": list(problems)}
    if problems:
        return row
    if kind == "soak":
        row["top1"] = row["top1_at_end"] = row["stable"] = all(matched)
        return row
    verdict = judge_polls(polls, event)
    row["stable"] = verdict.passed
    row["top1"] = row["top1_at_end"] = polls[-1].matched
    if event and not row["top1"]:  # as _judge_polls: named, then quiet, counts for top1
        row["top1"] = verdict.passed and polls[-1].quiet
    return row


def test_test_stable_is_named_at_the_end_and_on_every_poll_after_the_first_match(
    bench: Any,
) -> None:
    rows = [
        _row("steady", "fault", [False, True, True, True]),  # passes: late, then held
        _row("flip", "fault", [True, False, True, True]),  # right at the end, not stable
        _row("lost", "fault", [True, True, True, False]),  # stable until it was not
        _row("never", "pair", [False, False, False]),
        _row("cold_start@moderate", "fault", [True, False, False], event=True),  # then quiet
        _row("soak-900s-quick", "soak", [True] * 5),
        _row("soak-noisy", "soak", [True, False, True]),
        _row("gaps", "unknown", [], problems=("no sample at all for 9.0 s",)),
    ]
    assert [bench.test_passed(r) for r in rows] == [
        True, False, False, False, True, True, False, False,
    ]  # fmt: skip
    manifest = Manifest(Path(MANIFEST_NAME), "ab" * 32, {}, {"git_commit": "c" * 40})
    got = bench.testset_figures(rows, manifest)
    assert got["test_stable"] == 3 / 8  # every recording counts, the unfit one fails
    # the end alone: flip's last poll is right (not stable), the cold start's quiet end
    # is not (stable, by the one-time-event rule)
    assert got["test_top1_at_end"] == 3 / 8
    assert got["test_cases"] == 8 and got["test_unfit"] == 1
    assert got["manifest"] == "ab" * 32 and got["testset_commit"] == "c" * 40
    assert got["test_failed"] == ["flip", "lost", "never", "soak-noisy", "gaps"]
    assert got["by_kind"]["fault"] == {"n": 4, "stable": 2}


def test_a_tampered_set_is_refused_before_any_diagnosis(
    bench: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "cpu_burn@severe.json").write_text("{}")
    (tmp_path / MANIFEST_NAME).write_text(f"{'0' * 64}  cpu_burn@severe.json\n")
    with pytest.raises(ManifestError, match=r"cpu_burn@severe\.json: SHA-256"):
        bench.testset(tmp_path)
    assert bench.main(["--testset", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "refused" in err and "cpu_burn@severe.json" in err


def test_the_ordinary_run_refuses_a_frozen_set(bench: Any, tmp_path: Path) -> None:
    (tmp_path / MANIFEST_NAME).write_text("")
    with pytest.raises(SystemExit, match="read only by --testset"):
        bench.recorded(tmp_path)


#: ``benchmarks/testset`` however a path to it is spelt ("/" or ``Path`` parts).
_TESTSET = re.compile("benchmarks" + r"\W{1,6}" + "testset" + r"\b(?!\.py|_)")


def test_nothing_but_the_accuracy_benchmark_names_the_test_set() -> None:
    """No test, no other script, nothing in the package may read the test set: a figure
    on it is held out only while nothing tunes on it."""
    files = [
        *(REPO / "src").rglob("*.py"),
        *(REPO / "src").rglob("*.yml"),
        *(REPO / "src").rglob("*.yaml"),
        *(REPO / "tests").rglob("*.py"),
        *(REPO / "benchmarks").rglob("*.py"),
        REPO / "Makefile",
    ]
    # this file spells the path in its pattern's examples below
    allowed = {REPO / "benchmarks" / "diagnosis_accuracy.py", Path(__file__).resolve()}
    found = [
        str(p.relative_to(REPO))
        for p in files
        if p not in allowed and p.is_file() and _TESTSET.search(p.read_text(errors="replace"))
    ]
    assert found == []
    # the pattern finds the spellings a reader would use
    assert _TESTSET.search('ROOT / "benchmarks" / "testset"')
    assert _TESTSET.search("benchmarks/testset/")
    assert not _TESTSET.search("benchmarks/freeze_testset.py")


def test_a_frozen_set_is_verified_then_scored_whole(bench: Any, tmp_path: Path) -> None:
    """End to end on one real recording (a copy of the corpus's pair, frozen here)."""
    name = "redis_down+traffic_surge"
    for suffix in (".json", ".aivsnap"):
        (tmp_path / f"{name}{suffix}").write_bytes(
            (bench.RECORDINGS / f"{name}{suffix}").read_bytes()
        )
    commit = json.loads((tmp_path / f"{name}.json").read_text())["git_commit"]
    made = write_manifest(tmp_path, commands=["copied"], git=lambda _d: GitState(commit))
    figures, rows = bench.testset(tmp_path)
    assert figures["manifest"] == made.sha256 and figures["test_cases"] == 1
    assert figures["testset_commit"] == commit
    assert rows[0]["split"] == "test" and rows[0]["test_passed"] is True, rows[0]
    assert figures["test_stable"] == 1.0
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [MANIFEST_NAME, f"{name}.json", f"{name}.aivsnap"]
    )  # nothing written into the set (no HELDOUT.txt)
