"""``rank_changes``: which series changed most between a baseline and an incident window.

The generic half of a diagnosis, for faults no signature knows: every metric
family is fetched with one range query, turned into something comparable
(counters into rates, histograms into p50/p99 and a request rate, gauges as
they are), and each series is scored against its own baseline with robust
statistics, so neither noise nor units decide the order.

Scoring, per series (``b`` the baseline points, ``x`` the incident points)::

    scale = max(1.4826 * MAD(b), relative_floor * |median(b)|, unit floor)
    z      = (x - median(b)) / scale          clipped to +-1000
    excess = band * (1 + ln(|z| / band)) where |z| > band, else 0
    score  = mean excess over the incident (dominant side), after the most
             extreme 5 % on each side (one point at least) is pulled in

so a shift counts by its size *and* by how much of the incident it lasts
(``beyond``, the share of incident points outside the band). The unit floor
(1 ms, 1 MiB, 1 W, one event a minute...) keeps a series that sat flat at zero
from scoring thousands of sigmas on a wiggle; it is the only term that is not
scale-free, and it applies only where the unit is known (the signal catalogue,
its aliases, or a Prometheus unit suffix such as ``_seconds``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from .. import signals
from ..errors import AivitalsError, ConfigError
from ..signals import MetricType
from ..tsdb import Backend, QueryResult
from ._model import Unseen

__all__ = ["DEFAULT_EXCLUDE", "Change", "ChangeRanking", "rank_changes"]

#: Names ``rank_changes`` leaves out of discovery by default: recording-rule outputs
#: (``level:metric:operation``, derived from raw series that are ranked themselves),
#: alert state series, and the monitor's own telemetry (the aivitals agent's, a
#: Prometheus's or VictoriaMetrics's, scrape bookkeeping). Its own ingest rate moves
#: whenever series come and go, and in validate runs it outranked the faults' signals.
DEFAULT_EXCLUDE = (
    r".*:.*|ALERTS|ALERTS_FOR_STATE|aivitals_.*|prometheus_.*|vm_.*|vmalert_.*"
    r"|scrape_.*|up"
)


#: Robust sigma from the median absolute deviation (normal data).
_MAD_SIGMA = 1.4826
#: |z| is clipped here: past a thousand sigmas the size no longer orders anything,
#: persistence does (and a zero scale gives exactly this).
Z_CAP = 1000.0
#: Share of the incident's points, on each side, that cannot carry a score alone.
TRIM = 0.05
#: A series needs this many finite points in each window to be scored.
MIN_POINTS = 3
#: Points a series may have in one range query (Prometheus refuses more than 11,000).
_MAX_POINTS = 10_000
#: The label that tells a histogram's p50, p99 and rate apart inside one query.
_STAT = "aivitals_stat"

#: The smallest change of a level worth reading, by unit (gauges, quantiles).
_LEVEL_FLOOR: dict[str, float] = {
    "seconds": 1e-3,
    "bytes": float(2**20),
    "ratio": 1e-3,
    "percent": 0.1,
    "celsius": 1.0,
    "watts": 1.0,
    "joules": 1.0,
    "hertz": 1e6,
    "volts": 0.01,
    "amperes": 0.01,
    "meters": 0.01,
    "tokens": 1.0,
    "requests": 1.0,
}
#: ... and of a rate (counters, per second): one event a minute, a KiB a second,
#: a hundredth of a core.
_RATE_FLOOR: dict[str, float] = {"bytes": 1024.0, "seconds": 0.01, "joules": 1.0}
_EVENT_RATE_FLOOR = 1.0 / 60.0
#: Units with a level floor of their own; any other catalogue unit counts things
#: (requests, errors, threads, pages) and gets one thing as its floor.
_SUFFIX_UNITS = ("seconds", "bytes", "ratio", "percent", "celsius", "watts", "joules", "hertz")
#: Layer by name prefix, for metrics the catalogue and its aliases do not know.
_PREFIX_LAYERS: tuple[tuple[str, str], ...] = (
    ("gpu_", "model"),
    ("dcgm_", "model"),
    ("nvidia_", "model"),
    ("vllm:", "model"),
    ("tgi_", "model"),
    ("model_", "model"),
    ("node_", "infrastructure"),
    ("host_", "infrastructure"),
    ("kernel_", "infrastructure"),
    ("container_", "infrastructure"),
    ("http_", "service"),
    ("process_", "service"),
    ("service_", "service"),
    ("python_", "service"),
)
_NO_POINTS = "no points in either window"
_NAME = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?$", re.DOTALL)

Direction = Literal["up", "down"]
_Kind = Literal["gauge", "counter", "histogram", "unknown"]


@dataclass(frozen=True, slots=True)
class Change:
    """One series that moved between the baseline and the incident.

    ``metric`` is the family (a histogram's base name); ``stat`` says what was
    compared: ``value`` (a gauge), ``rate`` (a counter per second, or a
    histogram's requests per second), ``p50``/``p99`` (a histogram's quantiles).
    ``kind`` is ``gauge``, ``counter``, ``counter (inferred)`` (no type known,
    monotone data) or ``histogram``. ``layer`` comes from the signal catalogue
    (None when unknown). ``score`` is the mean excess beyond the band, in robust
    sigmas compressed logarithmically past it (see the module doc: ~10 for a
    30-sigma shift that holds, about 20 at most); ``shift`` the incident median's distance from
    the baseline median in the same sigmas; ``beyond`` the share of incident
    points outside the band on the ``direction`` side; ``scale`` the sigma used,
    in the series' own unit; ``siblings`` how many other series of the same
    family also changed (so a family cut to ``per_family`` entries still says
    how wide it moved).
    """

    metric: str
    stat: str
    labels: Mapping[str, str]
    layer: str | None
    kind: str
    unit: str
    baseline_median: float
    incident_median: float
    score: float
    shift: float
    direction: Direction
    beyond: float
    scale: float
    siblings: int = 0

    @property
    def series(self) -> str:
        """``metric:stat{labels}``, for display."""
        inner = ",".join(f'{k}="{v}"' for k, v in sorted(self.labels.items()))
        return f"{self.metric}:{self.stat}{{{inner}}}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "metric": self.metric,
            "stat": self.stat,
            "labels": dict(self.labels),
            "layer": self.layer,
            "kind": self.kind,
            "unit": self.unit,
            "baseline_median": self.baseline_median,
            "incident_median": self.incident_median,
            "score": self.score,
            "shift": self.shift,
            "direction": self.direction,
            "beyond": self.beyond,
            "scale": self.scale,
            "siblings": self.siblings,
        }


@dataclass(frozen=True, slots=True)
class ChangeRanking:
    """What ``rank_changes`` found: the ranked changes and what it could not look at.

    ``changes`` are ordered by score, at most ``per_family`` per family and
    ``limit`` in all, each with ``score >= min_score``. ``layers`` maps each
    layer that moved to its best score (highest first); ``unseen`` lists the
    families that were skipped (a query error, no points in a window) and why;
    ``queries`` counts the requests sent to the backend; ``series`` the series
    scored.
    """

    changes: tuple[Change, ...]
    layers: tuple[tuple[str, float], ...]
    unseen: tuple[Unseen, ...]
    baseline: tuple[float, float]
    incident: tuple[float, float]
    step: float
    queries: int
    families: int
    series: int
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def top_layer(self) -> str | None:
        """The layer whose best change scores highest, or None when nothing moved."""
        return self.layers[0][0] if self.layers else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "changes": [c.to_dict() for c in self.changes],
            "layers": [[layer, score] for layer, score in self.layers],
            "top_layer": self.top_layer,
            "unseen": [{"what": u.what, "why": u.why} for u in self.unseen],
            "baseline": list(self.baseline),
            "incident": list(self.incident),
            "step": self.step,
            "queries": self.queries,
            "families": self.families,
            "series": self.series,
            "notes": list(self.notes),
        }


# ----------------------------------------------------------------- families


@dataclass(frozen=True, slots=True)
class _Family:
    """One metric family to fetch: its query kind and what is known of it."""

    name: str
    kind: _Kind
    matchers: str
    layer: str | None
    unit: str
    unit_scale: float  # foreign unit -> catalogue unit (an alias such as DCGM MiB)


def _spec_of(name: str) -> tuple[signals.MetricSpec | None, float]:
    spec = signals.family_of(name)
    if spec is not None:
        return spec, 1.0
    translated = signals.translate(name)
    if translated is not None:
        ours, scale, _ = translated
        return signals.family_of(ours), scale
    return None, 1.0


def _layer_by_prefix(name: str) -> str | None:
    low = name.lower()
    return next((layer for prefix, layer in _PREFIX_LAYERS if low.startswith(prefix)), None)


def _unit_by_suffix(name: str) -> str:
    base = name.removesuffix("_total")
    for unit in _SUFFIX_UNITS:
        if base.endswith("_" + unit):
            return unit
    return ""


def _families(names: Sequence[tuple[str, str]]) -> list[_Family]:
    """Group sample names into families: a histogram's ``_bucket/_sum/_count`` are one."""
    present = {n for n, _ in names}
    out: dict[str, _Family] = {}
    for name, matchers in names:
        if name.startswith("ALERTS"):  # the rule engine's own bookkeeping, not a signal
            continue
        spec, unit_scale = _spec_of(name)
        base, kind = name, _kind(spec, name)
        if name.endswith("_bucket"):
            base, kind = name.removesuffix("_bucket"), "histogram"
        for suffix in ("_count", "_sum"):
            if name.endswith(suffix) and name.removesuffix(suffix) + "_bucket" in present:
                base, kind = name.removesuffix(suffix), "histogram"
        if kind is None:
            continue
        layer = spec.layer.value if spec is not None else _layer_by_prefix(base)
        unit = spec.unit if spec is not None else _unit_by_suffix(base)
        out.setdefault(base + matchers, _Family(base, kind, matchers, layer, unit, unit_scale))
    return sorted(out.values(), key=lambda f: (f.name, f.matchers))


def _kind(spec: signals.MetricSpec | None, name: str) -> _Kind | None:
    if spec is None:
        return "counter" if name.endswith(("_total", "_count", "_sum")) else "unknown"
    if spec.type is MetricType.INFO:
        return None  # labels, not a level: nothing to compare
    if spec.type is MetricType.HISTOGRAM:
        # The family's base name asks for the histogram; its _count or _sum alone is a counter.
        return "histogram" if name == spec.name else "counter"
    return "counter" if spec.type is MetricType.COUNTER else "gauge"


def _query(fam: _Family, window: float, quantiles: Sequence[float]) -> str:
    w = _fmt_duration(window)
    m = fam.matchers
    if fam.kind == "histogram":
        parts = [
            f"label_replace(histogram_quantile({q:g}, rate({fam.name}_bucket{m}[{w}])), "
            f'"{_STAT}", "p{_pct(q)}", "", "")'
            for q in quantiles
        ]
        parts.append(f'label_replace(rate({fam.name}_count{m}[{w}]), "{_STAT}", "rate", "", "")')
        return " or ".join(parts)
    if fam.kind == "counter":
        return f"rate({fam.name}{m}[{w}])"
    return f"{fam.name}{m}"


def _pct(q: float) -> str:
    return f"{q * 100:g}".replace(".", "_")


def _fmt_duration(seconds: float) -> str:
    ms = max(1, round(seconds * 1000))
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


# ----------------------------------------------------------------- scoring


@dataclass(frozen=True, slots=True)
class _Score:
    baseline_median: float
    incident_median: float
    scale: float
    score: float
    shift: float
    direction: Direction
    beyond: float


def _score(
    base: npt.NDArray[np.float64],
    inc: npt.NDArray[np.float64],
    *,
    band: float,
    relative_floor: float,
    floor: float,
) -> _Score:
    med_b = float(np.median(base))
    med_i = float(np.median(inc))
    mad = float(np.median(np.abs(base - med_b)))
    scale = max(_MAD_SIGMA * mad, relative_floor * abs(med_b), floor)
    diff = inc - med_b
    if scale > 0:
        z = np.clip(diff / scale, -Z_CAP, Z_CAP)
        shift = max(-Z_CAP, min(Z_CAP, (med_i - med_b) / scale))
    else:  # flat baseline, unit unknown: any departure is as far as it can be
        z = np.sign(diff) * Z_CAP
        shift = math.copysign(Z_CAP, med_i - med_b) if med_i != med_b else 0.0
    n = len(z)
    # Winsorize: the most extreme TRIM of the incident on each side (one point at least)
    # is pulled in to the next, so a lone spike cannot carry a score; a change that
    # lasts longer than that keeps its full size.
    k = max(1, math.ceil(TRIM * n))
    if n > 2 * k:
        ordered = np.sort(z)
        z = np.clip(z, ordered[k], ordered[n - 1 - k])
    up, down = z > band, z < -band
    # Past the band a point counts logarithmically: on quantized or flat baselines z runs
    # into the hundreds, and a shift that holds should outrank a louder one that flickers.
    excess = band * (1.0 + np.log(np.maximum(np.abs(z), band) / band))
    mass_up, mass_down = float(excess[up].sum()) / n, float(excess[down].sum()) / n
    if mass_up > mass_down or (mass_up == mass_down and shift >= 0):
        return _Score(med_b, med_i, scale, mass_up, shift, "up", float(up.mean()))
    return _Score(med_b, med_i, scale, mass_down, shift, "down", float(down.mean()))


def _floor(unit: str, stat: str, unit_scale: float) -> float:
    if stat == "rate":  # counters count things: one a minute, unless the unit says bytes or seconds
        f = _RATE_FLOOR.get(unit, _EVENT_RATE_FLOOR)
    elif unit:
        f = _LEVEL_FLOOR.get(unit, 1.0)
    else:
        return 0.0
    # The data is in the foreign unit (an alias's): e.g. DCGM MiB where ours is bytes.
    return f / unit_scale if unit_scale > 0 else f


def _is_counter(series: Sequence[tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]]) -> bool:
    """Unknown type: a counter if nothing ever falls (but for a reset) and it rises in the baseline.

    A gauge that only climbs during the incident (a leak) has a flat baseline
    and stays a gauge; a counter of events that never happened in the baseline
    is compared as a level, which still shows it rose.
    """
    rising = False
    for base, inc in series:
        for part in (base, inc):
            if len(part) < 2:
                continue
            if np.any(part < 0):
                return False
            d = np.diff(part)
            falls = d < 0
            # A reset drops to (near) zero; any other fall means a gauge.
            if np.count_nonzero(falls) > 1 or np.any(part[1:][falls] > 0.5 * part[:-1][falls]):
                return False
        if len(base) > 1 and np.count_nonzero(np.diff(base) > 0) >= MIN_POINTS:
            rising = True
    return rising


def _local_rate(t: npt.NDArray[np.float64], v: npt.NDArray[np.float64], window: float) -> _Points:
    """``rate()`` computed from the points: the reset-adjusted increase over ``window`` or more.

    Per step would alias: points taken every 5 s from a counter scraped every
    15 s rise on one step in three, a rate of 0, 0, 3x that no baseline survives.
    """
    if len(v) < 2:
        return t[:0], v[:0]
    d = np.diff(v)
    d = np.where(d < 0, v[1:], d)  # a reset: the counter restarted from zero
    grown = np.concatenate(([0.0], np.cumsum(d)))
    j = np.searchsorted(t, t - window, side="right") - 1  # the newest point >= window back
    ok = (j >= 0) & (t - t[np.maximum(j, 0)] <= 2 * window)  # not across a gap between windows
    i, j = np.nonzero(ok)[0], j[ok]
    return t[i], (grown[i] - grown[j]) / (t[i] - t[j])


# ----------------------------------------------------------------- the API


def rank_changes(
    backend: Backend,
    baseline: tuple[float, float],
    incident: tuple[float, float],
    *,
    selector: str | Sequence[str] | None = None,
    step: float | None = None,
    limit: int = 10,
    per_family: int = 3,
    min_score: float = 1.0,
    band: float = 3.0,
    relative_floor: float = 0.05,
    rate_window: float | None = None,
    quantiles: Sequence[float] = (0.5, 0.99),
    max_families: int = 1000,
    workers: int = 1,
    exclude: str | None = DEFAULT_EXCLUDE,
) -> ChangeRanking:
    """Rank the series that changed most from ``baseline`` to ``incident``.

    ::

        from aivitals.diagnose import rank_changes
        r = rank_changes(store, baseline=(t0, t1), incident=(t1, t2))
        r.top_layer, [(c.series, round(c.score, 1)) for c in r.changes[:3]]

    ``baseline`` and ``incident`` are ``(start, end)`` in epoch seconds; the
    baseline ends before the incident starts. ``selector`` is a metric name or
    a list of them, each optionally with matchers (``'http_requests_total{job="api"}'``);
    without it every metric name is discovered (``label_values`` on the embedded
    store, one instant query otherwise), except the names ``exclude`` matches
    (a full-match regex; default ``DEFAULT_EXCLUDE``: recording-rule outputs,
    which repeat the raw series they are computed from, and what the monitoring
    system reports about itself; ``None`` keeps every name). ``step`` (default: a sixtieth of the
    shorter window, at most 10,000 points a query) is the resolution; counters
    are turned into rates over ``rate_window`` (default ``max(4 * step, min(60 s,
    shorter window / 4))``: a minute, so four 15 s scrapes, unless a window is too
    short to hold four of those rates).
    Queries: one range query per family when the windows are at most one window
    apart, two when they are further apart, plus one for discovery on a
    remote backend; ``workers`` sends that many at once (worth it on a remote
    backend only: the embedded store computes under one lock and the GIL; the
    order of the result does not depend on it). A family whose query fails is skipped and listed in
    ``unseen``; non-finite points (NaN, Inf, stale) are dropped.

    ``ConfigError`` for an empty, reversed or overlapping window or a bad setting.
    """
    b0, b1 = _window("baseline", baseline)
    i0, i1 = _window("incident", incident)
    if b1 > i0:
        raise ConfigError(
            f"the baseline ({b0:g}..{b1:g}) must end before the incident ({i0:g}..{i1:g}) starts"
        )
    if not isinstance(backend, Backend):
        raise ConfigError(f"backend must implement query/query_range, got {type(backend).__name__}")
    _check_settings(
        limit, per_family, min_score, band, relative_floor, quantiles, max_families, workers
    )
    shorter = min(b1 - b0, i1 - i0)
    joined = (i0 - b1) <= max(b1 - b0, i1 - i0)
    spans = [(b0, i1)] if joined else [(b0, b1), (i0, i1)]
    widest = max(e - s for s, e in spans)
    if step is None:
        step = max(shorter / 60.0, widest / _MAX_POINTS, 1e-3)
    elif not (isinstance(step, int | float) and math.isfinite(step) and step > 0):
        raise ConfigError(f"step must be a positive number of seconds, got {step!r}")
    step = float(step)
    if shorter / step + 1 < MIN_POINTS:
        raise ConfigError(
            f"a window of {shorter:g}s holds fewer than {MIN_POINTS} points at step {step:g}s"
        )
    if widest / step > _MAX_POINTS:
        raise ConfigError(
            f"step {step:g}s asks for {widest / step:.0f} points a series in one query, over "
            f"{_MAX_POINTS} (Prometheus refuses 11,000): use {widest / _MAX_POINTS:g}s or more"
        )
    window = max(4 * step, min(60.0, shorter / 4)) if rate_window is None else rate_window
    if (
        isinstance(window, bool)
        or not isinstance(window, int | float)
        or not (math.isfinite(window) and window > 0)
    ):
        raise ConfigError(f"rate_window must be a positive number of seconds, got {rate_window!r}")
    window = float(window)

    queries = 0
    unseen: list[Unseen] = []
    notes: list[str] = []
    if exclude is not None and not isinstance(exclude, str):
        raise ConfigError(f"exclude must be a regex string or None, got {exclude!r}")
    if selector is None:
        names, used_query = _discover(backend, i1)
        queries += used_query
        if exclude is not None:
            try:
                skip = re.compile(exclude)
            except re.error as exc:
                raise ConfigError(f"exclude {exclude!r} is not a regex: {exc}") from None
            names = [(n, m) for n, m in names if not skip.fullmatch(n)]
        if not names:
            unseen.append(Unseen("metrics", "the backend returned no metric names"))
    else:
        names = _parse_selector(selector)
    families = _families(names)
    if len(families) > max_families:
        unseen.append(
            Unseen(f"{len(families) - max_families} families", f"over max_families={max_families}")
        )
        families = families[:max_families]

    found: list[Change] = []
    n_series = 0

    def fetch(fam: _Family) -> tuple[list[QueryResult], int, AivitalsError | None]:
        expr = _query(fam, window, quantiles)
        results: list[QueryResult] = []
        try:
            for s, e in spans:
                results.append(backend.query_range(expr, s, e, step))
        except AivitalsError as exc:
            return results, len(results) + 1, exc
        return results, len(results), None

    if workers > 1 and len(families) > 1:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            fetched = list(pool.map(fetch, families))  # in family order: a stable ranking
    else:
        fetched = [fetch(fam) for fam in families]
    for fam, (results, sent, error) in zip(families, fetched, strict=True):
        queries += sent
        if error is not None:
            unseen.append(Unseen(fam.name + fam.matchers, f"{type(error).__name__}: {error}"))
            continue
        for res in results:
            notes += [f"{fam.name}: partial answer: {w}" for w in res.warnings]
        changes, scored, skipped = _score_family(
            fam,
            results,
            (b0, b1),
            (i0, i1),
            band=band,
            relative_floor=relative_floor,
            window=window,
        )
        n_series += scored
        # A discovered name with no points in either window was simply not around then;
        # one the caller asked for is worth saying.
        if skipped and (selector is not None or scored or skipped != _NO_POINTS):
            unseen.append(Unseen(fam.name + fam.matchers, skipped))
        found += changes
    return _assemble(
        found,
        unseen,
        notes,
        limit=limit,
        per_family=per_family,
        min_score=min_score,
        baseline=(b0, b1),
        incident=(i0, i1),
        step=step,
        queries=queries,
        families=len(families),
        series=n_series,
    )


def _window(what: str, value: object) -> tuple[float, float]:
    if not (isinstance(value, tuple | list) and len(value) == 2):
        raise ConfigError(f"{what} must be a (start, end) pair of epoch seconds, got {value!r}")
    start, end = value
    for v in (start, end):
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            raise ConfigError(f"{what} must hold finite epoch seconds, got {value!r}")
    if end == start:
        raise ConfigError(f"{what} window is empty ({start:g}..{end:g})")
    if end < start:
        raise ConfigError(
            f"{what} window is reversed: it ends ({end:g}) before it starts ({start:g})"
        )
    return float(start), float(end)


def _check_settings(
    limit: int,
    per_family: int,
    min_score: float,
    band: float,
    relative_floor: float,
    quantiles: Sequence[float],
    max_families: int,
    workers: int,
) -> None:
    counts = (
        ("limit", limit),
        ("per_family", per_family),
        ("max_families", max_families),
        ("workers", workers),
    )
    for key, n in counts:
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ConfigError(f"{key} must be a positive integer, got {n!r}")
    for key, x in (("min_score", min_score), ("relative_floor", relative_floor)):
        if not (isinstance(x, int | float) and math.isfinite(x) and x >= 0):
            raise ConfigError(f"{key} must be a number >= 0, got {x!r}")
    if not (isinstance(band, int | float) and math.isfinite(band) and band > 0):
        raise ConfigError(f"band must be a positive number of sigmas, got {band!r}")
    if not quantiles or not all(isinstance(q, float) and 0 < q < 1 for q in quantiles):
        raise ConfigError(f"quantiles must be floats in (0, 1), got {quantiles!r}")


def _discover(backend: Backend, at: float) -> tuple[list[tuple[str, str]], int]:
    values: Callable[[str], Sequence[str]] | None = getattr(backend, "label_values", None)
    if callable(values):
        return [(n, "") for n in values("__name__")], 0
    res = backend.query('group by (__name__) ({__name__=~".+"})', at)
    return sorted({(s.labels["__name__"], "") for s in res.vector if "__name__" in s.labels}), 1


def _parse_selector(selector: str | Sequence[str]) -> list[tuple[str, str]]:
    items = [selector] if isinstance(selector, str) else list(selector)
    if not items:
        raise ConfigError("selector is empty: name at least one metric, or pass None to discover")
    out: list[tuple[str, str]] = []
    for item in items:
        m = _NAME.match(item.strip()) if isinstance(item, str) else None
        if m is None:
            raise ConfigError(f"selector {item!r} is not a metric name with optional {{matchers}}")
        out.append((m.group(1), m.group(2) or ""))
    return out


_Points = tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]


def _points(points: Sequence[tuple[float, float]]) -> _Points:
    arr = np.asarray(points, dtype=np.float64).reshape(-1, 2)
    arr = arr[np.argsort(arr[:, 0], kind="stable")]
    keep = np.isfinite(arr[:, 1])
    return arr[keep, 0], arr[keep, 1]


def _split(
    t: npt.NDArray[np.float64], v: npt.NDArray[np.float64], win: tuple[float, float]
) -> npt.NDArray[np.float64]:
    return v[(t >= win[0]) & (t <= win[1])]


def _score_family(
    fam: _Family,
    results: Sequence[QueryResult],
    base_win: tuple[float, float],
    inc_win: tuple[float, float],
    *,
    band: float,
    relative_floor: float,
    window: float,
) -> tuple[list[Change], int, str]:
    by_labels: dict[tuple[tuple[str, str], ...], list[tuple[float, float]]] = {}
    for res in results:
        for rs in res.matrix:
            key = tuple(sorted((k, v) for k, v in rs.labels.items() if k != "__name__"))
            by_labels.setdefault(key, []).extend(rs.points)
    if not by_labels:
        return [], 0, _NO_POINTS
    raw = {k: _points(p) for k, p in by_labels.items()}
    kind: str = fam.kind
    if kind == "unknown":
        counter = _is_counter(
            [(_split(t, v, base_win), _split(t, v, inc_win)) for t, v in raw.values()]
        )
        kind = "counter (inferred)" if counter else "gauge"
    changes: list[Change] = []
    no_base = no_inc = 0
    for key, (t, v) in raw.items():
        labels = dict(key)
        stat = labels.pop(_STAT, "rate" if kind.startswith("counter") else "value")
        if kind == "counter (inferred)":
            t, v = _local_rate(t, v, window)
        bv, iv = _split(t, v, base_win), _split(t, v, inc_win)
        if len(bv) < MIN_POINTS and stat == "rate" and len(iv) >= MIN_POINTS:
            # A counter that did not exist yet had counted nothing.
            bv = np.zeros(MIN_POINTS)
        if len(bv) < MIN_POINTS:
            no_base += 1
            continue
        if len(iv) < MIN_POINTS:
            no_inc += 1
            continue
        # A histogram's rate counts observations, whatever unit the observations have.
        unit = "" if fam.kind == "histogram" and stat == "rate" else fam.unit
        floor = _floor(unit, stat, fam.unit_scale)
        s = _score(bv, iv, band=band, relative_floor=relative_floor, floor=floor)
        changes.append(
            Change(
                metric=fam.name,
                stat=stat,
                labels=labels,
                layer=fam.layer,
                kind=kind,
                unit=(f"{unit}/s" if unit else "1/s") if stat == "rate" else unit,
                baseline_median=s.baseline_median,
                incident_median=s.incident_median,
                score=s.score,
                shift=s.shift,
                direction=s.direction,
                beyond=s.beyond,
                scale=s.scale,
            )
        )
    why = []
    if no_base:
        why.append(f"{no_base} series with under {MIN_POINTS} finite points in the baseline")
    if no_inc:
        why.append(f"{no_inc} series with under {MIN_POINTS} finite points in the incident")
    return changes, len(changes), "; ".join(why)


def _assemble(
    found: list[Change],
    unseen: list[Unseen],
    notes: list[str],
    *,
    limit: int,
    per_family: int,
    min_score: float,
    baseline: tuple[float, float],
    incident: tuple[float, float],
    step: float,
    queries: int,
    families: int,
    series: int,
) -> ChangeRanking:
    # One entry per series: its p50, p99 and rate are one series moving, keep the strongest.
    best: dict[tuple[str, tuple[tuple[str, str], ...]], Change] = {}
    for c in found:
        if c.score < min_score:
            continue
        key = (c.metric, tuple(sorted(c.labels.items())))
        if key not in best or c.score > best[key].score:
            best[key] = c
    ranked = sorted(best.values(), key=lambda c: (-c.score, -abs(c.shift), c.series))
    moved: dict[str, int] = {}
    layers: dict[str, float] = {}
    for c in ranked:
        moved[c.metric] = moved.get(c.metric, 0) + 1
        if c.layer is not None:
            layers[c.layer] = max(layers.get(c.layer, 0.0), c.score)
    shown: list[Change] = []
    per: dict[str, int] = {}
    for c in ranked:
        if len(shown) >= limit:
            break
        if per.get(c.metric, 0) >= per_family:
            continue
        per[c.metric] = per.get(c.metric, 0) + 1
        shown.append(_with_siblings(c, moved[c.metric] - 1))
    return ChangeRanking(
        changes=tuple(shown),
        layers=tuple(sorted(layers.items(), key=lambda kv: (-kv[1], kv[0]))),
        unseen=tuple(unseen),
        baseline=baseline,
        incident=incident,
        step=step,
        queries=queries,
        families=families,
        series=series,
        notes=tuple(notes),
    )


def _with_siblings(c: Change, siblings: int) -> Change:
    return replace(c, siblings=siblings)
