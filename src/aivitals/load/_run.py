"""Running a load: build the requests and the schedule, send, drain, summarize."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
import threading
import time
from collections.abc import Callable, Coroutine
from time import perf_counter
from typing import Any

import numpy as np

from ._client import Engine
from ._config import LoadConfig
from ._payload import (
    RequestSpec,
    completions_request,
    embeddings_request,
    get_request,
    make_prompt,
)
from ._report import SLO, LoadReport, RequestResult, summarize
from ._schedule import poisson_schedule, uniform_schedule
from ._slack import tight_timer_slack
from ._target import check_target
from ._trace import load_trace

__all__ = ["LoadCounters", "run_load", "run_load_async"]

Progress = Callable[[int, int], None]

#: The most a request is handed from the dispatcher thread to the event loop
#: before its send time (the switch between them takes about this long).
_EARLY = 50e-6


class LoadCounters:
    """What the load generator itself sent and got back, readable while it runs.

    ``sent`` counts requests handed to a connection; ``answered`` answers
    without error, ``timeouts`` requests the client gave up on, ``errors``
    every other failure (HTTP 4xx/5xx, refused connections, stream errors).
    Plain ints written by the load's event loop thread; a reader in another
    thread sees a consistent enough view for a live display.

    **Usage**::

        counters = LoadCounters()
        threading.Thread(target=run_load, args=(cfg,), kwargs={"counters": counters}).start()
        print(counters.sent, counters.answered)
    """

    __slots__ = ("_lock", "answered", "errors", "sent", "timeouts", "ttft")

    def __init__(self) -> None:
        self.sent = 0
        self.answered = 0
        self.errors = 0
        self.timeouts = 0
        #: times to first token (s) of the latest streamed answers, newest last
        self.ttft: list[float] = []
        self._lock = threading.Lock()

    def record(self, result: RequestResult) -> None:
        if result.ok:
            self.answered += 1
        elif result.error == "timeout":
            self.timeouts += 1
        else:
            self.errors += 1
        if result.ttft is not None:
            with self._lock:
                self.ttft.append(result.ttft)
                if len(self.ttft) > 512:
                    del self.ttft[:256]

    def recent_ttft(self) -> list[float]:
        with self._lock:
            return list(self.ttft)

    @property
    def in_flight(self) -> int:
        return max(0, self.sent - self.answered - self.errors - self.timeouts)


def _payload_kind(config: LoadConfig, path: str) -> str:
    if config.payload != "auto":
        return config.payload
    if path.split("?")[0].rstrip("/").endswith("/embeddings"):
        return "embeddings"
    if path.split("?")[0].rstrip("/").endswith("/completions"):
        return "completions"
    return "get"


def _one(
    kind: str, path: str, prompt_tokens: int, max_tokens: int, stream: bool, rng: random.Random
) -> RequestSpec:
    if kind == "embeddings":
        return embeddings_request(make_prompt(prompt_tokens, rng=rng), path=path)
    if kind == "completions":
        prompt = make_prompt(prompt_tokens, rng=rng)
        return completions_request(prompt, max_tokens, stream=stream, path=path)
    return get_request(path)


def _plan(config: LoadConfig, path: str) -> tuple[list[float] | None, list[RequestSpec]]:
    """Send offsets (None in closed loop) and the requests to cycle through."""
    rng = random.Random(config.seed)
    kind = _payload_kind(config, path)
    if config.trace is not None:
        trace = load_trace(
            config.trace,
            time_scale=config.time_scale,
            duration=config.duration,
            max_prompt_tokens=config.max_prompt_tokens,
            max_output_tokens=config.max_output_tokens,
        )
        if config.requests:
            # the trace gives the send times; the caller's requests (cycled) the bodies
            return [t.at for t in trace], list(config.requests)
        specs = [
            _one(
                kind if kind != "get" else "completions",
                path,
                t.prompt_tokens,
                t.max_tokens,
                config.stream,
                rng,
            )
            for t in trace
        ]
        return [t.at for t in trace], specs
    if config.requests:
        specs = list(config.requests)
    elif kind == "get":
        specs = [get_request(path)]
    else:
        n = config.input_pool or 1
        specs = [
            _one(kind, path, config.prompt_tokens, config.max_tokens, config.stream, rng)
            for _ in range(n)
        ]
    if config.rate is None:
        return None, specs
    if config.arrival == "uniform":
        offsets = uniform_schedule(config.rate, config.duration)
    else:
        offsets = poisson_schedule(config.rate, config.duration, seed=config.seed)
    if not config.requests and config.input_pool == 0 and kind != "get":
        specs = [
            _one(kind, path, config.prompt_tokens, config.max_tokens, config.stream, rng)
            for _ in offsets
        ]
    return offsets, specs


class _Run:
    def __init__(
        self,
        config: LoadConfig,
        stop: threading.Event | None,
        progress: Progress | None,
        counters: LoadCounters | None = None,
    ) -> None:
        self.config = config
        self.counters = counters
        self.host, self.port, self.path = check_target(config.url, config.allow_hosts)
        self.host_header = f"{self.host}:{self.port}"
        self.stop = stop
        self.progress = progress
        self.results: list[RequestResult] = []
        self.lags: list[float] = []
        self.engine = Engine(
            self.host,
            self.port,
            max_connections=config.max_connections,
            timeout=config.timeout,
            on_result=self._on_result if counters is not None else self.results.append,
        )

    def _on_result(self, result: RequestResult) -> None:
        self.results.append(result)
        assert self.counters is not None
        self.counters.record(result)

    def stopped(self) -> bool:
        return self.stop is not None and self.stop.is_set()

    async def run(self) -> LoadReport:
        offsets, specs = _plan(self.config, self.path)
        wires = {id(s): s.wire(self.host_header) for s in specs}
        total = len(offsets) if offsets is not None else 0
        helpers = [asyncio.ensure_future(self._sweeper())]
        if self.progress is not None:
            helpers.append(asyncio.ensure_future(self._report_progress(total)))
        try:
            await self._prewarm()
            t0 = perf_counter() + 0.005
            if offsets is None:
                await self._closed(specs, wires, t0)
            else:
                await self._open(offsets, specs, wires, t0)
            await self._drain()
            end = max((r.intended + r.latency for r in self.results), default=perf_counter())
        finally:
            self.engine.close()
            for h in helpers:
                h.cancel()
        return self._summary(max(end - t0, 1e-9))

    async def _prewarm(self) -> None:
        want = self.config.concurrency or min(self.config.connections, self.config.max_connections)
        for _ in range(want):
            self.engine.open()
        # Bounded: a connect that is slow (SYN lost) joins later instead of delaying all.
        deadline = perf_counter() + min(self.config.timeout, 1.0)
        while self.engine._tasks and perf_counter() < deadline:
            await asyncio.sleep(0.002)

    async def _open(
        self, offsets: list[float], specs: list[RequestSpec], wires: dict[int, bytes], t0: float
    ) -> None:
        if self.config.spin > 0:
            await self._open_spinning(offsets, specs, wires, t0)
        else:
            await self._open_threaded(offsets, specs, wires, t0)

    async def _open_threaded(
        self, offsets: list[float], specs: list[RequestSpec], wires: dict[int, bytes], t0: float
    ) -> None:
        """Send times kept by a thread that sleeps with nanosleep (the event loop's
        timers are only millisecond-precise) and hands each batch to the loop just
        before it is due. A sleeping dispatcher also keeps its priority on a busy
        CPU, where a spinning one is preempted for whole time slices."""
        loop = asyncio.get_running_loop()
        engine, lags, counters = self.engine, self.lags, self.counters
        finished = asyncio.Event()
        # At most a quarter of the mean gap, so waiting out the hand-over never takes
        # more than a quarter of the loop's time at high rates.
        span = offsets[-1] - offsets[0] if len(offsets) > 1 else 1.0
        early = min(_EARLY, 0.25 * span / max(len(offsets), 1))
        halt = threading.Event()

        def submit(batch: list[tuple[RequestSpec, float]]) -> None:
            # The batch is handed over a little before it is due (a thread switch
            # costs about that); wait out the rest here so nothing leaves early.
            first = batch[0][1]
            while (now := perf_counter()) < first:
                pass
            for spec, due in batch:
                lags.append(now - due)
                engine.submit(spec, wires[id(spec)], due)
            if counters is not None:
                counters.sent += len(batch)

        def dispatch() -> None:
            with tight_timer_slack():
                send_all()

        def send_all() -> None:
            cycle = itertools.cycle(specs)
            i, n = 0, len(offsets)
            try:
                while i < n and not halt.is_set() and not self.stopped():
                    now = perf_counter()
                    batch = []
                    while i < n and t0 + offsets[i] <= now + early:
                        batch.append((next(cycle), t0 + offsets[i]))
                        i += 1
                    if batch:
                        loop.call_soon_threadsafe(submit, batch)
                    if i < n:
                        wait = t0 + offsets[i] - early - perf_counter()
                        time.sleep(max(0.0, min(wait, 0.1)))
            finally:
                with contextlib.suppress(RuntimeError):  # the loop is already closed
                    loop.call_soon_threadsafe(finished.set)

        thread = threading.Thread(target=dispatch, name="aivitals-load-dispatch", daemon=True)
        thread.start()
        try:
            await finished.wait()
        finally:
            halt.set()

    async def _open_spinning(
        self, offsets: list[float], specs: list[RequestSpec], wires: dict[int, bytes], t0: float
    ) -> None:
        engine, spin, lags = self.engine, self.config.spin, self.lags
        cycle = itertools.cycle(specs)
        i, n = 0, len(offsets)
        while i < n and not self.stopped():
            now = perf_counter()
            while i < n and t0 + offsets[i] <= now:
                spec = next(cycle)
                due = t0 + offsets[i]
                lags.append(now - due)
                engine.submit(spec, wires[id(spec)], due)
                if self.counters is not None:
                    self.counters.sent += 1
                i += 1
            if i < n:
                gap = t0 + offsets[i] - perf_counter()
                await asyncio.sleep(gap - spin if gap > spin else 0)

    async def _closed(self, specs: list[RequestSpec], wires: dict[int, bytes], t0: float) -> None:
        cycle = itertools.cycle(specs)
        config = self.config
        kind = _payload_kind(config, self.path)
        # input_pool 0 means every request different; a closed loop does not know how
        # many it will send, so each is made when it is sent (cycling the plan's one spec
        # sent the same input every time, and a response cache answered all but the first)
        fresh = not config.requests and config.input_pool == 0 and kind != "get"
        rng = random.Random(None if config.seed is None else config.seed + 1)

        def next_request() -> tuple[RequestSpec, bytes]:
            if fresh:
                spec = _one(
                    kind, self.path, config.prompt_tokens, config.max_tokens, config.stream, rng
                )
                wire = spec.wire(self.host_header)
            else:
                spec = next(cycle)
                wire = wires[id(spec)]
            if self.counters is not None:
                self.counters.sent += 1
            return spec, wire

        engine = self.engine
        engine.next_request = next_request
        engine.closed_until = t0 + self.config.duration
        waiting = [*engine.fresh, *engine.idle]
        engine.fresh.clear()
        engine.idle.clear()
        for conn in waiting:
            engine._release(conn)
        while perf_counter() < engine.closed_until and not self.stopped():
            await asyncio.sleep(min(0.05, max(engine.closed_until - perf_counter(), 0)))
        engine.closed_until = 0.0

    async def _drain(self) -> None:
        deadline = perf_counter() + self.config.timeout + 1.0
        while not self.engine.idle_and_drained and perf_counter() < deadline:
            if self.stopped():
                self.engine.backlog.clear()
            await asyncio.sleep(0.005)

    async def _sweeper(self) -> None:
        step = min(0.05, self.config.timeout / 4)
        while True:
            await asyncio.sleep(step)
            self.engine.sweep(perf_counter())

    async def _report_progress(self, total: int) -> None:
        assert self.progress is not None
        while True:
            self.progress(len(self.results), total)
            await asyncio.sleep(0.25)

    def _summary(self, duration: float) -> LoadReport:
        c = self.config
        slo = None
        if c.slo_ttft is not None or c.slo_tpot is not None or c.slo_e2e is not None:
            slo = SLO(ttft=c.slo_ttft, tpot=c.slo_tpot, e2e=c.slo_e2e)
        lag = float(np.percentile(self.lags, 99)) * 1000.0 if self.lags else 0.0
        return summarize(
            self.results,
            mode=c.mode,
            target=c.url,
            duration_s=duration,
            offered_rate=c.rate,
            concurrency=c.concurrency,
            slo=slo,
            max_client_queue=self.engine.max_backlog,
            connections=self.engine.peak_conns,
            send_lag_p99_ms=lag,
            stopped_early=self.stopped(),
        )


async def run_load_async(
    config: LoadConfig,
    *,
    stop: threading.Event | None = None,
    progress: Progress | None = None,
    counters: LoadCounters | None = None,
) -> LoadReport:
    """Run the load in the current event loop; see ``run_load``."""
    return await _Run(config, stop, progress, counters).run()


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop
    except ImportError:
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def _run_coro(coro: Coroutine[Any, Any, LoadReport]) -> LoadReport:
    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        return runner.run(coro)


def run_load(
    config: LoadConfig,
    *,
    stop: threading.Event | None = None,
    progress: Progress | None = None,
    counters: LoadCounters | None = None,
) -> LoadReport:
    """Send the load described by ``config`` and return the report (blocking).

    Runs its own event loop (uvloop when installed), so it can be called from
    a plain thread. Setting ``stop`` ends the sending early; requests in flight
    are still awaited. ``progress(done, total)`` is called about four times a
    second (``total`` is 0 in closed loop). ``counters`` (a ``LoadCounters``)
    is kept up to date while the load runs, for a live view.

    **Usage**::

        report = run_load(LoadConfig(url="http://127.0.0.1:8000/v1/embeddings",
                                     rate=100, duration=30))
        print(report.format())
    """
    if config.progress and progress is None and counters is None:
        return _with_rich_progress(config, stop)
    return _run_coro(run_load_async(config, stop=stop, progress=progress, counters=counters))


def _with_rich_progress(config: LoadConfig, stop: threading.Event | None) -> LoadReport:
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (
        TextColumn("[bold]load[/] {task.description}"),
        BarColumn(),
        TextColumn("{task.completed} done"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, transient=True) as bar:
        task = bar.add_task(config.mode, total=None)
        start = perf_counter()

        def update(done: int, total: int) -> None:
            if total:
                bar.update(task, completed=done, total=total)
            else:
                elapsed = perf_counter() - start
                bar.update(
                    task,
                    completed=done,
                    total=None,
                    description=f"{config.mode} {elapsed:.0f}/{config.duration:.0f}s",
                )

        return _run_coro(run_load_async(config, stop=stop, progress=update))
