"""``aivitals query`` on a snapshot file, through the click runner."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from aivitals.cli import cli, main
from aivitals.errors import ConfigError
from aivitals.tsdb import Store, parse_duration, parse_time

T = 1_700_000_000.0


@pytest.fixture
def snapshot(tmp_path: Path) -> Path:
    store = Store()
    for i in range(20):
        store.append("c_total", {"pod": "a"}, float(i), T + 15 * i)
    path = tmp_path / "s.aivsnap"
    store.save(path)
    return path


def test_query_snapshot_json(snapshot: Path) -> None:
    result = CliRunner().invoke(
        cli, ["query", "c_total", "--snapshot", str(snapshot), "--at", str(T + 285), "--json"]
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["resultType"] == "vector"
    assert data["result"][0]["value"] == [T + 285, "19.0"]


def test_query_snapshot_table_and_range(snapshot: Path) -> None:
    args = ["query", "rate(c_total[1m])", "--snapshot", str(snapshot)]
    result = CliRunner().invoke(cli, [*args, "--range", str(T + 60), str(T + 120), "30s"])
    assert result.exit_code == 0, result.output
    assert 'pod="a"' in result.output and "matrix" in result.output


def test_bad_expression_prints_error_and_exits_1(
    snapshot: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["query", "sum(", "--snapshot", str(snapshot)])
    assert exit_info.value.code == 1
    assert capsys.readouterr().err.startswith("QueryError: invalid PromQL")


def test_two_sources_is_a_config_error(snapshot: Path) -> None:
    result = CliRunner().invoke(
        cli, ["query", "x", "--snapshot", str(snapshot), "--prometheus", "http://127.0.0.1:1"]
    )
    assert isinstance(result.exception, ConfigError)


def test_duration_and_time_parsing() -> None:
    assert parse_duration("step", "1h30m") == 5400
    assert parse_duration("step", "15") == 15
    assert parse_time("--at", "now-5m", 1000.0) == 700.0
    with pytest.raises(ConfigError, match="step"):
        parse_duration("step", "5 minutes")
    with pytest.raises(ConfigError, match="--at"):
        parse_time("--at", "yesterday", 0.0)
