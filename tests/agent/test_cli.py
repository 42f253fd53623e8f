from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from aivitals.cli import cli, main
from tests._servers import free_port

from .conftest import wait_for

REPO = Path(__file__).resolve().parents[2]


def test_collectors_command_json(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        cli,
        [
            "collectors",
            "--gpu",
            "sim",
            "--sim-gpu-dir",
            str(tmp_path),
            "--pid",
            str(os.getpid()),
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    rows = {r["collector"]: r for r in json.loads(result.output)["collectors"]}
    assert set(rows) >= {"host", "process", "gpu", "kernel"}
    assert rows["gpu"]["up"] is True and rows["gpu"]["samples"] > 5
    assert rows["host"]["samples"] > 10


def test_collectors_command_table_and_samples(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        cli, ["collectors", "--gpu", "sim", "--sim-gpu-dir", str(tmp_path), "--samples"]
    )
    assert result.exit_code == 0, result.output
    assert result.output.startswith("collector")
    assert 'gpu_memory_total_bytes{gpu="0",backend="sim"}' in result.output


def test_agent_refuses_remote_listen_without_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["agent", "--listen", "0.0.0.0:9464", "--gpu", "none"])
    assert info.value.code == 1
    assert (
        "ConfigError: listen: '0.0.0.0:9464' is not a loopback address" in capsys.readouterr().err
    )


def test_agent_bad_interval(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["agent", "--interval", "soon", "--gpu", "none"])
    assert info.value.code == 1
    assert "ConfigError: interval: 'soon' is not a duration" in capsys.readouterr().err


def test_agent_bad_netns(capsys: pytest.CaptureFixture[str]) -> None:
    # a relative path is neither an ip netns name nor a namespace file
    with pytest.raises(SystemExit) as info:
        main(["agent", "--netns", "proc/1/ns/net", "--gpu", "none", "--listen", "127.0.0.1:0"])
    assert info.value.code == 1
    err = capsys.readouterr().err
    assert "ConfigError: netns: 'proc/1/ns/net' is not a namespace name, glob or absolute" in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--probe", "nourl"], "expected NAME=URL"),
        (["--probe", "a=http://127.0.0.1:1/", "--probe", "a=http://127.0.0.1:2/"], "twice"),
        (["--probe", "a=ftp://127.0.0.1/"], "is not an http(s) URL"),
        (
            ["--probe", "a=http://127.0.0.1:1/", "--probe-timeout", "5s"],
            "below the collector timeout",
        ),
    ],
)
def test_agent_bad_probe(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["agent", "--gpu", "none", "--listen", "127.0.0.1:0", *argv])
    assert info.value.code in (1, 2)
    assert message in capsys.readouterr().err


@pytest.mark.integration
def test_agent_command_runs_and_stops_on_sigterm(tmp_path: Path) -> None:
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "aivitals.cli",
        "agent",
        "--listen",
        f"127.0.0.1:{port}",
        "--gpu",
        "sim",
        "--sim-gpu-dir",
        str(tmp_path),
        "--interval",
        "200ms",
    ]
    proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        url = f"http://127.0.0.1:{port}"

        def ready() -> bool:
            try:
                return httpx.get(url + "/-/ready", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(ready, timeout=30)
        text = httpx.get(url + "/metrics", timeout=5).text
        assert 'gpu_utilization_ratio{gpu="0",backend="sim"}' in text
        q = httpx.get(url + "/api/v1/query", params={"query": "host_memory_total_bytes"}).json()
        assert float(q["data"]["result"][0]["value"][1]) > 0
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    assert b"aivitals agent on http://127.0.0.1:" in err
