"""The demo's workload: the Azure conversation trace at a rate the machine can carry.

**Lengths.** The trace's prompt and output token counts are those of a
production LLM (a median of about 1,000 prompt and 130 output tokens); the demo's
random-weight GPT-2-shaped model runs on whatever the machine has, often a CPU,
where one token costs milliseconds. Replayed as recorded, a completion takes a
second or more, and at any useful rate requests queue for seconds: the alerts
would be true of that service. So every length is multiplied by one constant,
``LENGTH_SCALE`` (1/16), and clipped to ``MAX_PROMPT_TOKENS`` /
``MAX_OUTPUT_TOKENS``: the relative distribution (short and long requests, the
long tail) is the trace's, and a completion takes about 0.05-0.3 s on a CPU, as
an answer from a real GPU server does. The view and ``why()`` say so.

**Arrivals.** The trace's own send times, with its gaps stretched or shrunk by
one factor (``time_scale``) so that its mean rate becomes the target rate; the
burstiness of the real trace is kept. A replay shorter than the demo starts
over from the beginning of the trace.

**The target rate.** A few seconds of closed-loop load (as many requests in
flight as the service has workers, each prompt different so the cache cannot
help) measure what the service completes per second on this machine; the
replay runs at ``utilization`` (0.6 by default) of that.

**Repetition (what the cache sees).** Users repeat themselves: a few questions
are asked often, most rarely. The completions come from a pool of ``N``
distinct requests, each with the prompt and output lengths of one trace row
(prompts made of common words; the text is meaningless), and every request
draws pool entry ``k`` with probability proportional to ``1 / k**s`` (a Zipf
law, ``s`` = 1 by default, as measured for web and query popularity). With a
response cache whose entries live ``ttl`` seconds and requests arriving at
``rate`` per second, entry ``k`` is asked ``rate * p_k`` times per second; a
miss writes it and the next ``rate * p_k * ttl`` requests in its lifetime hit,
so its hit ratio is ``x / (1 + x)`` with ``x = rate * p_k * ttl`` and the
expected hit ratio is ``sum_k p_k * x_k / (1 + x_k)`` (the steady state; a
cold cache starts lower). ``N`` is chosen so this lands on ``hit_ratio``
(0.4 by default): tens of percent, as in a real service, neither 0 nor 100 %.
"""

from __future__ import annotations

import csv
import itertools
import math
import random
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from ..errors import ConfigError, ServiceError
from ..load import (
    LoadConfig,
    RequestSpec,
    TraceRequest,
    completions_request,
    embeddings_request,
    make_prompt,
    run_load,
)

__all__ = [
    "LENGTH_SCALE",
    "MAX_OUTPUT_TOKENS",
    "MAX_PROMPT_TOKENS",
    "Capacity",
    "Workload",
    "churn_entry",
    "churn_period",
    "churned_requests",
    "expected_hit_ratio",
    "hot_set_size",
    "level_rate",
    "measure_capacity",
    "plan_workload",
    "pool_size_for",
    "rate_multiplier",
    "scale_lengths",
    "swing_offsets",
    "trace_rate",
    "write_trace_csv",
    "zipf_weights",
]

#: Every trace length is multiplied by this (see the module doc): a median completion of
#: the trace (130 output tokens) becomes 8 tokens, its 99th percentile (600) 38.
LENGTH_SCALE = 1 / 16
#: Caps after scaling (they clip under 1 % of the azure-conv rows): what the demo model
#: takes at interactive speed on a CPU.
MAX_PROMPT_TOKENS = 256
MAX_OUTPUT_TOKENS = 48
#: A probe P50 above this (ms) means completions too slow for DOMAIN's absolute bounds.
SLOW_COMPLETION_MS = 700.0
#: The most distinct pool entries (only the entries drawn are ever built).
_MAX_POOL = 20_000_000


def _weights(n: int, s: float) -> Any:
    import numpy as np

    raw = 1.0 / np.arange(1, n + 1, dtype=float) ** s
    return raw / raw.sum()


def zipf_weights(n: int, s: float) -> list[float]:
    """Popularity of ranks 1..n under a Zipf law with exponent ``s``, summing to 1."""
    if n < 1:
        raise ConfigError(f"pool size {n!r}: expected >= 1")
    return [float(w) for w in _weights(n, s)]


def expected_hit_ratio(weights: Any, rate: float, ttl: float) -> float:
    """Steady-state hit ratio of a TTL cache under independent requests (see the module doc)."""
    import numpy as np

    p = np.asarray(weights, dtype=float)
    x = rate * p * ttl
    return float((p * x / (1.0 + x)).sum())


def pool_size_for(target: float, rate: float, ttl: float, s: float = 1.0) -> int:
    """The pool size whose expected hit ratio is closest to ``target`` (bisection)."""
    if not 0.0 < target < 1.0:
        raise ConfigError(f"hit ratio {target!r}: expected 0 < ratio < 1")
    lo, hi = 1, _MAX_POOL
    # the hit ratio falls as the pool grows
    while lo < hi:
        mid = (lo + hi) // 2
        if expected_hit_ratio(_weights(mid, s), rate, ttl) > target:
            lo = mid + 1
        else:
            hi = mid
    return lo


def scale_lengths(
    trace: list[TraceRequest],
    scale: float = LENGTH_SCALE,
    *,
    max_prompt: int = MAX_PROMPT_TOKENS,
    max_output: int = MAX_OUTPUT_TOKENS,
) -> list[TraceRequest]:
    """The trace with every length times ``scale`` (rounded, at least 1, at most the caps);
    the send times are unchanged."""
    if not 0.0 < scale <= 1.0:
        raise ConfigError(f"length scale {scale!r}: expected 0 < scale <= 1")
    return [
        TraceRequest(
            t.at,
            min(max_prompt, max(1, round(t.prompt_tokens * scale))),
            min(max_output, max(1, round(t.max_tokens * scale))),
        )
        for t in trace
    ]


def trace_rate(trace: list[TraceRequest]) -> float:
    """Mean requests per second of a trace (as loaded, time_scale 1)."""
    if len(trace) < 2 or trace[-1].at <= 0:
        raise ConfigError("the trace holds fewer than two requests with distinct times")
    return (len(trace) - 1) / trace[-1].at


@dataclass(frozen=True)
class Capacity:
    """What the closed-loop probe measured."""

    rps: float
    concurrency: int
    seconds: float
    completed: int
    p50_ms: float
    failed: int
    #: what the embeddings stream run beside the probe completed per second (0: none)
    alongside_rps: float = 0.0


def measure_capacity(
    url: str,
    specs: list[RequestSpec],
    *,
    concurrency: int,
    seconds: float,
    timeout: float,
    alongside: LoadConfig | None = None,
) -> Capacity:
    """Closed loop at ``concurrency`` for ``seconds``: completions per second on this machine.

    ``alongside`` (the embeddings stream at its own rate) runs at the same time, so
    the probe measures the mix the replay sends: the completions' share of the CPU
    is what is left beside the embeddings. A probe that completes nothing, or fails
    most of its requests, means the service cannot serve: ``ServiceError`` says
    what the client saw.
    """
    cfg = LoadConfig(
        url=url,
        concurrency=concurrency,
        duration=seconds,
        requests=tuple(specs),
        timeout=timeout,
    )
    side: list[Any] = []

    def run_side(side_cfg: LoadConfig) -> None:
        try:
            side.append(run_load(side_cfg))
        except Exception as exc:  # reported below, with the probe's own outcome
            side.append(exc)

    thread = None
    if alongside is not None:
        thread = threading.Thread(target=run_side, args=(alongside,), name="capacity-probe-side")
        thread.start()
    try:
        report = run_load(cfg)
    finally:
        if thread is not None and alongside is not None:
            thread.join(timeout=alongside.duration + alongside.timeout + 5.0)
    if side and isinstance(side[0], Exception):
        raise ServiceError(
            f"the embeddings stream beside the capacity probe failed: "
            f"{type(side[0]).__name__}: {side[0]}"
        )
    if report.completed == 0 or report.failed > report.completed:
        errors = ", ".join(f"{k} x{v}" for k, v in sorted(report.errors.items())) or "none"
        raise ServiceError(
            f"the capacity probe of {url} completed {report.completed} of {report.sent} "
            f"requests in {seconds:g} s (errors: {errors}); the service cannot serve"
        )
    return Capacity(
        rps=report.request_throughput,
        concurrency=concurrency,
        seconds=seconds,
        completed=report.completed,
        p50_ms=report.e2e.median_ms,
        failed=report.failed,
        alongside_rps=side[0].request_throughput if side else 0.0,
    )


@dataclass(frozen=True)
class Workload:
    """The replay the demo runs and why: rate, time scale, pools and their expected hits."""

    target_rps: float
    time_scale: float
    trace_rps: float
    pool_size: int
    zipf_s: float
    expected_hit_ratio: float
    completions: tuple[RequestSpec, ...]
    embeddings: tuple[RequestSpec, ...]
    embeddings_rps: float
    capacity: Capacity | None
    utilization: float
    #: the factor the trace's token lengths were multiplied by (1: as recorded)
    length_scale: float = 1.0

    def why(self) -> str:
        cap = self.capacity
        if cap is None:
            head = f"replaying at {self.target_rps:.2f} completions/s (given with --rate)"
        else:
            head = (
                f"capacity probe: {cap.rps:.2f} completions/s with {cap.concurrency} in flight "
                f"over {cap.seconds:g} s beside {cap.alongside_rps:.1f} embeddings/s "
                f"(P50 {cap.p50_ms:,.0f} ms); replaying at "
                f"{self.utilization:.0%} of it: {self.target_rps:.2f}/s"
            )
        if cap is not None and cap.p50_ms > SLOW_COMPLETION_MS:
            # DOMAIN's absolute bounds (1 s P99 queue wait, 2 x SLA inference P99) assume
            # answers well under a second; say so when this machine cannot give them
            head += (
                f" [a completion takes {cap.p50_ms / 1000:.1f} s here (the machine is slow or "
                "busy): waits behind it pass 1 s and QueueWaitHigh / InferenceLatencyHigh "
                "may fire on this load]"
            )
        lengths = (
            "token lengths as recorded"
            if self.length_scale == 1.0
            else f"token lengths x1/{1 / self.length_scale:g} of the trace's"
        )
        return (
            f"{head}; the trace's {self.trace_rps:.2f}/s with its gaps x{self.time_scale:.2f}; "
            f"{lengths}; "
            f"prompts from a pool of {self.pool_size} (Zipf s={self.zipf_s:g}, expected "
            f"cache hits {self.expected_hit_ratio:.0%} once warm); embeddings "
            f"{self.embeddings_rps:g}/s"
        )


def zipf_ranks(weights: Any, n: int, rng: random.Random) -> list[int]:
    """``n`` independent draws of a rank (0-based) with the given popularity."""
    import numpy as np

    cum = np.cumsum(np.asarray(weights, dtype=float))
    top, last = float(cum[-1]), len(cum) - 1
    points = np.array([rng.random() * top for _ in range(n)])
    return [min(int(i), last) for i in np.searchsorted(cum, points)]


def _pick(
    trace: list[TraceRequest], ranks: list[int], make: Any, rng: random.Random
) -> list[RequestSpec]:
    """The requests for ``ranks``: entry k gets the lengths of trace row k (cycled) and one
    text; only the entries drawn are built."""
    built: dict[int, RequestSpec] = {}
    out = []
    for k in ranks:
        spec = built.get(k)
        if spec is None:
            spec = built[k] = make(trace[k % len(trace)], rng)
        out.append(spec)
    return out


def _completion(t: TraceRequest, rng: random.Random) -> RequestSpec:
    return completions_request(make_prompt(t.prompt_tokens, rng=rng), t.max_tokens)


def _embedding(t: TraceRequest, rng: random.Random) -> RequestSpec:
    # a short text (a query, a title): the trace's prompt length scaled down to 8..64 words
    return embeddings_request(make_prompt(8 + t.prompt_tokens % 57, rng=rng))


def plan_workload(
    trace: list[TraceRequest],
    *,
    url: str,
    workers: int,
    rate: float | None,
    utilization: float,
    hit_ratio: float,
    cache_ttl: float,
    embeddings_rate: float,
    probe_seconds: float,
    duration: float | None = None,
    zipf_s: float = 1.0,
    seed: int = 0,
    draws: int = 20_000,
    length_scale: float = 1.0,
) -> Workload:
    """Measure capacity (unless ``rate`` is given), then size the pools; see the module doc.

    ``length_scale`` records what ``trace``'s lengths were multiplied by (for ``why``).
    With a ``duration``, the time scale is set on the part of the trace that run
    replays, so it sends ``rate * duration`` requests.
    """
    if not 0.0 < utilization <= 1.0:
        raise ConfigError(f"utilization {utilization!r}: expected 0 < u <= 1")
    rng = random.Random(seed)
    base = url.rstrip("/")
    # the pool's entry e has the lengths of trace row offset + 7919 e (as churned_requests')
    offset = rng.randrange(len(trace))
    capacity: Capacity | None = None
    if rate is None:
        # distinct prompts (another seed than the pool's): the cache cannot flatter the
        # probe. Their lengths are those of the pool's 512 most asked entries, the mix the
        # run sends: the trace's first 512 rows ask shorter prompts (mean 58 scaled tokens
        # against 73 for the pool's entries and the whole trace), so a probe of them reads
        # more capacity than the run's mix has
        probe_rng = random.Random(seed + 1)
        probe = _pick(trace, [offset + k * 7919 for k in range(512)], _completion, probe_rng)
        probe_emb = _pick(trace, list(range(512)), _embedding, probe_rng)
        capacity = measure_capacity(
            base + "/v1/completions",
            probe,
            concurrency=workers,
            seconds=probe_seconds,
            timeout=30.0,
            alongside=LoadConfig(
                url=base + "/v1/embeddings",
                rate=embeddings_rate,
                duration=probe_seconds,
                requests=tuple(probe_emb),
                timeout=30.0,
            ),
        )
        rate = utilization * capacity.rps
    if not rate > 0:
        raise ConfigError(f"rate {rate!r}: expected > 0 requests per second")
    trace_rps = trace_rate(trace)
    time_scale = trace_rps / rate
    needed = int(rate * duration) if duration is not None else len(trace)
    if 2 <= needed < len(trace):
        # a bounded run replays only the start of the trace, whose own rate differs from
        # the whole trace's (the first minutes of azure-conv run at 3-4/s, the hour at
        # 5.5/s): scale that part, so the run sends rate * duration requests
        assert duration is not None
        trace_rps = needed / trace[needed].at
        time_scale = duration / trace[needed].at
    size = pool_size_for(hit_ratio, rate, cache_ttl, zipf_s)
    weights = _weights(size, zipf_s)
    # the pool's entries are spread over the trace, so popular prompts have any length
    ranks = [(offset + k * 7919) for k in zipf_ranks(weights, draws, rng)]
    completions = _pick(trace, ranks, _completion, rng)
    emb_size = pool_size_for(hit_ratio, embeddings_rate, cache_ttl, zipf_s)
    emb_ranks = zipf_ranks(_weights(emb_size, zipf_s), draws, rng)
    embeddings = _pick(trace, emb_ranks, _embedding, rng)
    return Workload(
        target_rps=rate,
        time_scale=time_scale,
        trace_rps=trace_rps,
        pool_size=size,
        zipf_s=zipf_s,
        expected_hit_ratio=expected_hit_ratio(weights, rate, cache_ttl),
        completions=tuple(completions),
        embeddings=tuple(embeddings),
        embeddings_rps=embeddings_rate,
        capacity=capacity,
        utilization=utilization,
        length_scale=length_scale,
    )


# --- the soak: a slow swing of the rate and a drifting popularity (cache churn) -------------
def _check_swing(duration: float, low: float, high: float) -> None:
    if not (isinstance(duration, int | float) and math.isfinite(duration) and duration > 0):
        raise ConfigError(f"swing duration {duration!r}: expected > 0 seconds")
    if not (math.isfinite(low) and math.isfinite(high) and 0 < low <= high):
        raise ConfigError(f"rate swing x{low!r}..x{high!r}: expected 0 < low <= high")


def rate_multiplier(t: float, duration: float, low: float = 0.5, high: float = 1.5) -> float:
    """The soak's rate multiplier at ``t`` seconds into a run of ``duration``: a ramp from
    ``low`` at the start to ``high`` at the end.

    Geometric (``low * (high / low) ** (t / duration)``): the rate changes by the same
    share every minute, the least any path from ``low`` to ``high`` can (x1.25 a minute
    over 5 minutes, x1.019 over an hour), so no minute of it looks like a surge while the
    run still crosses the whole range. Past the end it keeps ``high``.
    """
    _check_swing(duration, low, high)
    return float(low * (high / low) ** (min(max(t, 0.0), duration) / duration))


def swing_offsets(
    offsets: Sequence[float],
    duration: float,
    low: float = 0.5,
    high: float = 1.5,
    *,
    lead_in: float = 0.0,
) -> list[float]:
    """Send times with the rate multiplied by ``rate_multiplier``.

    The trace's own clock advances ``rate_multiplier(t)`` trace seconds per wall second,
    so its bursts and gaps keep their shape (a burst at x1.5 is the same burst, 1.5x
    denser) while the mean rate follows the ramp. ``offsets`` are the trace's send times
    at x1. Over the run the trace's clock advances ``duration * mean multiplier``
    (``(high - low) / ln(high / low)``, 0.91 for 0.5..1.5); later offsets keep the
    multiplier of the end. ``lead_in`` seconds at ``low`` come first (a warm-up before
    the ramp): the ramp then starts at ``lead_in``.
    """
    import numpy as np

    _check_swing(duration, low, high)
    if not (math.isfinite(lead_in) and lead_in >= 0):
        raise ConfigError(f"lead-in {lead_in!r}: expected >= 0 seconds")
    at = np.asarray(offsets, dtype=float)
    if at.size and (not np.all(np.isfinite(at)) or at.min() < 0):
        raise ConfigError("trace offsets: expected finite times >= 0")
    if lead_in > 0:
        first = at < low * lead_in
        rest = swing_offsets(list(at[~first] - low * lead_in), duration, low, high)
        out = np.empty_like(at)
        out[first] = at[first] / low
        out[~first] = lead_in + np.asarray(rest)
        return [float(w) for w in out]
    growth = math.log(high / low) / duration  # per second
    # the trace clock M(t) = integral of the multiplier, inverted in closed form
    if growth == 0.0:
        wall = at / low
    else:
        end = low * math.expm1(growth * duration) / growth  # M(duration)
        wall = np.log1p(np.minimum(at, end) * growth / low) / growth
        past = at > end
        wall[past] = duration + (at[past] - end) / high
    return [float(w) for w in wall]


def level_rate(offsets: Sequence[float], rate: float, window: float) -> list[float]:
    """Send times with the trace's slow drift taken out: every ``window`` seconds of the
    trace sends at ``rate`` on average, its bursts and gaps inside the window kept.

    The Azure trace ebbs and flows over an hour by itself, so a soak's swing multiplied
    the trace's own drift: the 60-minute soak planned x0.5..x1.5 and sent x0.46..x0.98.
    Each window is stretched or squeezed to ``count / rate`` seconds (an empty window
    vanishes), so the swing applied afterwards is the only slow change. ``offsets``
    must be sorted; the result is too.
    """
    import numpy as np

    if not (math.isfinite(rate) and rate > 0):
        raise ConfigError(f"level rate {rate!r}: expected > 0 requests/s")
    if not (math.isfinite(window) and window > 0):
        raise ConfigError(f"level window {window!r}: expected > 0 seconds")
    at = np.asarray(offsets, dtype=float)
    if not at.size:
        return []
    if not np.all(np.isfinite(at)) or at.min() < 0 or np.any(np.diff(at) < 0):
        raise ConfigError("trace offsets: expected sorted finite times >= 0")
    index = (at // window).astype(int)
    counts = np.bincount(index)
    lengths = counts / rate  # each window's new length: its requests at ``rate``
    starts = np.concatenate(([0.0], np.cumsum(lengths)[:-1]))
    within = (at - index * window) / window  # where in its window, 0..1
    return [float(t) for t in starts[index] + within * lengths[index]]


def repeat_trace(offsets: Sequence[float], covering: float) -> tuple[list[float], list[int]]:
    """The trace played again from its start as often as needed to reach ``covering``
    seconds: the send times and, for each, the index of the trace row it replays.

    A soak compresses the trace to its target rate and then swings it, so it can need
    more trace than there is: the packaged hour at 8.3 requests/s lasts 39 minutes, and
    an hour swung x0.5..x1.5 reads 57 of them (without a replay a 60-minute soak runs
    dry after about 41-46 minutes and sends x0.5 where x1.2-x1.5 is planned). One mean
    gap separates a pass's last request from the next one's first.
    ``offsets`` must be sorted; a trace that already covers ``covering`` comes back as it
    is.
    """
    if not (math.isfinite(covering) and covering >= 0):
        raise ConfigError(f"covering {covering!r}: expected finite seconds >= 0")
    n = len(offsets)
    if n and (
        not all(math.isfinite(t) and t >= 0 for t in offsets)
        or any(b < a for a, b in itertools.pairwise(offsets))
    ):
        raise ConfigError("trace offsets: expected sorted finite times >= 0")
    period = offsets[-1] + offsets[-1] / (n - 1) if n >= 2 else 0.0
    if period <= 0 or offsets[-1] >= covering:
        return list(offsets), list(range(n))
    passes = math.ceil(covering / period)
    times = [t + k * period for k in range(passes) for t in offsets]
    return times, [i for _ in range(passes) for i in range(n)]


def hot_set_size(weights: Any, share: float = 0.5) -> int:
    """How many of the most popular entries carry ``share`` of the requests."""
    import numpy as np

    if not 0 < share <= 1:
        raise ConfigError(f"share {share!r}: expected 0 < share <= 1")
    cum = np.cumsum(np.asarray(weights, dtype=float))
    return int(np.searchsorted(cum, share * cum[-1] - 1e-12)) + 1


def churn_period(pool_size: int, zipf_s: float, duration: float, turnovers: float = 2.0) -> float:
    """Seconds between two new most-popular prompts, so that the hot set (the entries that
    carry half the requests) is replaced ``turnovers`` times over ``duration``."""
    if not turnovers > 0:
        raise ConfigError(f"churn turnovers {turnovers!r}: expected > 0")
    if not duration > 0:
        raise ConfigError(f"churn duration {duration!r}: expected > 0 seconds")
    return duration / (turnovers * hot_set_size(_weights(pool_size, zipf_s)))


def churn_entry(rank: int, t: float, every: float) -> int:
    """The pool entry at popularity ``rank`` (0-based) ``t`` seconds in: every ``every``
    seconds a new entry takes rank 0 and every other moves one rank down.

    New questions arrive popular and old ones fade, as topics do: an entry that falls
    out of the asked ranks is left to expire from the cache by its TTL (nothing is
    flushed), and each new one costs one miss before it hits.
    """
    if not every > 0:
        raise ConfigError(f"churn period {every!r}: expected > 0 seconds")
    return rank - int(t // every)


def churned_requests(
    trace: list[TraceRequest],
    send_times: Sequence[float],
    *,
    pool_size: int,
    zipf_s: float = 1.0,
    every: float,
    seed: int = 0,
) -> list[RequestSpec]:
    """One completion per send time: a Zipf rank drawn for it, mapped through
    ``churn_entry`` at that time; entry ``e`` has the lengths of trace row
    ``offset + 7919 e`` (cycled, as ``plan_workload``'s pool) and one text."""
    rng = random.Random(seed)
    offset = rng.randrange(len(trace))
    ranks = zipf_ranks(_weights(pool_size, zipf_s), len(send_times), rng)
    keys = [
        offset + churn_entry(k, t, every) * 7919 for k, t in zip(ranks, send_times, strict=True)
    ]
    return _pick(trace, keys, _completion, rng)


#: The (arbitrary) first timestamp of a written trace: a date with no daylight-saving
#: change within days of it anywhere, as the reader takes naive times as local.
_TRACE_EPOCH = datetime(2024, 1, 10)


def write_trace_csv(path: Path, send_times: Sequence[float], rows: Sequence[TraceRequest]) -> Path:
    """A trace file (``aivitals.load`` columns) sending ``rows[i]`` at ``send_times[i]``."""
    if len(send_times) != len(rows):
        raise ConfigError(f"{len(send_times)} send times for {len(rows)} trace rows")
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(("TIMESTAMP", "ContextTokens", "GeneratedTokens"))
        for at, row in zip(send_times, rows, strict=True):
            stamp = (_TRACE_EPOCH + timedelta(seconds=at)).isoformat(
                sep=" ", timespec="microseconds"
            )
            w.writerow((stamp, row.prompt_tokens, row.max_tokens))
    return path
