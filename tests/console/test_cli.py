"""``aivitals console``: its bad input is a clear error, and it serves until stopped."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx
import pytest

from aivitals.cli import main

from .test_server import _raw_get


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--agent", "http://a:1", "--prometheus", "http://b:2"], "choose one of"),
        (["--listen", "0.0.0.0:9999"], "not a loopback address"),
        (["--prometheus", "ftp://x"], "must start with http"),
        (["--interval", "soon"], "interval"),
    ],
)
def test_console_bad_input(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["console", *argv])
    assert exc.value.code == 1
    assert message in capsys.readouterr().err


def test_console_serves_until_sigterm() -> None:
    from tests._servers import free_port

    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "aivitals.cli",
            "console",
            "--port",
            str(port),
            "--agent",
            "http://127.0.0.1:9",
        ],
        stderr=subprocess.PIPE,
        env={**os.environ},
    )
    try:
        url = f"http://127.0.0.1:{port}/"
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                if httpx.get(url, timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        assert httpx.get(url).status_code == 200
        assert _raw_get(url, "/console/../../cli.py")[0] == 404
        a = httpx.get(url + "console/api/alerts", timeout=15)
        assert a.status_code == 502  # nobody at :9: said so, not hung
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=15)
    assert proc.returncode == 0
    assert f"aivitals console on http://127.0.0.1:{port}/" in err.decode()
