"""The fleet's steady traffic: a hit ratio that stays put and a median that stays a hit."""

from __future__ import annotations

from aivitals.fleet._traffic import MISS_EVERY, is_fresh


def test_the_misses_are_a_steady_third() -> None:
    assert MISS_EVERY == 3
    flags = [is_fresh(i) for i in range(300)]
    assert sum(flags) == 100
    assert flags[:3] == [False, False, True]  # hits from the first requests on


def test_no_window_of_a_few_requests_holds_half_misses() -> None:
    """The median latency of any rate window (5 to 40 requests: 2.5-20 s at 2/s) is a
    hit's: with half misses it sat on the edge between a hit's few milliseconds and a
    miss's tens, and jumped a bucket whenever a window held one miss more."""
    flags = [is_fresh(i) for i in range(200)]
    for n in range(5, 41):
        for start in range(len(flags) - n):
            misses = sum(flags[start : start + n])
            assert misses < n / 2, (n, start, misses)
