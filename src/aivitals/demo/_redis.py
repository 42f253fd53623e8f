"""Start a private redis-server on 127.0.0.1 with a free port, and stop it by pid."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

from .._ports import free_port
from ..errors import ServiceError

if TYPE_CHECKING:
    from ..chaos import RunDir

__all__ = ["RedisServer", "free_port"]


class RedisServer:
    """A throwaway Redis: no persistence, loopback only, its own temp directory.

    **Usage**::

        with RedisServer() as redis:
            print(redis.url)          # redis://127.0.0.1:PORT/0

    With a ``ledger`` (the owner's ``RunDir``) the temp dir and the process are
    written to it and the process carries the ledger's run marker, so
    ``aivitals chaos cleanup`` stops it after a crash of its owner. A fault that
    kills it and starts a new one hands the new one over with ``adopt``; ``stop``
    then stops that one.
    """

    def __init__(
        self,
        *,
        port: int | None = None,
        binary: str | None = None,
        ledger: RunDir | None = None,
    ) -> None:
        found = binary or shutil.which("redis-server")
        if found is None:
            raise ServiceError("redis-server not found: apt-get install redis-server")
        self.binary = found
        self.port = port or free_port()
        self.ledger = ledger
        self.proc: subprocess.Popen[bytes] | None = None
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        #: (pid, start time) of a replacement handed over by a fault
        self._adopted: tuple[int, float | None] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int | None:
        if self._adopted is not None:
            return self._adopted[0]
        return None if self.proc is None else self.proc.pid

    def adopt(self, pid: int, start: float | None) -> None:
        """Take over a redis-server started in place of ours (same port and dir)."""
        self._adopted = (pid, start)

    def alive(self) -> bool:
        """Is our redis-server (or the one a fault handed over) running?"""
        if self._adopted is not None:
            from ..chaos import same_process

            return same_process(*self._adopted)
        return self.proc is not None and self.proc.poll() is None

    def start(self, timeout: float = 10.0) -> RedisServer:
        from ..chaos import RUN_ENV, keeps_title, start_time

        self._tmp = tempfile.TemporaryDirectory(prefix="aivitals-redis-")
        env = dict(os.environ)
        env.pop(RUN_ENV, None)
        if self.ledger is not None:
            self.ledger.journal.record("path", path=self._tmp.name)
            env[RUN_ENV] = self.ledger.run_id
        argv = [
            self.binary,
            "--bind", "127.0.0.1",
            "--port", str(self.port),
            "--save", "",
            "--appendonly", "no",
            "--dir", self._tmp.name,
            "--protected-mode", "yes",
            "--loglevel", "warning",
            *keeps_title(self.binary),  # the run marker in its environment survives
        ]  # fmt: skip
        log = Path(self._tmp.name) / "redis.log"
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env
            )
        if self.ledger is not None:
            pid = self.proc.pid
            self.ledger.journal.record("process", pid=pid, start=start_time(pid), label="redis")
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
        if self._adopted is not None:
            from ..chaos import kill_tree

            # before its directory goes: a replacement must not outlive its cwd
            kill_tree(*self._adopted, grace=5.0)
            self._adopted = None
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
