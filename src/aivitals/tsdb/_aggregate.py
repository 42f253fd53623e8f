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
from ._values import Floats, Ints, Vec

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
    keys, gid = _groups(vec, by, names)
    if op in ("topk", "bottomk"):
        assert param is not None
        return _topk(ctx, vec, gid, len(keys), param, op == "topk")
    n_groups = len(keys)
    present = np.zeros((n_groups, ctx.n), dtype=bool)
    np.logical_or.at(present, gid, vec.m)
    if op == "quantile":
        assert param is not None
        value = _quantile_groups(vec, gid, n_groups, param)
    else:
        assert handler is not None
        value = handler(vec, gid, n_groups)
    return Vec(keys, value, present)


def _grouping(modifier: Any) -> tuple[bool, frozenset[str]]:
    if modifier is None:
        return True, frozenset()
    return modifier.type == pp.AggModifierType.By, frozenset(modifier.labels)


def group_labels(labels: Labels, by: bool, names: frozenset[str]) -> Labels:
    if by:
        return tuple(p for p in labels if p[0] in names)
    return tuple(p for p in labels if p[0] not in names and p[0] != "__name__")


def _groups(vec: Vec, by: bool, names: frozenset[str]) -> tuple[list[Labels], Ints]:
    index: dict[Labels, int] = {}
    gid = np.empty(len(vec), dtype=np.int64)
    for i, lb in enumerate(vec.labels):
        gid[i] = index.setdefault(group_labels(lb, by, names), len(index))
    return list(index), gid


def _zeros(vec: Vec, n_groups: int) -> Floats:
    return np.zeros((n_groups, vec.v.shape[1]))


def _sum(vec: Vec, gid: Ints, n_groups: int) -> Floats:
    acc = _zeros(vec, n_groups)
    np.add.at(acc, gid, np.where(vec.m, vec.v, 0.0))
    return acc


def _count(vec: Vec, gid: Ints, n_groups: int) -> Floats:
    acc = _zeros(vec, n_groups)
    np.add.at(acc, gid, vec.m.astype(np.float64))
    return acc


def _group(vec: Vec, gid: Ints, n_groups: int) -> Floats:
    return np.ones((n_groups, vec.v.shape[1]))


def _avg(vec: Vec, gid: Ints, n_groups: int) -> Floats:
    mean: Floats = _sum(vec, gid, n_groups) / _count(vec, gid, n_groups)
    return mean


def _minmax(pick: Any) -> Callable[[Vec, Ints, int], Floats]:
    def run(vec: Vec, gid: Ints, n_groups: int) -> Floats:
        acc = np.full((n_groups, vec.v.shape[1]), np.nan)
        # NaN loses to any number (fmin/fmax), as Prometheus's min/max ignore NaN
        pick.at(acc, gid, np.where(vec.m, vec.v, np.nan))
        return acc

    return run


def _stdvar(vec: Vec, gid: Ints, n_groups: int) -> Floats:
    count = _count(vec, gid, n_groups)
    mean = _sum(vec, gid, n_groups) / count
    dev = np.where(vec.m, vec.v - mean[gid], 0.0)
    acc = _zeros(vec, n_groups)
    np.add.at(acc, gid, dev * dev)
    # Welford (Prometheus) gives exactly 0 for equal values; two passes might not.
    lo, hi = _minmax(np.fmin)(vec, gid, n_groups), _minmax(np.fmax)(vec, gid, n_groups)
    variance: Floats = np.where(lo == hi, 0.0, acc / count)
    return variance


def _stddev(vec: Vec, gid: Ints, n_groups: int) -> Floats:
    std: Floats = np.sqrt(_stdvar(vec, gid, n_groups))
    return std


_SIMPLE: dict[str, Callable[[Vec, Ints, int], Floats]] = {
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
    # Go's sort.Float64s puts NaN first; Python's sort leaves NaN wherever it was.
    ordered = [v for v in values if v != v] + sorted(v for v in values if v == v)
    n = len(ordered)
    rank = q * (n - 1)
    lower = max(0, math.floor(rank))
    upper = min(n - 1, lower + 1)
    weight = rank - math.floor(rank)
    return ordered[lower] * (1 - weight) + ordered[upper] * weight


def _quantile_groups(vec: Vec, gid: Ints, n_groups: int, q: Floats) -> Floats:
    out = np.full((n_groups, vec.v.shape[1]), np.nan)
    members: list[list[int]] = [[] for _ in range(n_groups)]
    for i, g in enumerate(gid.tolist()):
        members[g].append(i)
    for g, rows in enumerate(members):
        for j in range(vec.v.shape[1]):
            vals = [float(vec.v[i, j]) for i in rows if vec.m[i, j]]
            if vals:
                out[g, j] = quantile(float(q[j]), vals)
    return out


def _topk(ctx: Context, vec: Vec, gid: Ints, n_groups: int, k: Floats, top: bool) -> Vec:
    keep = np.zeros(vec.m.shape, dtype=bool)
    members: list[list[int]] = [[] for _ in range(n_groups)]
    for i, g in enumerate(gid.tolist()):
        members[g].append(i)
    for step in range(ctx.n):
        kk = _k_value(ctx, float(k[step]))
        if kk < 1:
            continue
        col_v, col_m = vec.v[:, step].tolist(), vec.m[:, step].tolist()
        for rows in members:
            present = [i for i in rows if col_m[i]]
            present.sort(key=lambda i: _rank_key(col_v[i], top), reverse=top)
            keep[present[:kk], step] = True
    return Vec(vec.labels, vec.v, keep).nonempty()


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
    if not label or not label.replace("_", "a").isalnum() or label[0].isdigit():
        raise QueryError(f"invalid label name {label!r} for count_values", expr=ctx.expr)
    counts: dict[Labels, Floats] = {}
    for i, lb in enumerate(vec.labels):
        base = dict(group_labels(lb, by, names))
        for step in np.flatnonzero(vec.m[i]).tolist():
            base[label] = format_value(float(vec.v[i, step]))
            key = tuple(sorted(base.items()))
            counts.setdefault(key, np.zeros(ctx.n))[step] += 1
    if not counts:
        return Vec.empty(ctx.n)
    values = np.array(list(counts.values()))
    return Vec(list(counts), values, values > 0)


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
