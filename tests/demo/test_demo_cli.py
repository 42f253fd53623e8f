from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from click.testing import CliRunner

from aivitals.cli import cli
from tests._servers import require_binary


def test_demo_refuses_an_unknown_fault_before_starting_anything() -> None:
    result = CliRunner().invoke(cli, ["demo", "--fault", "no_such_fault", "--duration", "5"])
    assert result.exit_code != 0
    assert "no_such_fault" in str(result.exception)


@pytest.mark.parametrize("flag", ["--duration", "--fault-after", "--fault-duration"])
def test_demo_refuses_non_positive_durations(flag: str) -> None:
    result = CliRunner().invoke(cli, ["demo", flag, "-1"])
    assert result.exit_code != 0
    assert flag.lstrip("-") in str(result.exception)


@pytest.mark.integration
@pytest.mark.slow
def test_ctrl_c_leaves_no_process_behind(tmp_path: Path) -> None:
    require_binary("redis-server")
    out = tmp_path / "demo.out"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "COLUMNS": "120"}
    with out.open("wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "aivitals.cli", "demo", "--duration", "600"],
            stdout=sink,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
        )
    try:
        ports = _wait_for_urls(out, proc)
        time.sleep(3)  # let load and the live view run
        family = psutil.Process(proc.pid).children(recursive=True)
        assert family, "the demo started no child processes (redis, service)"
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) in (0, 1, 130)
    finally:
        if proc.poll() is None:
            proc.kill()
    _gone, alive = psutil.wait_procs(family, timeout=10)
    assert not alive, f"left running: {[p.pid for p in alive]}"
    listening = {c.laddr.port for c in psutil.net_connections("tcp") if c.status == "LISTEN"}
    assert not (set(ports) & listening), "a port of the demo is still listening"


def _wait_for_urls(out: Path, proc: subprocess.Popen[bytes]) -> list[int]:
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        text = out.read_text(errors="replace")
        found = re.findall(r"(?:service|agent) http://127\.0\.0\.1:(\d+)", text)
        if len(found) >= 2:
            return [int(p) for p in found]
        if proc.poll() is not None:
            pytest.fail(f"demo exited {proc.returncode}: {text[-3000:]}")
        time.sleep(0.5)
    pytest.fail("demo did not print its URLs within 180 s")
