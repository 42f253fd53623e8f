from __future__ import annotations

import math

import numpy as np
import pytest

from aivitals.diagnose._nab import (
    LOW_FN,
    LOW_FP,
    STANDARD,
    NabFile,
    probation_rows,
    row_weights,
    scaled_sigmoid,
    score_corpus,
)


def test_sigmoid_matches_the_documented_points() -> None:
    assert scaled_sigmoid(-1.0) == pytest.approx(0.98661, abs=1e-5)
    assert scaled_sigmoid(0.0) == 0.0
    assert scaled_sigmoid(3.5) == -1.0


def test_probation_is_15_percent_capped_at_750_rows() -> None:
    assert probation_rows(1000) == 150
    assert probation_rows(10000) == 750


def test_detection_at_a_window_start_is_a_full_true_positive() -> None:
    n = 1000
    scores = np.zeros(n)
    scores[500] = 1.0
    r = score_corpus([NabFile(scores, [(500, 599)])], STANDARD)
    assert r.raw == pytest.approx(1.0)
    assert r.normalized == pytest.approx(100.0)


def test_no_detection_scores_the_null_detector() -> None:
    r = score_corpus([NabFile(np.zeros(1000), [(500, 599)])], STANDARD)
    assert r.raw == pytest.approx(-1.0)
    assert r.normalized == pytest.approx(0.0)


def test_late_detection_in_window_earns_less() -> None:
    scores = np.zeros(1000)
    scores[590] = 1.0
    r = score_corpus([NabFile(scores, [(500, 599)])], STANDARD)
    expected = scaled_sigmoid(-(599 - 590 + 1) / 100) / scaled_sigmoid(-1.0)
    assert r.raw == pytest.approx(expected)
    assert 0 < r.raw < 1


def test_false_positive_before_any_window_costs_fp_weight() -> None:
    scores = np.zeros(1000)
    scores[300] = 1.0  # after probation, before the window
    scores[500] = 1.0
    r = score_corpus([NabFile(scores, [(500, 599)])], STANDARD)
    assert r.raw == pytest.approx(1.0 - 0.11)
    low_fp = score_corpus([NabFile(scores, [(500, 599)])], LOW_FP)
    assert low_fp.raw == pytest.approx(1.0 - 0.22)


def test_detections_in_probation_are_ignored() -> None:
    scores = np.zeros(1000)
    scores[10] = 1.0
    scores[500] = 1.0
    r = score_corpus([NabFile(scores, [(500, 599)])], STANDARD)
    assert r.raw == pytest.approx(1.0)


def test_false_positive_after_a_window_is_weighted_by_distance() -> None:
    n = 1000
    w, wid = row_weights(n, [(500, 599)], STANDARD)
    assert wid[550] == 0 and wid[700] == -1
    assert w[600] == pytest.approx(scaled_sigmoid(1 / 99) * 0.11)
    assert w[900] == pytest.approx(-0.11)
    assert w[300] == pytest.approx(-0.11)


def test_threshold_is_chosen_over_the_whole_corpus() -> None:
    a = np.zeros(1000)
    a[500] = 0.9
    a[300] = 0.5  # a weaker false positive
    b = np.zeros(1000)
    b[400] = 0.6
    files = [NabFile(a, [(500, 599)]), NabFile(b, [(400, 499)])]
    r = score_corpus(files, STANDARD)
    # threshold 0.6 catches both windows and leaves the 0.5 false positive out
    assert r.threshold == pytest.approx(0.6)
    assert r.raw == pytest.approx(2.0)


def test_low_fn_profile_doubles_the_miss_cost() -> None:
    r = score_corpus([NabFile(np.zeros(1000), [(500, 599), (800, 899)])], LOW_FN)
    assert r.null == -4.0
    assert r.raw == -4.0


def test_empty_corpus_is_zero() -> None:
    r = score_corpus([], STANDARD)
    assert r.normalized == 0.0
    assert not math.isnan(r.raw)
