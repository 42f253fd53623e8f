"""The evaluator's intermediate values, computed for every step of a query at once.

An instant query is a range query with one step. Each value holds, per
series, a numpy array of values over all steps and a mask of the steps where
the series is present, so selectors are read once per query, not per step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from ..errors import QueryError
from ._series import Labels

__all__ = ["Floats", "Mask", "Matrix", "RawSeries", "Scalar", "String", "Value", "Vec", "VecSeries"]

Floats = npt.NDArray[np.float64]
Mask = npt.NDArray[np.bool_]
Ints = npt.NDArray[np.int64]


@dataclass(slots=True)
class Scalar:
    v: Floats


@dataclass(slots=True)
class String:
    s: str


@dataclass(slots=True)
class VecSeries:
    labels: Labels
    v: Floats
    m: Mask


@dataclass(slots=True)
class Vec:
    series: list[VecSeries]
    order: str | None = None  # "asc" / "desc" after sort(), for instant results


@dataclass(slots=True)
class RawSeries:
    labels: Labels
    t: Ints
    v: Floats


@dataclass(slots=True)
class Matrix:
    """Raw samples plus, per step, the window ``[end - range, end]`` (ms, closed)."""

    series: list[RawSeries]
    ends: Ints
    range_ms: int
    selector: object = field(default=None)

    def bounds(self, raw: RawSeries) -> tuple[Ints, Ints]:
        lo = np.searchsorted(raw.t, self.ends - self.range_ms, side="left")
        hi = np.searchsorted(raw.t, self.ends, side="right")
        return lo.astype(np.int64), hi.astype(np.int64)


Value = Scalar | String | Vec | Matrix


def drop_name(labels: Labels) -> Labels:
    if labels and labels[0][0] == "__name__":
        return labels[1:]
    return tuple(p for p in labels if p[0] != "__name__")


def merge_same_labels(series: list[VecSeries]) -> list[VecSeries]:
    """Join series whose labels became equal; both present at one step is an error."""
    out: dict[Labels, VecSeries] = {}
    for s in series:
        seen = out.get(s.labels)
        if seen is None:
            out[s.labels] = s
            continue
        if np.any(seen.m & s.m):
            raise QueryError("vector cannot contain metrics with the same labelset")
        out[s.labels] = VecSeries(s.labels, np.where(s.m, s.v, seen.v), seen.m | s.m)
    return list(out.values())
