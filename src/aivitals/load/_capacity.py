"""Capacity sweep: closed loop at rising concurrency until the P95 jumps.

Know your real capacity before production does: below the knee more
concurrency buys throughput at flat latency; past it requests only queue, so
P95 jumps while throughput stays flat.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from ..errors import ConfigError
from ._config import LoadConfig
from ._report import LoadReport
from ._run import run_load

__all__ = ["CapacityLevel", "CapacityReport", "find_knee", "sweep_capacity"]


@dataclass(frozen=True, slots=True)
class CapacityLevel:
    """One step of the sweep."""

    concurrency: int
    throughput: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    error_rate: float


@dataclass
class CapacityReport:
    """The sweep and its knee. ``knee`` is the first concurrency whose P95 jumped
    (or whose errors passed the limit); ``safe_concurrency`` the level before it."""

    levels: list[CapacityLevel]
    knee: int | None
    safe_concurrency: int | None
    capacity_rps: float | None
    jump: float
    reason: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def format(self) -> str:
        lines = [f"{'conc':>6} {'req/s':>10} {'p50 ms':>9} {'p95 ms':>9} {'p99 ms':>9} {'err':>6}"]
        for lv in self.levels:
            mark = "  <- knee" if lv.concurrency == self.knee else ""
            lines.append(
                f"{lv.concurrency:>6} {lv.throughput:>10.1f} {lv.p50_ms:>9.2f} "
                f"{lv.p95_ms:>9.2f} {lv.p99_ms:>9.2f} {lv.error_rate:>6.1%}{mark}"
            )
        if self.knee is None:
            lines.append("no knee found: P95 never jumped; raise the top concurrency")
        else:
            lines.append(
                f"knee at concurrency {self.knee} ({self.reason}); safe concurrency "
                f"{self.safe_concurrency}, capacity {self.capacity_rps or 0:.1f} req/s"
            )
        return "\n".join(lines)


def find_knee(
    levels: Sequence[CapacityLevel], *, jump: float = 1.5, max_error_rate: float = 0.05
) -> tuple[int | None, str]:
    """Index of the first level whose P95 is ``jump`` times the previous one's, or
    whose error rate passes ``max_error_rate``; ``(None, "")`` when there is none."""
    for i, lv in enumerate(levels):
        if lv.error_rate > max_error_rate:
            return i, f"errors {lv.error_rate:.1%} > {max_error_rate:.0%}"
        if i and levels[i - 1].p95_ms > 0 and lv.p95_ms >= jump * levels[i - 1].p95_ms:
            ratio = lv.p95_ms / levels[i - 1].p95_ms
            return i, f"P95 x{ratio:.2f} vs concurrency {levels[i - 1].concurrency}"
    return None, ""


def _level(c: int, report: LoadReport) -> CapacityLevel:
    return CapacityLevel(
        c,
        report.request_throughput,
        report.e2e.median_ms,
        report.e2e.p95_ms,
        report.e2e.p99_ms,
        report.error_rate,
    )


def sweep_capacity(
    url: str,
    *,
    levels: Sequence[int] = (1, 2, 4, 8, 16, 32, 64),
    step_duration: float = 10.0,
    jump: float = 1.5,
    max_error_rate: float = 0.05,
    stop: threading.Event | None = None,
    on_level: Callable[[CapacityLevel], None] | None = None,
    **load_options: Any,
) -> CapacityReport:
    """Run closed-loop load at each concurrency in ``levels`` and find the knee.

    The sweep stops one level after the knee, so a service is not pushed far
    past what it can take. ``load_options`` go to ``LoadConfig``.

    **Usage**::

        rep = sweep_capacity("http://127.0.0.1:8000/v1/embeddings", step_duration=5)
        print(rep.format())
    """
    if not levels or any(c < 1 for c in levels) or list(levels) != sorted(set(levels)):
        raise ConfigError(f"levels: {list(levels)!r} must be increasing positive integers")
    if not jump > 1:
        raise ConfigError(f"jump: {jump!r} must be > 1")
    done: list[CapacityLevel] = []
    for c in levels:
        cfg = LoadConfig(url=url, concurrency=c, duration=step_duration, **load_options)
        lv = _level(c, run_load(cfg, stop=stop))
        done.append(lv)
        if on_level is not None:
            on_level(lv)
        knee, _ = find_knee(done, jump=jump, max_error_rate=max_error_rate)
        if (knee is not None and len(done) > knee + 1) or (stop is not None and stop.is_set()):
            break
    knee, reason = find_knee(done, jump=jump, max_error_rate=max_error_rate)
    safe = done[knee - 1] if knee else (None if knee == 0 else done[-1])
    return CapacityReport(
        levels=done,
        knee=done[knee].concurrency if knee is not None else None,
        safe_concurrency=safe.concurrency if safe else None,
        capacity_rps=safe.throughput if safe else None,
        jump=jump,
        reason=reason,
    )
