"""One run of the demo: the stack, the measured workload, the load streams and the watcher.

``aivitals demo`` drives it with a live view; ``benchmarks/demo_health.py``
drives the same run without one. Every second ``check()`` raises what failed
(a load stream, Redis, the service, the agent) as a ``ServiceError``.

**Usage**::

    with DemoSession(SessionOptions(duration=60)) as run:
        while run.seconds < 60:
            run.check()
            time.sleep(1)
"""

from __future__ import annotations

import dataclasses
import shutil
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from ..errors import ConfigError, ServiceError

__all__ = [
    "CACHE_TTL",
    "COMPRESSED_RULES",
    "FOR_FACTOR",
    "DemoSession",
    "SessionOptions",
    "SoakLoad",
    "check_port_free",
    "preflight",
]

#: The service's response cache TTL (seconds), which the prompt pool is sized against.
CACHE_TTL = 300.0
#: After a fault ends, what it stopped gets this long to come back before the watcher
#: calls it dead.
FAULT_GRACE = 15.0
#: Compressed rules (a fault shown in a minute): ``for:`` durations divided by this ...
FOR_FACTOR = 10.0
#: ... and these windows: short enough to move within a fault, long enough that a
#: healthy service's noise (a P99 of a handful of requests, a hit ratio of a few
#: lookups) does not page.
COMPRESSED_RULES: dict[str, Any] = {
    "rate_window": "60s",
    "short_window": "20s",
    "idle_window": "20s",
    "unseen_hold_window": "100s",  # five short windows, as shipped
    "saturation_window": "20s",
    "composite_window": "30s",
    "baseline_window": "3m",
}


@dataclass(frozen=True, kw_only=True)
class SessionOptions:
    """What to run. ``rate`` None: measure capacity and replay at ``utilization`` of it."""

    trace: str = "azure-conv"
    duration: float | None = None
    rate: float | None = None
    utilization: float = 0.5
    hit_ratio: float = 0.4
    probe_seconds: float = 5.0
    embeddings_rate: float = 2.0
    port: int | None = None
    compressed_rules: bool = False


def preflight(trace: str, port: int | None) -> list[Any]:
    """What must hold before anything starts: the trace loads, Redis exists, the port is free.

    Returns the trace, its lengths scaled to the demo model (``_workload.scale_lengths``).
    """
    from ..load import load_trace
    from ._workload import scale_lengths

    rows = scale_lengths(load_trace(trace))
    if len(rows) < 2:
        raise ConfigError(f"trace {trace!r}: {len(rows)} request(s); the replay needs at least 2")
    if shutil.which("redis-server") is None:
        raise ConfigError(
            "redis-server not found on the PATH; the demo caches responses in Redis "
            "(apt-get install redis-server)"
        )
    if port is not None:
        check_port_free(port)
    return rows


def check_port_free(port: int) -> None:
    """``ServiceError`` when something (another demo?) already listens on 127.0.0.1:port."""
    if not 0 < port < 65536:
        raise ConfigError(f"--port={port!r}: expected 1..65535")
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError as exc:
            raise ServiceError(
                f"port {port} on 127.0.0.1 is in use ({exc.strerror}); is another "
                "aivitals demo running? Stop it or choose another --port"
            ) from None


#: Seconds ``DemoSession.stop`` lets the load streams finish before the stack stops.
STOP_GRACE = 5.0


class DemoSession:
    """Start with ``start()`` (or ``with``); ``check()`` every second; ``stop()`` always."""

    def __init__(self, options: SessionOptions, *, say: Any = print) -> None:
        from ._stack import Stack, StackConfig
        from ._streams import AgentCheck

        self.options = options
        self.say = say
        self.trace_rows = preflight(options.trace, options.port)
        compressed = options.compressed_rules
        self.stack = Stack(
            StackConfig(
                quick=compressed,
                for_factor=FOR_FACTOR,
                # 1 s scrapes in both modes: the live view reads 8 s rate windows
                interval=1.0,
                rule_params=dict(COMPRESSED_RULES) if compressed else {},
                service_args=("--cache-ttl", f"{CACHE_TTL:g}"),
            )
        )
        if options.port is not None:
            self.stack.service_port = options.port
        self.stop_event = threading.Event()
        self.streams: list[Any] = []
        self.workload: Any = None
        self.started = 0.0
        self.active_fault: Any = None
        self._agent_check = AgentCheck()

    @property
    def rules_note(self) -> str:
        if self.options.compressed_rules:
            windows = ", ".join(f"{k} {v}" for k, v in COMPRESSED_RULES.items())
            return f"time-compressed rules (for: divided by {FOR_FACTOR:g}; {windows})"
        return "real-time rules (the pack's own windows and for: durations)"

    @property
    def seconds(self) -> float:
        return time.monotonic() - self.started if self.started else 0.0

    def start(self) -> DemoSession:
        from ._streams import workload_streams
        from ._workload import LENGTH_SCALE, plan_workload

        opts = self.options
        stack = self.stack
        try:
            stack.start()
            assert stack.service is not None
            self.say(f"service {stack.service.url}  agent {stack.agent.url}  (Ctrl-C stops all)")
            self.say(f"console {stack.agent.url}/")
            self.say(f"{self.rules_note}; GPU backend: {stack.config.gpu_backend}")
            if opts.rate is None:
                self.say(f"measuring capacity for {opts.probe_seconds:g} s ...")
            self.workload = plan_workload(
                self.trace_rows,
                url=stack.service.url,
                workers=stack.config.workers,
                rate=opts.rate,
                utilization=opts.utilization,
                hit_ratio=opts.hit_ratio,
                cache_ttl=CACHE_TTL,
                embeddings_rate=opts.embeddings_rate,
                probe_seconds=opts.probe_seconds,
                duration=opts.duration,
                length_scale=LENGTH_SCALE,
            )
            self.say(self.workload.why())
            self.started = time.monotonic()
            until = None if opts.duration is None else self.started + opts.duration
            self.streams = workload_streams(
                self.workload,
                base_url=stack.service.url,
                trace=opts.trace,
                stop=self.stop_event,
                until=until,
            )
            for st in self.streams:
                st.start()
        except BaseException:
            self.stop()
            raise
        return self

    def check(self) -> None:
        """Raise (``ServiceError``) what stopped: a load stream, or a part of the stack."""
        from ._streams import stack_failure

        for st in self.streams:
            st.check()
        active = self.active_fault
        if active is not None and time.time() < active.ends_at + FAULT_GRACE:
            return  # what the fault stops may be down for now
        failure = stack_failure(self.stack, self._agent_check)
        if failure is not None:
            raise ServiceError(failure)

    def clients(self) -> list[Any]:
        return [st.counts() for st in self.streams]

    def stop(self) -> None:
        self.stop_event.set()
        # one short grace for all the streams, then the stack stops whatever they do: a
        # stream still planning its replay (a pool of a million prompts encoded before the
        # first send) does not look at the stop event, and 35 s a stream kept Ctrl-C waiting
        # over a minute (its threads are daemons: they end with the process)
        deadline = time.monotonic() + STOP_GRACE
        for st in self.streams:
            st.join(timeout=max(0.0, deadline - time.monotonic()))
        self.stack.stop()

    def __enter__(self) -> DemoSession:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class SoakLoad:
    """The demo's replay on a started ``Stack`` for a soak of ``duration`` seconds.

    As ``aivitals demo`` replays: a capacity probe, the trace (lengths scaled) with its
    own bursts, sized so the swing's busiest point sends ``utilization`` of the measured
    rate (x1 is ``utilization / max(1, swing[1])`` of it), a Zipf prompt pool sized
    for ``hit_ratio`` against ``cache_ttl``, embeddings beside it. Two things change
    over the run (``_workload``): the rate ramps from x``swing[0]`` to x``swing[1]``
    (``swing_offsets``: the same share every minute; the embeddings too), and the popular
    prompts drift (``churn_entry``: the hot set is replaced ``churn_turnovers`` times),
    so cached keys stop being asked and expire while new ones are cached. With
    ``level_window``, the trace's own slow drift is taken out first (``level_rate``),
    so the swing is the only slow change. The warped send times go to the load
    generator as trace files in the stack's workdir.
    ``warm_up`` seconds at the ramp's start rate come first; the soak's clock
    (``seconds``, ``started_at``, ``multiplier``) starts after them.

    **Usage**::

        load = SoakLoad(stack, duration=300, cache_ttl=60).start()
        while load.seconds < 300:
            load.check(); time.sleep(1)
        load.stop()
    """

    def __init__(
        self,
        stack: Any,
        *,
        duration: float,
        cache_ttl: float,
        swing: tuple[float, float] = (0.5, 1.5),
        warm_up: float = 0.0,
        churn_turnovers: float = 2.0,
        trace: str = "azure-conv",
        utilization: float = 0.5,
        hit_ratio: float = 0.4,
        embeddings_rate: float = 2.0,
        probe_seconds: float = 5.0,
        seed: int = 0,
        level_window: float | None = None,
    ) -> None:
        from ._streams import AgentCheck
        from ._workload import rate_multiplier

        rate_multiplier(0.0, duration, *swing)  # a bad duration or swing fails here
        if not warm_up >= 0:
            raise ConfigError(f"warm_up={warm_up!r}: expected >= 0 seconds")
        if not cache_ttl > 0:
            raise ConfigError(f"cache_ttl={cache_ttl!r}: expected > 0 seconds")
        if level_window is not None and not level_window > 0:
            raise ConfigError(f"level_window={level_window!r}: expected > 0 seconds")
        self.stack = stack
        #: trace seconds (at x1) over which the trace's own drift is levelled (None: kept)
        self.level_window = level_window
        self.duration = float(duration)
        #: seconds of load at the ramp's start rate before the soak's clock starts
        self.warm_up = float(warm_up)
        self.cache_ttl = cache_ttl
        self.swing = swing
        self.churn_turnovers = churn_turnovers
        self.trace = trace
        self.utilization = utilization
        self.hit_ratio = hit_ratio
        self.embeddings_rate = embeddings_rate
        self.probe_seconds = probe_seconds
        self.seed = seed
        self.trace_rows = preflight(trace, None)
        self.stop_event = threading.Event()
        self.streams: list[Any] = []
        self.workload: Any = None
        #: seconds between two new most popular prompts
        self.churn_every = 0.0
        #: wall-clock time (``time.time()``) the soak's clock starts: the replay's start
        #: plus the warm-up
        self.started_at = 0.0
        self._started = 0.0
        self._agent_check = AgentCheck()

    @property
    def seconds(self) -> float:
        """Seconds on the soak's clock (negative during the warm-up; 0 before the start)."""
        return time.monotonic() - self._started - self.warm_up if self._started else 0.0

    @property
    def base_rps(self) -> float:
        """The completions rate at x1 (``base_utilization`` of the measured capacity)."""
        return float(self.workload.target_rps) if self.workload is not None else 0.0

    @property
    def base_utilization(self) -> float:
        """The share of the measured capacity x1 sends, so that ``utilization`` is what
        the swing's busiest point sends, not its middle.

        A soak proves that a service under a load it is sized for raises no alert, so
        its peak must not exceed that size. Sized at x1 instead, the x1.5 peak asked
        75 % of the probe's rate, which this probe (5 s of completions, nothing else
        busy) reads above what the service sustains beside its scrapes, rules and
        diagnosis: a 60-minute soak sized so paged QueueWaitHigh, a true 1.9 s P99 wait,
        at x1.13 (57 % of the probe), and the 5-minute soaks' bursts kept both workers
        busy for 8-15 s near their x1.3-x1.5 peak.
        """
        return self.utilization / max(1.0, self.swing[1])

    def multiplier(self, t: float) -> float:
        """The planned rate multiplier ``t`` seconds into the replay."""
        from ._workload import rate_multiplier

        return rate_multiplier(t, self.duration, *self.swing)

    def start(self) -> SoakLoad:
        """Probe the capacity, plan the replay, start the load streams (blocks for the probe)."""
        from ..load import TraceRequest, poisson_schedule
        from ._streams import workload_streams
        from ._workload import (
            LENGTH_SCALE,
            churn_period,
            churned_requests,
            level_rate,
            plan_workload,
            repeat_trace,
            swing_offsets,
            write_trace_csv,
        )

        stack = self.stack
        workload = plan_workload(
            self.trace_rows,
            url=stack.service.url,
            workers=stack.config.workers,
            rate=None,
            utilization=self.base_utilization,
            hit_ratio=self.hit_ratio,
            cache_ttl=self.cache_ttl,
            embeddings_rate=self.embeddings_rate,
            probe_seconds=self.probe_seconds,
            duration=self.warm_up + self.duration,
            seed=self.seed,
            length_scale=LENGTH_SCALE,
        )
        # the trace at x1, its clock run at the ramp's multiplier (after the warm-up at its
        # start rate); what falls past the end is not sent
        end = self.warm_up + self.duration
        at_x1 = [r.at * workload.time_scale for r in self.trace_rows]
        if self.level_window is not None:
            # the trace's own slow drift out, so the swing is the only slow change
            at_x1 = level_rate(at_x1, workload.target_rps, self.level_window)
        # compressed to the target rate the trace can be shorter than the soak reads (at
        # most the warm-up at the low end plus the whole run at the high end): replayed
        # again from its start, never left to run dry
        low, high = self.swing
        at_x1, replayed = repeat_trace(at_x1, self.warm_up * low + self.duration * high)
        trace_rows = [self.trace_rows[i] for i in replayed]
        warped = swing_offsets(
            at_x1,
            self.duration,
            *self.swing,
            lead_in=self.warm_up,
        )
        rows = [r for r, t in zip(trace_rows, warped, strict=True) if t < end]
        sends = warped[: len(rows)]
        self.churn_every = churn_period(
            workload.pool_size, workload.zipf_s, end, self.churn_turnovers
        )
        completions = churned_requests(
            self.trace_rows,
            sends,
            pool_size=workload.pool_size,
            zipf_s=workload.zipf_s,
            every=self.churn_every,
            seed=self.seed,
        )
        path = write_trace_csv(Path(stack.workdir) / "soak-trace.csv", sends, rows)
        # the embeddings ramp with the completions (a whole service's traffic rises, not one
        # endpoint's: the mix of input lengths the model sees stays the demo's)
        emb = swing_offsets(
            poisson_schedule(self.embeddings_rate, end, seed=self.seed),
            self.duration,
            *self.swing,
            lead_in=self.warm_up,
        )
        emb = [t for t in emb if t < end]
        # their bodies come from the embeddings pool; the lengths written are placeholders
        emb_path = write_trace_csv(
            Path(stack.workdir) / "soak-embeddings.csv",
            emb,
            [TraceRequest(t, 1, 1) for t in emb],
        )
        # the file holds the swung send times: replayed as written
        self.workload = dataclasses.replace(workload, completions=tuple(completions))
        replay = dataclasses.replace(self.workload, time_scale=1.0)
        self._started = time.monotonic()
        self.started_at = time.time() + self.warm_up
        self.streams = workload_streams(
            replay,
            base_url=stack.service.url,
            trace=str(path),
            stop=self.stop_event,
            until=self._started + end,
            embeddings_trace=str(emb_path),
        )
        for st in self.streams:
            st.start()
        return self

    def why(self) -> str:
        if self.workload is None:
            return "not started"
        low, high = self.swing
        levelled = (
            f" (the trace's own drift levelled per {self.level_window:g} s of it)"
            if self.level_window is not None
            else ""
        )
        return (
            f"{self.workload.why()}; {self.warm_up:g} s of warm-up at x{low:g}, then the rate "
            f"ramped x{low:g}..x{high:g} over {self.duration:g} s{levelled} "
            "(completions and embeddings); "
            f"a new most popular prompt every {self.churn_every:.1f} s (hot set replaced "
            f"{self.churn_turnovers:g} times)"
        )

    def check(self) -> None:
        """Raise (``ServiceError``) what stopped: a load stream, or a part of the stack."""
        from ._streams import stack_failure

        for st in self.streams:
            st.check()
        failure = stack_failure(self.stack, self._agent_check)
        if failure is not None:
            raise ServiceError(failure)

    def clients(self) -> list[Any]:
        return [st.counts() for st in self.streams]

    def stop(self) -> None:
        """Stop sending and wait for the requests in flight (the stack keeps running)."""
        self.stop_event.set()
        for st in self.streams:
            st.join(timeout=35)
