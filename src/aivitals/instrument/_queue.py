"""Queues and worker pools that report their length, wait and saturation.

The queue's wait (enqueue to start of execution) is the most sensitive
early signal an AI service has: once its P99 passes about a second, 504s
follow within a minute. These wrappers measure it where it happens.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import os
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

from prometheus_client import REGISTRY, CollectorRegistry

from ..errors import ConfigError
from ._logging import log_event
from ._metrics import family

__all__ = ["InstrumentedExecutor", "InstrumentedQueue", "PoolSaturated"]

T = TypeVar("T")


class PoolSaturated(RuntimeError):
    """The executor already holds ``max_workers + max_queue`` tasks; the task was refused."""


#: How often a busy pool's running tasks are credited to worker_pool_busy_seconds_total
#: between their starts and ends. A scrape sees the counter at most this stale per busy
#: worker: over an 8 s rate window of a 2-worker pool, a stuck pool reads >= 0.98 busy.
BUSY_TICK_S = 0.1


class _BusyTicker:
    """One daemon thread per process that credits busy pools' running time every
    ``BUSY_TICK_S``, so a task that never ends (a stuck worker) still counts as busy.

    It sleeps while no pool is busy. Pools are held weakly; a pool joins under its own
    lock when it becomes busy and leaves under the same lock when it is idle, so a task
    that starts while the ticker drops its pool cannot be missed.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pools: weakref.WeakSet[InstrumentedExecutor] = weakref.WeakSet()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def watch(self, pool: InstrumentedExecutor) -> None:
        """Credit ``pool`` until it is idle (called under the pool's lock)."""
        with self._lock:
            self._pools.add(pool)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="aivitals-pool-busy", daemon=True
                )
                self._thread.start()
        self._wake.set()

    def drop(self, pool: InstrumentedExecutor) -> None:
        """Stop crediting ``pool`` (called under the pool's lock, when it is idle)."""
        with self._lock:
            self._pools.discard(pool)

    def _run(self) -> None:
        while True:
            self._wake.wait()
            time.sleep(BUSY_TICK_S)
            with self._lock:
                pools = list(self._pools)
            for pool in pools:
                pool._tick()
            with self._lock:
                if not self._pools:
                    self._wake.clear()


_TICKER = _BusyTicker()


def _new_ticker_after_fork() -> None:
    # a child forked while another thread held the ticker's lock would inherit it held;
    # the parent's pools (and their threads) do not live in the child anyway
    global _TICKER
    _TICKER = _BusyTicker()


os.register_at_fork(after_in_child=_new_ticker_after_fork)


class InstrumentedQueue(asyncio.Queue[T]):
    """A bounded ``asyncio.Queue`` exporting length, capacity, wait and rejections.

    ``put_nowait`` on a full queue raises ``asyncio.QueueFull`` as usual and
    counts ``queue_rejections_total{reason="full"}``. The wait histogram
    measures enqueue to ``get``: the moment a worker takes the item.

    **Usage**::

        queue = InstrumentedQueue(maxsize=64, name="generate")
        queue.put_nowait(job)        # or: await queue.put(job)
        job = await queue.get()      # observes queue_wait_seconds{queue="generate"}
    """

    def __init__(
        self,
        maxsize: int = 0,
        *,
        name: str = "default",
        registry: CollectorRegistry | None = REGISTRY,
    ) -> None:
        if isinstance(maxsize, bool) or not isinstance(maxsize, int) or maxsize < 0:
            raise ConfigError(f"maxsize must be an int >= 0, got {maxsize!r}")
        if not isinstance(name, str) or not name:
            raise ConfigError(f"name must be a non-empty str, got {name!r}")
        super().__init__(maxsize)
        self.name = name
        self._length = family("queue_length", registry).labels(name)
        self._wait = family("queue_wait_seconds", registry).labels(name)
        self._rejected = family("queue_rejections_total", registry)
        if maxsize:
            family("queue_capacity", registry).labels(name).set(maxsize)

    def put_nowait(self, item: T) -> None:
        try:
            super().put_nowait(item)
        except asyncio.QueueFull:
            self.reject("full")
            raise
        log_event("enqueued", {"queue": self.name, "queue_length": self.qsize()})

    def reject(self, reason: str) -> None:
        """Count a submission refused for ``reason`` (full, deadline, ...)."""
        self._rejected.labels(self.name, reason).inc()

    # asyncio.Queue stores through _put/_get; the timestamp rides along with the item
    def _put(self, item: Any) -> None:
        super()._put((time.perf_counter(), item))  # type: ignore[arg-type]
        self._length.set(self.qsize())

    def _get(self) -> Any:
        entry: tuple[float, Any] = super()._get()  # type: ignore[assignment]
        enqueued, item = entry
        self._wait.observe(time.perf_counter() - enqueued)
        self._length.set(self.qsize())
        return item


class InstrumentedExecutor(concurrent.futures.Executor):
    """Wraps a ThreadPoolExecutor or ProcessPoolExecutor: active/max workers, busy time,
    wait, rejections.

    ``max_queue`` bounds the tasks waiting for a worker (None: unbounded, as the
    stdlib); past it ``submit`` raises ``PoolSaturated``. Usable with
    ``loop.run_in_executor``. A thread pool runs each task in a copy of the
    submitter's context (``propagate_context``), so the request id and state
    follow the work into the worker's logs and model calls.

    **Usage**::

        pool = InstrumentedExecutor(ThreadPoolExecutor(8), name="tokenize", max_queue=32)
        result = await asyncio.get_running_loop().run_in_executor(pool, tokenize, text)
    """

    def __init__(
        self,
        executor: concurrent.futures.Executor,
        *,
        name: str = "default",
        max_workers: int | None = None,
        max_queue: int | None = None,
        propagate_context: bool = True,
        registry: CollectorRegistry | None = REGISTRY,
    ) -> None:
        workers = getattr(executor, "_max_workers", None) if max_workers is None else max_workers
        if not isinstance(workers, int) or workers < 1:
            raise ConfigError(f"max_workers must be a positive int, got {workers!r}")
        if max_queue is not None and (not isinstance(max_queue, int) or max_queue < 0):
            raise ConfigError(f"max_queue must be an int >= 0 or None, got {max_queue!r}")
        self.executor = executor
        self.name = name
        self.max_workers = workers
        self.max_queue = max_queue
        self._threads = isinstance(executor, concurrent.futures.ThreadPoolExecutor)
        self._propagate = propagate_context and self._threads
        self._lock = threading.Lock()
        self._outstanding = 0
        self._running = 0
        self._active = family("worker_pool_active_workers", registry).labels(name)
        # The gauge is what a scrape happens to catch; the busy-time counter integrates
        # it, so rate()/max_workers is the exact busy share over any window (a 2-worker
        # pool sampled once a second reads "all busy" for several scrapes in a row in a
        # healthy burst). Credited at every change and, while busy, every BUSY_TICK_S.
        self._busy = family("worker_pool_busy_seconds_total", registry).labels(name)
        self._busy_workers = 0
        self._credited_at = time.monotonic()
        self._rejected = family("worker_pool_rejections_total", registry).labels(name)
        self._wait = family("queue_wait_seconds", registry).labels(f"pool:{name}")
        self._length = family("queue_length", registry).labels(f"pool:{name}")
        family("worker_pool_max_workers", registry).labels(name).set(workers)

    @property
    def active(self) -> int:
        """Workers executing a task now."""
        return self._running if self._threads else min(self._outstanding, self.max_workers)

    @property
    def waiting(self) -> int:
        """Tasks submitted and not started."""
        return max(0, self._outstanding - self.active)

    def submit(
        self, fn: Callable[..., T], /, *args: Any, **kwargs: Any
    ) -> concurrent.futures.Future[T]:
        with self._lock:
            limit = None if self.max_queue is None else self.max_workers + self.max_queue
            if limit is not None and self._outstanding >= limit:
                self._rejected.inc()
                raise PoolSaturated(
                    f"pool {self.name!r} full: {self._outstanding} tasks for "
                    f"{self.max_workers} workers + {self.max_queue} queued"
                )
            self._outstanding += 1
            self._publish()
            waiting = self.waiting
        log_event("enqueued", {"queue": f"pool:{self.name}", "queue_length": waiting})
        submitted = time.perf_counter()
        try:
            if self._threads:
                ctx = contextvars.copy_context() if self._propagate else None
                future = self.executor.submit(self._run_thread, submitted, ctx, fn, args, kwargs)
            else:
                timed: Callable[..., Any] = _run_timed
                future = self.executor.submit(timed, time.time(), fn, args, kwargs)
        except BaseException:
            self._done()
            self._rejected.inc()  # shut down or broken pool: the task was refused
            raise
        return self._finish_future(future)

    def _run_thread(
        self,
        submitted: float,
        ctx: contextvars.Context | None,
        fn: Callable[..., T],
        args: Any,
        kwargs: Any,
    ) -> T:
        self._wait.observe(time.perf_counter() - submitted)
        with self._lock:
            self._running += 1
            self._publish()
        try:
            return ctx.run(fn, *args, **kwargs) if ctx is not None else fn(*args, **kwargs)
        finally:
            with self._lock:
                self._running -= 1
                self._publish()

    def _finish_future(self, inner: concurrent.futures.Future[Any]) -> concurrent.futures.Future[T]:
        if self._threads:
            inner.add_done_callback(lambda _: self._done())
            return inner
        outer: concurrent.futures.Future[T] = concurrent.futures.Future()

        def relay(done: concurrent.futures.Future[Any]) -> None:
            self._done()
            if done.cancelled():
                outer.cancel()
                return
            exc = done.exception()
            if exc is not None:
                outer.set_exception(exc)
                return
            waited, result = done.result()
            self._wait.observe(max(0.0, waited))
            outer.set_result(result)

        outer.set_running_or_notify_cancel()
        inner.add_done_callback(relay)
        return outer

    def _done(self) -> None:
        with self._lock:
            self._outstanding -= 1
            self._publish()

    def _publish(self) -> None:
        # under self._lock: credit the time since the last change at the old count
        self._credit()
        busy = self.active
        if busy and not self._busy_workers:
            _TICKER.watch(self)
        elif self._busy_workers and not busy:
            _TICKER.drop(self)
        self._busy_workers = busy
        self._active.set(busy)
        self._length.set(self.waiting)

    def _credit(self) -> None:
        now = time.monotonic()
        if self._busy_workers:
            self._busy.inc(self._busy_workers * (now - self._credited_at))
        self._credited_at = now

    def _tick(self) -> None:
        with self._lock:
            self._credit()

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self.executor.shutdown(wait=wait, cancel_futures=cancel_futures)


def _run_timed(submitted: float, fn: Callable[..., T], args: Any, kwargs: Any) -> tuple[float, T]:
    # runs in the worker process: wall clock, since perf_counter is per process
    waited = time.time() - submitted
    return waited, fn(*args, **kwargs)
