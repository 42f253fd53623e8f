"""Start a private redis-server on 127.0.0.1 with a free port, and stop it by pid."""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

from ..errors import ServiceError

__all__ = ["RedisServer", "free_port"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """A throwaway Redis: no persistence, loopback only, its own temp directory.

    **Usage**::

        with RedisServer() as redis:
            print(redis.url)          # redis://127.0.0.1:PORT/0
    """

    def __init__(self, *, port: int | None = None, binary: str | None = None) -> None:
        found = binary or shutil.which("redis-server")
        if found is None:
            raise ServiceError("redis-server not found: apt-get install redis-server")
        self.binary = found
        self.port = port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self._tmp: tempfile.TemporaryDirectory[str] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def start(self, timeout: float = 10.0) -> RedisServer:
        self._tmp = tempfile.TemporaryDirectory(prefix="aivitals-redis-")
        argv = [
            self.binary,
            "--bind", "127.0.0.1",
            "--port", str(self.port),
            "--save", "",
            "--appendonly", "no",
            "--dir", self._tmp.name,
            "--protected-mode", "yes",
            "--loglevel", "warning",
        ]  # fmt: skip
        log = Path(self._tmp.name) / "redis.log"
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        self._wait(timeout, log)
        return self

    def _wait(self, timeout: float, log: Path) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                break
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                pass
            time.sleep(0.05)
        tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
        self.stop()
        raise ServiceError(f"redis-server on port {self.port} did not start: {tail}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
