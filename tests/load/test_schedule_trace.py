from __future__ import annotations

import itertools
import statistics
from pathlib import Path

import pytest

from aivitals.errors import ConfigError, FaultRefused, ParseError
from aivitals.load import (
    check_target,
    load_trace,
    parse_duration,
    poisson_schedule,
    uniform_schedule,
)


def test_poisson_schedule_has_the_rate_and_exponential_gaps() -> None:
    offsets = poisson_schedule(1000.0, 20.0, seed=7)
    # Count is Poisson(20,000): 5 sigma is about 700.
    assert abs(len(offsets) - 20_000) < 700
    gaps = [b - a for a, b in itertools.pairwise(offsets)]
    mean = statistics.fmean(gaps)
    assert mean == pytest.approx(0.001, rel=0.03)
    # Exponential gaps: standard deviation equals the mean (CV 1), unlike a fixed rate.
    assert statistics.pstdev(gaps) / mean == pytest.approx(1.0, abs=0.05)
    assert offsets == sorted(offsets) and offsets[0] > 0 and offsets[-1] < 20.0


def test_poisson_schedule_is_reproducible_with_a_seed() -> None:
    assert poisson_schedule(50, 2, seed=1) == poisson_schedule(50, 2, seed=1)
    assert poisson_schedule(50, 2, seed=1) != poisson_schedule(50, 2, seed=2)


def test_uniform_schedule_is_evenly_spaced() -> None:
    assert uniform_schedule(4, 1) == [0.0, 0.25, 0.5, 0.75]


@pytest.mark.parametrize("rate,duration", [(0, 1), (-5, 1), (10, 0), (10, -1)])
def test_bad_rate_or_duration_is_refused(rate: float, duration: float) -> None:
    with pytest.raises(ConfigError):
        poisson_schedule(rate, duration)


def test_azure_trace_is_read_with_real_lengths() -> None:
    reqs = load_trace("azure-code", max_prompt_tokens=None, max_output_tokens=None)
    assert len(reqs) == 8819  # data rows in the file (its README says 8,818)
    assert reqs[0].at == 0.0
    assert all(b.at >= a.at for a, b in itertools.pairwise(reqs))
    # The first row of the file: 4808 context tokens, 10 generated.
    assert (reqs[0].prompt_tokens, reqs[0].max_tokens) == (4808, 10)
    assert 3000 < reqs[-1].at < 3700  # about one hour


def test_trace_time_scale_duration_and_caps() -> None:
    full = load_trace("azure-conv", limit=200)
    fast = load_trace("azure-conv", limit=200, time_scale=0.1)
    assert fast[-1].at == pytest.approx(full[-1].at * 0.1)
    cut = load_trace("azure-conv", duration=10.0)
    assert cut and all(r.at < 10.0 for r in cut)
    capped = load_trace("azure-code", limit=50, max_prompt_tokens=100, max_output_tokens=5)
    assert max(r.prompt_tokens for r in capped) <= 100 and max(r.max_tokens for r in capped) <= 5


def test_trace_from_a_file_and_bad_files(tmp_path: Path) -> None:
    good = tmp_path / "t.csv"
    good.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:00:00.5000000,10,2\n2023-11-16 18:00:01.0000000,20,3\n"
    )
    reqs = load_trace(str(good))
    assert [(r.at, r.prompt_tokens, r.max_tokens) for r in reqs] == [(0.0, 10, 2), (0.5, 20, 3)]
    bad = tmp_path / "bad.csv"
    bad.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,x,1\n")
    with pytest.raises(ParseError, match=r"bad\.csv:2"):
        load_trace(str(bad))
    empty = tmp_path / "empty.csv"
    empty.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n")
    with pytest.raises(ParseError, match="no requests"):
        load_trace(str(empty))
    with pytest.raises(ConfigError, match="azure-code"):
        load_trace("no-such-trace")
    with pytest.raises(ConfigError, match="time_scale"):
        load_trace(str(good), time_scale=0)


@pytest.mark.parametrize(
    "url",
    ["http://127.0.0.1:80/", "http://localhost:8000/x", "http://127.9.9.9/", "http://[::1]:1/"],
)
def test_loopback_targets_are_accepted(url: str) -> None:
    check_target(url)


@pytest.mark.parametrize("url", ["http://10.0.0.5/", "http://example.com/", "http://8.8.8.8:80/"])
def test_non_loopback_targets_are_refused_unless_allowed(url: str) -> None:
    with pytest.raises(FaultRefused, match="not on loopback"):
        check_target(url)
    host = url.split("//")[1].split(":")[0].split("/")[0]
    check_target(url, allow_hosts=[host])


def test_bad_urls_are_config_errors() -> None:
    for url in ("https://127.0.0.1/", "127.0.0.1:80", "http://:80/", "http://127.0.0.1:99999/"):
        with pytest.raises(ConfigError):
            check_target(url)


def test_durations_parse() -> None:
    assert parse_duration("30s") == 30.0
    assert parse_duration("2m") == 120.0
    assert parse_duration("500ms") == 0.5
    assert parse_duration("1h") == 3600.0
    assert parse_duration("12") == 12.0
    assert parse_duration(-3) == -3.0  # the caller decides what negative means
    for bad in ("soon", "3 days", "", "1e3s"):
        with pytest.raises(ConfigError, match="duration"):
            parse_duration(bad)
