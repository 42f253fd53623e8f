"""The Numenta Anomaly Benchmark's scoring, written from its SCORING.md.

Per file: rows after the probation period; windows of labelled anomalies; a
sigmoid position weight that rewards early detection inside a window and
punishes detections after it less the further they are; one threshold for the
whole corpus chosen to maximise the raw score; the result normalised between
the null detector (0) and the perfect one (100).

**Usage**::

    files = [NabFile(scores=s, windows=[(120, 180)]), ...]   # windows as row ranges
    result = score_corpus(files, STANDARD)
    result.normalized, result.threshold
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

__all__ = [
    "LOW_FN",
    "LOW_FP",
    "PROFILES",
    "STANDARD",
    "NabFile",
    "NabProfile",
    "NabResult",
    "row_weights",
    "scaled_sigmoid",
    "score_corpus",
]


@dataclass(frozen=True, slots=True)
class NabProfile:
    name: str
    tp: float
    fn: float
    fp: float


STANDARD = NabProfile("standard", 1.0, 1.0, 0.11)
LOW_FP = NabProfile("reward_low_FP_rate", 1.0, 1.0, 0.22)
LOW_FN = NabProfile("reward_low_FN_rate", 1.0, 2.0, 0.11)
PROFILES = (STANDARD, LOW_FP, LOW_FN)


@dataclass(frozen=True, slots=True)
class NabFile:
    """A file's anomaly scores (one per row) and its windows as inclusive row ranges."""

    scores: npt.NDArray[np.float64]
    windows: Sequence[tuple[int, int]]


@dataclass(frozen=True, slots=True)
class NabResult:
    profile: str
    raw: float
    normalized: float
    threshold: float
    null: float
    perfect: float


def scaled_sigmoid(x: float) -> float:
    """NAB's ``S(x) = 2 / (1 + exp(5x)) - 1``, and -1 beyond x = 3."""
    if x > 3.0:
        return -1.0
    return 2.0 / (1.0 + math.exp(5.0 * x)) - 1.0


_S_MINUS_1 = scaled_sigmoid(-1.0)


def probation_rows(n: int) -> int:
    return int(min(math.floor(0.15 * n), 0.15 * 5000))


def row_weights(
    n: int, windows: Sequence[tuple[int, int]], profile: NabProfile
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.int64]]:
    """Each row's weighted score if it were a detection, and its window id (-1 outside)."""
    weights = np.full(n, -profile.fp)
    window_of = np.full(n, -1, dtype=np.int64)
    ordered = sorted(windows)
    for wid, (left, right) in enumerate(ordered):
        width = right - left + 1
        for i in range(max(left, 0), min(right, n - 1) + 1):
            weights[i] = scaled_sigmoid(-(right - i + 1) / width) * profile.tp / _S_MINUS_1
            window_of[i] = wid
        nxt = ordered[wid + 1][0] if wid + 1 < len(ordered) else n
        for i in range(right + 1, min(nxt, n)):
            x = abs(right - i) / (width - 1) if width > 1 else math.inf
            weights[i] = scaled_sigmoid(x) * profile.fp
    return weights, window_of


def score_corpus(files: Sequence[NabFile], profile: NabProfile) -> NabResult:
    """The best raw score over one corpus-wide threshold, and its normalised value."""
    all_scores: list[npt.NDArray[np.float64]] = []
    all_weights: list[npt.NDArray[np.float64]] = []
    all_windows: list[npt.NDArray[np.int64]] = []
    n_windows = 0
    for f in files:
        n = len(f.scores)
        w, wid = row_weights(n, f.windows, profile)
        keep = np.arange(n) >= probation_rows(n)
        gid = np.where(wid >= 0, wid + n_windows, -1)
        n_windows += len(f.windows)
        all_scores.append(np.asarray(f.scores, dtype=np.float64)[keep])
        all_weights.append(w[keep])
        all_windows.append(gid[keep])
    null = -profile.fn * n_windows
    perfect = profile.tp * n_windows
    if not all_scores:
        return NabResult(profile.name, null, 0.0, 1.0, null, perfect)
    raw, threshold = _sweep(
        np.concatenate(all_scores),
        np.concatenate(all_weights),
        np.concatenate(all_windows),
        n_windows,
        profile,
    )
    norm = 100.0 * (raw - null) / (perfect - null) if perfect != null else 0.0
    return NabResult(profile.name, raw, norm, threshold, null, perfect)


def _sweep(
    scores: npt.NDArray[np.float64],
    weights: npt.NDArray[np.float64],
    windows: npt.NDArray[np.int64],
    n_windows: int,
    profile: NabProfile,
) -> tuple[float, float]:
    """Lower the threshold one distinct score at a time, updating the raw score."""
    order = np.argsort(-scores, kind="stable")
    best_in_window = np.full(n_windows, -profile.fn)
    fp_sum = 0.0
    window_sum = -profile.fn * n_windows
    best_raw, best_threshold = window_sum, float(scores.max()) + 1e-9 if scores.size else 1.0
    i = 0
    while i < len(order):
        value = scores[order[i]]
        j = i
        while j < len(order) and scores[order[j]] == value:
            k = order[j]
            wid = windows[k]
            if wid < 0:
                fp_sum += weights[k]
            elif weights[k] > best_in_window[wid]:
                window_sum += weights[k] - best_in_window[wid]
                best_in_window[wid] = weights[k]
            j += 1
        raw = fp_sum + window_sum
        if raw > best_raw:
            best_raw, best_threshold = raw, float(value)
        i = j
    return best_raw, best_threshold
