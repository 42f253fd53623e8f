"""Serve ``tests.instrument._wsgi_app:service`` with a real gunicorn, stopped by process group."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests._servers import free_port
from tests.instrument._uvicorn import _stop_group, _wait_ready

REPO = Path(__file__).resolve().parents[2]
CONF = "python:aivitals.instrument.gunicorn_conf"


APP = "tests.instrument._wsgi_app:service"
#: the same app, with a prometheus metric of its own made before aivitals is imported
EARLY_APP = "tests.instrument._wsgi_early:service"


def _command(
    port: int, workers: int, worker_class: str, threads: int, conf: bool, app: str
) -> list[str]:
    cmd = [sys.executable, "-m", "gunicorn", app]
    cmd += ["-w", str(workers), "-k", worker_class, "--threads", str(threads)]
    cmd += ["-b", f"127.0.0.1:{port}", "--log-level", "warning", "--graceful-timeout", "5"]
    return [*cmd, "-c", CONF] if conf else cmd


def _env(tmp: Path, env: dict[str, str] | None) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if k.upper() != "PROMETHEUS_MULTIPROC_DIR"}
    # TMPDIR: the directory aivitals makes by itself lands in the test's own tmp
    extra = {"PYTHONPATH": f"{REPO}:{REPO / 'src'}", "AIVITALS_TEST_SERVE": "1", "TMPDIR": str(tmp)}
    return {**base, **extra, **(env or {})}


@contextmanager
def gunicorn_wsgi(
    tmp: Path,
    *,
    workers: int = 2,
    worker_class: str = "sync",
    threads: int = 1,
    conf: bool = False,
    app: str = APP,
    env: dict[str, str] | None = None,
    timeout: float = 60.0,
) -> Iterator[str]:
    """gunicorn serving the test Flask app; yields its base URL."""
    port = free_port()
    log = open(tmp / "gunicorn.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        _command(port, workers, worker_class, threads, conf, app),
        cwd=REPO,
        env=_env(tmp, env),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        try:
            _wait_ready(proc, url, timeout)
        except (RuntimeError, TimeoutError) as exc:
            text = (tmp / "gunicorn.log").read_text(errors="replace")[-3000:]
            raise RuntimeError(f"{exc}; gunicorn log:\n{text}") from exc
        yield url
    finally:
        _stop_group(proc)
        log.close()


def gunicorn_boot_failure(
    tmp: Path,
    *,
    workers: int = 2,
    app: str = APP,
    env: dict[str, str] | None = None,
    timeout: float = 60.0,
) -> tuple[int, str]:
    """Start gunicorn expecting its workers to refuse to boot: (exit status, its log)."""
    port = free_port()
    log_path = tmp / "gunicorn-refused.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            _command(port, workers, "sync", 1, False, app),
            cwd=REPO,
            env=_env(tmp, env),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        try:
            while proc.poll() is None:
                if time.monotonic() > deadline:
                    raise TimeoutError("gunicorn kept running: the workers booted")
                time.sleep(0.1)
        finally:
            if proc.poll() is None:
                _stop_group(proc)
    return int(proc.returncode), log_path.read_text(errors="replace")
