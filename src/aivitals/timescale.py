"""The time scale of a run: how fast rule time runs, and every window, period and phase
that follows from it.

Two scales. ``QUICK`` compresses time for CI (``aivitals validate --quick``, quick
fleets): 1 s ticks, short rule windows and every ``for:`` divided by 60, so a run of a
few minutes asks the same questions as the shipped rules over hours. ``SHIPPED`` is the
rule pack as it ships (full-length runs). Everything that depends on the scale (the
stack's tick and rule pack, validate's phases, poll period and diagnosis windows, the
findings' hold, the soak's cadence, a fleet's servers) reads it from here.

**Usage**::

    from aivitals.timescale import TimeScale
    scale = TimeScale.of(quick=True)             # QUICK
    scale.tick, scale.rule_windows["rate_window"], scale.hold   # 1.0, "8s", 16.0
    scale.phases.fault_max, scale.poll_every                    # 25.0, 3.0
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from .errors import ConfigError

__all__ = ["QUICK", "SHIPPED", "Phases", "SoakCadence", "TimeScale"]


@dataclass(frozen=True, kw_only=True, slots=True)
class Phases:
    """validate's phases of one case, seconds, where the run leaves them unset: the
    baseline, the fault (ended early once caught, but not before ``fault_min``), and the
    wait for the alerts to resolve after the revert."""

    baseline: float
    fault_min: float
    fault_max: float
    recover_max: float


@dataclass(frozen=True, kw_only=True, slots=True)
class SoakCadence:
    """A soak's diagnosis polls (every ``poll_every`` over the last ``window``, the first
    once ``min_window`` has passed) and the demo cache's TTL it runs with, seconds."""

    poll_every: float
    window: float
    min_window: float
    cache_ttl: float


@dataclass(frozen=True, kw_only=True)
class TimeScale:
    """One time scale; see the module docstring. Two exist: ``QUICK`` and ``SHIPPED``."""

    name: str
    #: rule time compressed: ``rule_windows`` on the pack, ``for:`` divided by ``for_factor``
    compressed: bool
    #: scrape, collect and rule-evaluation period of the agent, seconds
    tick: float
    #: rule-pack parameters (``PackParams`` names) of the compressed pack; {} as shipped
    rule_windows: Mapping[str, str]
    #: every ``for:`` of the pack is divided by this (at least 1 s; see ``scale_for``)
    for_factor: float
    #: validate's load on a fresh stack before its first baseline, seconds
    warm_up: float
    phases: Phases
    #: validate's period between two diagnosis polls of a fault phase, seconds
    poll_every: float
    #: seconds the diagnosis is watched after its first correct poll before a fault phase
    #: may end (it runs on past ``fault_max`` to give it that long): a few polls cover
    #: seconds, and an operator acts on an answer that holds for minutes
    stable_for: float
    #: the calm after a revert is at least this many ticks (and one rate window)
    settle_ticks: int
    #: validate's least diagnosis window, seconds, however short the baseline
    diagnosis_window: float
    soak: SoakCadence
    #: scrape and rule-evaluation period of a fleet's Prometheus and vmalert, seconds
    server_tick: float
    #: the newest seconds VictoriaMetrics hides from queries in a fleet
    server_lag: float
    #: Alertmanager's group wait and interval in a fleet, seconds (None: its own)
    alert_group: float | None

    def __post_init__(self) -> None:
        if not self.compressed and (self.rule_windows or self.for_factor != 1.0):
            raise ConfigError(f"time scale {self.name!r}: rule windows or for_factor uncompressed")
        if not (self.tick > 0 and self.for_factor >= 1):
            raise ConfigError(f"time scale {self.name!r}: expected tick > 0 and for_factor >= 1")
        # a read-only copy, so the shared instances cannot be changed through their dict
        object.__setattr__(self, "rule_windows", MappingProxyType(dict(self.rule_windows)))

    def __hash__(self) -> int:
        # the generated hash would hash the rule windows' mapping, which cannot be hashed
        return hash((self.name, self.compressed, self.tick, self.for_factor))

    @classmethod
    def of(cls, quick: bool) -> TimeScale:
        """``QUICK`` for a compressed run, else ``SHIPPED``."""
        return QUICK if quick else SHIPPED

    @classmethod
    def quick(cls) -> TimeScale:
        return QUICK

    @classmethod
    def shipped(cls) -> TimeScale:
        return SHIPPED

    @property
    def diagnosis_rate(self) -> float | None:
        """The diagnosis's rate window, seconds: the compressed pack's ``rate_window``, so
        rates span enough requests; None leaves it to the diagnosis (a minute)."""
        window = self.rule_windows.get("rate_window")
        if window is None:
            return None
        import promql_parser

        return float(promql_parser.parse_duration(window).total_seconds())

    @property
    def hold(self) -> float:
        """How long findings with memory hold a finding whose evidence went (``hold_for``
        of the diagnosis's rate window: 16 s quick, 120 s shipped)."""
        from .diagnose import hold_for

        return hold_for(self.diagnosis_rate)


QUICK = TimeScale(
    name="quick",
    compressed=True,
    tick=1.0,
    # every rate() window still spans >= 4 scrapes of 1 s
    rule_windows={
        "scrape_interval": "1s",
        "evaluation_interval": "1s",
        "rate_window": "8s",
        "short_window": "4s",
        # LatencyHighWorkersIdle's idle share is a sampled gauge: over 4 samples a blocked
        # loop's bursts of work read as a busy pool and its 2 s for: keeps restarting, up to
        # 15 s into the fault, against validate's 25 s deadline. Over 8 samples, replayed on
        # the 13 quick event_loop_blocked recordings above the threshold strength, it holds
        # 3 evaluations in a row 5-9 s into the fault (4 samples: 5-15 s)
        "idle_window": "8s",
        # five short windows, as the shipped 5m over 1m
        "unseen_hold_window": "20s",
        # WorkerPoolSaturated's busy share (the pool's busy-time counter; the gauge's average
        # for pools without it): over 4 s, six scrapes in a row that caught both workers busy
        # (the trace's bursts near a quick soak's x1.4 peak) page P0 for the 1 s for:. Over
        # 8 s it can still page there: the bursts keep the pool >= 95 % busy for 8-15 s, which
        # the shipped 1m window reads as 80 % at most (docs/validate.md, "--quick"). The
        # worker_pool_saturated fault's stuck pool is busy throughout
        "saturation_window": "8s",
        "composite_window": "6s",
        "baseline_window": "30s",
        "leak_window": "10s",
        "rss_window": "10s",
        # DiskWillFill's 6h regression and 24h horizon by one factor (2160), so "full
        # within four windows at the last window's rate" is asked at both scales; the
        # horizon kept at 24h would read any write in 10 s as a disk filling
        "disk_fill_window": "10s",
        "disk_fill_horizon": "40s",
        # the SLO burn-rate windows by the same factor (60) as for:, the shortest held at
        # the rate window; the drill sets no SLA, so these page nothing there
        "slo_fast_short_window": "8s",
        "slo_slow_short_window": "30s",
        "slo_fast_window": "1m",
        "slo_slow_window": "6m",
        "slo_ticket_window": "72m",
    },
    for_factor=60.0,
    # the request and cache rates ramp up from zero for several seconds, and a 4 s
    # baseline taken on that ramp made the first scenario's fault look like a traffic surge
    warm_up=15.0,
    # a 10 s baseline: the diagnosis's window starts there (never in the previous case),
    # and its detector learns "normal" from the first 5 of those seconds
    phases=Phases(baseline=10.0, fault_min=5.0, fault_max=25.0, recover_max=20.0),
    poll_every=3.0,
    stable_for=30.0,
    settle_ticks=8,
    # the 10 s baseline and the first poll, 5 s into the fault: never the previous case
    diagnosis_window=15.0,
    # the cache TTL is compressed with rule time, so keys expire within a five-minute soak
    soak=SoakCadence(poll_every=10.0, window=60.0, min_window=30.0, cache_ttl=60.0),
    server_tick=1.0,
    # alerts and diagnoses within seconds need the newest samples
    server_lag=1.0,
    # deliver within seconds, not the minutes of production
    alert_group=1.0,
)

SHIPPED = TimeScale(
    name="shipped",
    compressed=False,
    tick=5.0,
    rule_windows={},
    for_factor=1.0,
    # one cache TTL, as the soak warms up: the signatures' "usual level" is a 5-minute
    # median, and without it the first case (cache_stampede) has only its 60 s baseline and
    # the cold cache's ramp behind it, so its usual hit ratio reads 0.13, the stampede's 0
    # falls short of it by less than the threshold, and the diagnosis loses the fault at 90 s
    warm_up=300.0,
    phases=Phases(baseline=60.0, fault_min=30.0, fault_max=120.0, recover_max=180.0),
    poll_every=10.0,
    stable_for=120.0,
    settle_ticks=8,
    # so the detector has points to learn from, even when the baseline is shorter
    diagnosis_window=30.0,
    # the demo's own 300 s cache TTL
    soak=SoakCadence(poll_every=30.0, window=180.0, min_window=90.0, cache_ttl=300.0),
    server_tick=15.0,
    server_lag=30.0,
    alert_group=None,
)
