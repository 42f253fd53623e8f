"""aivitals names the temp directory without tempfile's first-call write probe."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from aivitals._tempdir import temp_root

# The probe writes a bare 8-character file and removes it; a process killed in
# between leaves it. Here the probe leaves a marker instead, so a call shows.
_PROBE = """
import sys, tempfile
def probe():
    open(sys.argv[1], "w").close()
    raise AssertionError("tempfile probed the temp directory")
tempfile._get_default_tempdir = probe
"""


def _run(code: str, tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    marker = tmp_path / "probed"
    full = dict(os.environ, TMPDIR=str(tmp_path / "t"), **env)
    (tmp_path / "t").mkdir(exist_ok=True)
    return subprocess.run(
        [sys.executable, "-c", _PROBE + code, str(marker)],
        env=full, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_an_aivitals_process_never_probes_the_temp_directory_at_exit(tmp_path: Path) -> None:
    # every aivitals process registers an exit hook that looks for its workers' metric files
    done = _run("import aivitals.instrument, aivitals.chaos._helpers, aivitals.cli", tmp_path)
    assert done.returncode == 0, done.stderr
    assert not (tmp_path / "probed").exists(), done.stderr
    assert os.listdir(tmp_path / "t") == []


def test_the_helpers_paths_name_the_temp_directory_without_probing(tmp_path: Path) -> None:
    code = (
        "from aivitals.collect.gpu._sim import default_sim_dir\n"
        "from aivitals.instrument._multiprocess import children_directory\n"
        "import aivitals.validate._lock as lock, aivitals.fleet._fleet as fleet\n"
        "import os, sys\n"
        "os.environ.pop('AIVITALS_SIM_GPU_DIR', None)\n"
        "assert default_sim_dir() == os.path.join(os.environ['TMPDIR'], 'aivitals-sim-gpu')\n"
        "children_directory()\n"
    )
    done = _run(code, tmp_path)
    assert done.returncode == 0, done.stderr
    assert not (tmp_path / "probed").exists(), done.stderr


@pytest.mark.parametrize("var", ["TMPDIR", "TEMP", "TMP"])
def test_temp_root_names_what_gettempdir_names(
    var: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tempfile

    for v in ("TMPDIR", "TEMP", "TMP"):
        monkeypatch.delenv(v, raising=False)
    monkeypatch.setenv(var, str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)
    assert temp_root() == str(tmp_path)
    monkeypatch.setattr(tempfile, "tempdir", None)
    assert tempfile.gettempdir() == temp_root()


def test_a_missing_temp_variable_falls_through_as_gettempdir_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tempfile

    monkeypatch.setenv("TMPDIR", str(tmp_path / "gone"))
    monkeypatch.setenv("TEMP", str(tmp_path))
    monkeypatch.delenv("TMP", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", None)
    assert temp_root() == str(tmp_path)
    monkeypatch.setattr(tempfile, "tempdir", None)
    assert tempfile.gettempdir() == str(tmp_path)
