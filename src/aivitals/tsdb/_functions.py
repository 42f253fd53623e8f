"""PromQL functions, as Prometheus 2.x computes them.

Range-vector functions see, per step, the samples of each series inside the
closed window ``[t - range, t]``. ``rate``/``increase``/``delta`` use
Prometheus's extrapolation: the result is scaled from the sampled interval
towards the window edges, by at most half an average sample spacing where the
series starts or ends well inside the window, and never below a counter's
zero point. Everything common is vectorised over all series and steps; the
rarer functions whose last bits depend on Prometheus's order of operations
(stddev, quantile, regression) run per window in that order.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import promql_parser as pp

from ..errors import QueryError, UnsupportedQueryError
from ._aggregate import quantile
from ._engine import Context, evaluate, expect_scalar, expect_vector, select_instant
from ._series import Labels
from ._values import (
    Floats,
    Ints,
    Mask,
    Matrix,
    Scalar,
    String,
    Value,
    Vec,
    drop_name,
    merge_same_labels,
)

__all__ = ["SUPPORTED", "bucket_quantile", "call"]

_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")

#: A range function: (matrix, lo, hi) -> (values, present), each (series, steps).
StepFn = Callable[[Matrix, Ints, Ints], tuple[Floats, Mask]]


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


def _over_range(mat: Matrix, fn: StepFn, *, keep_name: bool = False) -> Vec:
    if len(mat) == 0:
        return Vec.empty(len(mat.ends))
    lo, hi = mat.bounds()
    value, mask = fn(mat, lo, hi)
    labels = mat.labels if keep_name else [drop_name(lb) for lb in mat.labels]
    return merge_same_labels(Vec(labels, value, mask).nonempty())


def _reduceat(ufunc: Any) -> StepFn:
    """``ufunc`` over every window, one vectorised ``reduceat`` per step."""

    def run(mat: Matrix, lo: Ints, hi: Ints) -> tuple[Floats, Mask]:
        mask = hi > lo
        padded = np.append(mat.v, 0.0)  # reduceat needs every index < len
        out = np.full(lo.shape, np.nan)
        for j in range(lo.shape[1]):
            idx = np.empty(2 * lo.shape[0], dtype=np.int64)
            idx[0::2], idx[1::2] = lo[:, j], hi[:, j]
            out[:, j] = ufunc.reduceat(padded, idx)[0::2]
        return out, mask

    return run


def _avg_fn(mat: Matrix, lo: Ints, hi: Ints) -> tuple[Floats, Mask]:
    total, mask = _reduceat(np.add)(mat, lo, hi)
    return total / np.maximum(hi - lo, 1), mask


def _count_changes(flags: Mask) -> StepFn:
    def run(mat: Matrix, lo: Ints, hi: Ints) -> tuple[Floats, Mask]:
        mask = hi > lo
        cum = np.concatenate(([0], np.cumsum(flags)))  # cum[i] = flags before i
        top = len(cum) - 1
        # flags of the samples after the first of the window, up to its last
        counted = cum[np.minimum(hi, top)] - cum[np.minimum(lo + 1, top)]
        return np.where(mask, counted, 0).astype(np.float64), mask

    return run


def _changes_fn(mat: Matrix, lo: Ints, hi: Ints) -> tuple[Floats, Mask]:
    v = mat.v
    prev = np.concatenate(([np.nan], v[:-1]))
    flags = (v != prev) & ~(np.isnan(v) & np.isnan(prev))
    return _count_changes(flags)(mat, lo, hi)


def _resets_fn(mat: Matrix, lo: Ints, hi: Ints) -> tuple[Floats, Mask]:
    v = mat.v
    prev = np.concatenate(([np.nan], v[:-1]))
    return _count_changes(v < prev)(mat, lo, hi)


def _count_fn(mat: Matrix, lo: Ints, hi: Ints) -> tuple[Floats, Mask]:
    n = (hi - lo).astype(np.float64)
    return n, n > 0


def _last_fn(mat: Matrix, lo: Ints, hi: Ints) -> tuple[Floats, Mask]:
    mask = hi > lo
    return mat.v[np.where(mask, hi - 1, 0)], mask


def _present_fn(mat: Matrix, lo: Ints, hi: Ints) -> tuple[Floats, Mask]:
    return np.ones(lo.shape), hi > lo


def _extrapolated(counter: bool, rate: bool) -> StepFn:
    def run(mat: Matrix, lo: Ints, hi: Ints) -> tuple[Floats, Mask]:
        return _extrapolated_rate(mat, lo, hi, counter=counter, rate=rate)

    return run


def _reset_corrections(mat: Matrix, first: Ints, last: Ints, mask: Mask) -> Floats:
    """Per window, the sum of the values before each counter reset inside it."""
    v = mat.v
    resets = np.flatnonzero(v[1:] < v[:-1]) + 1  # sample i restarted below sample i-1
    out = np.zeros(first.shape)
    if len(resets) == 0:
        return out
    inside = np.searchsorted(resets, last, "right") - np.searchsorted(resets, first, "right")
    # Exact sums in Prometheus's order, only where a window holds a reset (rare).
    for i, j in zip(*np.nonzero(mask & (inside > 0)), strict=True):
        total = 0.0
        for k in resets[(resets > first[i, j]) & (resets <= last[i, j])].tolist():
            total += float(v[k - 1])
        out[i, j] = total
    return out


def _extrapolated_rate(
    mat: Matrix, lo: Ints, hi: Ints, *, counter: bool, rate: bool
) -> tuple[Floats, Mask]:
    mask = (hi - lo) >= 2
    if not mask.any():
        return np.zeros(lo.shape), mask
    first = np.where(mask, lo, 0)
    last = np.where(mask, hi - 1, 0)
    t, v = mat.t, mat.v
    result = v[last] - v[first]
    if counter:
        result = result + _reset_corrections(mat, first, last, mask)
    ends, rng = mat.ends[None, :], mat.range_ms
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
    def run(mat: Matrix, lo: Ints, hi: Ints) -> tuple[Floats, Mask]:
        mask = (hi - lo) >= 2
        last = np.where(mask, hi - 1, 1)
        prev = last - 1
        if len(mat.v) < 2:
            return np.zeros(lo.shape), mask
        lv, pv = mat.v[last], mat.v[prev]
        gap = (mat.t[last] - mat.t[prev]).astype(np.float64)
        result = np.where(lv < pv, lv, lv - pv) / (gap / 1000) if is_rate else lv - pv
        return result, mask & (gap > 0)

    return run


def _in_order(
    mat: Matrix, lo: Ints, hi: Ints, min_points: int
) -> tuple[Ints, Iterator[tuple[Mask, Ints, Floats]]]:
    """Walk every window with at least ``min_points`` samples at once, sample by sample.

    Returns the flat indices of those windows and an iterator over ``k`` of
    (window still has a k-th sample, its timestamp, its value): the same order
    of floating-point operations as Prometheus's per-window loops, vectorised
    across windows.
    """
    count = (hi - lo).ravel()
    active = np.flatnonzero(count >= min_points)
    first, n = lo.ravel()[active], count[active]

    shortest = int(n.min()) if len(n) else 0
    everyone = np.ones(len(n), dtype=bool)

    def walk() -> Iterator[tuple[Mask, Ints, Floats]]:
        for k in range(int(n.max()) if len(n) else 0):
            if k < shortest:  # every window still has a k-th sample
                j = first + k
                yield everyone, mat.t[j], mat.v[j]
                continue
            live = k < n
            j = first + np.minimum(k, n - 1)
            yield live, mat.t[j], mat.v[j]

    return active, walk()


def _regression(
    mat: Matrix, lo: Ints, hi: Ints, intercept_ms: Ints | None
) -> tuple[Ints, Floats, Floats]:
    """Least-squares slope and intercept per window, as Prometheus's linearRegression.

    ``intercept_ms`` per window (flat, for the active ones) or None for each
    window's first sample time.
    """
    active, samples = _in_order(mat, lo, hi, 2)
    size = len(active)
    n, sx, sy, sxy, sx2 = (np.zeros(size) for _ in range(5))
    y0 = mat.v[lo.ravel()[active]]
    const = np.ones(size, dtype=bool)
    anchor = mat.t[lo.ravel()[active]] if intercept_ms is None else intercept_ms[active]
    for live, t, v in samples:
        x = (t - anchor) / 1e3
        const &= ~live | (v == y0)
        np.add(n, 1.0, out=n, where=live)
        np.add(sx, x, out=sx, where=live)
        np.add(sy, v, out=sy, where=live)
        np.add(sxy, x * v, out=sxy, where=live)
        np.add(sx2, x * x, out=sx2, where=live)
    cov_xy = sxy - sx * sy / n
    var_x = sx2 - sx * sx / n
    slope = cov_xy / var_x
    intercept = sy / n - slope * sx / n
    # A constant series has slope 0 (NaN if it is infinite), whatever the rounding.
    inf = np.isinf(y0)
    slope = np.where(const, np.where(inf, np.nan, 0.0), slope)
    intercept = np.where(const, np.where(inf, np.nan, y0), intercept)
    return active, slope, intercept


def _scatter(shape: tuple[int, ...], active: Ints, values: Floats) -> tuple[Floats, Mask]:
    out = np.full(shape, np.nan)
    mask = np.zeros(shape, dtype=bool)
    out.ravel()[active] = values
    mask.ravel()[active] = True
    return out, mask


def _deriv_fn(mat: Matrix, lo: Ints, hi: Ints) -> tuple[Floats, Mask]:
    active, slope, _ = _regression(mat, lo, hi, None)
    return _scatter(lo.shape, active, slope)


def _stdvar_fn(mat: Matrix, lo: Ints, hi: Ints) -> tuple[Floats, Mask]:
    """Welford's running variance per window, in Prometheus's order."""
    active, samples = _in_order(mat, lo, hi, 1)
    count, mean, aux = (np.zeros(len(active)) for _ in range(3))
    for live, _, v in samples:
        np.add(count, 1.0, out=count, where=live)
        delta = v - mean
        new_mean = mean + delta / count
        np.add(aux, delta * (v - new_mean), out=aux, where=live)
        np.copyto(mean, new_mean, where=live)
    return _scatter(lo.shape, active, aux / count)


def _stddev_fn(mat: Matrix, lo: Ints, hi: Ints) -> tuple[Floats, Mask]:
    variance, mask = _stdvar_fn(mat, lo, hi)
    return np.sqrt(variance), mask


def _simple_range(name: str, fn: StepFn, keep_name: bool = False) -> Callable[..., Value]:
    def run(ctx: Context, args: list[Any]) -> Value:
        return _over_range(_matrix(ctx, args[0], name), fn, keep_name=keep_name)

    return run


def _predict_linear(ctx: Context, args: list[Any]) -> Value:
    mat = _matrix(ctx, args[0], "predict_linear")
    duration = expect_scalar(ctx, evaluate(ctx, args[1]), "predict_linear()")
    # The regression is anchored at the evaluation step, even for an @-fixed window.
    intercepts = ctx.ts

    def fn(mat: Matrix, lo: Ints, hi: Ints) -> tuple[Floats, Mask]:
        anchors = np.broadcast_to(intercepts[None, :], lo.shape).ravel()
        active, slope, icept = _regression(mat, lo, hi, anchors)
        steps = np.broadcast_to(duration[None, :], lo.shape).ravel()[active]
        return _scatter(lo.shape, active, slope * steps + icept)

    return _over_range(mat, fn)


def _quantile_over_time(ctx: Context, args: list[Any]) -> Value:
    q = expect_scalar(ctx, evaluate(ctx, args[0]), "quantile_over_time()")
    mat = _matrix(ctx, args[1], "quantile_over_time")

    def fn(mat: Matrix, lo: Ints, hi: Ints) -> tuple[Floats, Mask]:
        out = np.full(lo.shape, np.nan)
        mask = hi > lo
        for i, j in zip(*np.nonzero(mask), strict=True):
            out[i, j] = quantile(float(q[j]), mat.v[lo[i, j] : hi[i, j]].tolist())
        return out, mask

    return _over_range(mat, fn)


def _absent_over_time(ctx: Context, args: list[Any]) -> Value:
    mat = _matrix(ctx, args[0], "absent_over_time")
    seen: Mask = np.zeros(ctx.n, dtype=bool)
    if len(mat):
        lo, hi = mat.bounds()
        seen = np.asarray((hi > lo).any(axis=0), dtype=bool)
    arg = args[0]
    labels = _absent_labels(arg.vector_selector) if isinstance(arg, pp.MatrixSelector) else ()
    return _one_series(labels, np.ones(ctx.n), ~seen)


def _one_series(labels: Labels, v: Floats, m: Mask) -> Vec:
    return Vec([labels], v[None, :], m[None, :]).nonempty()


# ------------------------------------------------------------ instant vectors


def _vector_arg(ctx: Context, arg: Any, name: str) -> Vec:
    return expect_vector(ctx, evaluate(ctx, arg), f"{name}()")


def _with_values(vec: Vec, v: Floats, m: Mask | None = None) -> Vec:
    out = Vec([drop_name(lb) for lb in vec.labels], v, vec.m if m is None else vec.m & m)
    return merge_same_labels(out.nonempty())


def _math(fn: Callable[[Floats], Floats], name: str) -> Callable[..., Value]:
    def run(ctx: Context, args: list[Any]) -> Value:
        vec = _vector_arg(ctx, args[0], name)
        return _with_values(vec, fn(vec.v))

    return run


def _round(ctx: Context, args: list[Any]) -> Value:
    vec = _vector_arg(ctx, args[0], "round")
    to = expect_scalar(ctx, evaluate(ctx, args[1]), "round()") if len(args) > 1 else None
    inverse = np.ones(ctx.n) if to is None else 1.0 / to
    return _with_values(vec, np.floor(vec.v * inverse + 0.5) / inverse)


def _clamp(ctx: Context, args: list[Any], lower: bool, upper: bool) -> Value:
    vec = _vector_arg(ctx, args[0], "clamp")
    scalars = [expect_scalar(ctx, evaluate(ctx, a), "clamp()") for a in args[1:]]
    lo = scalars[0] if lower else None
    hi = scalars[-1] if upper else None
    v = vec.v
    if hi is not None:
        v = np.minimum(hi[None, :], v)
    if lo is not None:
        v = np.maximum(lo[None, :], v)
    ok = np.ones(ctx.n, dtype=bool) if lo is None or hi is None else hi >= lo
    return _with_values(vec, v, np.broadcast_to(ok[None, :], v.shape))


def _timestamp(ctx: Context, args: list[Any]) -> Value:
    arg = args[0]
    if isinstance(arg, pp.VectorSelector):
        vec, times = select_instant(ctx, arg)
        return _with_values(vec, times.astype(np.float64) / 1000)
    vec = _vector_arg(ctx, arg, "timestamp")
    secs = ctx.ts.astype(np.float64) / 1000
    return _with_values(vec, np.broadcast_to(secs[None, :], vec.v.shape).copy())


def _time(ctx: Context, args: list[Any]) -> Value:
    return Scalar(ctx.ts.astype(np.float64) / 1000)


def _vector(ctx: Context, args: list[Any]) -> Value:
    v = expect_scalar(ctx, evaluate(ctx, args[0]), "vector()")
    return Vec([()], v[None, :].copy(), np.ones((1, ctx.n), dtype=bool))


def _scalar(ctx: Context, args: list[Any]) -> Value:
    vec = _vector_arg(ctx, args[0], "scalar")
    if len(vec) == 0:
        return Scalar(np.full(ctx.n, np.nan))
    count = vec.m.sum(axis=0)
    value = np.where(vec.m, vec.v, 0.0).sum(axis=0)
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
    seen: Mask = np.zeros(ctx.n, dtype=bool)
    if len(vec):
        seen = np.asarray(vec.m.any(axis=0), dtype=bool)
    labels = _absent_labels(args[0]) if isinstance(args[0], pp.VectorSelector) else ()
    return _one_series(labels, np.ones(ctx.n), ~seen)


def _sort(order: str) -> Callable[..., Value]:
    def run(ctx: Context, args: list[Any]) -> Value:
        vec = _vector_arg(ctx, args[0], "sort")
        return Vec(vec.labels, vec.v, vec.m, order=order)

    return run


def _date(part: Callable[[Any], Any]) -> Callable[..., Value]:
    """``hour()``, ``month(v)``, ...: a UTC calendar field of ``v`` (default: now)."""

    def run(ctx: Context, args: list[Any]) -> Value:
        if args:
            vec = _vector_arg(ctx, args[0], "date function")
        else:
            now = ctx.ts.astype(np.float64)[None, :] / 1000
            vec = Vec([()], now, np.ones((1, ctx.n), dtype=bool))
        finite = np.isfinite(vec.v)
        secs = np.where(finite, np.trunc(vec.v), 0).astype(np.int64).astype("datetime64[s]")
        return _with_values(vec, np.where(finite, part(secs).astype(np.float64), np.nan))

    return run


def _days(t: Any, unit: str) -> Any:
    return (t.astype("datetime64[D]") - t.astype(unit).astype("datetime64[D]")).astype(np.int64)


def _pi(ctx: Context, args: list[Any]) -> Value:
    return Scalar(np.full(ctx.n, math.pi))


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


def _relabel(ctx: Context, vec: Vec, fn: Callable[[dict[str, str]], None]) -> Vec:
    labels = []
    for lb in vec.labels:
        lab = dict(lb)
        fn(lab)
        labels.append(tuple(sorted((k, v) for k, v in lab.items() if v != "")))
    return merge_same_labels(Vec(labels, vec.v, vec.m))


def _label_replace(ctx: Context, args: list[Any]) -> Value:
    vec = _vector_arg(ctx, args[0], "label_replace")
    dst, repl, src, regex = (_string_arg(ctx, a, "label_replace() argument") for a in args[1:5])
    try:
        rx = re.compile(f"^(?:{regex})$")
    except re.error as exc:
        raise QueryError(f"invalid regular expression in label_replace(): {regex!r}") from exc
    if not _LABEL_NAME.match(dst):
        raise QueryError(f"invalid destination label name in label_replace(): {dst!r}")

    def apply(lab: dict[str, str]) -> None:
        m = rx.match(lab.get(src, ""))
        if m is not None:
            lab[dst] = _go_expand(repl, m)

    return _relabel(ctx, vec, apply)


def _label_join(ctx: Context, args: list[Any]) -> Value:
    vec = _vector_arg(ctx, args[0], "label_join")
    dst, sep, *srcs = (_string_arg(ctx, a, "label_join() argument") for a in args[1:])
    if not _LABEL_NAME.match(dst):
        raise QueryError(f"invalid destination label name in label_join(): {dst!r}")

    def apply(lab: dict[str, str]) -> None:
        lab[dst] = sep.join(lab.get(name, "") for name in srcs)

    return _relabel(ctx, vec, apply)


def _histogram_quantile(ctx: Context, args: list[Any]) -> Value:
    q = expect_scalar(ctx, evaluate(ctx, args[0]), "histogram_quantile()")
    vec = _vector_arg(ctx, args[1], "histogram_quantile")
    groups: dict[Labels, list[tuple[float, int]]] = {}
    for i, lb in enumerate(vec.labels):
        lab = dict(lb)
        try:
            upper = float(lab.pop("le"))
        except (KeyError, ValueError):
            continue  # not a bucket: Prometheus skips it
        lab.pop("__name__", None)
        groups.setdefault(tuple(sorted(lab.items())), []).append((upper, i))
    if not groups:
        return Vec.empty(ctx.n)
    values = np.full((len(groups), ctx.n), np.nan)
    present = np.zeros((len(groups), ctx.n), dtype=bool)
    for g, buckets in enumerate(groups.values()):
        buckets.sort(key=lambda b: b[0])  # stable: equal bounds keep their order
        rows = [i for _, i in buckets]
        m = vec.m[rows]
        present[g] = m.any(axis=0)
        # the steps where every bucket is present and counted: all at once (most of a
        # diagnosis's time went to this loop over 5,000 series); the rest one by one
        whole = m.all(axis=0) & ~np.isnan(vec.v[rows]).any(axis=0)
        if whole.any():
            cols = np.flatnonzero(whole)
            uppers = np.array([ub for ub, _ in buckets])
            values[g, cols] = _bucket_quantiles(q[cols], uppers, vec.v[rows][:, cols])
        for j in np.flatnonzero(present[g] & ~whole).tolist():
            points = [(ub, float(vec.v[i, j])) for ub, i in buckets if vec.m[i, j]]
            values[g, j] = bucket_quantile(float(q[j]), points)
    return Vec(list(groups), values, present)


def _bucket_quantiles(q: Floats, uppers: Floats, counts: Floats) -> Floats:
    """``bucket_quantile`` at many steps at once: ``uppers`` sorted (buckets,), ``counts``
    (buckets, steps) without NaN, ``q`` (steps,). The same operations in the same order,
    so the same floats; a bucket empty at rank 0 gives NaN, as Prometheus's 0/0 does."""
    out = np.full(counts.shape[1], np.nan)
    # equal bounds merged (summed in order), then counts made not to decrease
    starts = np.flatnonzero(np.concatenate(([True], uppers[1:] != uppers[:-1])))
    ub = uppers[starts]
    c = np.maximum.accumulate(np.add.reduceat(counts, starts, axis=0), axis=0)
    if len(ub) >= 2 and math.isinf(ub[-1]) and ub[-1] > 0:
        obs = c[-1]
        rank = q * obs
        ge = c[:-1] >= rank[None, :]
        idx = np.where(ge.any(axis=0), ge.argmax(axis=0), len(ub) - 1)
        cols = np.arange(len(idx))
        below = np.where(idx > 0, c[np.maximum(idx - 1, 0), cols], 0.0)
        start = np.where(idx > 0, ub[np.maximum(idx - 1, 0)], 0.0)
        end = ub[idx]
        with np.errstate(divide="ignore", invalid="ignore"):
            inside = start + (end - start) * ((rank - below) / (c[idx, cols] - below))
        out = np.where(idx == len(ub) - 1, ub[-2], inside)
        out = np.where((idx == 0) & (ub[0] <= 0), ub[0], out)
        out = np.where(obs == 0, np.nan, out)
    # q outside [0, 1] or NaN decides before the buckets do
    out = np.where(q < 0, -np.inf, np.where(q > 1, np.inf, out))
    return np.where(np.isnan(q), np.nan, out)


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
    if count == 0:  # rank 0 in an empty first bucket: Prometheus's 0/0
        return math.nan
    return start + (end - start) * (rank / count)


_FUNCS: dict[str, Callable[[Context, list[Any]], Value]] = {
    "rate": _simple_range("rate", _extrapolated(True, True)),
    "increase": _simple_range("increase", _extrapolated(True, False)),
    "delta": _simple_range("delta", _extrapolated(False, False)),
    "irate": _simple_range("irate", _instant_delta(True)),
    "idelta": _simple_range("idelta", _instant_delta(False)),
    "deriv": _simple_range("deriv", _deriv_fn),
    "predict_linear": _predict_linear,
    "avg_over_time": _simple_range("avg_over_time", _avg_fn),
    "sum_over_time": _simple_range("sum_over_time", _reduceat(np.add)),
    "min_over_time": _simple_range("min_over_time", _reduceat(np.fmin)),
    "max_over_time": _simple_range("max_over_time", _reduceat(np.fmax)),
    "count_over_time": _simple_range("count_over_time", _count_fn),
    "last_over_time": _simple_range("last_over_time", _last_fn, keep_name=True),
    "present_over_time": _simple_range("present_over_time", _present_fn),
    "stdvar_over_time": _simple_range("stdvar_over_time", _stdvar_fn),
    "stddev_over_time": _simple_range("stddev_over_time", _stddev_fn),
    "quantile_over_time": _quantile_over_time,
    "changes": _simple_range("changes", _changes_fn),
    "resets": _simple_range("resets", _resets_fn),
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
    "minute": _date(lambda t: (t.astype("datetime64[m]") - t.astype("datetime64[h]")).astype(int)),
    "hour": _date(lambda t: (t.astype("datetime64[h]") - t.astype("datetime64[D]")).astype(int)),
    "day_of_week": _date(lambda t: (t.astype("datetime64[D]").astype(np.int64) + 4) % 7),
    "day_of_month": _date(lambda t: _days(t, "datetime64[M]") + 1),
    "day_of_year": _date(lambda t: _days(t, "datetime64[Y]") + 1),
    "days_in_month": _date(
        lambda t: (
            (t.astype("datetime64[M]") + 1).astype("datetime64[D]")
            - t.astype("datetime64[M]").astype("datetime64[D]")
        ).astype(np.int64)
    ),
    "month": _date(lambda t: t.astype("datetime64[M]").astype(np.int64) % 12 + 1),
    "year": _date(lambda t: t.astype("datetime64[Y]").astype(np.int64) + 1970),
    "acos": _math(np.arccos, "acos"),
    "acosh": _math(np.arccosh, "acosh"),
    "asin": _math(np.arcsin, "asin"),
    "asinh": _math(np.arcsinh, "asinh"),
    "atan": _math(np.arctan, "atan"),
    "atanh": _math(np.arctanh, "atanh"),
    "cos": _math(np.cos, "cos"),
    "cosh": _math(np.cosh, "cosh"),
    "sin": _math(np.sin, "sin"),
    "sinh": _math(np.sinh, "sinh"),
    "tan": _math(np.tan, "tan"),
    "tanh": _math(np.tanh, "tanh"),
    "deg": _math(np.degrees, "deg"),
    "rad": _math(np.radians, "rad"),
    "pi": _pi,
    "label_join": _label_join,
}

#: Every function name the embedded evaluator implements.
SUPPORTED = frozenset(_FUNCS)
