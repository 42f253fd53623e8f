from __future__ import annotations

import math

import numpy as np
import pytest

from aivitals.diagnose import DetectorConfig, StreamingDetector, detect
from aivitals.errors import ConfigError


def _noise(n: int, seed: int = 0, level: float = 1.0, rel: float = 0.02) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return level * (1 + rel * rng.standard_normal(n))


def test_jump_is_found_within_seconds_of_its_start() -> None:
    x = _noise(600)
    x[400:] *= 1.5
    r = detect(x[None, :], np.arange(600.0))
    assert 400 <= r.first_deviation[0] <= 410
    assert r.direction[0] == 1.0
    assert r.max_score[0] > 0.9


def test_slow_drift_p99_plus_50_percent_over_20_minutes_is_caught_early() -> None:
    n, start = 1800, 600
    x = _noise(n, seed=1)
    x[start:] *= 1 + 0.5 * np.arange(n - start) / 1200.0
    r = detect(x[None, :], np.arange(float(n)))
    # caught while the creep is still under +15%
    assert start < r.first_deviation[0] < start + 360


def test_single_outliers_do_not_count_as_leaving_the_baseline() -> None:
    x = _noise(900, seed=2)
    x[[200, 450, 700]] *= 8
    r = detect(x[None, :], np.arange(900.0))
    assert math.isnan(r.first_deviation[0])


def test_noise_alone_never_leaves_the_baseline() -> None:
    data = np.vstack([_noise(1800, seed=s, rel=0.1) for s in range(10)])
    r = detect(data, np.arange(1800.0))
    assert np.isnan(r.first_deviation).all()


def test_downward_shift_has_direction_minus_one() -> None:
    x = _noise(500, seed=3)
    x[300:] *= 0.4
    r = detect(x[None, :], np.arange(500.0))
    assert r.direction[0] == -1.0


def test_gaps_are_skipped_and_state_carries_over() -> None:
    x = _noise(600, seed=4)
    x[100:200] = np.nan
    x[450:] += 0.5
    r = detect(x[None, :], np.arange(600.0))
    assert 450 <= r.first_deviation[0] <= 460
    assert (r.scores[0, 100:200] == 0).all()


def test_flat_series_then_change_is_anomalous_and_flat_is_not() -> None:
    flat = np.zeros(300)
    step = np.zeros(300)
    step[200:] = 3.0
    r = detect(np.vstack([flat, step]), np.arange(300.0))
    assert math.isnan(r.first_deviation[0])
    assert r.first_deviation[1] == 200.0


def test_streaming_and_batch_give_the_same_scores() -> None:
    x = _noise(300, seed=5)
    x[200:] *= 2
    det = StreamingDetector(1)
    stream = np.array([det.update([v])[0] for v in x])
    batch = detect(x[None, :], np.arange(300.0)).scores[0]
    assert np.allclose(stream, batch)


def test_scores_stay_in_unit_interval_even_for_extreme_values() -> None:
    x = np.concatenate([_noise(100), [1e300, -1e300, 0.0, 1e-300], _noise(100)])
    r = detect(x[None, :], np.arange(float(len(x))))
    assert ((r.scores >= 0) & (r.scores <= 1)).all()


def test_novelty_reports_an_episode_once() -> None:
    x = _noise(2000, seed=6)
    x[1000:] *= 3
    det = StreamingDetector(1, DetectorConfig(novelty=True))
    s = np.array([det.update([v])[0] for v in x])
    assert s[1000:1010].max() > 0.5
    assert s[1100:].max() < s[1000:1010].max() / 2


@pytest.mark.parametrize(
    ("key", "value"),
    [("alpha", 0.0), ("alpha", 1.5), ("warmup", 1), ("spike_z", -1.0), ("season", -2)],
)
def test_bad_config_names_the_key_and_value(key: str, value: float) -> None:
    with pytest.raises(ConfigError, match=key):
        DetectorConfig(**{key: value})  # type: ignore[arg-type]


def test_bad_series_count_is_refused() -> None:
    with pytest.raises(ConfigError, match="n_series"):
        StreamingDetector(0)


def test_seasonal_pattern_is_not_an_anomaly() -> None:
    t = np.arange(4000.0)
    x = 10 + 5 * np.sin(2 * np.pi * t / 200) + _noise(4000, seed=7, level=0.2, rel=1.0)
    det = StreamingDetector(1, DetectorConfig(season=200))
    s = np.array([det.update([v])[0] for v in x])
    assert (s[1000:] > 0.5).mean() < 0.01


def test_range_breach_scores_a_first_ever_extreme() -> None:
    # Noise in [0, 1) for 200 rows, then 1.2: beyond the past range by 20 % of it.
    rng = np.random.default_rng(3)
    data = [*rng.random(200), 1.2]
    cfg = DetectorConfig(range_breach=0.05, spike_z=1e6, shift_z=1e6, cusum_h=1e6)
    det = StreamingDetector(1, cfg)
    scores = [float(det.update([v])[0]) for v in data]
    assert scores[-1] == 1.0
    assert max(scores[:-1]) < 1.0


def test_range_breach_within_tolerance_or_off_does_not_fire() -> None:
    rng = np.random.default_rng(4)
    data = [*rng.random(200), 1.01]  # 1 % beyond the range, tolerance 5 %
    for cfg in (
        DetectorConfig(range_breach=0.05, spike_z=1e6, shift_z=1e6, cusum_h=1e6),
        DetectorConfig(spike_z=1e6, shift_z=1e6, cusum_h=1e6),
    ):
        det = StreamingDetector(1, cfg)
        scores = [float(det.update([v])[0]) for v in data]
        assert scores[-1] < 0.5


def test_range_breach_ignores_flat_history_gaps_and_warmup() -> None:
    cfg = DetectorConfig(range_breach=0.05, warmup=5, spike_z=1e6, shift_z=1e6, cusum_h=1e6)
    det = StreamingDetector(2, cfg)
    # series 0 flat, then 1.5: no range to leave, and the baseline views are off;
    # series 1: warm-up rows, a gap (not counted), a new extreme still in warm-up,
    # then one beyond everything once warm.
    rows = [[1.0, float(v)] for v in (0, 10, 0, 10)] + [[1.0, np.nan]] * 3
    rows += [[1.0, 20.0], [1.5, 30.0]]
    out = [det.update(r) for r in rows]
    assert all(float(o[1]) == 0.0 for o in out[:-1])
    assert float(out[-1][1]) == 1.0
    assert float(out[-1][0]) < 0.5


def test_range_breach_rejects_negative_tolerance() -> None:
    with pytest.raises(ConfigError, match="range_breach"):
        DetectorConfig(range_breach=-0.1)
