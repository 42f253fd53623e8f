"""The time scale is one object: its two instances hold the values the stack, validate,
the soak and the fleet ran with before they read it from there, and every reader gets
them from it."""

from __future__ import annotations

from dataclasses import replace

import pytest

from aivitals.errors import ConfigError
from aivitals.timescale import QUICK, SHIPPED, Phases, SoakCadence, TimeScale

QUICK_WINDOWS = {
    "scrape_interval": "1s",
    "evaluation_interval": "1s",
    "rate_window": "8s",
    "short_window": "4s",
    "idle_window": "8s",
    "unseen_hold_window": "20s",
    "saturation_window": "8s",
    "composite_window": "6s",
    "baseline_window": "30s",
    "leak_window": "10s",
    "rss_window": "10s",
    "disk_fill_window": "10s",
    "disk_fill_horizon": "40s",
    "slo_fast_short_window": "8s",
    "slo_slow_short_window": "30s",
    "slo_fast_window": "1m",
    "slo_slow_window": "6m",
    "slo_ticket_window": "72m",
}


def test_a_regression_window_and_its_horizon_compress_by_one_factor() -> None:
    """DiskWillFill asks "at the last window's rate, empty within the horizon": a horizon
    compressed less than its window asks about far more windows, and reads any write
    burst as a disk filling."""
    from aivitals.alerts import PackParams
    from aivitals.alerts._params import parse_duration

    shipped, quick = PackParams(), PackParams(**dict(QUICK.rule_windows))
    factors = {
        parse_duration(getattr(shipped, name)) / parse_duration(getattr(quick, name))
        for name in ("disk_fill_window", "disk_fill_horizon")
    }
    assert len(factors) == 1, factors


def test_the_quick_scale_holds_the_compressed_values() -> None:
    s = TimeScale.quick()
    assert s is QUICK is TimeScale.of(quick=True)
    assert s.compressed and s.name == "quick"
    assert s.tick == 1.0 and s.for_factor == 60.0
    assert dict(s.rule_windows) == QUICK_WINDOWS
    assert s.warm_up == 15.0
    assert s.phases == Phases(baseline=10.0, fault_min=5.0, fault_max=25.0, recover_max=20.0)
    assert (s.poll_every, s.stable_for, s.settle_ticks) == (3.0, 30.0, 8)
    assert (s.diagnosis_window, s.diagnosis_rate, s.hold) == (15.0, 8.0, 16.0)
    assert s.soak == SoakCadence(poll_every=10.0, window=60.0, min_window=30.0, cache_ttl=60.0)
    assert (s.server_tick, s.server_lag, s.alert_group) == (1.0, 1.0, 1.0)


def test_the_shipped_scale_holds_the_real_time_values() -> None:
    s = TimeScale.shipped()
    assert s is SHIPPED is TimeScale.of(quick=False)
    assert not s.compressed and s.name == "shipped"
    assert s.tick == 5.0 and s.for_factor == 1.0 and dict(s.rule_windows) == {}
    assert s.warm_up == 300.0
    assert s.phases == Phases(baseline=60.0, fault_min=30.0, fault_max=120.0, recover_max=180.0)
    assert (s.poll_every, s.stable_for, s.settle_ticks) == (10.0, 120.0, 8)
    # the rate is left to the diagnosis (a minute), and the hold is two of those
    assert (s.diagnosis_window, s.diagnosis_rate, s.hold) == (30.0, None, 120.0)
    assert s.soak == SoakCadence(poll_every=30.0, window=180.0, min_window=90.0, cache_ttl=300.0)
    assert (s.server_tick, s.server_lag, s.alert_group) == (15.0, 30.0, None)


def test_the_quick_windows_still_span_four_scrapes_and_name_the_tick() -> None:
    import promql_parser

    w = QUICK.rule_windows
    assert w["scrape_interval"] == w["evaluation_interval"] == f"{QUICK.tick:g}s"
    for key in ("rate_window", "short_window"):
        assert promql_parser.parse_duration(w[key]).total_seconds() >= 4 * QUICK.tick


def test_a_scale_cannot_be_changed_in_place() -> None:
    with pytest.raises(AttributeError):
        QUICK.tick = 2.0  # type: ignore[misc]
    with pytest.raises(TypeError):
        QUICK.rule_windows["rate_window"] = "1m"  # type: ignore[index]
    assert hash(QUICK) != hash(SHIPPED)


def test_an_uncompressed_scale_keeps_the_pack_as_shipped() -> None:
    with pytest.raises(ConfigError, match="uncompressed"):
        replace(SHIPPED, for_factor=60.0)
    with pytest.raises(ConfigError, match="uncompressed"):
        replace(SHIPPED, rule_windows={"rate_window": "8s"})
    with pytest.raises(ConfigError, match="tick"):
        replace(QUICK, tick=0.0)


def test_every_reader_takes_its_values_from_the_scale() -> None:
    from aivitals.demo import QUICK_RULES, StackConfig
    from aivitals.fleet import FleetConfig
    from aivitals.validate import ValidateConfig
    from aivitals.validate._record import MIN_DIAGNOSIS_WINDOW, QUICK_MIN_WINDOW
    from aivitals.validate._runner import warm_up_seconds
    from aivitals.validate._soak import SoakPlan

    assert QUICK_RULES == QUICK_WINDOWS
    assert (QUICK_MIN_WINDOW, MIN_DIAGNOSIS_WINDOW) == (15.0, 30.0)
    for quick, scale in ((True, QUICK), (False, SHIPPED)):
        assert StackConfig(quick=quick).scale == scale
        assert StackConfig(quick=quick).tick == scale.tick
        assert FleetConfig(quick=quick).scale is scale
        config = ValidateConfig(quick=quick)
        assert config.scale is scale and warm_up_seconds(config) == scale.warm_up
        for key in ("baseline", "fault_min", "fault_max", "recover_max"):
            assert config.phase(key) == getattr(scale.phases, key)
        plan = SoakPlan.for_run(3600, quick=quick)
        soak = scale.soak
        assert (plan.poll_every, plan.window, plan.min_window) == (
            soak.poll_every,
            soak.window,
            soak.min_window,
        )
        assert plan.cache_ttl == plan.warm_up == soak.cache_ttl
    assert (FleetConfig(quick=True).tick, FleetConfig(quick=False).tick) == ("1s", "15s")


def test_a_stack_puts_its_interval_and_for_factor_into_its_scale() -> None:
    """The demo's compressed rules divide ``for:`` by 10 at 1 s ticks; its real-time rules
    keep the shipped pack (a ``for_factor`` is ignored) at 1 s ticks too."""
    from aivitals.demo import StackConfig

    compressed = StackConfig(quick=True, for_factor=10.0, interval=1.0).scale
    assert (compressed.tick, compressed.for_factor, compressed.hold) == (1.0, 10.0, 16.0)
    real_time = StackConfig(quick=False, for_factor=10.0, interval=1.0).scale
    assert (real_time.compressed, real_time.tick, real_time.for_factor) == (False, 1.0, 1.0)
    assert StackConfig(quick=True).scale.for_factor == 60.0
    with pytest.raises(ConfigError, match="for_factor"):
        StackConfig(for_factor=0.5)
