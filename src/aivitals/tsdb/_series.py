"""One stored series: compact int64/float64 arrays with a retention window.

Timestamps are int64 milliseconds and values float64, each in an
``array.array`` (16 bytes per sample plus the arrays' growth slack), never a
Python object per sample. Old samples are dropped from the head lazily: a
``start`` offset moves forward and the arrays are compacted only when the
dead head is large, so trimming is amortised O(1) per sample.
"""

from __future__ import annotations

import math
import struct
from array import array
from bisect import bisect_left, bisect_right

import numpy as np
import numpy.typing as npt

__all__ = ["STALE_NAN", "Labels", "Series", "is_stale", "label_key"]

#: Prometheus's staleness marker: a NaN with this exact bit pattern.
STALE_BITS = 0x7FF0000000000002
STALE_NAN: float = struct.unpack("<d", struct.pack("<Q", STALE_BITS))[0]

#: A series identity: sorted ``(name, value)`` pairs, ``__name__`` included.
Labels = tuple[tuple[str, str], ...]

# Compact once the dropped head is 1/8 of the array: memory stays within 12.5% of
# the live samples and each sample is moved about 8 times over its life.
_COMPACT_MIN = 256
_COMPACT_SHARE = 8


def is_stale(value: float) -> bool:
    """True for Prometheus's staleness marker (not for an ordinary NaN)."""
    return math.isnan(value) and struct.pack("<d", value) == struct.pack("<Q", STALE_BITS)


def label_key(labels: dict[str, str] | tuple[tuple[str, str], ...]) -> Labels:
    """The canonical, hashable identity of a label set."""
    items = labels.items() if isinstance(labels, dict) else labels
    return tuple(sorted((k, v) for k, v in items if v != ""))


def seek(ts: array[int], t: int, start: int, *, right: bool = False) -> int:
    """``bisect_left`` (or ``bisect_right``) of ``t`` in ``ts[start:]``, usually in O(1).

    Scrapes are nearly regular, so the position is first guessed by
    interpolation and then corrected by a few steps; irregular series fall
    back to bisection around the guess.
    """
    n = len(ts)
    if n <= start:
        return start
    first, last = ts[start], ts[n - 1]
    if t < first or (t == first and not right):
        return start
    if t > last or (t == last and right):
        return n
    span = last - first
    i = start + (t - first) * (n - 1 - start) // (span if span > 0 else 1)
    for _ in range(4):
        # the answer is the first i with ts[i] > t (right) or ts[i] >= t (left)
        if i > start and (ts[i - 1] > t if right else ts[i - 1] >= t):
            i -= 1
        elif i < n and (ts[i] <= t if right else ts[i] < t):
            i += 1
        else:
            return i
    return bisect_right(ts, t, start) if right else bisect_left(ts, t, start)


class Series:
    """The samples of one series, oldest first, in two parallel arrays."""

    __slots__ = ("dead", "id", "labels", "start", "ts", "vals")

    def __init__(self, sid: int, labels: Labels) -> None:
        self.id = sid
        self.labels = labels
        self.ts = array("q")
        self.vals = array("d")
        self.start = 0
        self.dead = False  # set when the store drops it; parsers' caches then refetch

    def __len__(self) -> int:
        return len(self.ts) - self.start

    def append(self, t_ms: int, value: float) -> str | None:
        """Append one sample; returns the rejection reason instead of storing, or None."""
        ts = self.ts
        if len(ts) > self.start:
            last = ts[-1]
            if t_ms < last:
                return "out_of_order"
            if t_ms == last:
                return "duplicate"
        ts.append(t_ms)
        self.vals.append(value)
        return None

    def trim_before(self, min_t_ms: int) -> int:
        """Drop samples older than ``min_t_ms``; returns how many were dropped."""
        cut = bisect_left(self.ts, min_t_ms, self.start)
        dropped = cut - self.start
        self.start = cut
        if self.start >= _COMPACT_MIN and self.start * _COMPACT_SHARE >= len(self.ts):
            del self.ts[: self.start]
            del self.vals[: self.start]
            self.start = 0
        return dropped

    def window(self, mint: int, maxt: int) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]:
        """Copies of the samples with ``mint <= t <= maxt`` as numpy arrays."""
        lo = bisect_left(self.ts, mint, self.start)
        hi = bisect_right(self.ts, maxt, lo)
        t = np.frombuffer(self.ts[lo:hi], dtype=np.int64)
        v = np.frombuffer(self.vals[lo:hi], dtype=np.float64)
        return t, v

    def nbytes(self) -> int:
        return self.ts.buffer_info()[1] * 8 + self.vals.buffer_info()[1] * 8
