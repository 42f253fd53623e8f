"""The evaluator's intermediate values, columnar over series and steps.

An instant query is a range query with one step. An instant vector holds a
``(series, steps)`` matrix of values and one of presence, so an operation is
a few numpy calls over every series at once, not a Python loop per series.
A range vector holds the raw samples of all series concatenated, with offsets,
and finds every step's window of every series in one vectorised search.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from ..errors import QueryError
from ._series import Labels

__all__ = [
    "Floats",
    "Ints",
    "Mask",
    "Matrix",
    "Scalar",
    "String",
    "Value",
    "Vec",
    "drop_name",
    "merge_same_labels",
]

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
class Vec:
    """``labels[i]`` is series i; ``v[i, j]`` its value at step j where ``m[i, j]``."""

    labels: list[Labels]
    v: Floats
    m: Mask
    order: str | None = None  # "asc" / "desc" after sort(), for instant results

    @staticmethod
    def empty(n: int) -> Vec:
        return Vec([], np.zeros((0, n)), np.zeros((0, n), dtype=bool))

    def __len__(self) -> int:
        return len(self.labels)

    def keep(self, rows: Any) -> Vec:
        """The rows selected by an index array or boolean mask."""
        rows = np.asarray(rows)
        if rows.dtype == bool:
            rows = np.flatnonzero(rows)
        return Vec([self.labels[i] for i in rows.tolist()], self.v[rows], self.m[rows])

    def nonempty(self) -> Vec:
        present = self.m.any(axis=1)
        return self if present.all() else self.keep(present)


@dataclass(slots=True)
class Matrix:
    """Raw samples of many series, concatenated; per step the window ``[end - range, end]``.

    Series i owns ``t[off[i]:off[i + 1]]`` (sorted) and the same slice of ``v``.
    """

    labels: list[Labels]
    t: Ints
    v: Floats
    off: Ints
    ends: Ints
    range_ms: int
    selector: Any = field(default=None)
    #: True when every sample lies in every step's window (one evaluation time).
    exact: bool = False

    def __len__(self) -> int:
        return len(self.labels)

    def bounds(self) -> tuple[Ints, Ints]:
        """``lo, hi`` of shape (series, steps): each window is ``t[lo:hi]``."""
        n_series = len(self.labels)
        if self.exact:
            steps = len(self.ends)
            lo = np.repeat(self.off[:-1, None], steps, axis=1)
            return lo, np.repeat(self.off[1:, None], steps, axis=1)
        if n_series == 0 or len(self.t) == 0:
            z = np.zeros((n_series, len(self.ends)), dtype=np.int64)
            z += self.off[:-1, None] if n_series else 0
            return z, z.copy()
        base = min(int(self.t.min()), int(self.ends.min()) - self.range_ms)
        # Series i owns keys [i * big, (i + 1) * big): one search finds every window.
        big = max(int(self.t.max()), int(self.ends.max())) - base + 2
        counts = np.diff(self.off)
        sid = np.arange(n_series, dtype=np.int64)
        key = np.repeat(sid * big, counts) + (self.t - base)
        row = (sid * big)[:, None]
        start = np.clip(self.ends - self.range_ms - base, 0, big - 1)[None, :]
        end = np.clip(self.ends - base, 0, big - 1)[None, :]
        lo = np.searchsorted(key, row + start, side="left")
        hi = np.searchsorted(key, row + end, side="right")
        return lo.astype(np.int64), hi.astype(np.int64)


Value = Scalar | String | Vec | Matrix


def drop_name(labels: Labels) -> Labels:
    if labels and labels[0][0] == "__name__":
        return labels[1:]
    return tuple(p for p in labels if p[0] != "__name__")


def merge_same_labels(vec: Vec) -> Vec:
    """Join rows whose labels became equal; both present at one step is an error."""
    rows: dict[Labels, list[int]] = {}
    for i, lb in enumerate(vec.labels):
        rows.setdefault(lb, []).append(i)
    if len(rows) == len(vec.labels):
        return vec
    labels, vs, ms = [], [], []
    for lb, idx in rows.items():
        m = vec.m[idx]
        if (m.sum(axis=0) > 1).any():
            raise QueryError("vector cannot contain metrics with the same labelset")
        v = vec.v[idx[0]].copy()
        for i in idx[1:]:
            v = np.where(vec.m[i], vec.v[i], v)
        labels.append(lb)
        vs.append(v)
        ms.append(m.any(axis=0))
    return Vec(labels, np.array(vs), np.array(ms), vec.order)
