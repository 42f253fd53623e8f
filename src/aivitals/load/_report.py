"""Per-request results and the run report, in the manner of vLLM's benchmark_serving."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

__all__ = ["SLO", "LatencyStats", "LoadReport", "RequestResult", "summarize"]


@dataclass(slots=True)
class RequestResult:
    """What happened to one request. Times are seconds; ``latency`` counts from the
    intended send time (open loop) or the actual send time (closed loop)."""

    intended: float
    sent: float
    latency: float
    status: int
    ttft: float | None = None
    output_tokens: int = 0
    prompt_tokens: int = 0
    error: str | None = None
    code: str | None = None
    itl: list[float] | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and 200 <= self.status < 400


@dataclass(frozen=True, slots=True)
class SLO:
    """Service-level objectives for goodput, in seconds; ``None`` means not checked."""

    ttft: float | None = None
    tpot: float | None = None
    e2e: float | None = None

    def met(self, r: RequestResult) -> bool:
        if not r.ok:
            return False
        if self.e2e is not None and r.latency > self.e2e:
            return False
        # A non-streaming answer has no first token: only e2e applies to it.
        if self.ttft is not None and r.ttft is not None and r.ttft > self.ttft:
            return False
        tpot = _tpot(r)
        return self.tpot is None or tpot is None or tpot <= self.tpot


@dataclass(frozen=True, slots=True)
class LatencyStats:
    """Milliseconds: mean, median and tail percentiles (numpy's linear interpolation)."""

    count: int
    mean_ms: float
    median_ms: float
    p90_ms: float
    p95_ms: float
    p99_ms: float
    max_ms: float

    @classmethod
    def of(cls, seconds: Sequence[float]) -> LatencyStats:
        if not seconds:
            nan = float("nan")
            return cls(0, nan, nan, nan, nan, nan, nan)
        a = np.asarray(seconds, dtype=float) * 1000.0
        p50, p90, p95, p99 = np.percentile(a, [50, 90, 95, 99])
        return cls(
            len(a), float(a.mean()), float(p50), float(p90), float(p95), float(p99), float(a.max())
        )


def _tpot(r: RequestResult) -> float | None:
    # Time per output token excluding the first, as vLLM defines it.
    if r.ttft is None or r.output_tokens < 2:
        return None
    return (r.latency - r.ttft) / (r.output_tokens - 1)


@dataclass
class LoadReport:
    """The outcome of one load run; ``format()`` prints it, ``to_json()`` saves it."""

    mode: str
    target: str
    duration_s: float
    offered_rate: float | None
    concurrency: int | None
    sent: int
    completed: int
    failed: int
    total_input_tokens: int
    total_output_tokens: int
    request_throughput: float
    output_throughput: float
    total_token_throughput: float
    goodput: float | None
    slo: dict[str, float | None]
    e2e: LatencyStats
    ttft: LatencyStats
    tpot: LatencyStats
    itl: LatencyStats
    #: Latency from the actual send (what a closed-loop tool such as wrk reports);
    #: the gap to ``e2e`` is time requests waited in the client (open loop).
    e2e_from_send: LatencyStats | None = None
    errors: dict[str, int] = field(default_factory=dict)
    error_codes: dict[str, int] = field(default_factory=dict)
    max_client_queue: int = 0
    connections: int = 0
    send_lag_p99_ms: float = 0.0
    stopped_early: bool = False

    @property
    def error_rate(self) -> float:
        return self.failed / self.sent if self.sent else 0.0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["error_rate"] = self.error_rate
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, allow_nan=True)

    def format(self) -> str:
        """A text report like vLLM's ``benchmark_serving`` summary."""
        rows: list[tuple[str, str]] = [
            ("Mode", f"{self.mode} ({self.target})"),
            ("Successful requests", str(self.completed)),
            ("Failed requests", str(self.failed)),
            ("Benchmark duration (s)", f"{self.duration_s:.2f}"),
            ("Total input tokens", str(self.total_input_tokens)),
            ("Total generated tokens", str(self.total_output_tokens)),
            ("Request throughput (req/s)", f"{self.request_throughput:.2f}"),
            ("Output token throughput (tok/s)", f"{self.output_throughput:.2f}"),
            ("Total token throughput (tok/s)", f"{self.total_token_throughput:.2f}"),
        ]
        if self.goodput is not None:
            rows.append(("Request goodput (req/s)", f"{self.goodput:.2f}"))
        out = [_rule("Load Result"), *(f"{k + ':':<40}{v:<10}" for k, v in rows)]
        for title, stats, key in (
            ("Time to First Token", self.ttft, "TTFT"),
            ("Time per Output Token (excl. 1st token)", self.tpot, "TPOT"),
            ("Inter-token Latency", self.itl, "ITL"),
            ("End-to-end Latency", self.e2e, "E2EL"),
        ):
            if stats.count:
                out += [_rule(title), *_stat_lines(key, stats)]
        if self.errors:
            out.append(_rule("Errors"))
            out += [f"{k + ':':<40}{v:<10}" for k, v in sorted(self.errors.items())]
            out += [f"{'code ' + k + ':':<40}{v:<10}" for k, v in sorted(self.error_codes.items())]
        out.append("=" * 50)
        return "\n".join(out)


def _rule(title: str) -> str:
    return f"{' ' + title + ' ':-^50}"


def _stat_lines(key: str, s: LatencyStats) -> list[str]:
    return [
        f"{f'Mean {key} (ms):':<40}{s.mean_ms:<10.2f}",
        f"{f'Median {key} (ms):':<40}{s.median_ms:<10.2f}",
        f"{f'P95 {key} (ms):':<40}{s.p95_ms:<10.2f}",
        f"{f'P99 {key} (ms):':<40}{s.p99_ms:<10.2f}",
    ]


def summarize(
    results: Sequence[RequestResult],
    *,
    mode: str,
    target: str,
    duration_s: float,
    offered_rate: float | None = None,
    concurrency: int | None = None,
    slo: SLO | None = None,
    max_client_queue: int = 0,
    connections: int = 0,
    send_lag_p99_ms: float = 0.0,
    stopped_early: bool = False,
) -> LoadReport:
    """Turn per-request results into a ``LoadReport``."""
    ok = [r for r in results if r.ok]
    errors = Counter(r.error or f"HTTP {r.status}" for r in results if not r.ok)
    codes = Counter(r.code for r in results if not r.ok and r.code)
    tin = sum(r.prompt_tokens for r in ok)
    tout = sum(r.output_tokens for r in ok)
    dur = max(duration_s, 1e-9)
    goodput = None if slo is None else sum(1 for r in ok if slo.met(r)) / dur
    tpots = [t for r in ok if (t := _tpot(r)) is not None]
    itls = [x for r in ok if r.itl for x in r.itl]
    return LoadReport(
        mode=mode,
        target=target,
        duration_s=duration_s,
        offered_rate=offered_rate,
        concurrency=concurrency,
        sent=len(results),
        completed=len(ok),
        failed=len(results) - len(ok),
        total_input_tokens=tin,
        total_output_tokens=tout,
        request_throughput=len(ok) / dur,
        output_throughput=tout / dur,
        total_token_throughput=(tin + tout) / dur,
        goodput=goodput,
        slo={} if slo is None else {"ttft": slo.ttft, "tpot": slo.tpot, "e2e": slo.e2e},
        e2e=LatencyStats.of([r.latency for r in ok]),
        ttft=LatencyStats.of([r.ttft for r in ok if r.ttft is not None]),
        tpot=LatencyStats.of(tpots),
        itl=LatencyStats.of(itls),
        e2e_from_send=LatencyStats.of([r.latency - (r.sent - r.intended) for r in ok]),
        errors=dict(errors),
        error_codes=dict(codes),
        max_client_queue=max_client_queue,
        connections=connections,
        send_lag_p99_ms=send_lag_p99_ms,
        stopped_early=stopped_early,
    )
