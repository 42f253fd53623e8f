"""PromQL functions, as Prometheus 2.x computes them.

Range-vector functions see, per step, the samples of each series inside the
closed window ``[t - range, t]``. ``rate``/``increase``/``delta`` use
Prometheus's extrapolation: the result is scaled from the sampled interval
towards the window edges, by at most half an average sample spacing where the
series starts or ends well inside the window, and never below a counter's
zero point.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

import numpy as np
import promql_parser as pp

from ..errors import QueryError, UnsupportedQueryError
from ._aggregate import quantile
from ._engine import Context, evaluate, expect_scalar, expect_vector, select_instant
from ._series import Labels
from ._values import (
    Floats,
    Matrix,
    RawSeries,
    Scalar,
    String,
    Value,
    Vec,
    VecSeries,
    drop_name,
    merge_same_labels,
)

__all__ = ["SUPPORTED", "call"]

_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")


def call(ctx: Context, node: Any) -> Value:
    name = node.func.name
    impl = _FUNCS.get(name)
    if impl is None:
        raise UnsupportedQueryError(f"function {name}()", expr=ctx.expr)
    return impl(ctx, list(node.args))


# -------------------------------------------------------------- range vectors


def _matrix(ctx: Context, arg: Any, name: str) -> Matrix:
    value = evaluate(ctx, arg)
    if not isinstance(value, Matrix):
        raise QueryError(f"{name}() needs a range vector", expr=ctx.expr)
    return value


StepFn = Callable[[RawSeries, Any, Any, Matrix], tuple[Floats, Any]]


def _over_range(ctx: Context, mat: Matrix, fn: StepFn, *, keep_name: bool = False) -> Vec:
    out = []
    for raw in mat.series:
        lo, hi = mat.bounds(raw)
        value, mask = fn(raw, lo, hi, mat)
        if mask.any():
            labels = raw.labels if keep_name else drop_name(raw.labels)
            out.append(VecSeries(labels, value, mask))
    return Vec(merge_same_labels(out))


def _windowed(reduce: Callable[[list[float]], float]) -> StepFn:
    """A function of each window's values, computed in Python in Prometheus's order."""

    def run(raw: RawSeries, lo: Any, hi: Any, _mat: Matrix) -> tuple[Floats, Any]:
        out = np.full(len(lo), np.nan)
        mask = hi > lo
        for i in np.flatnonzero(mask):
            out[i] = reduce(raw.v[lo[i] : hi[i]].tolist())
        return out, mask

    return run


def _sum_values(values: list[float]) -> float:
    total = 0.0
    for v in values:
        total += v
    return total


def _avg_values(values: list[float]) -> float:
    mean, count = 0.0, 0.0
    for v in values:
        count += 1
        if math.isinf(mean):
            if math.isinf(v) and (mean > 0) == (v > 0):
                continue
            if not math.isinf(v) and not math.isnan(v):
                continue
        mean += v / count - mean / count
    return mean


def _min_values(values: list[float]) -> float:
    best = values[0]
    for v in values:
        if v < best or math.isnan(best):
            best = v
    return best


def _max_values(values: list[float]) -> float:
    best = values[0]
    for v in values:
        if v > best or math.isnan(best):
            best = v
    return best


def _stdvar_values(values: list[float]) -> float:
    count = mean = aux = 0.0
    for v in values:
        count += 1
        delta = v - mean
        mean += delta / count
        aux += delta * (v - mean)
    return aux / count


def _changes(values: list[float]) -> float:
    changes = 0
    prev = values[0]
    for cur in values[1:]:
        if cur != prev and not (math.isnan(cur) and math.isnan(prev)):
            changes += 1
        prev = cur
    return float(changes)


def _resets(values: list[float]) -> float:
    resets = 0
    prev = values[0]
    for cur in values[1:]:
        if cur < prev:
            resets += 1
        prev = cur
    return float(resets)


def _count_fn(raw: RawSeries, lo: Any, hi: Any, _mat: Matrix) -> tuple[Floats, Any]:
    n = (hi - lo).astype(np.float64)
    return n, n > 0


def _last_fn(raw: RawSeries, lo: Any, hi: Any, _mat: Matrix) -> tuple[Floats, Any]:
    mask = hi > lo
    return raw.v[np.where(mask, hi - 1, 0)], mask


def _present_fn(raw: RawSeries, lo: Any, hi: Any, _mat: Matrix) -> tuple[Floats, Any]:
    return np.ones(len(lo)), hi > lo


def _extrapolated(counter: bool, rate: bool) -> StepFn:
    def run(raw: RawSeries, lo: Any, hi: Any, mat: Matrix) -> tuple[Floats, Any]:
        return _extrapolated_rate(raw, lo, hi, mat, counter=counter, rate=rate)

    return run


def _extrapolated_rate(
    raw: RawSeries, lo: Any, hi: Any, mat: Matrix, *, counter: bool, rate: bool
) -> tuple[Floats, Any]:
    mask = (hi - lo) >= 2
    if not mask.any():
        return np.zeros(len(lo)), mask
    first = np.where(mask, lo, 0)
    last = np.where(mask, hi - 1, 0)
    t, v = raw.t, raw.v
    result = v[last] - v[first]
    if counter:
        drops = np.where(v[1:] < v[:-1], v[:-1], 0.0)
        corrections = np.concatenate(([0.0], np.cumsum(drops)))
        result = result + (corrections[last] - corrections[first])
    ends, rng = mat.ends, mat.range_ms
    duration_to_start = (t[first] - (ends - rng)) / 1000
    duration_to_end = (ends - t[last]) / 1000
    sampled = (t[last] - t[first]) / 1000
    average = sampled / np.maximum(hi - lo - 1, 1)
    if counter:
        to_zero = sampled * (v[first] / result)
        use_zero = (result > 0) & (v[first] >= 0) & (to_zero < duration_to_start)
        duration_to_start = np.where(use_zero, to_zero, duration_to_start)
    threshold = average * 1.1
    interval = sampled + np.where(duration_to_start < threshold, duration_to_start, average / 2)
    interval = interval + np.where(duration_to_end < threshold, duration_to_end, average / 2)
    factor = interval / sampled
    if rate:
        factor = factor / (rng / 1000)
    return result * factor, mask


def _instant_delta(is_rate: bool) -> StepFn:
    def run(raw: RawSeries, lo: Any, hi: Any, _mat: Matrix) -> tuple[Floats, Any]:
        mask = (hi - lo) >= 2
        if len(raw.t) < 2:
            return np.zeros(len(lo)), mask
        last = np.where(mask, hi - 1, 1)
        prev = last - 1
        lv, pv = raw.v[last], raw.v[prev]
        gap = (raw.t[last] - raw.t[prev]).astype(np.float64)
        result = np.where(lv < pv, lv, lv - pv) / (gap / 1000) if is_rate else lv - pv
        return result, mask & (gap > 0)

    return run


def _regression(raw: RawSeries, lo: int, hi: int, intercept_ms: int) -> tuple[float, float]:
    ts = raw.t[lo:hi].tolist()
    vs = raw.v[lo:hi].tolist()
    if all(v == vs[0] for v in vs):
        if math.isinf(vs[0]):
            return math.nan, math.nan
        return 0.0, vs[0]
    n = sum_x = sum_y = sum_xy = sum_x2 = 0.0
    for t, v in zip(ts, vs, strict=True):
        x = (t - intercept_ms) / 1e3
        n += 1
        sum_x += x
        sum_y += v
        sum_xy += x * v
        sum_x2 += x * x
    cov_xy = sum_xy - sum_x * sum_y / n
    var_x = sum_x2 - sum_x * sum_x / n
    slope = cov_xy / var_x
    return slope, sum_y / n - slope * sum_x / n


def _deriv_fn(raw: RawSeries, lo: Any, hi: Any, _mat: Matrix) -> tuple[Floats, Any]:
    out = np.full(len(lo), np.nan)
    mask = (hi - lo) >= 2
    for i in np.flatnonzero(mask):
        out[i] = _regression(raw, int(lo[i]), int(hi[i]), int(raw.t[lo[i]]))[0]
    return out, mask


def _range_call(
    ctx: Context, args: list[Any], name: str, fn: StepFn, *, keep_name: bool = False
) -> Vec:
    return _over_range(ctx, _matrix(ctx, args[0], name), fn, keep_name=keep_name)


def _simple_range(name: str, fn: StepFn, keep_name: bool = False) -> Callable[..., Value]:
    def run(ctx: Context, args: list[Any]) -> Value:
        return _range_call(ctx, args, name, fn, keep_name=keep_name)

    return run


def _predict_linear(ctx: Context, args: list[Any]) -> Value:
    mat = _matrix(ctx, args[0], "predict_linear")
    duration = expect_scalar(ctx, evaluate(ctx, args[1]), "predict_linear()")
    at_fixed = getattr(mat.selector, "at", None) is not None
    intercepts = np.full(ctx.n, ctx.start_ms) if at_fixed else ctx.ts

    def fn(raw: RawSeries, lo: Any, hi: Any, _mat: Matrix) -> tuple[Floats, Any]:
        out = np.full(len(lo), np.nan)
        mask = (hi - lo) >= 2
        for i in np.flatnonzero(mask):
            slope, icept = _regression(raw, int(lo[i]), int(hi[i]), int(intercepts[i]))
            out[i] = slope * float(duration[i]) + icept
        return out, mask

    return _over_range(ctx, mat, fn)


def _quantile_over_time(ctx: Context, args: list[Any]) -> Value:
    q = expect_scalar(ctx, evaluate(ctx, args[0]), "quantile_over_time()")
    mat = _matrix(ctx, args[1], "quantile_over_time")

    def fn(raw: RawSeries, lo: Any, hi: Any, _mat: Matrix) -> tuple[Floats, Any]:
        out = np.full(len(lo), np.nan)
        mask = hi > lo
        for i in np.flatnonzero(mask):
            out[i] = quantile(float(q[i]), raw.v[lo[i] : hi[i]].tolist())
        return out, mask

    return _over_range(ctx, mat, fn)


def _absent_over_time(ctx: Context, args: list[Any]) -> Value:
    mat = _matrix(ctx, args[0], "absent_over_time")
    seen = np.zeros(ctx.n, dtype=bool)
    for raw in mat.series:
        lo, hi = mat.bounds(raw)
        seen |= hi > lo
    arg = args[0]
    labels = _absent_labels(arg.vector_selector) if isinstance(arg, pp.MatrixSelector) else ()
    return Vec([VecSeries(labels, np.ones(ctx.n), ~seen)] if (~seen).any() else [])


# ------------------------------------------------------------ instant vectors


def _vector_arg(ctx: Context, arg: Any, name: str) -> Vec:
    return expect_vector(ctx, evaluate(ctx, arg), f"{name}()")


def _math(fn: Callable[[Floats], Floats], name: str) -> Callable[..., Value]:
    def run(ctx: Context, args: list[Any]) -> Value:
        vec = _vector_arg(ctx, args[0], name)
        out = [VecSeries(drop_name(s.labels), fn(s.v), s.m) for s in vec.series]
        return Vec(merge_same_labels(out))

    return run


def _round(ctx: Context, args: list[Any]) -> Value:
    vec = _vector_arg(ctx, args[0], "round")
    to = expect_scalar(ctx, evaluate(ctx, args[1]), "round()") if len(args) > 1 else None
    inverse = np.ones(ctx.n) if to is None else 1.0 / to
    out = [
        VecSeries(drop_name(s.labels), np.floor(s.v * inverse + 0.5) / inverse, s.m)
        for s in vec.series
    ]
    return Vec(merge_same_labels(out))


def _clamp(ctx: Context, args: list[Any], lower: bool, upper: bool) -> Value:
    vec = _vector_arg(ctx, args[0], "clamp")
    scalars = [expect_scalar(ctx, evaluate(ctx, a), "clamp()") for a in args[1:]]
    lo = scalars[0] if lower else None
    hi = scalars[-1] if upper else None
    ok = np.ones(ctx.n, dtype=bool) if lo is None or hi is None else hi >= lo
    out = []
    for s in vec.series:
        v = s.v
        if hi is not None:
            v = np.minimum(hi, v)
        if lo is not None:
            v = np.maximum(lo, v)
        out.append(VecSeries(drop_name(s.labels), v, s.m & ok))
    return Vec(merge_same_labels(out))


def _timestamp(ctx: Context, args: list[Any]) -> Value:
    arg = args[0]
    if isinstance(arg, pp.VectorSelector):
        vec, times = select_instant(ctx, arg)
        out = [
            VecSeries(drop_name(s.labels), t.astype(np.float64) / 1000, s.m)
            for s, t in zip(vec.series, times, strict=True)
        ]
    else:
        vec = _vector_arg(ctx, arg, "timestamp")
        secs = ctx.ts.astype(np.float64) / 1000
        out = [VecSeries(drop_name(s.labels), secs, s.m) for s in vec.series]
    return Vec(merge_same_labels(out))


def _time(ctx: Context, args: list[Any]) -> Value:
    return Scalar(ctx.ts.astype(np.float64) / 1000)


def _vector(ctx: Context, args: list[Any]) -> Value:
    v = expect_scalar(ctx, evaluate(ctx, args[0]), "vector()")
    return Vec([VecSeries((), v, np.ones(ctx.n, dtype=bool))])


def _scalar(ctx: Context, args: list[Any]) -> Value:
    vec = _vector_arg(ctx, args[0], "scalar")
    count = np.zeros(ctx.n)
    value = np.full(ctx.n, np.nan)
    for s in vec.series:
        count += s.m
        value = np.where(s.m, s.v, value)
    return Scalar(np.where(count == 1, value, np.nan))


def _absent_labels(vs: Any) -> Labels:
    seen: dict[str, str | None] = {}
    for m in vs.matchers.matchers:
        if m.op != pp.MatchOp.Equal or m.name == "__name__":
            continue
        seen[m.name] = None if m.name in seen else m.value
    return tuple(sorted((k, v) for k, v in seen.items() if v is not None and v != ""))


def _absent(ctx: Context, args: list[Any]) -> Value:
    vec = _vector_arg(ctx, args[0], "absent")
    seen = np.zeros(ctx.n, dtype=bool)
    for s in vec.series:
        seen |= s.m
    labels = _absent_labels(args[0]) if isinstance(args[0], pp.VectorSelector) else ()
    return Vec([VecSeries(labels, np.ones(ctx.n), ~seen)] if (~seen).any() else [])


def _sort(order: str) -> Callable[..., Value]:
    def run(ctx: Context, args: list[Any]) -> Value:
        vec = _vector_arg(ctx, args[0], "sort")
        return Vec(vec.series, order=order)

    return run


def _string_arg(ctx: Context, arg: Any, what: str) -> str:
    value = evaluate(ctx, arg)
    if not isinstance(value, String):
        raise QueryError(f"{what} must be a string", expr=ctx.expr)
    return value.s


def _go_expand(template: str, match: re.Match[str]) -> str:
    """Go's ``Regexp.ExpandString``: ``$1``, ``${1}``, ``$name``, ``${name}``, ``$$``."""
    out: list[str] = []
    i = 0
    while i < len(template):
        ch = template[i]
        if ch != "$" or i + 1 >= len(template):
            out.append(ch)
            i += 1
            continue
        nxt = template[i + 1]
        if nxt == "$":
            out.append("$")
            i += 2
            continue
        if nxt == "{":
            close = template.find("}", i + 2)
            name = template[i + 2 : close] if close > 0 else ""
            if close < 0 or not re.fullmatch(r"[A-Za-z0-9_]+", name):
                out.append("$")
                i += 1
                continue
            i = close + 1
        else:
            m = re.match(r"[A-Za-z0-9_]+", template[i + 1 :])
            if m is None:
                out.append("$")
                i += 1
                continue
            name = m.group(0)
            i += 1 + len(name)
        out.append(_group(match, name))
    return "".join(out)


def _group(match: re.Match[str], name: str) -> str:
    try:
        got = match.group(int(name)) if name.isdigit() else match.group(name)
    except IndexError:  # no such group: Go expands it to nothing
        return ""
    return got or ""


def _label_replace(ctx: Context, args: list[Any]) -> Value:
    vec = _vector_arg(ctx, args[0], "label_replace")
    dst, repl, src, regex = (_string_arg(ctx, a, "label_replace() argument") for a in args[1:5])
    try:
        rx = re.compile(f"^(?:{regex})$")
    except re.error as exc:
        raise QueryError(f"invalid regular expression in label_replace(): {regex!r}") from exc
    if not _LABEL_NAME.match(dst):
        raise QueryError(f"invalid destination label name in label_replace(): {dst!r}")
    out = []
    for s in vec.series:
        lab = dict(s.labels)
        m = rx.match(lab.get(src, ""))
        if m is not None:
            value = _go_expand(repl, m)
            if value:
                lab[dst] = value
            else:
                lab.pop(dst, None)
        out.append(VecSeries(tuple(sorted(lab.items())), s.v, s.m))
    return Vec(merge_same_labels(out))


def _label_join(ctx: Context, args: list[Any]) -> Value:
    vec = _vector_arg(ctx, args[0], "label_join")
    dst, sep, *srcs = (_string_arg(ctx, a, "label_join() argument") for a in args[1:])
    if not _LABEL_NAME.match(dst):
        raise QueryError(f"invalid destination label name in label_join(): {dst!r}")
    out = []
    for s in vec.series:
        lab = dict(s.labels)
        value = sep.join(lab.get(name, "") for name in srcs)
        if value:
            lab[dst] = value
        else:
            lab.pop(dst, None)
        out.append(VecSeries(tuple(sorted(lab.items())), s.v, s.m))
    return Vec(merge_same_labels(out))


def _histogram_quantile(ctx: Context, args: list[Any]) -> Value:
    q = expect_scalar(ctx, evaluate(ctx, args[0]), "histogram_quantile()")
    vec = _vector_arg(ctx, args[1], "histogram_quantile")
    groups: dict[Labels, list[tuple[float, VecSeries]]] = {}
    for s in vec.series:
        lab = dict(s.labels)
        try:
            upper = float(lab.pop("le"))
        except (KeyError, ValueError):
            continue  # not a bucket: Prometheus skips it
        lab.pop("__name__", None)
        groups.setdefault(tuple(sorted(lab.items())), []).append((upper, s))
    out = []
    for labels, buckets in groups.items():
        value = np.full(ctx.n, np.nan)
        present = np.zeros(ctx.n, dtype=bool)
        for _, s in buckets:
            present |= s.m
        for i in np.flatnonzero(present):
            points = [(ub, float(s.v[i])) for ub, s in buckets if s.m[i]]
            value[i] = bucket_quantile(float(q[i]), points)
        out.append(VecSeries(labels, value, present))
    return Vec(out)


def bucket_quantile(q: float, buckets: list[tuple[float, float]]) -> float:
    """The q-quantile of classic buckets ``(upper_bound, cumulative_count)``."""
    if math.isnan(q):
        return math.nan
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    buckets = sorted(buckets, key=lambda b: b[0])
    if not buckets or not math.isinf(buckets[-1][0]) or buckets[-1][0] < 0:
        return math.nan
    merged: list[list[float]] = []
    for ub, count in buckets:
        if merged and merged[-1][0] == ub:
            merged[-1][1] += count
        else:
            merged.append([ub, count])
    highest = -math.inf
    for b in merged:  # counts must not decrease (scrapes of buckets are not atomic)
        if b[1] > highest:
            highest = b[1]
        elif b[1] < highest:
            b[1] = highest
    if len(merged) < 2:
        return math.nan
    observations = merged[-1][1]
    if observations == 0:
        return math.nan
    rank = q * observations
    idx = next((i for i in range(len(merged) - 1) if merged[i][1] >= rank), len(merged) - 1)
    if idx == len(merged) - 1:
        return merged[-2][0]
    if idx == 0 and merged[0][0] <= 0:
        return merged[0][0]
    start, end, count = 0.0, merged[idx][0], merged[idx][1]
    if idx > 0:
        start = merged[idx - 1][0]
        count -= merged[idx - 1][1]
        rank -= merged[idx - 1][1]
    return start + (end - start) * (rank / count)


_FUNCS: dict[str, Callable[[Context, list[Any]], Value]] = {
    "rate": _simple_range("rate", _extrapolated(True, True)),
    "increase": _simple_range("increase", _extrapolated(True, False)),
    "delta": _simple_range("delta", _extrapolated(False, False)),
    "irate": _simple_range("irate", _instant_delta(True)),
    "idelta": _simple_range("idelta", _instant_delta(False)),
    "deriv": _simple_range("deriv", _deriv_fn),
    "predict_linear": _predict_linear,
    "avg_over_time": _simple_range("avg_over_time", _windowed(_avg_values)),
    "sum_over_time": _simple_range("sum_over_time", _windowed(_sum_values)),
    "min_over_time": _simple_range("min_over_time", _windowed(_min_values)),
    "max_over_time": _simple_range("max_over_time", _windowed(_max_values)),
    "count_over_time": _simple_range("count_over_time", _count_fn),
    "last_over_time": _simple_range("last_over_time", _last_fn, keep_name=True),
    "present_over_time": _simple_range("present_over_time", _present_fn),
    "stdvar_over_time": _simple_range("stdvar_over_time", _windowed(_stdvar_values)),
    "stddev_over_time": _simple_range(
        "stddev_over_time", _windowed(lambda v: math.sqrt(_stdvar_values(v)))
    ),
    "quantile_over_time": _quantile_over_time,
    "changes": _simple_range("changes", _windowed(_changes)),
    "resets": _simple_range("resets", _windowed(_resets)),
    "absent_over_time": _absent_over_time,
    "histogram_quantile": _histogram_quantile,
    "abs": _math(np.abs, "abs"),
    "ceil": _math(np.ceil, "ceil"),
    "floor": _math(np.floor, "floor"),
    "sqrt": _math(np.sqrt, "sqrt"),
    "exp": _math(np.exp, "exp"),
    "ln": _math(np.log, "ln"),
    "log2": _math(np.log2, "log2"),
    "log10": _math(np.log10, "log10"),
    "sgn": _math(np.sign, "sgn"),
    "round": _round,
    "clamp": lambda ctx, args: _clamp(ctx, args, True, True),
    "clamp_min": lambda ctx, args: _clamp(ctx, args, True, False),
    "clamp_max": lambda ctx, args: _clamp(ctx, args, False, True),
    "timestamp": _timestamp,
    "time": _time,
    "vector": _vector,
    "scalar": _scalar,
    "absent": _absent,
    "sort": _sort("asc"),
    "sort_desc": _sort("desc"),
    "label_replace": _label_replace,
    "label_join": _label_join,
}

#: Every function name the embedded evaluator implements.
SUPPORTED = frozenset(_FUNCS)
