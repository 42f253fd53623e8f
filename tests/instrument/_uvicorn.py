"""Run the test app under a real uvicorn on 127.0.0.1, stopped by process group."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from tests._servers import free_port

REPO = Path(__file__).resolve().parents[2]


@contextmanager
def uvicorn_server(
    *, workers: int = 1, env: dict[str, str] | None = None, timeout: float = 60.0
) -> Iterator[str]:
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "uvicorn",
        "tests.instrument._mp_app:app",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        str(workers),
        "--log-level",
        "warning",
    ]
    full_env = {**os.environ, **(env or {}), "PYTHONPATH": str(REPO)}
    log = open(os.devnull, "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=full_env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"uvicorn exited with {proc.returncode}")
            try:
                if httpx.get(f"{url}/v1/pid", timeout=1.0).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"uvicorn not answering on {url}")
            time.sleep(0.1)
        yield url
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(15)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(5)
        log.close()
