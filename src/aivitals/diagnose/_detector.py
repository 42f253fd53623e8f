"""A streaming baseline-deviation detector, vectorised over many series.

One general method for every signal (and for every NAB file): a robust
exponentially weighted baseline (level and scale updated with Huber-clipped
residuals, so outliers do not drag it), and three views of the standardised
residual ``z``:

- *spike*: ``|z|`` of the point itself;
- *shift*: a short EWMA of ``z``, which sees a level change after a few points
  even when each point alone is unremarkable;
- *drift*: a two-sided CUSUM of ``z``, which accumulates a slow creep
  (P99 +50 % over 20 minutes) long before any single point is far out.

Each view is divided by the value at which it is "clearly anomalous", the
largest ratio ``c`` becomes the score ``c**2 / (1 + c**2)`` (0.5 at the
threshold). A seasonal term (``season`` rows) compares the point with the
same phase one season ago when that predicts the series better than the
level does. NaN is a gap: state is carried across it untouched.

An optional *range breach* stage (``range_breach``, off by default) scores 1
for a value that leaves everything the series has shown so far (its running
min/max) by more than that fraction of the range: Numenta's "spatial anomaly"
rule, which catches first-ever extremes that a slowly learnt baseline scale
under-rates. It is the stage that lifts the NAB score (see docs/diagnose.md).

**Usage**::

    det = StreamingDetector(n_series=3)
    for row in data:                 # row: array of 3 values, NaN for a gap
        scores = det.update(row)     # array of 3 scores in [0, 1]

    result = detect(values, times)   # whole window at once, same method
    result.first_deviation[i]        # time series i first left its baseline
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from ..errors import ConfigError

__all__ = ["DetectionResult", "DetectorConfig", "StreamingDetector", "detect"]

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True, kw_only=True)
class DetectorConfig:
    """Settings of the detector; one set for every series (no per-series tuning).

    ``alpha`` is the baseline's learning rate per sample; ``warmup`` the rows
    used to seed level and scale; ``spike_z``, ``shift_z`` and ``cusum_h`` the
    points at which each view scores 0.5; ``rel_floor`` keeps a flat series'
    scale from collapsing to zero; ``novelty`` reports only the rise of an
    episode (later points of the same episode are damped), which suits
    first-detection scoring such as NAB's.
    """

    alpha: float = 0.01
    alpha_scale: float = 0.01
    short_alpha: float = 0.2
    clip: float = 3.0
    cusum_k: float = 1.0
    cusum_h: float = 30.0
    spike_z: float = 8.0
    shift_z: float = 3.5
    warmup: int = 30
    rel_floor: float = 0.002
    abs_floor: float = 1e-9
    season: int = 0
    novelty: bool = False
    novelty_decay: float = 0.995
    novelty_alpha: float = 0.002
    novelty_z: float = 4.0
    novelty_short: float = 0.5
    novelty_log: bool = False
    range_breach: float | None = None

    def __post_init__(self) -> None:
        for key in (
            "alpha",
            "alpha_scale",
            "short_alpha",
            "novelty_decay",
            "novelty_alpha",
            "novelty_short",
        ):
            value = getattr(self, key)
            if not 0.0 < value <= 1.0:
                raise ConfigError(f"DetectorConfig.{key} must be in (0, 1], got {value!r}")
        for key in ("clip", "cusum_h", "spike_z", "shift_z"):
            value = getattr(self, key)
            if not value > 0:
                raise ConfigError(f"DetectorConfig.{key} must be > 0, got {value!r}")
        if self.warmup < 3:
            raise ConfigError(f"DetectorConfig.warmup must be >= 3, got {self.warmup!r}")
        if self.season < 0:
            raise ConfigError(f"DetectorConfig.season must be >= 0, got {self.season!r}")
        if self.range_breach is not None and not self.range_breach >= 0:
            raise ConfigError(
                f"DetectorConfig.range_breach must be >= 0 or None, got {self.range_breach!r}"
            )


@dataclass(slots=True)
class _State:
    level: FloatArray
    scale: FloatArray
    short: FloatArray
    cpos: FloatArray
    cneg: FloatArray
    peak: FloatArray
    rmean: FloatArray
    magnitude: FloatArray
    rvar: FloatArray
    rshort: FloatArray
    seen: npt.NDArray[np.int64]
    low: FloatArray
    high: FloatArray
    warm: list[FloatArray] = field(default_factory=list)
    history: list[FloatArray] = field(default_factory=list)
    season_err: FloatArray | None = None
    level_err: FloatArray | None = None


class StreamingDetector:
    """Scores each new row of ``n_series`` values against each series' own baseline."""

    def __init__(self, n_series: int, config: DetectorConfig | None = None) -> None:
        if n_series < 1:
            raise ConfigError(f"StreamingDetector n_series must be >= 1, got {n_series!r}")
        self.config = config or DetectorConfig()
        self.n = n_series
        z = np.zeros(n_series)
        self._s = _State(
            level=np.full(n_series, np.nan),
            scale=z.copy(),
            short=z.copy(),
            cpos=z.copy(),
            cneg=z.copy(),
            peak=z.copy(),
            rmean=z.copy(),
            magnitude=z.copy(),
            rvar=z.copy() + 0.01,
            rshort=z.copy(),
            seen=np.zeros(n_series, dtype=np.int64),
            low=np.full(n_series, np.inf),
            high=np.full(n_series, -np.inf),
        )
        if self.config.season:
            self._s.season_err = z.copy()
            self._s.level_err = z.copy()
        self.last_z = z.copy()

    def update(self, row: npt.ArrayLike) -> FloatArray:
        """Score one row (NaN = no value) and learn from it; returns scores in [0, 1]."""
        x = np.asarray(row, dtype=np.float64).reshape(self.n)
        cfg, s = self.config, self._s
        ok = np.isfinite(x)
        scores = np.zeros(self.n)
        warming = s.seen < cfg.warmup
        if warming.any():
            self._warm(x, ok & warming)
        active = ok & ~warming
        if active.any():
            scores = self._score(x, active)
            if cfg.range_breach is not None:
                scores = np.where(self._breach(x, active, cfg.range_breach), 1.0, scores)
        s.low = np.where(ok, np.fmin(s.low, x), s.low)
        s.high = np.where(ok, np.fmax(s.high, x), s.high)
        s.seen += ok
        if cfg.season:
            self._remember(x)
        return scores

    def _breach(
        self, x: FloatArray, active: npt.NDArray[np.bool_], tol: float
    ) -> npt.NDArray[np.bool_]:
        """Values beyond the series' whole past range by more than ``tol`` of that range."""
        s = self._s
        with np.errstate(over="ignore", invalid="ignore"):
            span = s.high - s.low
            out = (x > s.high + tol * span) | (x < s.low - tol * span)
        # A flat past (span 0) has no range to leave: the baseline views judge it.
        return active & (span > 0) & np.isfinite(span) & out

    def _warm(self, x: FloatArray, mask: npt.NDArray[np.bool_]) -> None:
        s = self._s
        row = np.where(mask, x, np.nan)
        s.warm.append(row)
        done = mask & (s.seen + 1 >= self.config.warmup)
        if done.any():
            block = np.vstack(s.warm)[:, done]
            med = np.nanmedian(block, axis=0)
            mad = np.nanmedian(np.abs(block - med), axis=0) * 1.4826
            diffs = np.nanmedian(np.abs(np.diff(block, axis=0)), axis=0) / 1.128
            s.level[done] = med
            s.magnitude[done] = np.nanmean(np.abs(block), axis=0)
            s.scale[done] = np.fmax(mad, np.nan_to_num(diffs))
        if not (s.seen + mask < self.config.warmup).any():
            s.warm.clear()

    def _predict(self, x: FloatArray) -> FloatArray:
        """The expected value: the level, or the seasonal value where that fits better."""
        s, cfg = self._s, self.config
        if not cfg.season or len(s.history) < cfg.season:
            return s.level
        assert s.season_err is not None and s.level_err is not None
        prior = s.history[-cfg.season]
        seasonal = s.level + (prior - s.level) * 0.8
        ok = np.isfinite(prior) & np.isfinite(x)
        err_s = np.where(ok, np.abs(x - seasonal), s.season_err)
        err_l = np.where(ok, np.abs(x - s.level), s.level_err)
        s.season_err += 0.01 * (err_s - s.season_err)
        s.level_err += 0.01 * (err_l - s.level_err)
        use = ok & (s.season_err < 0.8 * s.level_err)
        return np.where(use, seasonal, s.level)

    def _score(self, x: FloatArray, active: npt.NDArray[np.bool_]) -> FloatArray:
        cfg, s = self.config, self._s
        expected = self._predict(x)
        floor = np.fmax(cfg.rel_floor * s.magnitude, cfg.abs_floor)
        scale = np.fmax(s.scale, floor)
        with np.errstate(over="ignore", invalid="ignore"):
            resid = np.where(active, x - expected, 0.0)
            z = np.nan_to_num(resid / scale, nan=0.0, posinf=1e12, neginf=-1e12)
        # The shift and drift views see z winsorised at the spike level, so one
        # outlier cannot pass for a level change.
        zc = np.clip(z, -cfg.spike_z, cfg.spike_z)
        s.short = np.where(active, s.short + cfg.short_alpha * (zc - s.short), s.short)
        s.cpos = np.where(active, np.maximum(0.0, s.cpos + zc - cfg.cusum_k), s.cpos)
        s.cneg = np.where(active, np.maximum(0.0, s.cneg - zc - cfg.cusum_k), s.cneg)
        ratio = np.maximum.reduce(
            [
                np.abs(z) / cfg.spike_z,
                np.abs(s.short) / cfg.shift_z,
                np.maximum(s.cpos, s.cneg) / cfg.cusum_h,
            ]
        )
        # Clipped so that absurd values (1e300) score 1 instead of overflowing.
        ratio = np.nan_to_num(np.clip(ratio, 0.0, 1e6), nan=0.0)
        score = np.where(active, ratio**2 / (1.0 + ratio**2), 0.0)
        self.last_z = np.where(active, z, 0.0)
        self._learn(x, resid, scale, active, ratio)
        if cfg.novelty:
            score = self._novel(ratio, active)
        return score

    def _learn(
        self,
        x: FloatArray,
        resid: FloatArray,
        scale: FloatArray,
        active: npt.NDArray[np.bool_],
        ratio: FloatArray,
    ) -> None:
        cfg, s = self.config, self._s
        bound = cfg.clip * scale
        clipped = np.clip(resid, -bound, bound)
        # Learn faster while a sustained shift is under way so a new normal is
        # accepted in minutes, slower during spikes so outliers are ignored.
        boost = np.where(ratio > 1.0, 2.0, 1.0)
        s.level = np.where(active, s.level + cfg.alpha * boost * clipped, s.level)
        s.magnitude = np.where(
            active, s.magnitude + cfg.alpha_scale * (np.abs(x) - s.magnitude), s.magnitude
        )
        s.scale = np.where(active, s.scale + cfg.alpha_scale * (np.abs(clipped) - s.scale), s.scale)
        # Once the CUSUM has said its piece, reset it so a new normal stops
        # scoring and the next drift can be seen.
        reset = active & (np.maximum(s.cpos, s.cneg) > 3.0 * cfg.cusum_h)
        s.cpos = np.where(reset, 0.0, s.cpos)
        s.cneg = np.where(reset, 0.0, s.cneg)

    def _novel(self, ratio: FloatArray, active: npt.NDArray[np.bool_]) -> FloatArray:
        """How unusual the recent ratios are for this series, reported at an episode's rise.

        A noisy series lives at high ratios and a calm one at low; judging the
        short-term ratio against the series' own long-run distribution makes
        one threshold fit both, and damping after a peak reports each episode
        once.
        """
        s, cfg = self._s, self.config
        # log1p tames heavy-tailed series so their ratios are closer to Gaussian
        ratio = np.log1p(np.clip(ratio, 0.0, 1e6)) if cfg.novelty_log else ratio
        s.rshort = np.where(active, s.rshort + cfg.novelty_short * (ratio - s.rshort), s.rshort)
        zl = (s.rshort - s.rmean) / np.sqrt(s.rvar + 1e-6)
        dev = np.clip(ratio, 0.0, 10.0) - s.rmean
        s.rmean = np.where(active, s.rmean + cfg.novelty_alpha * dev, s.rmean)
        s.rvar = np.where(active, s.rvar + cfg.novelty_alpha * (dev * dev - s.rvar), s.rvar)
        c = np.maximum(zl, 0.0) / cfg.novelty_z
        score = c**2 / (1.0 + c**2)
        out = np.clip(score - s.peak, 0.0, 1.0)
        s.peak = np.where(active, np.maximum(score, s.peak * cfg.novelty_decay), s.peak)
        return np.where(active, np.clip(out, 0.0, 1.0), 0.0)

    def _remember(self, x: FloatArray) -> None:
        s = self._s
        s.history.append(x.copy())
        if len(s.history) > self.config.season:
            del s.history[0]


@dataclass(frozen=True, slots=True)
class DetectionResult:
    """Scores of a window: ``scores[i, t]``, and per series its peak, direction
    (+1 above baseline, -1 below) and the time it first left its baseline
    (NaN when it never did)."""

    scores: FloatArray
    max_score: FloatArray
    direction: FloatArray
    first_deviation: FloatArray


def detect(
    values: npt.ArrayLike,
    times: npt.ArrayLike,
    *,
    config: DetectorConfig | None = None,
    threshold: float = 0.5,
    min_run: int = 5,
    floors: npt.ArrayLike | None = None,
) -> DetectionResult:
    """Run the streaming detector over a window, ``values[i, t]`` at ``times[t]``.

    A series "left its baseline" at the first point of the first run of at
    least ``min_run`` anomalous points (score >= ``threshold``) that is not
    followed by a return to normal for as long; that run's mean sign of ``z``
    is its direction. ``floors`` (one per series) is the smallest change that
    matters, so a counter moving from 0 to 1 is not an anomaly by itself.

    >>> r = detect([[1.0] * 40 + [5.0] * 20], list(range(60)))
    >>> float(r.first_deviation[0])
    40.0
    """
    data = np.atleast_2d(np.asarray(values, dtype=np.float64))
    ts = np.asarray(times, dtype=np.float64)
    n, t_len = data.shape
    det = StreamingDetector(n, config)
    floor_arr = None if floors is None else np.asarray(floors, dtype=np.float64)
    scores = np.zeros((n, t_len))
    zs = np.zeros((n, t_len))
    for t in range(t_len):
        scores[:, t] = det.update(data[:, t])
        zs[:, t] = det.last_z
    if floor_arr is not None:
        scores = _apply_floors(scores, data, det, floor_arr)
    first, direction = _episodes(scores, zs, ts, threshold, min_run)
    return DetectionResult(scores, scores.max(axis=1, initial=0.0), direction, first)


def _apply_floors(
    scores: FloatArray, data: FloatArray, det: StreamingDetector, floors: FloatArray
) -> FloatArray:
    """Zero the scores of points that differ from the warm-up median by less than the floor."""
    warm = min(det.config.warmup, data.shape[1])
    with np.errstate(all="ignore"):
        base = np.nanmedian(data[:, :warm], axis=1) if warm else np.zeros(data.shape[0])
    base = np.nan_to_num(base)
    small = np.abs(np.nan_to_num(data) - base[:, None]) < floors[:, None]
    return np.where(small, 0.0, scores)


def _episodes(
    scores: FloatArray, zs: FloatArray, ts: FloatArray, threshold: float, min_run: int
) -> tuple[FloatArray, FloatArray]:
    n = scores.shape[0]
    first = np.full(n, np.nan)
    direction = np.zeros(n)
    hot = scores >= threshold
    for i in np.flatnonzero(hot.sum(axis=1) >= min_run):
        start = _sustained_start(hot[i], min_run)
        if start is None:
            continue
        first[i] = ts[start]
        seg = zs[i, start:][hot[i, start:]]
        direction[i] = float(np.sign(seg.mean())) if seg.size else 0.0
    return first, direction


def _sustained_start(hot: npt.NDArray[np.bool_], min_run: int) -> int | None:
    """Start of the first run of ``min_run`` hot points within a stretch that stays mostly hot."""
    idx = np.flatnonzero(hot)
    for k in range(len(idx) - min_run + 1):
        # min_run hot points within 2 * min_run rows: a sustained episode,
        # tolerant of the odd cool point in noisy data.
        if idx[k + min_run - 1] - idx[k] < 2 * min_run:
            return int(idx[k])
    return None
