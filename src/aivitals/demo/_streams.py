"""The demo's load streams and the watcher of its processes: nothing fails silently.

A load stream is a thread that replays its part of the workload until told to
stop; an exception in it is kept and raised again in the main thread by
``check()``. ``stack_failure`` says which part of the stack died (Redis, the
service, the agent), read from the processes themselves, once a second.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx

from ..errors import ServiceError
from ..load import LoadConfig, LoadCounters, run_load
from ._view import ClientCounts
from ._workload import Workload

__all__ = ["LoadStream", "stack_failure", "workload_streams"]

#: A replay that ends before the demo does starts over; a day is the longest single pass.
_DAY = 24 * 3600.0


class LoadStream(threading.Thread):
    """Runs ``make_config(seconds_left)`` passes of load until ``stop`` is set.

    ``error`` holds the exception that ended it (``check()`` raises it as a
    ``ServiceError`` naming the stream); ``counters`` are the generator's own.
    """

    def __init__(
        self,
        name: str,
        make_config: Any,
        stop: threading.Event,
        *,
        until: float | None,
        load: Any = run_load,
    ) -> None:
        super().__init__(name=f"aivitals-demo-load-{name}", daemon=True)
        self.label = name
        self.make_config = make_config
        self.stop_event = stop
        self.until = until
        self.counters = LoadCounters()
        self.error: BaseException | None = None
        self.passes = 0
        #: the report of every finished pass (the last one may be cut short by ``stop``)
        self.reports: list[Any] = []
        self._load = load

    def run(self) -> None:
        try:
            while not self.stop_event.is_set():
                left = _DAY if self.until is None else self.until - time.monotonic()
                if left <= 0.5:
                    return
                cfg: LoadConfig = self.make_config(left)
                self.reports.append(self._load(cfg, stop=self.stop_event, counters=self.counters))
                self.passes += 1
        except BaseException as exc:  # kept for the main thread: a silent idle demo is a lie
            self.error = exc

    def check(self) -> None:
        """Raise what ended this stream early (``ServiceError`` naming the stream)."""
        if self.error is not None:
            exc = self.error
            raise ServiceError(
                f"the {self.label} load stopped: {type(exc).__name__}: {exc}"
            ) from exc
        early = self.until is None or time.monotonic() < self.until - 1.0
        if not self.is_alive() and not self.stop_event.is_set() and early:
            raise ServiceError(f"the {self.label} load ended early without an error")

    def counts(self) -> ClientCounts:
        c = self.counters
        return ClientCounts(self.label, c.sent, c.answered, c.errors, c.timeouts)


def workload_streams(
    workload: Workload,
    *,
    base_url: str,
    trace: str,
    stop: threading.Event,
    until: float | None,
    timeout: float = 30.0,
    load: Any = run_load,
    embeddings_trace: str | None = None,
) -> list[LoadStream]:
    """The completions replay and the embeddings stream of ``workload`` (not started).

    ``embeddings_trace`` (a trace file) gives the embeddings their send times, as the
    soak's ramp does; without it they are a Poisson stream at ``workload.embeddings_rps``.
    """
    base = base_url.rstrip("/")

    def completions(left: float) -> LoadConfig:
        return LoadConfig(
            url=base + "/v1/completions",
            trace=trace,
            time_scale=workload.time_scale,
            duration=left,
            requests=workload.completions,
            timeout=timeout,
        )

    def embeddings(left: float) -> LoadConfig:
        if embeddings_trace is not None:
            return LoadConfig(
                url=base + "/v1/embeddings",
                trace=embeddings_trace,
                duration=left,
                requests=workload.embeddings,
                timeout=timeout,
            )
        return LoadConfig(
            url=base + "/v1/embeddings",
            rate=workload.embeddings_rps,
            duration=min(left, 3600.0),
            requests=workload.embeddings,
            timeout=timeout,
        )

    return [
        LoadStream("completions", completions, stop, until=until, load=load),
        LoadStream("embeddings", embeddings, stop, until=until, load=load),
    ]


class AgentCheck:
    """An HTTP check of the agent, at most every ``every`` seconds (it runs in this process)."""

    def __init__(self, every: float = 5.0) -> None:
        self.every = every
        self._last = 0.0
        self._failures = 0

    def __call__(self, stack: Any) -> str | None:
        agent = stack.agent
        if agent is None:
            return None
        if not agent.started:
            return "the agent stopped"
        now = time.monotonic()
        if now - self._last < self.every:
            return None
        self._last = now
        try:
            httpx.get(agent.url + "/metrics", timeout=3.0).raise_for_status()
            self._failures = 0
        except (httpx.HTTPError, RuntimeError) as exc:
            self._failures += 1
            if self._failures >= 3:  # one slow answer on a busy machine is not a death
                return f"the agent at {agent.url} does not answer: {type(exc).__name__}: {exc}"
        return None


def stack_failure(stack: Any, agent_check: AgentCheck | None = None) -> str | None:
    """Which part of the stack died and how; None while all run."""
    redis = stack.redis
    proc = None if redis is None else redis.proc
    if proc is not None and proc.poll() is not None:
        return f"redis-server (pid {proc.pid}, port {redis.port}) exited with {proc.returncode}"
    service = stack.service
    if service is not None:
        code = service.exit_code()
        if code is not None:
            tail = service.tail(600).strip().replace("\n", " | ")
            return (
                f"the demo service (pid {service.pid}, port {service.port}) exited with "
                f"{code}: {tail or 'no output'}"
            )
    if agent_check is not None:
        return agent_check(stack)
    return None
