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
        _wait_ready(proc, url, timeout)
        yield url
    finally:
        _stop_group(proc)
        log.close()


GUNICORN_CONF = """
import aivitals.instrument


def child_exit(server, worker):
    aivitals.instrument.mark_worker_dead(worker.pid)
"""


@contextmanager
def gunicorn_server(
    tmp: Path, *, workers: int = 2, env: dict[str, str] | None = None, timeout: float = 60.0
) -> Iterator[str]:
    """gunicorn with uvicorn workers and the documented ``child_exit`` hook."""
    port = free_port()
    conf = tmp / "gunicorn.conf.py"
    conf.write_text(GUNICORN_CONF)
    cmd = [
        sys.executable,
        "-m",
        "gunicorn",
        "tests.instrument._mp_app:app",
        "-c",
        str(conf),
        "-w",
        str(workers),
        "-k",
        "uvicorn.workers.UvicornWorker",
        "-b",
        f"127.0.0.1:{port}",
        "--log-level",
        "warning",
    ]
    full_env = {**os.environ, **(env or {}), "PYTHONPATH": f"{REPO}:{REPO / 'src'}"}
    log = open(tmp / "gunicorn.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=full_env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(proc, url, timeout)
        yield url
    finally:
        _stop_group(proc)
        log.close()


def _wait_ready(proc: subprocess.Popen[bytes], url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            if httpx.get(f"{url}/v1/pid", timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"server not answering on {url}")
        time.sleep(0.1)


def _stop_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(15)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(5)
