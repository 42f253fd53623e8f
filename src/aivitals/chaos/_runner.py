"""The chaos runner: starts faults, bounds them, and reverts them whatever happens.

Reverts happen on ``stop``, when a fault's duration ends (a timer), on an
exception (context manager exit), on Ctrl-C / SIGTERM / SIGHUP (signal
handlers), at interpreter exit (``atexit``), and after a crash or SIGKILL of
the runner through the run's journal, which ``aivitals chaos cleanup`` and the
next runner replay. Only one runner may run at a time on a machine (a lock
file in the root directory).
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import fcntl
import os
import shutil
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

from ..errors import AlreadyRunning, FaultError
from ._fault import DEFAULT_MAX_DURATION, Fault, FaultContext, FaultEffect
from ._journal import CleanupReport, RunDir, cleanup, default_root
from ._registry import get_fault

__all__ = ["ActiveFault", "ChaosRunner", "interrupt_on_signals"]

_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def interrupt_on_signals() -> Iterator[None]:
    """Ctrl-C, SIGTERM and SIGHUP all raise ``KeyboardInterrupt`` inside the block, so a
    command that owns its signals (a ``ChaosRunner(handle_signals=False)`` under it)
    unwinds through every ``finally``: faults reverted, reports written.

    SIGINT is set too, not left to Python's default: a process started in the background
    by a shell without job control (``nohup cmd &``, a CI step) inherits SIGINT *ignored*,
    and Python then never raises ``KeyboardInterrupt`` for ``kill -INT``. The handlers
    found on entry are restored on exit. Main thread only (``signal.signal`` refuses
    others).

    **Usage**::

        with interrupt_on_signals():
            try:
                run()
            except KeyboardInterrupt:
                print("stopped")
    """

    def handler(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    old = {s: signal.signal(s, handler) for s in _SIGNALS}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


@dataclass
class ActiveFault:
    """A started fault: what it is, what it changed for clients, and when it ends."""

    fault: Fault
    effect: FaultEffect
    started_at: float
    ends_at: float
    stopped_at: float | None = None
    errors: list[str] = dataclasses.field(default_factory=list)

    @property
    def name(self) -> str:
        return self.fault.name

    @property
    def client_url(self) -> str | None:
        return self.effect.client_url

    @property
    def allow_hosts(self) -> tuple[str, ...]:
        return self.effect.allow_hosts


class ChaosRunner:
    """Runs faults against one service with guaranteed revert.

    **Usage**::

        ctx = FaultContext(target="http://127.0.0.1:8000", chaos_token=token)
        with ChaosRunner(ctx) as runner:
            active = runner.start("network_loss", duration=60, percent=10)
            run_load(LoadConfig(url=active.client_url + "/v1/embeddings", rate=20,
                                duration=60, allow_hosts=active.allow_hosts))
        # everything reverted here, even on an exception

    A second runner while one is open raises ``AlreadyRunning``. Opening a
    runner first replays the journals of runs whose runner died.
    """

    def __init__(
        self,
        ctx: FaultContext,
        *,
        root: Path | None = None,
        max_duration: float = DEFAULT_MAX_DURATION,
        handle_signals: bool = True,
    ) -> None:
        self.root = root or default_root()
        self.max_duration = max_duration
        self.handle_signals = handle_signals
        self._base_ctx = ctx
        self.ctx = ctx
        self.run: RunDir | None = None
        self.active: list[ActiveFault] = []
        self.recovered: CleanupReport | None = None
        self._lock_fd: int | None = None
        self._timers: list[threading.Timer] = []
        self._old_handlers: dict[int, Any] = {}
        self._mutex = threading.Lock()
        self.closed = threading.Event()

    # -- open / close --------------------------------------------------------------
    def __enter__(self) -> ChaosRunner:
        self.open()
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def open(self) -> ChaosRunner:
        self.root.mkdir(parents=True, exist_ok=True)
        self._acquire_lock()
        try:
            self.recovered = cleanup(self.root)
            self.run = RunDir.create(self.root)
            self.ctx = dataclasses.replace(self._base_ctx, run=self.run)
        except BaseException:
            self._release_lock()
            raise
        self._install_handlers()
        atexit.register(self.close)
        return self

    def close(self) -> list[str]:
        """Stop every fault, remove the run directory when all is reverted, unlock."""
        if self.closed.is_set() or self.run is None:
            return []
        for t in self._timers:
            t.cancel()
        errors = self.stop_all()
        # Kept only while something is left to revert (a later cleanup retries it);
        # errors with nothing pending were returned to the caller and are final.
        if not self.run.journal.pending():
            shutil.rmtree(self.run.path, ignore_errors=True)
        self.closed.set()
        self._restore_handlers()
        self._release_lock()
        atexit.unregister(self.close)
        return errors

    # -- faults ----------------------------------------------------------------------
    def start(
        self,
        fault: str | Fault,
        *,
        duration: float | None = None,
        context: FaultContext | None = None,
        **params: Any,
    ) -> ActiveFault:
        """Start a fault (a name plus ``duration`` and params, or a ``Fault``).

        ``context`` replaces the runner's context for this fault (a stack whose
        Redis was replaced by an earlier fault names the new one).
        """
        if self.run is None or self.closed.is_set():
            raise FaultError("the runner is not open (use it as a context manager)")
        if isinstance(fault, str):
            if duration is None:
                raise FaultError(f"fault {fault!r}: a duration is required")
            fault = get_fault(fault)(duration=duration, max_duration=self.max_duration, **params)
        elif fault.duration > self.max_duration:
            from ..errors import FaultRefused

            raise FaultRefused(
                f"fault {fault.name!r}: duration {fault.duration:g}s is longer "
                f"than the configured maximum {self.max_duration:g}s"
            )
        now = time.time()
        ctx = self.ctx if context is None else dataclasses.replace(context, run=self.run)
        effect = fault.start(ctx)
        active = ActiveFault(fault, effect, now, now + fault.duration)
        with self._mutex:
            self.active.append(active)
        timer = threading.Timer(fault.duration, self.stop, args=(active,))
        timer.daemon = True
        timer.start()
        self._timers.append(timer)
        return active

    def stop(self, active: ActiveFault) -> list[str]:
        """Revert one fault (idempotent)."""
        errors = active.fault.stop()
        if active.stopped_at is None:
            active.stopped_at = time.time()
        active.errors += errors
        return errors

    def stop_all(self) -> list[str]:
        with self._mutex:
            actives = list(self.active)
        errors: list[str] = []
        for active in reversed(actives):
            errors += self.stop(active)
        return errors

    def run_for(
        self,
        faults: Iterable[str],
        *,
        duration: float,
        params: dict[str, Any] | None = None,
        on_tick: Callable[[float], None] | None = None,
    ) -> list[ActiveFault]:
        """Start ``faults`` together, wait ``duration`` seconds, stop them."""
        started = [
            self.start(name, duration=duration, **(params or {}).get(name, {})) for name in faults
        ]
        end = time.monotonic() + duration
        while (left := end - time.monotonic()) > 0 and not self.closed.is_set():
            time.sleep(min(1.0, left))
            if on_tick is not None:
                on_tick(max(0.0, end - time.monotonic()))
        for active in started:
            self.stop(active)
        return started

    # -- lock and signals ----------------------------------------------------------
    def _acquire_lock(self) -> None:
        path = self.root / "runner.lock"
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 64).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise AlreadyRunning(
                f"another chaos run (pid {holder}) is in progress; wait for it to finish "
                f"(its faults are reverted when it ends)"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._lock_fd = fd

    def _release_lock(self) -> None:
        if self._lock_fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(self._lock_fd, 0)
            os.close(self._lock_fd)  # closing drops the flock
            self._lock_fd = None

    def _install_handlers(self) -> None:
        if not self.handle_signals or threading.current_thread() is not threading.main_thread():
            return
        for sig in _SIGNALS:
            self._old_handlers[sig] = signal.signal(sig, self._on_signal)

    def _restore_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig, old in self._old_handlers.items():
            signal.signal(sig, old)
        self._old_handlers.clear()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.close()
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise SystemExit(128 + signum)
