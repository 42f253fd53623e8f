"""Start real components (Prometheus, Alertmanager, VictoriaMetrics, Redis) for tests.

Each runs on 127.0.0.1 with a free port and a private temp directory, and is
stopped by pid when the test is done. A missing binary skips the test with the
package to install, except under CI, where it fails: CI must exercise them.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests._tiers import needs

DEBIAN_PACKAGE = {
    "prometheus": "prometheus",
    "promtool": "prometheus",
    "prometheus-alertmanager": "prometheus-alertmanager",
    "victoria-metrics": "victoria-metrics",
    "redis-server": "redis-server",
    "wrk": "wrk",
    "openssl": "openssl",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@needs("a Debian package's binary")
def require_binary(name: str) -> str:
    """The path of a binary; skips the test when it is absent (fails under CI)."""
    path = shutil.which(name)
    if path is None:
        msg = f"{name} not found: apt-get install {DEBIAN_PACKAGE.get(name, name)}"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)
    return path


@dataclass
class Server:
    name: str
    port: int
    proc: subprocess.Popen[bytes]
    workdir: Path
    log: Path
    scheme: str = "http"

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)


def _wait_http(
    server: Server, path: str, timeout: float, client: httpx.Client | None = None
) -> None:
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            break
        try:
            r = (client or httpx).get(server.url + path, timeout=1.0)
            if r.status_code == 200:
                return
            last = f"HTTP {r.status_code}"
        except httpx.HTTPError as exc:
            last = repr(exc)
        time.sleep(0.1)
    server.stop()
    tail = server.log.read_text(errors="replace")[-3000:] if server.log.exists() else ""
    raise RuntimeError(f"{server.name} did not become ready ({last}); log:\n{tail}")


@contextmanager
def _run(
    name: str,
    argv: Sequence[str],
    workdir: Path,
    port: int,
    ready_path: str,
    timeout: float = 30.0,
    *,
    scheme: str = "http",
    ready_client: httpx.Client | None = None,
) -> Iterator[Server]:
    log = workdir / f"{name}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            list(argv), stdout=out, stderr=subprocess.STDOUT, cwd=workdir, stdin=subprocess.DEVNULL
        )
    server = Server(name, port, proc, workdir, log, scheme)
    try:
        _wait_http(server, ready_path, timeout, ready_client)
        yield server
    finally:
        server.stop()


@contextmanager
def prometheus(
    config_yaml: str = "",
    *,
    data_dir: Path | None = None,
    rule_files: Sequence[Path] = (),
    extra_args: Sequence[str] = (),
    timeout: float = 30.0,
    web_config_yaml: str = "",
    ready_client: httpx.Client | None = None,
) -> Iterator[Server]:
    """A real Prometheus on 127.0.0.1. ``config_yaml`` is the body of prometheus.yml;
    ``data_dir`` may hold blocks made by ``promtool tsdb create-blocks-from``.
    ``web_config_yaml`` is a ``--web.config.file`` (basic auth, TLS: then the URL is
    https://), and ``ready_client`` the client that can pass it to see it ready."""
    binary = require_binary("prometheus")
    with tempfile.TemporaryDirectory(prefix="aivitals-prom-") as tmp:
        work = Path(tmp)
        port = free_port()
        cfg = work / "prometheus.yml"
        body = config_yaml or "global:\n  scrape_interval: 15s\n"
        if rule_files:
            body += "rule_files:\n" + "".join(f"  - {p}\n" for p in rule_files)
        cfg.write_text(body)
        data = data_dir or (work / "data")
        argv = [
            binary,
            f"--config.file={cfg}",
            f"--storage.tsdb.path={data}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--storage.tsdb.retention.time=100y",
            "--log.level=warn",
            *extra_args,
        ]
        scheme = "http"
        if web_config_yaml:
            web = work / "web.yml"
            web.write_text(web_config_yaml)
            argv.append(f"--web.config.file={web}")
            scheme = "https" if "tls_server_config" in web_config_yaml else "http"
        with _run(
            "prometheus",
            argv,
            work,
            port,
            "/-/ready",
            timeout,
            scheme=scheme,
            ready_client=ready_client,
        ) as server:
            yield server


@contextmanager
def alertmanager(config_yaml: str, *, timeout: float = 30.0) -> Iterator[Server]:
    binary = shutil.which("prometheus-alertmanager") or require_binary("alertmanager")
    with tempfile.TemporaryDirectory(prefix="aivitals-am-") as tmp:
        work = Path(tmp)
        port = free_port()
        cluster_port = free_port()
        cfg = work / "alertmanager.yml"
        cfg.write_text(config_yaml)
        argv = [
            binary,
            f"--config.file={cfg}",
            f"--storage.path={work / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            f"--cluster.listen-address=127.0.0.1:{cluster_port}",
            "--log.level=warn",
        ]
        with _run("alertmanager", argv, work, port, "/-/ready", timeout) as server:
            yield server


@contextmanager
def victoria_metrics(*, timeout: float = 30.0) -> Iterator[Server]:
    binary = require_binary("victoria-metrics")
    with tempfile.TemporaryDirectory(prefix="aivitals-vm-") as tmp:
        work = Path(tmp)
        port = free_port()
        argv = [
            binary,
            f"-storageDataPath={work / 'data'}",
            f"-httpListenAddr=127.0.0.1:{port}",
            "-retentionPeriod=100y",
            "-search.disableCache",
            "-loggerLevel=WARN",
        ]
        with _run("victoria-metrics", argv, work, port, "/health", timeout) as server:
            yield server


@contextmanager
def redis_server(*, timeout: float = 15.0) -> Iterator[Server]:
    binary = require_binary("redis-server")
    with tempfile.TemporaryDirectory(prefix="aivitals-redis-") as tmp:
        work = Path(tmp)
        port = free_port()
        argv = [
            binary,
            "--bind",
            "127.0.0.1",
            "--port",
            str(port),
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(work),
        ]
        log = work / "redis.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        server = Server("redis", port, proc, work, log)
        try:
            deadline = time.monotonic() + timeout
            while True:
                try:
                    with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
                        s.sendall(b"PING\r\n")
                        if s.recv(16).startswith(b"+PONG"):
                            break
                except OSError:
                    pass
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("redis-server did not start: " + log.read_text()[-2000:])
                time.sleep(0.05)
            yield server
        finally:
            server.stop()


def promtool(
    *args: str, input_text: str | None = None, timeout: float = 120.0
) -> subprocess.CompletedProcess[str]:
    """Run the real promtool; returns the completed process (check returncode)."""
    binary = require_binary("promtool")
    return subprocess.run(
        [binary, *args],
        input=input_text,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
