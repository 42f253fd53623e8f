"""Aggregation operators (``sum by (...)``, ``topk``, ``quantile``, ...), as Prometheus 2.x.

Numerics follow Prometheus where the order of operations shows in the last
bits: ``avg`` is an incremental mean, ``stddev``/``stdvar`` use Welford's
method, ``min``/``max`` ignore NaN unless every value is NaN.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import numpy as np
import promql_parser as pp

from ..errors import QueryError, UnsupportedQueryError
from ._engine import Context, evaluate, expect_scalar, expect_vector
from ._series import Labels
from ._values import Floats, Mask, Vec, VecSeries

__all__ = ["aggregate", "quantile"]


def aggregate(ctx: Context, node: Any) -> Vec:
    op = str(node.op)
    handler = _SIMPLE.get(op)
    if handler is None and op not in _PER_STEP:
        raise UnsupportedQueryError(f"aggregation {op!r}", expr=ctx.expr)
    vec = expect_vector(ctx, evaluate(ctx, node.expr), f"aggregation {op!r}")
    by, names = _grouping(node.modifier)
    if op == "count_values":
        return _count_values(ctx, node, vec, by, names)
    param = None
    if node.param is not None:
        param = expect_scalar(ctx, evaluate(ctx, node.param), f"parameter of {op!r}")
    groups = _groups(vec, by, names)
    if op in ("topk", "bottomk"):
        assert param is not None
        return _topk(ctx, groups, param, op == "topk")
    out: list[VecSeries] = []
    for labels, members in groups.items():
        present = np.zeros(ctx.n, dtype=bool)
        for s in members:
            present |= s.m
        if op == "quantile":
            assert param is not None
            value = _quantile_groups(members, param, ctx.n)
        else:
            assert handler is not None
            value = handler(members, ctx.n)
        out.append(VecSeries(labels, value, present))
    return Vec(out)


def _grouping(modifier: Any) -> tuple[bool, frozenset[str]]:
    if modifier is None:
        return True, frozenset()
    return modifier.type == pp.AggModifierType.By, frozenset(modifier.labels)


def group_labels(labels: Labels, by: bool, names: frozenset[str]) -> Labels:
    if by:
        return tuple(p for p in labels if p[0] in names)
    return tuple(p for p in labels if p[0] not in names and p[0] != "__name__")


def _groups(vec: Vec, by: bool, names: frozenset[str]) -> dict[Labels, list[VecSeries]]:
    groups: dict[Labels, list[VecSeries]] = {}
    for s in vec.series:
        groups.setdefault(group_labels(s.labels, by, names), []).append(s)
    return groups


def _sum(members: list[VecSeries], n: int) -> Floats:
    acc = np.zeros(n)
    started = np.zeros(n, dtype=bool)
    for s in members:
        acc = np.where(s.m, np.where(started, acc + s.v, s.v), acc)
        started |= s.m
    return acc


def _count(members: list[VecSeries], n: int) -> Floats:
    acc = np.zeros(n)
    for s in members:
        acc += s.m
    return acc


def _group(members: list[VecSeries], n: int) -> Floats:
    return np.ones(n)


def _avg(members: list[VecSeries], n: int) -> Floats:
    mean = np.zeros(n)
    count = np.zeros(n)
    for s in members:
        count = count + s.m
        first = s.m & (count == 1)
        inf_mean = np.isinf(mean)
        # Once the mean is infinite only an opposite infinity (or NaN) can change it.
        hold = inf_mean & ((np.isinf(s.v) & ((mean > 0) == (s.v > 0))) | np.isfinite(s.v))
        step = mean + (s.v / count - mean / count)
        mean = np.where(first, s.v, np.where(s.m & ~hold, step, mean))
    return mean


def _minmax(pick: Callable[[Floats, Floats], Floats]) -> Callable[[list[VecSeries], int], Floats]:
    def run(members: list[VecSeries], n: int) -> Floats:
        acc = np.full(n, np.nan)
        for s in members:
            acc = np.where(s.m, pick(acc, s.v), acc)
        return acc

    return run


def _welford(members: list[VecSeries], n: int) -> tuple[Floats, Floats]:
    count = np.zeros(n)
    mean = np.zeros(n)
    m2 = np.zeros(n)
    for s in members:
        count = count + s.m
        delta = s.v - mean
        new_mean = mean + delta / count
        m2 = np.where(s.m, m2 + delta * (s.v - new_mean), m2)
        mean = np.where(s.m, new_mean, mean)
    return m2 / count, count


def _stdvar(members: list[VecSeries], n: int) -> Floats:
    return _welford(members, n)[0]


def _stddev(members: list[VecSeries], n: int) -> Floats:
    return np.sqrt(_welford(members, n)[0])


_SIMPLE: dict[str, Callable[[list[VecSeries], int], Floats]] = {
    "sum": _sum,
    "count": _count,
    "group": _group,
    "avg": _avg,
    "min": _minmax(np.fmin),
    "max": _minmax(np.fmax),
    "stddev": _stddev,
    "stdvar": _stdvar,
}
_PER_STEP = ("quantile", "topk", "bottomk", "count_values")


def quantile(q: float, values: list[float]) -> float:
    """Prometheus's quantile: linear interpolation between closest ranks."""
    if not values or math.isnan(q):
        return math.nan
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    ordered = sorted(values)
    n = len(ordered)
    rank = q * (n - 1)
    lower = max(0, math.floor(rank))
    upper = min(n - 1, lower + 1)
    weight = rank - math.floor(rank)
    return ordered[lower] * (1 - weight) + ordered[upper] * weight


def _quantile_groups(members: list[VecSeries], q: Floats, n: int) -> Floats:
    out = np.full(n, np.nan)
    for i in range(n):
        vals = [float(s.v[i]) for s in members if s.m[i]]
        if vals:
            out[i] = quantile(float(q[i]), vals)
    return out


def _topk(ctx: Context, groups: dict[Labels, list[VecSeries]], k: Floats, top: bool) -> Vec:
    keep: dict[int, Mask] = {}
    everyone: list[VecSeries] = [s for members in groups.values() for s in members]
    index = {id(s): i for i, s in enumerate(everyone)}
    for members in groups.values():
        for step in range(ctx.n):
            kk = _k_value(ctx, float(k[step]))
            present = [s for s in members if s.m[step]]
            if kk < 1 or not present:
                continue
            present.sort(key=lambda s: _rank_key(float(s.v[step]), top), reverse=top)
            for s in present[:kk]:
                i = index[id(s)]
                keep.setdefault(i, np.zeros(ctx.n, dtype=bool))[step] = True
    out = [VecSeries(everyone[i].labels, everyone[i].v, m) for i, m in sorted(keep.items())]
    return Vec(out)


def _k_value(ctx: Context, k: float) -> int:
    if math.isnan(k) or math.isinf(k):
        raise QueryError(f"parameter of topk/bottomk is not a finite number: {k}", expr=ctx.expr)
    return int(k)


def _rank_key(v: float, top: bool) -> float:
    # NaN ranks last for both topk and bottomk, as in Prometheus.
    if math.isnan(v):
        return -math.inf if top else math.inf
    return v


def _count_values(ctx: Context, node: Any, vec: Vec, by: bool, names: frozenset[str]) -> Vec:
    param = evaluate(ctx, node.param)
    label = getattr(param, "s", None)
    if not isinstance(label, str):
        raise QueryError("count_values needs a string label name", expr=ctx.expr)
    if not label.replace("_", "a").isalnum() or label[0].isdigit():
        raise QueryError(f"invalid label name {label!r} for count_values", expr=ctx.expr)
    counts: dict[Labels, Floats] = {}
    for s in vec.series:
        base = dict(group_labels(s.labels, by, names))
        for step in np.flatnonzero(s.m):
            base[label] = format_value(float(s.v[step]))
            key = tuple(sorted(base.items()))
            counts.setdefault(key, np.zeros(ctx.n))[step] += 1
    return Vec([VecSeries(lb, c, c > 0) for lb, c in counts.items()])


def format_value(v: float) -> str:
    """Go's ``strconv.FormatFloat(v, 'f', -1, 64)``: shortest digits, never an exponent."""
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    text = format(Decimal(repr(v)), "f")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return text
