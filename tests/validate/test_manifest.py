"""The manifest that freezes a test set: written once, and every change to the folder
(a byte, a file added or removed, the manifest gone) refused with the file named."""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from aivitals.errors import AivitalsError, StoreError
from aivitals.tsdb import Store
from aivitals.validate._manifest import (
    MANIFEST_NAME,
    GitState,
    ManifestError,
    verify_manifest,
    write_manifest,
)
from aivitals.validate._record import save_recording
from tests._paths import load_script

T0 = 1_700_000_000.0


def _recording(directory: Path, name: str, commit: str | None = "c" * 40) -> None:
    """A small recording (one heartbeat series; its data need not be fit to score: the
    manifest hashes files, it does not judge them), its label's commit set to ``commit``."""
    store = Store(retention=7200.0)
    for i in range(120):
        store.append("up", {"job": "service"}, 1.0, T0 + i)
    label: dict[str, Any] = {
        "name": name, "kind": "fault", "faults": ["cpu_burn"], "expected": ["cpu_burn"],
        "layer": "host", "severity": "moderate", "params": {}, "t_baseline": T0 + 10,
        "t_fault": T0 + 60, "t_revert": T0 + 110, "quick": True, "tick": 1.0, "passed": True,
    }  # fmt: skip
    save_recording(store, directory, label, start=T0, end=T0 + 119)
    path = directory / f"{name}.json"
    doc = json.loads(path.read_text())
    doc["git_commit"] = commit
    path.write_text(json.dumps(doc))


def _clean(head: str = "c" * 40, dirty: tuple[str, ...] = ()) -> Any:
    return lambda _directory: GitState(head, None, dirty)


@pytest.fixture
def frozen(tmp_path: Path) -> Path:
    _recording(tmp_path, "cpu_burn@moderate")
    _recording(tmp_path, "cpu_burn@severe")
    write_manifest(tmp_path, commands=["aivitals validate --quick --sweep"], git=_clean())
    return tmp_path


def test_round_trip_lists_every_file_with_its_hash_and_the_code_version(frozen: Path) -> None:
    (frozen / "README.md").write_text("what the set is; not hashed\n")
    got = verify_manifest(frozen)
    assert sorted(got.files) == [
        "cpu_burn@moderate.aivsnap",
        "cpu_burn@moderate.json",
        "cpu_burn@severe.aivsnap",
        "cpu_burn@severe.json",
    ]
    snap = (frozen / "cpu_burn@severe.aivsnap").read_bytes()
    assert got.files["cpu_burn@severe.aivsnap"] == hashlib.sha256(snap).hexdigest()
    assert got.sha256 == hashlib.sha256((frozen / MANIFEST_NAME).read_bytes()).hexdigest()
    assert got.meta["git_commit"] == "c" * 40 and got.meta["git_dirty"] is False
    assert got.meta["commands"] == ["aivitals validate --quick --sweep"]
    assert got.meta["recordings"] == 2 and got.meta["recorded_from"].endswith("Z")


def test_the_hash_lines_are_what_sha256sum_checks(frozen: Path) -> None:
    """``sha256sum -c`` reads the same file (the header lines are warned about, skipped)."""
    out = subprocess.run(
        ["sha256sum", "-c", MANIFEST_NAME], cwd=frozen, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.count(": OK") == 4


def test_a_changed_byte_is_refused_naming_the_file(frozen: Path) -> None:
    path = frozen / "cpu_burn@moderate.aivsnap"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(ManifestError, match=r"refused.*cpu_burn@moderate\.aivsnap: SHA-256"):
        verify_manifest(frozen)


def test_an_extra_file_and_a_missing_one_are_refused_each_named(frozen: Path) -> None:
    (frozen / "cpu_burn@severe.json").unlink()
    (frozen / "HELDOUT.txt").write_text("a file nobody listed\n")
    with pytest.raises(ManifestError) as err:
        verify_manifest(frozen)
    text = str(err.value)
    assert "cpu_burn@severe.json: listed, missing" in text
    assert "HELDOUT.txt: not in the manifest" in text
    assert isinstance(err.value, StoreError)


def test_a_missing_manifest_is_refused(tmp_path: Path) -> None:
    _recording(tmp_path, "cpu_burn@moderate")
    with pytest.raises(
        ManifestError, match=r"MANIFEST\.sha256 is missing: .* not a frozen test set"
    ):
        verify_manifest(tmp_path)


def test_an_edited_manifest_is_refused(frozen: Path) -> None:
    manifest = frozen / MANIFEST_NAME
    manifest.write_text(manifest.read_text() + "not a hash line\n")
    with pytest.raises(ManifestError, match=r"line \d+: not a '<sha256>  <file>' line"):
        verify_manifest(frozen)


def test_a_set_is_frozen_once(frozen: Path) -> None:
    with pytest.raises(ManifestError, match="frozen once"):
        write_manifest(frozen, commands=["again"], git=_clean())


def test_recordings_of_two_code_versions_are_not_one_test_set(tmp_path: Path) -> None:
    _recording(tmp_path, "a", commit="a" * 40)
    _recording(tmp_path, "b", commit="b" * 40)
    with pytest.raises(ManifestError, match="not of one known code version"):
        write_manifest(tmp_path, commands=["x"], git=_clean())
    assert not (tmp_path / MANIFEST_NAME).exists()


def test_a_dirty_checkout_is_refused_unless_said_so(tmp_path: Path) -> None:
    _recording(tmp_path, "a")
    dirty = _clean(dirty=("src/aivitals/diagnose/_engine.py",))
    with pytest.raises(ManifestError, match=r"uncommitted changes: src/aivitals/diagnose"):
        write_manifest(tmp_path, commands=["x"], git=dirty)
    with pytest.raises(ManifestError, match="HEAD is " + "d" * 40):
        write_manifest(tmp_path, commands=["x"], git=_clean(head="d" * 40))
    got = write_manifest(tmp_path, commands=["x"], git=dirty, allow_dirty=True)
    assert got.meta["git_dirty"] is True
    assert verify_manifest(tmp_path).meta["dirty"] == got.meta["dirty"]


def test_the_folder_itself_and_the_reports_do_not_make_the_checkout_dirty(
    tmp_path: Path,
) -> None:
    _recording(tmp_path / "set", "a")
    state = GitState("c" * 40, tmp_path, ("set/a.json", "runs/report.json"))
    got = write_manifest(
        tmp_path / "set", commands=["x"], outputs=[tmp_path / "runs" / "report.json"],
        git=lambda _d: state,
    )  # fmt: skip
    assert got.meta["git_dirty"] is False


def test_a_hidden_temporary_or_a_file_that_is_not_a_recording_refuses_the_freeze(
    tmp_path: Path,
) -> None:
    _recording(tmp_path, "a")
    (tmp_path / ".a.json.tmp").write_text("{}")
    with pytest.raises(ManifestError, match=r"hidden temporary\): \.a\.json\.tmp"):
        write_manifest(tmp_path, commands=["x"], git=_clean())
    (tmp_path / ".a.json.tmp").unlink()
    (tmp_path / "report.json").write_text("{}")
    with pytest.raises(AivitalsError, match=r"report\.json"):  # load_recordings names it
        write_manifest(tmp_path, commands=["x"], git=_clean())


def test_the_freeze_script_records_into_an_empty_folder_only(tmp_path: Path) -> None:
    """``record`` runs the plan (here a stand-in that writes one recording per step, no
    live run), then freezes; a folder with anything but a README is refused untouched."""
    script = load_script("benchmarks/freeze_testset.py", "freeze_testset")
    target = tmp_path / "set"
    target.mkdir()
    (target / "old.json").write_text("{}")
    assert script.record(target, tmp_path / "runs", run=lambda cmd: 0) == 2
    (target / "old.json").unlink()
    ran: list[list[str]] = []

    def fake(cmd: list[str]) -> int:
        ran.append(cmd)
        _recording(target, f"step{len(ran)}", commit=None)  # commit set below
        return 1  # a failed check keeps the recordings

    assert script.record(target, tmp_path / "runs", run=fake) == 2  # no code version known
    assert [c[:3] for c in ran] == [["aivitals", "validate", "--quick"]] * 3
    assert "--sweep" in ran[0] and "--soak" in ran[2]
    assert "cpu_burn+gpu_memory_leak,redis_down+traffic_surge" in ran[1]
    assert not (target / MANIFEST_NAME).exists()
    stopped = tmp_path / "stopped"
    assert script.record(stopped, tmp_path / "runs", run=lambda cmd: 130) == 130
    assert script.verify(stopped) == 2  # never frozen
