"""PromQL evaluation: errors, unsupported constructs, and semantics checked by hand."""

from __future__ import annotations

import math

import pytest

from aivitals.errors import QueryError, UnsupportedQueryError
from aivitals.tsdb import Store
from aivitals.tsdb._aggregate import format_value
from aivitals.tsdb._functions import bucket_quantile

T = 1_700_000_000.0


@pytest.fixture
def store() -> Store:
    s = Store()
    for i in range(41):  # 10 minutes at 15 s
        s.append("c_total", {"pod": "a"}, 10.0 * i, T + 15 * i)
        s.append("c_total", {"pod": "b"}, 5.0 * i, T + 15 * i)
        s.append("g", {"pod": "a"}, float(i % 7), T + 15 * i)
    return s


END = T + 600


@pytest.mark.parametrize("expr", ["sum(", "rate(x[5m]", "x{", "1 +", "foo bar", ""])
def test_invalid_promql_is_a_query_error(store: Store, expr: str) -> None:
    with pytest.raises(QueryError, match="invalid PromQL"):
        store.query(expr, END)


@pytest.mark.parametrize(
    ("expr", "construct"),
    [
        ("double_exponential_smoothing(g[5m], 0.5, 0.5)", "double_exponential_smoothing"),
        ("mad_over_time(g[5m])", "mad_over_time"),
        ("histogram_count(g)", "histogram_count"),
        ('sort_by_label(g, "pod")', "sort_by_label"),
        ("limitk(1, g)", "limitk"),
    ],
)
def test_unsupported_names_the_construct(store: Store, expr: str, construct: str) -> None:
    with pytest.raises(UnsupportedQueryError, match=construct):
        store.query(expr, END)


def test_invalid_regex_is_a_query_error(store: Store) -> None:
    with pytest.raises(QueryError):
        store.query('g{pod=~"("}', END)


def test_rate_of_a_steady_counter(store: Store) -> None:
    got = {s.labels["pod"]: s.value for s in store.query("rate(c_total[5m])", END).vector}
    assert got["a"] == pytest.approx(10 / 15)
    assert got["b"] == pytest.approx(5 / 15)


def test_counter_reset_is_corrected() -> None:
    s = Store()
    for i, v in enumerate([10, 20, 30, 5, 15]):
        s.append("r_total", {}, float(v), T + 15 * i)
    # raw increase 5 + corrections 30 = 35 over 60 s sampled; window edges add no more
    assert s.query("increase(r_total[60s])", T + 60).values() == [pytest.approx(35.0)]
    assert s.query("resets(r_total[60s])", T + 60).values() == [1.0]


def test_lookback_is_five_minutes(store: Store) -> None:
    assert len(store.query("g", END + 300).vector) == 1
    assert store.query("g", END + 301).vector == []


def test_sum_by_and_name_dropping(store: Store) -> None:
    result = store.query("sum by (pod) (c_total)", END)
    assert {s.labels["pod"]: s.value for s in result.vector} == {"a": 400.0, "b": 200.0}
    assert all("__name__" not in s.labels for s in store.query("c_total * 2", END).vector)
    assert all(s.labels["__name__"] == "c_total" for s in store.query("c_total > 1", END).vector)


def test_many_to_many_is_an_error(store: Store) -> None:
    with pytest.raises(QueryError, match=r"many-to-many|duplicate"):
        store.query("c_total + on() c_total", END)


def test_range_query_shape(store: Store) -> None:
    result = store.query_range("sum(rate(c_total[1m]))", T + 60, T + 120, 30)
    assert result.type == "matrix"
    (series,) = result.matrix
    assert [t for t, _ in series.points] == [T + 60, T + 90, T + 120]
    assert all(v == pytest.approx(1.0) for _, v in series.points)


@pytest.mark.parametrize(
    ("start", "end", "step"), [(END, END - 1, 15), (END, END, 0), (0, 10**9, 1)]
)
def test_bad_range_arguments(store: Store, start: float, end: float, step: float) -> None:
    with pytest.raises(QueryError):
        store.query_range("g", start, end, step)


def test_range_vector_is_refused_in_range_query(store: Store) -> None:
    with pytest.raises(QueryError, match="range vector"):
        store.query_range("g[1m]", END - 60, END, 15)


def test_scalar_and_string_results(store: Store) -> None:
    assert store.query("1 + 2", END).scalar == (END, 3.0)
    assert store.query('"hello"', END).string == (END, "hello")


def test_histogram_quantile_rules() -> None:
    inf = math.inf
    assert bucket_quantile(0.5, [(1.0, 10.0), (2.0, 20.0), (inf, 20.0)]) == 1.0
    assert bucket_quantile(0.75, [(1.0, 10.0), (2.0, 20.0), (inf, 20.0)]) == 1.5
    assert bucket_quantile(0.99, [(1.0, 10.0), (inf, 20.0)]) == 1.0  # in +Inf: highest bound
    assert math.isnan(bucket_quantile(0.5, [(1.0, 10.0), (2.0, 20.0)]))  # no +Inf bucket
    assert math.isnan(bucket_quantile(0.5, [(inf, 0.0), (1.0, 0.0)]))  # no observations
    # non-monotonic counts are fixed up, not turned into negative widths
    assert bucket_quantile(0.5, [(1.0, 10.0), (2.0, 8.0), (inf, 20.0)]) == 1.0
    assert bucket_quantile(2, [(inf, 1.0)]) == inf
    assert bucket_quantile(-1, [(inf, 1.0)]) == -inf
    assert math.isnan(bucket_quantile(0, [(1.0, 0.0), (inf, 5.0)]))  # 0/0, not an error


def test_histogram_quantile_over_many_steps_gives_the_same_floats_as_one_at_a_time() -> None:
    """The vectorised path (every bucket present at a step) against ``bucket_quantile``:
    duplicate bounds, counts that decrease, empty buckets, bounds at or below zero, no
    +Inf bucket, and quantiles outside [0, 1] or NaN."""
    import numpy as np

    from aivitals.tsdb._functions import _bucket_quantiles

    rng = np.random.default_rng(7)
    inf = math.inf
    layouts = [
        [0.1, 0.5, 1.0, inf],
        [0.5, 0.5, 1.0, inf, inf],  # equal bounds are summed
        [-1.0, 0.0, 2.0, inf],
        [0.0, inf],
        [0.1, 1.0],  # no +Inf bucket: NaN
        [inf],  # one bucket: NaN
        [-inf, 1.0, inf],
    ]
    qs = np.array([0.0, 0.5, 0.9, 0.99, 1.0, -0.5, 1.5, math.nan, 0.25, 0.75])
    for uppers in layouts:
        for trial in range(40):
            steps = len(qs)
            counts = np.cumsum(rng.integers(0, 4, size=(len(uppers), steps)), axis=0).astype(float)
            if trial % 3 == 0:  # scrapes not atomic: a count below the one before
                counts[rng.integers(0, len(uppers))] -= rng.integers(0, 3, size=steps)
            if trial % 5 == 0:
                counts[:, ::2] = 0.0  # no observations
            if trial % 7 == 0:
                counts[0] = 0.0  # an empty first bucket (rank 0 at q=0: 0/0)
            got = _bucket_quantiles(qs, np.array(uppers), counts)
            for j in range(steps):
                want = bucket_quantile(
                    float(qs[j]), list(zip(uppers, counts[:, j].tolist(), strict=True))
                )
                assert (math.isnan(want) and math.isnan(got[j])) or got[j] == want, (
                    uppers,
                    counts[:, j],
                    qs[j],
                )


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (1.0, "1"),
        (0.1, "0.1"),
        (1e21, "1000000000000000000000"),
        (1e-7, "0.0000001"),
        (math.inf, "+Inf"),
        (-math.inf, "-Inf"),
        (math.nan, "NaN"),
        (-2.5, "-2.5"),
    ],
)
def test_count_values_formats_like_go(value: float, text: str) -> None:
    assert format_value(value) == text


def test_too_many_points_is_refused(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    from aivitals.tsdb import _engine

    monkeypatch.setattr(_engine, "MAX_SAMPLES", 50)
    with pytest.raises(QueryError, match="too many samples"):
        store.query_range("g", T, T + 600, 15)
    with pytest.raises(QueryError, match="too many samples"):
        store.query("rate(c_total[10m])", END)


def test_runaway_subquery_is_refused(store: Store) -> None:
    with pytest.raises(QueryError, match="subquery"):
        store.query("max_over_time(g[10y:1s])", END)
