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
    Mask,
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

if TYPE_CHECKING:
    from ._store import Matcher, Store

__all__ = ["Context", "instant_query", "range_query"]

LOOKBACK_MS = 300_000
#: Subqueries without a step use Prometheus's default evaluation interval.
DEFAULT_SUBQUERY_STEP_MS = 60_000
MAX_POINTS = 11_000

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

    @property
    def n(self) -> int:
        return len(self.ts)

    def with_steps(self, ts: np.ndarray[Any, np.dtype[np.int64]]) -> Context:
        return Context(self.store, ts, self.start_ms, self.end_ms, self.expr)


def parse(expr: str) -> Any:
    try:
        return pp.parse(expr)
    except (ValueError, TypeError) as exc:
        raise QueryError(f"invalid PromQL: {exc}", expr=expr) from exc


def instant_query(store: Store, expr: str, at: float) -> QueryResult:
    node = parse(expr)
    t = round(at * 1000)
    ctx = Context(store, np.array([t], dtype=np.int64), t, t, expr)
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
    ctx = Context(store, np.arange(s, e + 1, st, dtype=np.int64), s, e, expr)
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
        out = []
        for raw in value.series:
            lo, hi = value.bounds(raw)
            pts = [
                (int(x) / 1000, float(y))
                for x, y in zip(raw.t[lo[0] : hi[0]], raw.v[lo[0] : hi[0]], strict=False)
            ]
            if pts:
                out.append(RangeSeries(dict(raw.labels), pts))
        return QueryResult("matrix", matrix=out)
    present = [s for s in value.series if s.m[0]]
    if value.order is not None:
        present.sort(key=lambda s: _sort_key(float(s.v[0])), reverse=value.order == "desc")
    return QueryResult(
        "vector", vector=[InstantSample(dict(s.labels), float(s.v[0]), ts) for s in present]
    )


def _sort_key(v: float) -> float:
    return -np.inf if np.isnan(v) else v


def _range_result(value: Value, ctx: Context) -> QueryResult:
    if isinstance(value, Scalar):
        value = Vec([VecSeries((), value.v, np.ones(ctx.n, dtype=bool))])
    if not isinstance(value, Vec):
        kind = "range vector" if isinstance(value, Matrix) else "string"
        raise QueryError(
            f'invalid expression type "{kind}" for range query, must be Scalar or instant Vector',
            expr=ctx.expr,
        )
    secs = ctx.ts / 1000
    out = []
    for s in sorted(value.series, key=lambda x: x.labels):
        idx = np.flatnonzero(s.m)
        if len(idx):
            pts = list(zip(secs[idx].tolist(), s.v[idx].tolist(), strict=True))
            out.append(RangeSeries(dict(s.labels), pts))
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
        out = [VecSeries(drop_name(s.labels), -s.v, s.m) for s in value.series]
        return Vec(merge_same_labels(out))
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


def select_instant(ctx: Context, vs: Any) -> tuple[Vec, list[np.ndarray[Any, Any]]]:
    """The selector's value per step, and per series the sample timestamps used."""
    eff = effective_times(ctx, vs.at, vs.offset)
    fetched = ctx.store.fetch(matchers_of(ctx, vs), int(eff.min()) - LOOKBACK_MS, int(eff.max()))
    out: list[VecSeries] = []
    times: list[np.ndarray[Any, Any]] = []
    for labels, t, v in fetched:
        if len(t) == 0:
            continue
        idx = np.searchsorted(t, eff, side="right") - 1
        ok = idx >= 0
        idx = np.where(ok, idx, 0)
        vals = v[idx]
        ok &= t[idx] >= eff - LOOKBACK_MS
        ok &= ~stale_mask(vals)
        if ok.any():
            out.append(VecSeries(labels, vals, ok))
            times.append(t[idx])
    return Vec(out), times


def _matrix_selector(ctx: Context, node: Any) -> Value:
    vs = node.vector_selector
    rng = _offset_ms(node.range)
    eff = effective_times(ctx, vs.at, vs.offset)
    fetched = ctx.store.fetch(matchers_of(ctx, vs), int(eff.min()) - rng, int(eff.max()))
    raws = []
    for labels, t, v in fetched:
        keep = ~stale_mask(v)
        if not keep.all():
            t, v = t[keep], v[keep]
        if len(t):
            raws.append(RawSeries(labels, t, v))
    return Matrix(raws, eff, rng, vs)


def _subquery(ctx: Context, node: Any) -> Value:
    rng = _offset_ms(node.range)
    step = _offset_ms(node.step) or DEFAULT_SUBQUERY_STEP_MS
    eff = effective_times(ctx, node.at, node.offset)
    first = int(eff.min()) - rng
    start = (first // step) * step
    if start < first:
        start += step
    grid = np.arange(start, int(eff.max()) + 1, step, dtype=np.int64)
    if len(grid) == 0:
        return Matrix([], eff, rng)
    inner = evaluate(ctx.with_steps(grid), node.expr)
    if isinstance(inner, Scalar):
        inner = Vec([VecSeries((), inner.v, np.ones(len(grid), dtype=bool))])
    if not isinstance(inner, Vec):
        raise QueryError("subquery is only allowed on an instant vector", expr=ctx.expr)
    raws = [RawSeries(s.labels, grid[s.m], s.v[s.m]) for s in inner.series if s.m.any()]
    return Matrix(raws, eff, rng)


def _call(ctx: Context, node: Any) -> Value:
    from ._functions import call

    return call(ctx, node)


def _aggregate(ctx: Context, node: Any) -> Value:
    from ._aggregate import aggregate

    return aggregate(ctx, node)


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


def labels_dict(labels: Labels) -> dict[str, str]:
    return dict(labels)
