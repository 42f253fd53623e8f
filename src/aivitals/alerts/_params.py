"""Thresholds and windows of the shipped rule pack, and its rendering.

The pack (``rules/aivitals-rules.yml``) holds ``[[ name ]]`` placeholders; they
are filled here from a validated :class:`PackParams`, so a threshold is never a
constant buried in an expression and a typo in a parameter name is an error,
not a silently unrendered rule.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, fields
from importlib import resources
from typing import Any

import promql_parser

from ..errors import ConfigError
from ..signals import LATENCY_BUCKETS

__all__ = ["PackParams", "parse_duration", "parse_param_pairs", "render_pack_text"]

_PLACEHOLDER = re.compile(r"\[\[\s*([a-z0-9_]+)\s*\]\]")
_DURATION = re.compile(r"^(?:\d+(?:ms|s|m|h|d|w|y))+$")
# Every rate()/increase() window must span at least this many scrapes (DOMAIN section 5).
_MIN_SCRAPES_PER_WINDOW = 4
# The windows of the burn-rate alerts, shortest first at the defaults.
_SLO_WINDOWS = (
    "slo_fast_short_window",
    "slo_slow_short_window",
    "slo_fast_window",
    "slo_slow_window",
    "slo_ticket_window",
)


def parse_duration(text: str, *, key: str = "duration") -> float:
    """Seconds in a Prometheus duration (``90s``, ``1h30m``); ``ConfigError`` names ``key``."""
    if not isinstance(text, str) or not _DURATION.match(text):
        raise ConfigError(f"{key}={text!r} is not a Prometheus duration such as 30s, 5m or 1h")
    if not any(c in "123456789" for c in text):
        return 0.0  # "0s": valid in a rule file, refused by the parser's duration helper
    return float(promql_parser.parse_duration(text).total_seconds())


def _number(value: float) -> str:
    """A number as PromQL text: integers without a point, others in shortest form."""
    if float(value).is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(float(value))


def _pct(value: float) -> str:
    return f"{value * 100:g}%"


@dataclass(frozen=True, kw_only=True)
class PackParams:
    """Thresholds and windows of the rule pack; defaults follow DOMAIN sections 4-5.

    **Usage**::

        params = PackParams(sla_seconds=0.5, queue_limit=50)
        text = render_pack_text(params)
    """

    #: Model SLA for the pure inference P99; the alert fires at twice it.
    sla_seconds: float = 1.0
    #: queue_length above this for 1m is P0.
    queue_limit: float = 20
    #: P99 queue wait above this (seconds) is P0.
    queue_wait_p99_seconds: float = 1.0
    #: Share of 504s over the short window above this is P0.
    http_504_ratio: float = 0.01
    #: Share of 429s over the short window above this for 5m is P1.
    http_429_ratio: float = 0.05
    #: Busy share of a worker pool above this for 30s is P0.
    worker_saturation_ratio: float = 0.95
    #: GPU memory used / total above this is an alert (and part of the composite rule).
    gpu_memory_ratio: float = 0.9
    #: GPU utilization P95 below this while requests wait or are slow, or above
    #: gpu_util_high, for 5m is P1.
    gpu_util_low: float = 0.30
    #: The healthy bound of queue_length (DOMAIN: under 5): more waiting on average while
    #: the GPU idles is the "bottleneck before the GPU" condition of GPUUtilizationLow.
    queue_healthy: float = 5
    #: A P99 over fewer requests than this is their maximum, not a tail: quantile
    #: conditions need at least this many requests in their window.
    quantile_min_requests: float = 100
    gpu_util_high: float = 0.95
    #: Utilization that never drops below this for a rate window plus 5m: SM stuck.
    gpu_util_stuck: float = 0.99
    #: Composite rule: the good-latency bound (a bucket of http_request_duration_seconds).
    latency_good_seconds: float = 1.5
    #: Composite rule: alert when the share of requests within latency_good_seconds is below.
    fast_share_min: float = 0.85
    #: Composite rule: the 5xx ratio grew by more than this (2.0 = +200%) over its baseline.
    error_growth: float = 2.0
    #: Composite rule: the window of the three conditions, and the baseline window before it.
    composite_window: str = "3m"
    baseline_window: str = "15m"
    #: Open fds / fd limit above this for 5m is P1.
    fd_ratio: float = 0.8
    #: RSS predicted (predict_linear over rss_window) to pass this share of host memory
    #: within rss_horizon.
    rss_limit_ratio: float = 0.9
    rss_window: str = "30m"
    rss_horizon: str = "4h"
    #: A process's GPU memory grew more than this over leak_window and still grows.
    gpu_process_growth_bytes: float = 2**30
    leak_window: str = "30m"
    #: KV-cache usage above this for 5m is P2.
    kv_cache_ratio: float = 0.95
    #: Disk busy share (io_time rate) above this for 2m is P1.
    disk_util_ratio: float = 0.95
    #: DiskWillFill (node_exporter mixin's NodeFilesystemSpaceFillingUp, its warning
    #: level): a writable filesystem with less than this share of its space available ...
    disk_fill_free_ratio: float = 0.4
    #: ... whose available bytes, extrapolated by predict_linear over disk_fill_window,
    #: reach 0 within disk_fill_horizon (the mixin: [6h], 24h; its critical one 20 %, 4h).
    #: The floor keeps a big, mostly empty disk that is written to from paging. Compressed
    #: runs shrink the window and the horizon by one factor: at the rate of the last
    #: window, full within four windows, the same question at either scale.
    disk_fill_window: str = "6h"
    disk_fill_horizon: str = "24h"
    #: DiskSpaceLow: a writable filesystem with less than this share available for 5m is
    #: P1 (the mixin's NodeFilesystemAlmostOutOfSpace warning level).
    disk_free_ratio: float = 0.05
    #: Retransmitted / sent TCP segments above this for 5m is P1.
    tcp_retransmit_ratio: float = 0.05
    #: A blackbox probe (the callers' path) slower than this on average over the short
    #: window, for 2m, is P2; succeeding less often than probe_success_ratio, P1.
    #: 0.2 s is the network_latency signature's own bound (100 ms added each way, the
    #: issue's at-threshold delay); it was 0.5 s, so the alert stayed quiet through a
    #: delay the diagnosis already named. Healthy probes on the demo read 15-45 ms over
    #: 8 s windows. A probe that crosses regions has a higher floor: set its floor + 0.2.
    probe_latency_seconds: float = 0.2
    probe_success_ratio: float = 0.9
    #: Interface errors per second above this for 5m is P2.
    network_errors_per_second: float = 0.0
    #: Non-idle share of the host's CPU time (idle and iowait excluded) above this for 5m is P1.
    cpu_busy_ratio: float = 0.9
    #: Mean time a request spends outside the model (mean HTTP time minus mean inference
    #: time, seconds) above this while the worker pool is idle, for 2m, is P1.
    outside_model_seconds: float = 0.5
    #: "Idle" for that alert: the busiest pool of the job has fewer than this share busy ...
    worker_idle_ratio: float = 0.5
    #: ... on average over this window. The busy share is a gauge sampled at each scrape,
    #: so its average is as noisy as it has few samples: a loop blocked by its handlers
    #: hands work to the pool in bursts, and over 4 samples a burst or two read as a busy
    #: pool (see validate's QUICK_RULES, which gives it 8).
    idle_window: str = "1m"
    #: While a job's request rates are unseen (a scrape of it failed within short_window,
    #: or requests were in flight and none finished), LatencyHighWorkersIdle holds the
    #: time outside at the last value it saw within this window, and averages the pool's
    #: busy share over it, rather than reading the gap as recovery. The
    #: last value is recorded up to a short window after the gap began, so the hold must
    #: be longer than short_window; 5m (five short windows) is Prometheus's lookback, how
    #: long a vanished sample stays current.
    unseen_hold_window: str = "5m"
    #: WorkerPoolSaturated's window: the busy share over it (the rate of the pool's
    #: busy-time counter; for pools without one, the sampled gauge's average) must pass
    #: worker_saturation_ratio. A gauge averaged over 4 samples read a few scrapes in a
    #: row that each caught a small pool all busy in a healthy burst as saturated (quick
    #: runs' soak paged on it for a second; QUICK_RULES gives it 8).
    saturation_window: str = "1m"
    #: Share of requests refused by the input guard, per reason, above this for 1m is P2.
    input_rejection_ratio: float = 0.05
    #: Share of cache lookups that failed (the cache unreachable) above this for 1m is P2.
    cache_error_ratio: float = 0.05
    #: The cache hit ratio fell by more than this share of its baseline (0.5: halved) ...
    cache_hit_drop: float = 0.5
    #: ... where that baseline was at least this (a cache that rarely hits cannot collapse).
    cache_hit_baseline_ratio: float = 0.3
    #: Share of deadline timeouts whose model work was not aborted above this for 1m is P1.
    unaborted_timeout_ratio: float = 0.5
    #: Service-level objectives of HTTP requests, for the burn-rate alerts of group
    #: aivitals-slo (the SRE workbook's "Alerting on SLOs", multiwindow, multi-burn-rate).
    #: They apply only to services with an SLA series (``aivitals_service_sla_seconds``,
    #: exported by ``aivitals agent --sla``): without one nothing is measured, so nothing
    #: pages. Share of requests that must finish within the SLA (budget: 1 %) ...
    slo_latency_objective: float = 0.99
    #: ... and share that must not end in a 5xx (budget 0.1 %: DOMAIN's healthy 504 rate).
    slo_error_objective: float = 0.999
    #: Burn rates: budget spent this many times faster than the objective allows. 14.4x
    #: over 1h spends 2 % of a 30-day budget (P0), 6x over 6h 5 % (P1), 1x over 3d 10 % (P2).
    slo_fast_burn: float = 14.4
    slo_slow_burn: float = 6
    slo_ticket_burn: float = 1
    #: Each burn rate holds over a long window and a short one (a twelfth of it), so an
    #: alert fires within minutes and resolves within minutes of the fix. The ticket's
    #: short window is the slow page's long one (6h), as in the workbook.
    slo_fast_window: str = "1h"
    slo_fast_short_window: str = "5m"
    slo_slow_window: str = "6h"
    slo_slow_short_window: str = "30m"
    slo_ticket_window: str = "3d"
    #: HTTPLatencyAboveBaseline (P2, a warning): the P99 over rate_window above this many
    #: times the P99 of the baseline_window before it (DOMAIN section 4: detect deviation
    #: from baseline, not only fixed limits).
    p99_baseline_factor: float = 1.5
    #: Window of rate(), increase() and quantiles over time.
    rate_window: str = "5m"
    #: Window of the fast ratios (504, 429, queue wait P99).
    short_window: str = "1m"
    #: How often rules are evaluated and targets scraped (written into the exported configs).
    evaluation_interval: str = "15s"
    scrape_interval: str = "15s"

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type == "str":
                parse_duration(value, key=f.name)
            elif isinstance(value, bool) or not isinstance(value, int | float):
                raise ConfigError(f"{f.name}={value!r} must be a number")
            elif not math.isfinite(value) or value < 0:
                raise ConfigError(f"{f.name}={value!r} must be a finite number >= 0")
        self._check_ratios()
        self._check_windows()
        self._check_slo()
        if self.latency_good_seconds not in LATENCY_BUCKETS:
            raise ConfigError(
                f"latency_good_seconds={self.latency_good_seconds!r} must be a bucket bound of "
                f"http_request_duration_seconds: {', '.join(map(_number, LATENCY_BUCKETS))}"
            )

    def _check_ratios(self) -> None:
        for name in (
            "http_504_ratio",
            "http_429_ratio",
            "worker_saturation_ratio",
            "gpu_memory_ratio",
            "gpu_util_low",
            "gpu_util_high",
            "gpu_util_stuck",
            "fast_share_min",
            "fd_ratio",
            "kv_cache_ratio",
            "disk_util_ratio",
            "disk_fill_free_ratio",
            "disk_free_ratio",
            "tcp_retransmit_ratio",
            "probe_success_ratio",
            "cpu_busy_ratio",
            "worker_idle_ratio",
            "input_rejection_ratio",
            "cache_error_ratio",
            "cache_hit_drop",
            "cache_hit_baseline_ratio",
            "unaborted_timeout_ratio",
        ):
            value = getattr(self, name)
            if value > 1:
                raise ConfigError(f"{name}={value!r} is a ratio and must be within 0..1")

    def _check_windows(self) -> None:
        scrape = parse_duration(self.scrape_interval, key="scrape_interval")
        for name in (
            "rate_window",
            "short_window",
            "composite_window",
            "baseline_window",
            "idle_window",
            "unseen_hold_window",
            "saturation_window",
            "disk_fill_window",
            *_SLO_WINDOWS,
        ):
            window = parse_duration(getattr(self, name), key=name)
            if window < _MIN_SCRAPES_PER_WINDOW * scrape:
                raise ConfigError(
                    f"{name}={getattr(self, name)!r} spans fewer than {_MIN_SCRAPES_PER_WINDOW} "
                    f"scrapes of scrape_interval={self.scrape_interval!r}; rate() needs at least 4"
                )

        hold = parse_duration(self.unseen_hold_window, key="unseen_hold_window")
        if hold <= parse_duration(self.short_window, key="short_window"):
            raise ConfigError(
                f"unseen_hold_window={self.unseen_hold_window!r} must be longer than "
                f"short_window={self.short_window!r}: the last value seen is recorded up to "
                "a short window into a gap, so a shorter hold never bridges one"
            )

    def _check_slo(self) -> None:
        for name in ("slo_latency_objective", "slo_error_objective"):
            value = getattr(self, name)
            if not 0 < value < 1:
                raise ConfigError(
                    f"{name}={value!r} must be within 0..1, exclusive: an objective of 1 "
                    "leaves no error budget to burn"
                )
        for name in ("slo_fast_burn", "slo_slow_burn", "slo_ticket_burn", "p99_baseline_factor"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name}={getattr(self, name)!r} must be > 0")
        # the recording rules are named by their window: two roles with one window would
        # record the same series twice
        windows = {n: parse_duration(getattr(self, n), key=n) for n in _SLO_WINDOWS}
        if len(set(windows.values())) != len(windows):
            raise ConfigError(
                "the SLO windows must all differ: "
                + ", ".join(f"{n}={getattr(self, n)}" for n in _SLO_WINDOWS)
            )
        # the longer windows sum the rates recorded over the fast short window
        if windows["slo_fast_short_window"] != min(windows.values()):
            raise ConfigError(
                f"slo_fast_short_window={self.slo_fast_short_window} must be the shortest "
                "SLO window: the others are summed from its recorded rates"
            )
        for short, long in (
            ("slo_fast_short_window", "slo_fast_window"),
            ("slo_slow_short_window", "slo_slow_window"),
            ("slo_slow_window", "slo_ticket_window"),
        ):
            if windows[short] >= windows[long]:
                raise ConfigError(
                    f"{short}={getattr(self, short)} must be shorter than "
                    f"{long}={getattr(self, long)}"
                )

    @classmethod
    def from_mapping(cls, params: dict[str, Any]) -> PackParams:
        """Build from keyword parameters; an unknown name is a ``ConfigError`` naming it."""
        known = {f.name for f in fields(cls)}
        for key in params:
            if key not in known:
                raise ConfigError(f"unknown rule pack parameter {key!r}; known: {sorted(known)}")
        return cls(**params)

    def placeholders(self) -> dict[str, str]:
        """The text each ``[[ name ]]`` of the pack becomes, derived values included."""
        out: dict[str, str] = {}
        for key, value in asdict(self).items():
            out[key] = value if isinstance(value, str) else _number(value)
            if not isinstance(value, str) and key.endswith("_ratio"):
                out[f"{key}_pct"] = _pct(value)
        out["gpu_util_high_pct"] = _pct(self.gpu_util_high)
        out["gpu_util_low_pct"] = _pct(self.gpu_util_low)
        out["gpu_util_stuck_pct"] = _pct(self.gpu_util_stuck)
        out["fast_share_min_pct"] = _pct(self.fast_share_min)
        out["error_growth_factor"] = _number(1.0 + self.error_growth)
        out["cache_hit_drop_pct"] = _pct(self.cache_hit_drop)
        # what is left of the baseline hit ratio at the threshold: 1 - drop
        out["cache_hit_keep"] = _number(round(1.0 - self.cache_hit_drop, 12))
        # prometheus_client writes bucket bounds as Python's repr: 1.5 -> "1.5", 2 -> "2.0".
        out["latency_good_le"] = repr(float(self.latency_good_seconds))
        # error budgets and the ratio each burn rate pages at, rounded so 1 - 0.99 reads 0.01
        for speed in ("fast", "slow", "ticket"):
            # the share of a 30-day budget a burn spends over its long window
            window = parse_duration(getattr(self, f"slo_{speed}_window"))
            spent = getattr(self, f"slo_{speed}_burn") * window / (30 * 86400)
            out[f"slo_{speed}_spent_pct"] = f"{spent * 100:.3g}%"
        for sli in ("latency", "error"):
            budget = 1.0 - getattr(self, f"slo_{sli}_objective")
            out[f"slo_{sli}_budget_pct"] = _pct(round(budget, 12))
            for speed in ("fast", "slow", "ticket"):
                burn = getattr(self, f"slo_{speed}_burn")
                out[f"slo_{sli}_{speed}_ratio"] = _number(round(burn * budget, 12))
                out[f"slo_{sli}_{speed}_ratio_pct"] = _pct(round(burn * budget, 12))
        out["rss_horizon_seconds"] = _number(parse_duration(self.rss_horizon))
        out["disk_fill_horizon_seconds"] = _number(parse_duration(self.disk_fill_horizon))
        return out


def _template_text() -> str:
    return (resources.files("aivitals.alerts") / "rules" / "aivitals-rules.yml").read_text("utf-8")


def render_pack_text(params: PackParams | None = None) -> str:
    """The shipped pack as Prometheus rule YAML with every placeholder filled."""
    values = (params or PackParams()).placeholders()

    def fill(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in values:
            raise ConfigError(f"rule pack placeholder [[ {name} ]] has no parameter")
        return values[name]

    return _PLACEHOLDER.sub(fill, _template_text())


def parse_param_pairs(pairs: tuple[str, ...]) -> dict[str, Any]:
    """``NAME=VALUE`` pairs (the CLIs' ``--param``) as ``PackParams`` keyword arguments."""
    types = {f.name: f.type for f in fields(PackParams)}
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or key not in types:
            raise ConfigError(
                f"--param {pair!r}: expected NAME=VALUE with NAME one of {sorted(types)}"
            )
        if types[key] == "str":
            out[key] = raw
            continue
        try:
            out[key] = float(raw)
        except ValueError:
            raise ConfigError(f"--param {key}={raw!r} must be a number") from None
    return out
