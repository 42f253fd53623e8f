"""A range query equals the instant queries at each of its steps.

The evaluator has two selector paths (bisecting per step for few steps, a
vectorised search over copied windows for many) and computes every step at
once; this checks both against one-step evaluation on the conformance data.
"""

from __future__ import annotations

import math

import pytest

from aivitals.errors import QueryError
from aivitals.tsdb import Store

from . import test_conformance as conf
from ._data import T0, generate

pytestmark = pytest.mark.slow

# Expressions whose meaning depends on the query range, not just the step.
_RANGE_DEPENDENT = ("start()", "end()", "sort", "topk", "bottomk")
EXPRS = [e for e in conf.EXPRESSIONS if not any(x in e for x in _RANGE_DEPENDENT)]


@pytest.fixture(scope="module")
def store() -> Store:
    s = Store(retention=10 * 3600)
    for name, labels, value, t in generate():
        s.append(name, labels, value, t)
    return s


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-12)


@pytest.mark.parametrize("steps", [5, 12])
def test_range_equals_instants(store: Store, steps: int) -> None:
    start, step = T0 + 4400, 97
    end = start + step * (steps - 1)
    failures = []
    for expr in EXPRS:
        try:
            ranged = store.query_range(expr, start, end, step)
        except QueryError:
            continue  # refused expressions are covered by the conformance test
        got = {(tuple(sorted(s.labels.items())), t): v for s in ranged.matrix for t, v in s.points}
        want = {}
        for k in range(steps):
            at = start + k * step
            result = store.query(expr, at)
            if result.type == "scalar":
                assert result.scalar is not None
                want[((), float(at))] = result.scalar[1]
            for sample in result.vector:
                want[(tuple(sorted(sample.labels.items())), float(at))] = sample.value
        if got.keys() != want.keys() or not all(_same(got[k], want[k]) for k in got):
            failures.append(expr)
    assert not failures, failures
