"""The per-series arrays: the interpolating seek agrees with bisection."""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right

from hypothesis import given
from hypothesis import strategies as st

from aivitals.tsdb._series import seek


@given(
    st.lists(st.integers(min_value=0, max_value=10**6), max_size=60),
    st.integers(min_value=-10, max_value=10**6 + 10),
    st.integers(min_value=0, max_value=70),
)
def test_seek_matches_bisect(raw: list[int], t: int, start: int) -> None:
    ts = array("q", sorted(set(raw)))
    start = min(start, len(ts))
    assert seek(ts, t, start) == bisect_left(ts, t, start)
    assert seek(ts, t, start, right=True) == bisect_right(ts, t, start)


def test_seek_on_regular_scrapes() -> None:
    ts = array("q", range(0, 15_000 * 100, 15_000))
    assert seek(ts, 15_000 * 40, 0) == 40
    assert seek(ts, 15_000 * 40, 0, right=True) == 41
    assert seek(ts, 15_000 * 40 + 1, 0) == 41
