"""``aivitals fleet up`` returns with the fleet running; ``fleet down`` (another process)
stops every process it started, checked by pid."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from click.testing import CliRunner

from aivitals.cli import cli
from aivitals.errors import AlreadyRunning
from aivitals.fleet import Fleet, FleetConfig
from tests._servers import require_binary


def _aivitals(*args: str, timeout: float = 240.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "aivitals.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _running(pid: int, started: float) -> bool:
    try:
        p = psutil.Process(pid)
        return abs(p.create_time() - started) < 0.05 and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


@pytest.mark.integration
@pytest.mark.slow
def test_fleet_up_then_down_leaves_nothing_running(tmp_path: Path) -> None:
    require_binary("prometheus")
    state = tmp_path / "fleet.json"
    up = _aivitals(
        "fleet", "up", "--nodes", "1", "--rps", "0", "--no-victoriametrics",
        "--state", str(state), "--workdir", str(tmp_path / "wd"),
    )  # fmt: skip
    try:
        assert up.returncode == 0, up.stderr + up.stdout
        assert "sim-node-1" in up.stdout
        procs = json.loads(state.read_text())["procs"]
        names = {p["name"] for p in procs}
        assert {"sim-node-1/service", "sim-node-1/agent", "prometheus", "alertmanager"} <= names
        # the CLI process is gone, the fleet is not
        assert all(_running(p["pid"], p["started"]) for p in procs)
        status = _aivitals("fleet", "status", "--json", "--state", str(state), timeout=30)
        assert status.returncode == 0, status.stderr
        assert all(json.loads(status.stdout)["running"].values())
        # a second fleet on the same state is refused, and the first keeps running
        second = Fleet(FleetConfig(nodes=1, state=state))
        with pytest.raises(AlreadyRunning):
            second.up()
        assert all(_running(p["pid"], p["started"]) for p in procs)
        assert not second.workdir.exists()  # its temp dir is not left behind
    finally:
        down = _aivitals("fleet", "down", "--state", str(state), timeout=60)
    assert down.returncode == 0, down.stderr
    assert "STILL RUNNING" not in down.stdout
    left = [p["name"] for p in procs if _running(p["pid"], p["started"])]
    assert left == []
    assert not state.exists()


def test_fleet_down_without_a_fleet_is_a_clear_error(tmp_path: Path) -> None:
    res = CliRunner().invoke(cli, ["fleet", "down", "--state", str(tmp_path / "none.json")])
    assert res.exit_code == 1
    assert "no fleet state" in str(res.exception)


def test_fleet_state_that_is_not_json_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "fleet.json"
    bad.write_text("{not json")
    res = CliRunner().invoke(cli, ["fleet", "status", "--state", str(bad)])
    assert res.exit_code == 1
    assert "unreadable" in str(res.exception)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"nodes": 0}, "nodes=0"), ({"nodes": 65}, "nodes=65"), ({"rps": -1.0}, "rps=-1")],
)
def test_fleet_config_refuses_bad_values(kwargs: dict[str, float], match: str) -> None:
    from aivitals.errors import ConfigError

    with pytest.raises(ConfigError, match=match):
        FleetConfig(**kwargs)  # type: ignore[arg-type]
