"""Binary operators: arithmetic, comparison (with and without ``bool``) and set operators.

Vector matching follows Prometheus: one-to-one by default, ``on``/``ignoring``
choose the matching labels, ``group_left``/``group_right`` allow many-to-one
and copy the listed labels from the "one" side. Arithmetic and ``bool``
comparisons drop ``__name__``; filtering comparisons and set operators keep it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import promql_parser as pp

from ..errors import QueryError, UnsupportedQueryError
from ._engine import Context, evaluate
from ._series import Labels
from ._values import Floats, Mask, Scalar, Value, Vec, VecSeries, drop_name, merge_same_labels

__all__ = ["binary"]

_ARITH: dict[str, Callable[[Floats, Floats], Floats]] = {
    "+": np.add,
    "-": np.subtract,
    "*": np.multiply,
    "/": np.divide,
    "%": np.fmod,
    "^": np.power,
    "atan2": np.arctan2,
}
_COMPARE: dict[str, Callable[[Floats, Floats], Mask]] = {
    "==": np.equal,
    "!=": np.not_equal,
    ">": np.greater,
    "<": np.less,
    ">=": np.greater_equal,
    "<=": np.less_equal,
}
_SET_OPS = ("and", "or", "unless")
#: Operators whose result drops ``__name__`` (Prometheus 2.x keeps it for atan2).
_DROPS_NAME = frozenset(("+", "-", "*", "/", "%", "^"))


def binary(ctx: Context, node: Any) -> Value:
    op = str(node.op)
    mod = node.modifier
    if mod is not None and (mod.fill_values.lhs is not None or mod.fill_values.rhs is not None):
        raise UnsupportedQueryError("fill() modifiers of vector matching", expr=ctx.expr)
    if op not in _ARITH and op not in _COMPARE and op not in _SET_OPS:
        raise UnsupportedQueryError(f"binary operator {op!r}", expr=ctx.expr)
    return_bool = bool(mod is not None and mod.return_bool)
    lhs = evaluate(ctx, node.lhs)
    rhs = evaluate(ctx, node.rhs)
    if isinstance(lhs, Scalar) and isinstance(rhs, Scalar):
        return Scalar(_scalar_op(op, lhs.v, rhs.v, ctx))
    if isinstance(lhs, Vec) and isinstance(rhs, Vec):
        return _vector_vector(ctx, op, mod, lhs, rhs, return_bool)
    if isinstance(lhs, Vec) and isinstance(rhs, Scalar):
        return _vector_scalar(op, lhs, rhs.v, return_bool, swap=False)
    if isinstance(lhs, Scalar) and isinstance(rhs, Vec):
        return _vector_scalar(op, rhs, lhs.v, return_bool, swap=True)
    raise QueryError(f"operator {op!r} needs scalars or instant vectors", expr=ctx.expr)


def _scalar_op(op: str, a: Floats, b: Floats, ctx: Context) -> Floats:
    if op in _ARITH:
        return _ARITH[op](a, b)
    if op in _COMPARE:
        return _COMPARE[op](a, b).astype(np.float64)
    raise QueryError(f"set operator {op!r} not allowed between scalars", expr=ctx.expr)


def _elem(op: str, lv: Floats, rv: Floats) -> tuple[Floats, Mask]:
    """Prometheus's vectorElemBinop: the value and whether the element is kept."""
    if op in _ARITH:
        return _ARITH[op](lv, rv), np.ones(len(lv), dtype=bool)
    return lv, _COMPARE[op](lv, rv)


def _vector_scalar(op: str, vec: Vec, sv: Floats, return_bool: bool, *, swap: bool) -> Value:
    if op in _SET_OPS:
        raise QueryError(f"set operator {op!r} not allowed between a vector and a scalar")
    out = []
    for s in vec.series:
        lv, rv = (sv, s.v) if swap else (s.v, sv)
        value, keep = _elem(op, lv, rv)
        if op in _COMPARE and swap:
            value = rv  # the vector's value is kept even when it is on the right
        if return_bool:
            value, keep = keep.astype(np.float64), np.ones(len(keep), dtype=bool)
        labels = drop_name(s.labels) if (op in _DROPS_NAME or return_bool) else s.labels
        m = s.m & keep
        if m.any():
            out.append(VecSeries(labels, value, m))
    return Vec(merge_same_labels(out))


def _signature(labels: Labels, on: bool, names: frozenset[str]) -> Labels:
    if on:
        return tuple(p for p in labels if p[0] in names)
    return tuple(p for p in labels if p[0] not in names and p[0] != "__name__")


def _matching(mod: Any) -> tuple[bool, frozenset[str], str, list[str]]:
    if mod is None:
        return False, frozenset(), "one-to-one", []
    on, names = False, frozenset[str]()
    if mod.matching is not None:
        on = mod.matching.type == pp.LabelModifierType.Include
        names = frozenset(mod.matching.labels)
    card = {
        "VectorMatchCardinality.OneToOne": "one-to-one",
        "VectorMatchCardinality.ManyToOne": "many-to-one",
        "VectorMatchCardinality.OneToMany": "one-to-many",
        "VectorMatchCardinality.ManyToMany": "many-to-many",
    }[str(mod.card)]
    group = list(getattr(mod, "group_labels", None) or [])
    return on, names, card, group


def _vector_vector(ctx: Context, op: str, mod: Any, lhs: Vec, rhs: Vec, return_bool: bool) -> Value:
    on, names, card, group = _matching(mod)
    if op in _SET_OPS:
        return _set_op(op, lhs, rhs, on, names, ctx.n)
    if card == "many-to-many":
        raise QueryError(f"operator {op!r} cannot use many-to-many matching", expr=ctx.expr)
    many, one = (rhs, lhs) if card == "one-to-many" else (lhs, rhs)
    ones = _one_side(ctx, one, on, names, card)
    out: list[VecSeries] = []
    matched: dict[Labels, Mask] = {}
    for s in many.series:
        sig = _signature(s.labels, on, names)
        found = ones.get(sig)
        if found is None:
            continue
        one_v, one_m, one_labels = found
        m = s.m & one_m
        if not m.any():
            continue
        if card == "one-to-one":
            prev = matched.get(sig)
            if prev is not None and np.any(prev & m):
                raise QueryError(
                    "multiple matches for labels: many-to-one matching must be explicit "
                    "(group_left/group_right)",
                    expr=ctx.expr,
                )
            matched[sig] = m if prev is None else (prev | m)
        lv, rv = (one_v, s.v) if card == "one-to-many" else (s.v, one_v)
        value, keep = _elem(op, lv, rv)
        if return_bool:
            value, keep = keep.astype(np.float64), np.ones(ctx.n, dtype=bool)
        m &= keep
        if not m.any():
            continue
        labels = _result_labels(s.labels, one_labels, op, return_bool, card, on, names, group)
        out.append(VecSeries(labels, value, m))
    try:
        return Vec(merge_same_labels(out))
    except QueryError:
        raise QueryError(
            "multiple matches for labels: grouping labels must ensure unique matches",
            expr=ctx.expr,
        ) from None


def _one_side(
    ctx: Context, one: Vec, on: bool, names: frozenset[str], card: str
) -> dict[Labels, tuple[Floats, Mask, Labels]]:
    """Per signature, the "one" side's value at each step; two at one step is an error."""
    out: dict[Labels, tuple[Floats, Mask, Labels]] = {}
    for s in one.series:
        sig = _signature(s.labels, on, names)
        prev = out.get(sig)
        if prev is None:
            out[sig] = (s.v, s.m, s.labels)
            continue
        if np.any(prev[1] & s.m):
            side = "left" if card == "one-to-many" else "right"
            raise QueryError(
                f"found duplicate series for the match group {dict(sig)} on the {side} "
                "hand-side of the operation; many-to-many matching not allowed: "
                "matching labels must be unique on one side",
                expr=ctx.expr,
            )
        if prev[2] != s.labels and card != "one-to-one":
            # Differently labelled series take turns: group labels may differ by step.
            raise UnsupportedQueryError(
                "group_left/group_right where the 'one' side changes series over the range",
                expr=ctx.expr,
            )
        out[sig] = (np.where(s.m, s.v, prev[0]), prev[1] | s.m, prev[2])
    return out


def _result_labels(
    many: Labels,
    one: Labels,
    op: str,
    return_bool: bool,
    card: str,
    on: bool,
    names: frozenset[str],
    group: list[str],
) -> Labels:
    lab = dict(many)
    if op in _DROPS_NAME or return_bool:
        lab.pop("__name__", None)
    if card == "one-to-one":
        if on:
            lab = {k: v for k, v in lab.items() if k in names}
        else:
            for k in names:
                lab.pop(k, None)
    else:
        one_d = dict(one)
        for k in group:
            if one_d.get(k, ""):
                lab[k] = one_d[k]
            else:
                lab.pop(k, None)
    return tuple(sorted(lab.items()))


def _set_op(op: str, lhs: Vec, rhs: Vec, on: bool, names: frozenset[str], n: int) -> Vec:
    def presence(vec: Vec) -> dict[Labels, Mask]:
        acc: dict[Labels, Mask] = {}
        for s in vec.series:
            sig = _signature(s.labels, on, names)
            acc[sig] = acc[sig] | s.m if sig in acc else s.m
        return acc

    none = np.zeros(n, dtype=bool)
    if op == "or":
        left = presence(lhs)
        out = list(lhs.series)
        for s in rhs.series:
            m = s.m & ~left.get(_signature(s.labels, on, names), none)
            if m.any():
                out.append(VecSeries(s.labels, s.v, m))
        return Vec(merge_same_labels(out))
    right = presence(rhs)
    out = []
    for s in lhs.series:
        other = right.get(_signature(s.labels, on, names), none)
        m = s.m & other if op == "and" else s.m & ~other
        if m.any():
            out.append(VecSeries(s.labels, s.v, m))
    return Vec(out)
