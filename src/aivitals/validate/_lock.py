"""One ``validate`` at a time per machine: an flock on a lock file."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from types import TracebackType

from .._tempdir import temp_root
from ..errors import AlreadyRunning

__all__ = ["RunLock", "default_lock_path"]


def default_lock_path() -> Path:
    return Path(os.environ.get("AIVITALS_VALIDATE_LOCK") or temp_root()) / (
        "aivitals-validate.lock"
    )


class RunLock:
    """Held for the whole run; released by the kernel if the process dies.

    **Usage**::

        with RunLock():            # AlreadyRunning if another validate holds it
            ...
    """

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or default_lock_path()
        self._fd: int | None = None

    def acquire(self) -> RunLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise AlreadyRunning(
                f"aivitals validate is already running (pid {holder}, lock {self.path}); "
                "wait for it to finish"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing releases the flock
            self._fd = None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()
