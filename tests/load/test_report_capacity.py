from __future__ import annotations

import math

import pytest

from aivitals.cli import main
from aivitals.errors import ConfigError
from aivitals.load import SLO, CapacityLevel, RequestResult, find_knee, summarize, sweep_capacity
from tests.load._server import tiny_server


def _ok(latency: float, ttft: float | None = None, out: int = 0) -> RequestResult:
    return RequestResult(0.0, 0.0, latency, 200, ttft=ttft, output_tokens=out, prompt_tokens=4)


def test_report_numbers() -> None:
    results = [_ok(x / 1000) for x in range(1, 101)]  # 1..100 ms
    results += [RequestResult(0, 0, 0.5, 503, error="HTTP 503", code="QUEUE_FULL")]
    rep = summarize(results, mode="open", target="t", duration_s=10.0, offered_rate=10.1)
    assert rep.sent == 101 and rep.completed == 100 and rep.failed == 1
    assert rep.request_throughput == pytest.approx(10.0)
    assert rep.e2e.median_ms == pytest.approx(50.5)
    assert rep.e2e.p99_ms == pytest.approx(99.01)
    assert rep.e2e.max_ms == pytest.approx(100.0)
    assert rep.errors == {"HTTP 503": 1} and rep.error_codes == {"QUEUE_FULL": 1}
    assert rep.total_input_tokens == 400
    assert rep.goodput is None


def test_tpot_excludes_the_first_token_and_goodput_applies_every_slo() -> None:
    a = _ok(1.0, ttft=0.1, out=10)  # TPOT = 0.9 / 9 = 0.1 s
    b = _ok(0.3, ttft=0.2, out=2)  # TPOT = 0.1 s
    c = _ok(2.0, ttft=1.5, out=1)  # no TPOT with one token
    rep = summarize(
        [a, b, c], mode="closed", target="t", duration_s=1.0, slo=SLO(ttft=1.0, tpot=0.2, e2e=1.5)
    )
    assert rep.tpot.count == 2 and rep.tpot.mean_ms == pytest.approx(100.0)
    assert rep.goodput == pytest.approx(2.0)  # c misses both ttft and e2e
    assert SLO(tpot=0.05).met(a) is False


def test_empty_results_give_nan_stats_not_a_crash() -> None:
    rep = summarize([], mode="open", target="t", duration_s=1.0)
    assert rep.sent == 0 and math.isnan(rep.e2e.median_ms) and rep.error_rate == 0.0
    assert "Successful requests" in rep.format()


def _lv(c: int, rps: float, p95: float, err: float = 0.0) -> CapacityLevel:
    return CapacityLevel(c, rps, p95 / 2, p95, p95 * 1.2, err)


def test_knee_is_where_p95_jumps() -> None:
    levels = [_lv(1, 10, 100), _lv(2, 20, 105), _lv(4, 38, 120), _lv(8, 40, 200), _lv(16, 40, 400)]
    idx, why = find_knee(levels, jump=1.5)
    assert idx == 3 and "x1.67" in why
    assert find_knee(levels[:3]) == (None, "")
    idx, why = find_knee([_lv(1, 10, 100), _lv(2, 20, 100, err=0.2)])
    assert idx == 1 and "errors" in why


def test_capacity_sweep_finds_the_knee_of_a_serial_server() -> None:
    # /serial serves one request at a time: P95 doubles with the concurrency.
    with tiny_server(slow_delay=0.05) as srv:
        rep = sweep_capacity(srv.url + "/serial", levels=(1, 2, 4), step_duration=0.5)
    assert rep.knee == 2 and rep.safe_concurrency == 1
    assert rep.capacity_rps == pytest.approx(20, rel=0.3)
    assert "knee at concurrency 2" in rep.format()


def test_capacity_bad_levels() -> None:
    for levels in ((), (4, 2), (0, 1), (1, 1)):
        with pytest.raises(ConfigError, match="levels"):
            sweep_capacity("http://127.0.0.1:1/", levels=levels)
    with pytest.raises(ConfigError, match="jump"):
        sweep_capacity("http://127.0.0.1:1/", jump=1.0)


def test_cli_capacity(capsys: pytest.CaptureFixture[str]) -> None:
    with tiny_server() as srv:
        main(["capacity", srv.url + "/", "--levels", "1,2", "--step", "0.3s"])
    out = capsys.readouterr().out
    assert "concurrency    1" in out and "conc" in out
