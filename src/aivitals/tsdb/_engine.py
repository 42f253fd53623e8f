"""PromQL evaluation over the embedded store, with Prometheus 2.x semantics.

Expressions are parsed by the ``promql-parser`` package; this module walks
its AST. Every node is evaluated for all steps of the query at once (see
``_values``). Selection follows Prometheus: an instant selector takes the
newest sample in ``[t - 5m, t]`` unless it is a staleness marker; a range
selector takes the samples in ``[t - range, t]`` (both ends closed, as in
Prometheus 2.x) without staleness markers. Anything this evaluator does not
implement raises ``UnsupportedQueryError`` naming the construct.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import promql_parser as pp

from ..errors import QueryError, UnsupportedQueryError
from ._series import STALE_BITS, Labels
from ._types import InstantSample, QueryResult, RangeSeries
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

if TYPE_CHECKING:
    from ._store import Matcher, Store

__all__ = ["Context", "instant_query", "range_query"]

LOOKBACK_MS = 300_000
#: Subqueries without a step use Prometheus's default evaluation interval.
DEFAULT_SUBQUERY_STEP_MS = 60_000
MAX_POINTS = 11_000
#: Points one selector may load, as Prometheus's default ``--query.max-samples``.
MAX_SAMPLES = 50_000_000

_MATCH_OPS = {
    "MatchOp.Equal": "=",
    "MatchOp.NotEqual": "!=",
    "MatchOp.Re": "=~",
    "MatchOp.NotRe": "!~",
}


@dataclass
class Context:
    store: Store
    ts: np.ndarray[Any, np.dtype[np.int64]]
    start_ms: int
    end_ms: int
    expr: str
    #: results of aggregations already computed (``Store.reusing_results``), or None
    reused: dict[Any, Any] | None = None

    @property
    def n(self) -> int:
        return len(self.ts)

    def with_steps(self, ts: np.ndarray[Any, np.dtype[np.int64]]) -> Context:
        return Context(self.store, ts, self.start_ms, self.end_ms, self.expr, self.reused)


def parse(expr: str) -> Any:
    try:
        return pp.parse(expr)
    except (ValueError, TypeError) as exc:
        raise QueryError(f"invalid PromQL: {exc}", expr=expr) from exc


def instant_query(store: Store, expr: str, at: float) -> QueryResult:
    node = parse(expr)
    t = round(at * 1000)
    ctx = Context(store, np.array([t], dtype=np.int64), t, t, expr, store._reused())
    with np.errstate(all="ignore"):
        value = evaluate(ctx, node)
    return _instant_result(value, t)


def range_query(store: Store, expr: str, start: float, end: float, step: float) -> QueryResult:
    if not step > 0:
        raise QueryError(f"step must be positive, got {step!r}", expr=expr)
    if end < start:
        raise QueryError(f"end {end!r} is before start {start!r}", expr=expr)
    s, e, st = round(start * 1000), round(end * 1000), round(step * 1000)
    if st <= 0 or (e - s) // st + 1 > MAX_POINTS:
        raise QueryError(
            f"exceeded maximum resolution of {MAX_POINTS} points per timeseries", expr=expr
        )
    node = parse(expr)
    ctx = Context(store, np.arange(s, e + 1, st, dtype=np.int64), s, e, expr, store._reused())
    with np.errstate(all="ignore"):
        value = evaluate(ctx, node)
    return _range_result(value, ctx)


def _instant_result(value: Value, t: int) -> QueryResult:
    ts = t / 1000
    if isinstance(value, Scalar):
        return QueryResult("scalar", scalar=(ts, float(value.v[0])))
    if isinstance(value, String):
        return QueryResult("string", string=(ts, value.s))
    if isinstance(value, Matrix):
        lo, hi = value.bounds()
        out = []
        for i, labels in enumerate(value.labels):
            a, b = int(lo[i, 0]), int(hi[i, 0])
            if b > a:
                pts = list(zip((value.t[a:b] / 1000).tolist(), value.v[a:b].tolist(), strict=True))
                out.append(RangeSeries(dict(labels), pts))
        return QueryResult("matrix", matrix=out)
    rows = np.flatnonzero(value.m[:, 0]).tolist()
    vals = value.v[:, 0].tolist()
    if value.order is not None:
        rows.sort(key=lambda i: _sort_key(vals[i]), reverse=value.order == "desc")
    else:
        rows.sort(key=lambda i: value.labels[i])
    return QueryResult(
        "vector", vector=[InstantSample(dict(value.labels[i]), vals[i], ts) for i in rows]
    )


def _sort_key(v: float) -> float:
    return -np.inf if np.isnan(v) else v


def _range_result(value: Value, ctx: Context) -> QueryResult:
    if isinstance(value, Scalar):
        value = Vec([()], value.v[None, :], np.ones((1, ctx.n), dtype=bool))
    if not isinstance(value, Vec):
        kind = "range vector" if isinstance(value, Matrix) else "string"
        raise QueryError(
            f'invalid expression type "{kind}" for range query, must be Scalar or instant Vector',
            expr=ctx.expr,
        )
    secs = (ctx.ts / 1000).tolist()
    out = []
    for i in sorted(range(len(value.labels)), key=lambda i: value.labels[i]):
        idx = np.flatnonzero(value.m[i]).tolist()
        if idx:
            row = value.v[i].tolist()
            out.append(RangeSeries(dict(value.labels[i]), [(secs[j], row[j]) for j in idx]))
    return QueryResult("matrix", matrix=out)


# ------------------------------------------------------------------- dispatch


def evaluate(ctx: Context, node: Any) -> Value:
    handler = _HANDLERS.get(type(node))
    if handler is None:
        raise UnsupportedQueryError(type(node).__name__, expr=ctx.expr)
    return handler(ctx, node)


def _number(ctx: Context, node: Any) -> Value:
    return Scalar(np.full(ctx.n, float(node.val)))


def _string(ctx: Context, node: Any) -> Value:
    return String(str(node.val))


def _paren(ctx: Context, node: Any) -> Value:
    return evaluate(ctx, node.expr)


def _unary(ctx: Context, node: Any) -> Value:
    value = evaluate(ctx, node.expr)
    if isinstance(value, Scalar):
        return Scalar(-value.v)
    if isinstance(value, Vec):
        return merge_same_labels(Vec([drop_name(lb) for lb in value.labels], -value.v, value.m))
    raise QueryError("unary minus needs a scalar or an instant vector", expr=ctx.expr)


# ------------------------------------------------------------------ selectors


def matchers_of(ctx: Context, vs: Any) -> list[Matcher]:
    if vs.matchers.or_matchers:
        raise UnsupportedQueryError("'or' inside a label matcher list", expr=ctx.expr)
    out: list[Matcher] = []
    if vs.name is not None:
        out.append(("__name__", "=", vs.name))
    for m in vs.matchers.matchers:
        out.append((m.name, _MATCH_OPS[str(m.op)], m.value))
    return out


def _offset_ms(delta: Any) -> int:
    return 0 if delta is None else round(delta.total_seconds() * 1000)


def effective_times(ctx: Context, at: Any, offset: Any) -> np.ndarray[Any, np.dtype[np.int64]]:
    """The times a selector reads at, per step: the step (or ``@``) minus the offset."""
    off = _offset_ms(offset)
    if at is None:
        return ctx.ts - off
    if at.type == pp.AtModifierType.Start:
        fixed = ctx.start_ms
    elif at.type == pp.AtModifierType.End:
        fixed = ctx.end_ms
    else:
        fixed = round(at.at.timestamp() * 1000)
    return np.full(ctx.n, fixed - off, dtype=np.int64)


def stale_mask(v: Floats) -> Mask:
    stale: Mask = v.view(np.uint64) == np.uint64(STALE_BITS)
    return stale


def _vector_selector(ctx: Context, vs: Any) -> Value:
    return select_instant(ctx, vs)[0]


#: Up to this many steps, instant selectors bisect per series and step.
_FEW_STEPS = 8


def select_instant(ctx: Context, vs: Any) -> tuple[Vec, Ints]:
    """The selector's value per series and step, and the sample timestamps used."""
    eff = effective_times(ctx, vs.at, vs.offset)
    matchers = matchers_of(ctx, vs)
    if ctx.n <= _FEW_STEPS or vs.at is not None:
        times = eff.tolist() if vs.at is None else eff[:1].tolist()
        labels, vals, tss, present = ctx.store.latest(matchers, times, LOOKBACK_MS)
        v = np.array(vals, dtype=np.float64).reshape(len(labels), len(times))
        t = np.array(tss, dtype=np.int64).reshape(len(labels), len(times))
        m = np.array(present, dtype=bool).reshape(len(labels), len(times))
        if vs.at is not None:  # one instant for every step
            v, t, m = (np.repeat(a, ctx.n, axis=1) for a in (v, t, m))
        return Vec(labels, v, m), t
    labels, t_all, v_all, off = ctx.store.fetch(
        matchers, int(eff.min()) - LOOKBACK_MS, int(eff.max())
    )
    if not labels:
        return Vec.empty(ctx.n), np.zeros((0, ctx.n), dtype=np.int64)
    check_size(ctx, len(t_all) + len(labels) * ctx.n)
    base = int(eff.min()) - LOOKBACK_MS
    big = int(eff.max()) - base + 2  # series i owns keys [i * big, (i + 1) * big)
    sid = np.arange(len(labels), dtype=np.int64)
    key = np.repeat(sid * big, np.diff(off)) + (t_all - base)
    idx = np.searchsorted(key, (sid * big)[:, None] + (eff - base)[None, :], side="right") - 1
    ok = idx >= off[:-1, None]
    idx = np.where(ok, idx, 0)
    t = t_all[idx]
    v = v_all[idx]
    ok &= t >= (eff - LOOKBACK_MS)[None, :]
    ok &= ~stale_mask(v)
    return _keep_present(labels, v, ok, t)


def check_size(ctx: Context, points: int) -> None:
    """Refuse a query that would hold more points than Prometheus allows by default."""
    if points > MAX_SAMPLES:
        raise QueryError(
            f"query processing would load too many samples into memory ({points:,} > "
            f"{MAX_SAMPLES:,})",
            expr=ctx.expr,
        )


def _keep_present(labels: list[Labels], v: Floats, m: Mask, t: Ints) -> tuple[Vec, Ints]:
    rows = np.flatnonzero(m.any(axis=1))
    return Vec([labels[i] for i in rows.tolist()], v[rows], m[rows]), t[rows]


def _matrix_selector(ctx: Context, node: Any) -> Value:
    vs = node.vector_selector
    rng = _offset_ms(node.range)
    eff = effective_times(ctx, vs.at, vs.offset)
    labels, t, v, off = ctx.store.fetch(matchers_of(ctx, vs), int(eff.min()) - rng, int(eff.max()))
    check_size(ctx, len(t) + len(labels) * ctx.n)
    stale = stale_mask(v)
    if stale.any():
        labels, t, v, off = _drop(labels, t, v, off, ~stale)
    # The fetch window is each step's window when all steps read at one instant.
    return Matrix(labels, t, v, off, eff, rng, vs, exact=bool(eff.min() == eff.max()))


def _drop(
    labels: list[Labels], t: Ints, v: Floats, off: Ints, keep: Mask
) -> tuple[list[Labels], Ints, Floats, Ints]:
    """Keep only the samples where ``keep``; series left without samples go."""
    sid = np.repeat(np.arange(len(labels)), np.diff(off))[keep]
    counts = np.bincount(sid, minlength=len(labels))
    rows = np.flatnonzero(counts)
    new_off = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(counts[rows], out=new_off[1:])
    return [labels[i] for i in rows.tolist()], t[keep], v[keep], new_off


def _subquery(ctx: Context, node: Any) -> Value:
    rng = _offset_ms(node.range)
    step = _offset_ms(node.step) or DEFAULT_SUBQUERY_STEP_MS
    eff = effective_times(ctx, node.at, node.offset)
    first = int(eff.min()) - rng
    start = (first // step) * step
    if start < first:
        start += step
    if (int(eff.max()) - start) // step + 1 > MAX_POINTS * 10:
        raise QueryError(
            f"subquery would evaluate more than {MAX_POINTS * 10:,} steps", expr=ctx.expr
        )
    grid = np.arange(start, int(eff.max()) + 1, step, dtype=np.int64)
    empty = np.zeros(0, dtype=np.int64)
    if len(grid) == 0:
        return Matrix([], empty, np.zeros(0), np.zeros(1, dtype=np.int64), eff, rng)
    inner = evaluate(ctx.with_steps(grid), node.expr)
    if isinstance(inner, Scalar):
        inner = Vec([()], inner.v[None, :], np.ones((1, len(grid)), dtype=bool))
    if not isinstance(inner, Vec):
        raise QueryError("subquery is only allowed on an instant vector", expr=ctx.expr)
    inner = inner.nonempty()
    counts = inner.m.sum(axis=1)
    off = np.zeros(len(inner) + 1, dtype=np.int64)
    np.cumsum(counts, out=off[1:])
    t = np.broadcast_to(grid, inner.m.shape)[inner.m]
    exact = bool(eff.min() == eff.max())
    return Matrix(inner.labels, t.astype(np.int64), inner.v[inner.m], off, eff, rng, exact=exact)


def _call(ctx: Context, node: Any) -> Value:
    from ._functions import call

    return call(ctx, node)


#: Aggregation results kept for reuse hold at most this many values (series x steps) in
#: all, about 180 MB with their masks: past it, results are computed and not kept.
REUSE_MAX_CELLS = 20_000_000


def _aggregate(ctx: Context, node: Any) -> Value:
    from ._aggregate import aggregate

    if ctx.reused is None:
        return aggregate(ctx, node)
    # the node's text names its selectors, ranges, offsets and @; @ start()/end() read
    # the query's bounds, and the steps decide every window
    key = (str(node), ctx.start_ms, ctx.end_ms, ctx.ts.tobytes())
    kept = ctx.reused.get(key)
    if kept is not None:
        return _copy(kept)  # a copy: the caller may change its arrays in place
    value = aggregate(ctx, node)
    if isinstance(value, Vec):
        kept_cells = sum(v.v.size for v in ctx.reused.values())
        if kept_cells + value.v.size <= REUSE_MAX_CELLS:
            ctx.reused[key] = _copy(value)
    return value


def _copy(vec: Vec) -> Vec:
    return Vec(list(vec.labels), vec.v.copy(), vec.m.copy(), vec.order)


def _binary(ctx: Context, node: Any) -> Value:
    from ._binary import binary

    return binary(ctx, node)


_HANDLERS: dict[type, Callable[[Context, Any], Value]] = {
    pp.NumberLiteral: _number,
    pp.StringLiteral: _string,
    pp.ParenExpr: _paren,
    pp.UnaryExpr: _unary,
    pp.VectorSelector: _vector_selector,
    pp.MatrixSelector: _matrix_selector,
    pp.SubqueryExpr: _subquery,
    pp.Call: _call,
    pp.AggregateExpr: _aggregate,
    pp.BinaryExpr: _binary,
}


def expect_vector(ctx: Context, value: Value, what: str) -> Vec:
    if not isinstance(value, Vec):
        raise QueryError(f"{what} needs an instant vector", expr=ctx.expr)
    return value


def expect_scalar(ctx: Context, value: Value, what: str) -> Floats:
    if not isinstance(value, Scalar):
        raise QueryError(f"{what} needs a scalar", expr=ctx.expr)
    return value.v
