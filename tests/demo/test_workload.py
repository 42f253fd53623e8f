"""The demo's workload model (rate, Zipf prompt pool, expected cache hits), its load
streams and the watcher of the stack's processes, without starting the stack."""

from __future__ import annotations

import itertools
import json
import random
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from aivitals.demo._streams import LoadStream, stack_failure
from aivitals.demo._view import ClientCounts, History, Snapshot, render, sparkline
from aivitals.demo._workload import (
    expected_hit_ratio,
    plan_workload,
    pool_size_for,
    trace_rate,
    zipf_ranks,
    zipf_weights,
)
from aivitals.errors import ConfigError, ServiceError
from aivitals.load import LoadConfig, TraceRequest, load_trace


def _trace(n: int = 200, gap: float = 0.5) -> list[TraceRequest]:
    rng = random.Random(1)
    return [TraceRequest(i * gap, rng.randint(20, 200), rng.randint(4, 48)) for i in range(n)]


def test_zipf_weights_sum_to_one_and_fall_with_rank() -> None:
    w = zipf_weights(1000, 1.0)
    assert sum(w) == pytest.approx(1.0)
    assert all(a > b for a, b in itertools.pairwise(w))
    assert w[0] / w[9] == pytest.approx(10.0)


@pytest.mark.slow
def test_the_pool_size_lands_the_expected_hit_ratio_on_the_target() -> None:
    for rate, target in ((1.0, 0.4), (5.0, 0.4), (3.0, 0.5)):
        n = pool_size_for(target, rate, 300.0)
        assert expected_hit_ratio(zipf_weights(n, 1.0), rate, 300.0) == pytest.approx(
            target, abs=0.01
        )
    # more traffic in a TTL needs a bigger pool for the same hit ratio
    assert pool_size_for(0.4, 5.0, 300.0) > pool_size_for(0.4, 1.0, 300.0)
    with pytest.raises(ConfigError):
        pool_size_for(1.0, 1.0, 300.0)


def test_the_hit_ratio_model_matches_a_simulated_ttl_cache() -> None:
    # Poisson arrivals, Zipf draws, entries that live ttl seconds from their miss: the
    # measured steady-state hit ratio is the one the pool was sized for.
    rate, ttl, target = 4.0, 60.0, 0.4
    n = pool_size_for(target, rate, ttl)
    rng = random.Random(7)
    ranks = zipf_ranks(zipf_weights(n, 1.0), 60_000, rng)
    expires: dict[int, float] = {}
    t, hits, counted = 0.0, 0, 0
    for i, k in enumerate(ranks):
        t += rng.expovariate(rate)
        hit = expires.get(k, -1.0) > t
        if not hit:
            expires[k] = t + ttl
        if i >= 20_000:  # past the cold start
            counted += 1
            hits += hit
    assert hits / counted == pytest.approx(target, abs=0.05)


def test_the_plan_at_a_given_rate_scales_the_trace_and_repeats_prompts() -> None:
    trace = _trace()
    wl = plan_workload(
        trace,
        url="http://127.0.0.1:1",
        workers=2,
        rate=4.0,
        utilization=0.6,
        hit_ratio=0.4,
        cache_ttl=300.0,
        embeddings_rate=2.0,
        probe_seconds=1.0,
        draws=5000,
    )
    assert wl.capacity is None  # no probe when the rate is given
    assert trace_rate(trace) == pytest.approx(2.0)
    assert wl.time_scale == pytest.approx(0.5)  # 2/s stretched to 4/s
    bodies = [s.body for s in wl.completions]
    distinct = len(set(bodies))
    assert 1 < distinct < len(bodies)  # repeated, but not all the same
    lengths = {(t.prompt_tokens, t.max_tokens) for t in trace}
    for spec in wl.completions[:200]:
        body = json.loads(spec.body)
        assert (len(body["prompt"].split()), body["max_tokens"]) in lengths
        assert body["stream"] is True
    assert "4.00 completions/s" in wl.why() and "--rate" in wl.why()


def test_the_packaged_trace_gives_a_rate_of_a_few_requests_a_second() -> None:
    rate = trace_rate(load_trace("azure-conv"))
    assert 4.0 < rate < 7.0  # 19,366 requests in about an hour


def test_a_load_stream_that_fails_is_raised_in_the_main_thread() -> None:
    def broken(cfg: LoadConfig, **kw: Any) -> None:
        raise ConfigError("trace 'x' not found")

    stop = threading.Event()
    stream = LoadStream(
        "completions",
        lambda left: LoadConfig(url="http://127.0.0.1:1/", rate=1, duration=left),
        stop,
        until=time.monotonic() + 60,
        load=broken,
    )
    stream.start()
    stream.join(5)
    with pytest.raises(ServiceError, match=r"completions load stopped: ConfigError: trace 'x'"):
        stream.check()


def test_a_load_stream_that_ends_early_without_error_is_a_failure() -> None:
    stop = threading.Event()
    stream = LoadStream(
        "embeddings",
        lambda left: LoadConfig(url="http://127.0.0.1:1/", rate=1, duration=left),
        stop,
        until=time.monotonic() + 60,
        load=lambda cfg, **kw: (_ for _ in ()).throw(SystemExit(0)),
    )
    stream.start()
    stream.join(5)
    with pytest.raises(ServiceError, match="embeddings load stopped: SystemExit"):
        stream.check()
    stop.set()


def _proc(code: int | None) -> Any:
    p = subprocess.Popen([sys.executable, "-c", f"import sys; sys.exit({code or 0})"])
    p.wait()
    return p


def test_the_watcher_names_the_part_that_died(tmp_path: Path) -> None:
    alive = SimpleNamespace(poll=lambda: None, pid=1, returncode=None)
    out = tmp_path / "service.out"
    out.write_text("Traceback ...\nRuntimeError: boom\n")
    service = SimpleNamespace(
        exit_code=lambda: None, pid=42, port=8000, tail=lambda n: out.read_text()[-n:]
    )
    stack = SimpleNamespace(
        redis=SimpleNamespace(proc=alive, port=6379), service=service, agent=None
    )
    assert stack_failure(stack) is None
    stack.redis = SimpleNamespace(proc=_proc(3), port=6379)
    assert "redis-server" in (stack_failure(stack) or "") and "exited with 3" in (
        stack_failure(stack) or ""
    )
    stack.redis = SimpleNamespace(proc=alive, port=6379)
    service.exit_code = lambda: -9
    msg = stack_failure(stack) or ""
    assert "demo service (pid 42, port 8000) exited with -9" in msg and "boom" in msg


def test_the_view_shows_the_client_counters_the_backend_and_sparklines() -> None:
    from rich.console import Console

    history = History(seconds=60)
    for i in range(30):
        history.add(Snapshot(at=1000.0 + i, rps=float(i), gpu_util=0.5))
    snap = Snapshot(
        at=1030.0,
        rps=3.0,
        gpu_backend="nvml",
        gpu_util=0.6,
        clients=[ClientCounts("completions", sent=10, answered=7, errors=1, timeouts=1)],
        cache_hits_by_kind={"completions": 0.125, "embeddings": 0.875},
    )
    console = Console(width=120, record=True)
    console.print(render(snap, title="t", status="s", history=history))
    text = console.export_text()
    assert "GPU util (nvml)" in text and "60.0%" in text
    # each kind of answer's hit ratio on its own line beside the other's
    line = next(x for x in text.splitlines() if "12.5%" in x)
    assert "completions" in line and "embeddings" in line and "87.5%" in line
    assert "completions" in text and "10" in text and "7" in text
    assert sparkline([0.0, 1.0, 2.0, 3.0], width=4) == "▁▃▆█"
    assert sparkline(history.values("rps"))


def test_a_bounded_run_scales_the_part_of_the_trace_it_replays() -> None:
    # the first half of this trace is twice as sparse as the second
    trace = [TraceRequest(i * 1.0, 50, 8) for i in range(100)]
    trace += [TraceRequest(100 + i * 0.5, 50, 8) for i in range(200)]
    common: dict[str, Any] = {
        "url": "http://127.0.0.1:1",
        "workers": 2,
        "rate": 2.0,
        "utilization": 0.6,
        "hit_ratio": 0.4,
        "cache_ttl": 300.0,
        "embeddings_rate": 1.0,
        "probe_seconds": 1.0,
        "draws": 100,
    }
    wl = plan_workload(trace, duration=30.0, **common)
    sent = [t for t in trace if t.at * wl.time_scale < 30.0]
    assert len(sent) == pytest.approx(60, abs=1)  # rate x duration
    unbounded = plan_workload(trace, **common)
    assert unbounded.time_scale == pytest.approx(trace_rate(trace) / 2.0)


def test_the_plan_says_when_completions_are_too_slow_for_the_domain_bounds() -> None:
    from dataclasses import replace

    from aivitals.demo._workload import Capacity

    wl = plan_workload(
        _trace(),
        url="http://127.0.0.1:1",
        workers=2,
        rate=1.0,
        utilization=0.5,
        hit_ratio=0.4,
        cache_ttl=300.0,
        embeddings_rate=1.0,
        probe_seconds=1.0,
        draws=10,
    )
    fast = replace(wl, capacity=Capacity(4.0, 2, 5.0, 20, 400.0, 0))
    slow = replace(wl, capacity=Capacity(1.2, 2, 5.0, 6, 1600.0, 0))
    assert "QueueWaitHigh" not in fast.why()
    assert "a completion takes 1.6 s here" in slow.why() and "QueueWaitHigh" in slow.why()


def test_trace_lengths_are_scaled_to_the_demo_model_keeping_times_and_order() -> None:
    from aivitals.demo._workload import (
        LENGTH_SCALE,
        MAX_OUTPUT_TOKENS,
        MAX_PROMPT_TOKENS,
        scale_lengths,
    )

    raw = load_trace("azure-conv")
    scaled = scale_lengths(raw)
    assert [t.at for t in scaled] == [t.at for t in raw]  # arrivals and bursts unchanged
    outputs = sorted(t.max_tokens for t in scaled)
    assert outputs[len(outputs) // 2] == round(
        sorted(t.max_tokens for t in raw)[len(raw) // 2] * LENGTH_SCALE
    )
    assert outputs[0] >= 1 and outputs[-1] <= MAX_OUTPUT_TOKENS
    assert max(t.prompt_tokens for t in scaled) <= MAX_PROMPT_TOKENS
    # the relative distribution is kept: a longer recorded output is never scaled shorter
    pairs = sorted(zip((t.max_tokens for t in raw), (t.max_tokens for t in scaled), strict=True))
    assert all(a[1] <= b[1] for a, b in itertools.pairwise(pairs))
    # the caps clip almost nothing: the long tail survives the scaling
    assert sum(t.max_tokens == MAX_OUTPUT_TOKENS for t in scaled) < 0.01 * len(scaled)
    with pytest.raises(ConfigError, match="length scale"):
        scale_lengths(raw, 0.0)
    wl = plan_workload(
        scaled,
        url="http://127.0.0.1:1",
        workers=2,
        rate=2.0,
        utilization=0.5,
        hit_ratio=0.4,
        cache_ttl=300.0,
        embeddings_rate=1.0,
        probe_seconds=1.0,
        draws=10,
        length_scale=LENGTH_SCALE,
    )
    assert "token lengths x1/16 of the trace's" in wl.why()


def test_the_capacity_probe_runs_the_embeddings_beside_the_completions() -> None:
    from aivitals.demo._workload import measure_capacity
    from aivitals.load import completions_request, embeddings_request
    from tests.load._server import tiny_server

    with tiny_server() as srv:
        cap = measure_capacity(
            srv.url + "/v1/completions",
            [completions_request("a b c", 4)],
            concurrency=2,
            seconds=1.0,
            timeout=5.0,
            alongside=LoadConfig(
                url=srv.url + "/v1/embeddings",
                rate=10.0,
                duration=1.0,
                requests=(embeddings_request("q"),),
                timeout=5.0,
            ),
        )
        paths = list(srv.paths)
    assert cap.rps > 0 and cap.alongside_rps > 0
    assert "/v1/embeddings" in paths and "/v1/completions" in paths
