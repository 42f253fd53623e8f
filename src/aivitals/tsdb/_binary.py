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
from ._values import Floats, Ints, Mask, Scalar, Value, Vec, drop_name, merge_same_labels

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
        value = _ARITH[op](lv, rv)
        return value, np.ones(np.shape(value), dtype=bool)
    return lv, _COMPARE[op](lv, rv)


def _vector_scalar(op: str, vec: Vec, sv: Floats, return_bool: bool, *, swap: bool) -> Value:
    if op in _SET_OPS:
        raise QueryError(f"set operator {op!r} not allowed between a vector and a scalar")
    other = np.broadcast_to(sv[None, :], vec.v.shape)
    lv, rv = (other, vec.v) if swap else (vec.v, other)
    value, keep = _elem(op, lv, rv)
    if op in _COMPARE and swap:
        value = rv  # the vector's value is kept even when it is on the right
    if return_bool:
        value, keep = keep.astype(np.float64), np.ones(keep.shape, dtype=bool)
    drop = op in _DROPS_NAME or return_bool
    labels = [drop_name(lb) for lb in vec.labels] if drop else vec.labels
    out = Vec(labels, np.array(value, dtype=np.float64), vec.m & keep).nonempty()
    return merge_same_labels(out)


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
    one_sigs, one_v, one_m, one_labels = _one_side(ctx, one, on, names, card)
    sigs = [_signature(lb, on, names) for lb in many.labels]
    idx = np.array([one_sigs.get(sig, -1) for sig in sigs], dtype=np.int64)
    rows = np.flatnonzero(idx >= 0)
    if len(rows) == 0:
        return Vec.empty(ctx.n)
    many = many.keep(rows)
    sigs = [sigs[i] for i in rows.tolist()]
    idx = idx[rows]
    m = many.m & one_m[idx]
    if card == "one-to-one":
        _check_one_to_one(ctx, idx, m, len(one_sigs))
    ov = one_v[idx]
    lv, rv = (ov, many.v) if card == "one-to-many" else (many.v, ov)
    value, keep = _elem(op, lv, rv)
    if return_bool:
        value, keep = keep.astype(np.float64), np.ones(keep.shape, dtype=bool)
    labels = [
        _result_labels(lb, one_labels[j], op, return_bool, card, on, names, group)
        for lb, j in zip(many.labels, idx.tolist(), strict=True)
    ]
    out = Vec(labels, np.array(value, dtype=np.float64), m & keep).nonempty()
    try:
        return merge_same_labels(out)
    except QueryError:
        raise QueryError(
            "multiple matches for labels: grouping labels must ensure unique matches",
            expr=ctx.expr,
        ) from None


def _check_one_to_one(ctx: Context, idx: Ints, m: Mask, n_groups: int) -> None:
    counts = np.zeros((n_groups, m.shape[1]), dtype=np.int64)
    np.add.at(counts, idx, m)
    if (counts > 1).any():
        raise QueryError(
            "multiple matches for labels: many-to-one matching must be explicit "
            "(group_left/group_right)",
            expr=ctx.expr,
        )


def _one_side(
    ctx: Context, one: Vec, on: bool, names: frozenset[str], card: str
) -> tuple[dict[Labels, int], Floats, Mask, list[Labels]]:
    """The "one" side per signature: values per step; two at one step is an error."""
    groups: dict[Labels, list[int]] = {}
    for i, lb in enumerate(one.labels):
        groups.setdefault(_signature(lb, on, names), []).append(i)
    sigs: dict[Labels, int] = {}
    vs: list[Floats] = []
    ms: list[Mask] = []
    labels: list[Labels] = []
    for sig, rows in groups.items():
        m = one.m[rows]
        if len(rows) > 1:
            if (m.sum(axis=0) > 1).any():
                side = "left" if card == "one-to-many" else "right"
                raise QueryError(
                    f"found duplicate series for the match group {dict(sig)} on the {side} "
                    "hand-side of the operation; many-to-many matching not allowed: "
                    "matching labels must be unique on one side",
                    expr=ctx.expr,
                )
            if card != "one-to-one" and len({one.labels[r] for r in rows}) > 1:
                # Differently labelled series take turns: group labels would vary by step.
                raise UnsupportedQueryError(
                    "group_left/group_right where the 'one' side changes series over the range",
                    expr=ctx.expr,
                )
        v = one.v[rows[0]].copy()
        for r in rows[1:]:
            v = np.where(one.m[r], one.v[r], v)
        sigs[sig] = len(labels)
        vs.append(v)
        ms.append(np.asarray(m.any(axis=0), dtype=bool))
        labels.append(one.labels[rows[0]])
    n = ctx.n
    v_arr = np.array(vs).reshape(len(labels), n)
    m_arr = np.array(ms, dtype=bool).reshape(len(labels), n)
    return sigs, v_arr, m_arr, labels


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


def _presence(vec: Vec, on: bool, names: frozenset[str]) -> tuple[list[Labels], dict[Labels, Mask]]:
    sigs = [_signature(lb, on, names) for lb in vec.labels]
    acc: dict[Labels, Mask] = {}
    for sig, m in zip(sigs, vec.m, strict=True):
        acc[sig] = acc[sig] | m if sig in acc else m
    return sigs, acc


def _set_op(op: str, lhs: Vec, rhs: Vec, on: bool, names: frozenset[str], n: int) -> Vec:
    none = np.zeros(n, dtype=bool)
    if op == "or":
        _, left = _presence(lhs, on, names)
        rsigs = [_signature(lb, on, names) for lb in rhs.labels]
        block = np.array([left.get(sig, none) for sig in rsigs], dtype=bool).reshape(len(rhs), n)
        extra = Vec(rhs.labels, rhs.v, rhs.m & ~block).nonempty()
        out = Vec(
            lhs.labels + extra.labels, np.vstack([lhs.v, extra.v]), np.vstack([lhs.m, extra.m])
        )
        return merge_same_labels(out)
    lsigs = [_signature(lb, on, names) for lb in lhs.labels]
    _, right = _presence(rhs, on, names)
    other = np.array([right.get(sig, none) for sig in lsigs], dtype=bool).reshape(len(lhs), n)
    m = lhs.m & other if op == "and" else lhs.m & ~other
    return Vec(lhs.labels, lhs.v, m).nonempty()
