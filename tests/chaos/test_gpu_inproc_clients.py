from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from aivitals.chaos import FaultContext
from aivitals.chaos._gpu import _OOM_PROMPTS
from aivitals.collect.gpu import SimGPU, SimGpuLostError
from aivitals.errors import ConfigError, FaultError, FaultRefused
from aivitals.signals import ErrorCode, classify_exception
from tests.chaos.conftest import assert_clean, run_processes
from tests.load._server import tiny_server

GIB = 2**30


def _wait(cond, timeout: float = 10.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return False


def test_gpu_xid_is_injected_for_the_service(
    runner_factory, chaos_root: Path, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    sim = SimGPU(tmp_path / "sim", memory_total=16 * GIB)
    ctx = FaultContext(sim_gpu_dir=tmp_path / "sim", service_pid=os.getpid())
    with runner_factory(ctx) as runner:
        active = runner.start("gpu_xid", duration=10, interval=0.2)
        assert _wait(lambda: len(sim.xid_events(0)) >= 3)
        ev = sim.xid_events(0)[0]
        assert ev["code"] == 79 and ev["pid"] == os.getpid()
        # 79: the device fell off the bus; every allocation fails, naming the Xid
        assert sim.lost(0)
        with pytest.raises(SimGpuLostError, match="Xid 79") as err:
            sim.allocate(os.getpid(), 1024)
        assert classify_exception(err.value) == ErrorCode.XID
        runner.stop(active)
        n = len(sim.xid_events(0))
        time.sleep(0.5)
        assert len(sim.xid_events(0)) == n  # the repeats end with the fault
        assert not sim.lost(0)  # the revert reset the device
        sim.allocate(os.getpid(), 1024)
        run_id = runner.run.run_id
    assert_clean(run_id, chaos_root)


def test_an_xid_other_than_79_leaves_the_device_working(
    runner_factory, chaos_root: Path, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    sim = SimGPU(tmp_path / "sim", memory_total=16 * GIB)
    ctx = FaultContext(sim_gpu_dir=tmp_path / "sim", service_pid=os.getpid())
    with runner_factory(ctx) as runner:
        runner.start("gpu_xid", duration=10, code=48)  # a double-bit ECC error
        assert _wait(lambda: len(sim.xid_events(0)) >= 1)
        assert not sim.lost(0)
        sim.allocate(os.getpid(), 1024)
        runner.stop_all()
        run_id = runner.run.run_id
    assert_clean(run_id, chaos_root)


def test_a_crashed_run_s_cleanup_resets_a_lost_device(tmp_path: Path) -> None:
    from aivitals.chaos._journal import revert_entry

    sim = SimGPU(tmp_path / "sim", memory_total=16 * GIB)
    sim.inject_xid(0, 79)
    assert sim.lost(0)
    revert_entry({"kind": "sim_lost", "state_dir": str(tmp_path / "sim"), "gpu": 0}, None)
    assert not sim.lost(0)


@pytest.mark.slow
def test_gpu_cotenant_takes_memory_periodically(
    runner_factory, chaos_root: Path, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    sim = SimGPU(tmp_path / "sim", memory_total=16 * GIB)
    ctx = FaultContext(sim_gpu_dir=tmp_path / "sim")
    with runner_factory(ctx) as runner:
        active = runner.start(
            "gpu_cotenant", duration=20, share=0.5, on_seconds=1, period_seconds=2
        )
        pid = active.effect.details["pid"]
        assert _wait(lambda: sim.processes(0).get(pid) == 8 * GIB, timeout=15)
        assert _wait(lambda: pid not in sim.processes(0), timeout=5)  # released off-period
        assert _wait(lambda: sim.processes(0).get(pid) == 8 * GIB, timeout=5)  # and again
        runner.stop(active)
        assert pid not in sim.processes(0)
        run_id = runner.run.run_id
    assert_clean(run_id, chaos_root)


def test_real_gpu_cotenant_is_refused_without_cuda(runner_factory) -> None:  # type: ignore[no-untyped-def]
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: the GPU-machine script covers real=1")
    with runner_factory() as runner, pytest.raises(FaultRefused, match="no CUDA device"):
        runner.start("gpu_cotenant", duration=5, real=1)


def _completions(srv: Any) -> list[bytes]:
    return [b for p, b in zip(srv.paths, srv.bodies, strict=True) if p == "/v1/completions"]


@pytest.mark.slow
def test_gpu_oom_holds_memory_and_sends_overlong_prompts(
    runner_factory, chaos_root: Path, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    sim = SimGPU(tmp_path / "sim", memory_total=16 * GIB)
    me = os.getpid()
    with tiny_server() as srv:
        ctx = FaultContext(target=srv.url, sim_gpu_dir=tmp_path / "sim", service_pid=me)
        with runner_factory(ctx) as runner:
            active = runner.start(
                "gpu_oom", duration=20, fill=0.9, concurrency=2, prompt_tokens=400, max_tokens=8
            )
            held = active.effect.details["held_bytes"]
            assert held == int(16 * GIB * 0.9) and sim.processes(0)[me] == held
            assert _wait(lambda: srv.paths.count("/v1/completions") >= 3)
            # 400 words of prompt: a body of well over a thousand bytes, not streamed.
            assert srv.bodies[-1].startswith(b'{"prompt": "') and srv.sizes[-1] > 1500
            runner.stop(active)
            assert sim.processes(0).get(me, 0) == 0
            run_id = runner.run.run_id
            # every prompt differs, and the next injection sends new ones: a response
            # cache in front of the model must not answer them
            first = _completions(srv)
            assert len(set(first)) == min(len(first), _OOM_PROMPTS)  # cycled past 64
            again = runner.start(
                "gpu_oom", duration=20, fill=0.9, concurrency=2, prompt_tokens=400, max_tokens=8
            )
            assert _wait(lambda: srv.paths.count("/v1/completions") >= len(first) + 3)
            runner.stop(again)
            assert not set(_completions(srv)[len(first) :]) & set(first)
    assert_clean(run_id, chaos_root)


def test_in_process_fault_goes_through_the_chaos_endpoint(runner_factory, chaos_root: Path) -> None:  # type: ignore[no-untyped-def]
    with tiny_server() as srv:
        ctx = FaultContext(target=srv.url, chaos_token=srv.chaos_token)
        with runner_factory(ctx) as runner:
            active = runner.start("gpu_contention", duration=10, factor=3)
            start = srv.chaos_calls[-1]
            assert start["fault"] == "slow_inference" and start["action"] == "start"
            assert start["params"] == {"factor": 3, "duration": 15.0}  # the service bounds it too
            assert active.fault.expected_signature == "gpu_contention"
            runner.stop(active)
            assert srv.chaos_calls[-1] == {
                "fault": "slow_inference",
                "action": "stop",
                "params": {},
            }
            runner.stop(active)  # idempotent: no second stop request
            assert len(srv.chaos_calls) == 2
            run_id = runner.run.run_id
    assert_clean(run_id, chaos_root)


def test_in_process_fault_errors(runner_factory) -> None:  # type: ignore[no-untyped-def]
    from tests._servers import free_port

    dead = f"http://127.0.0.1:{free_port()}"
    runner = runner_factory(FaultContext(target=dead, chaos_token="x" * 12)).open()
    with pytest.raises(FaultError, match="unreachable"):
        runner.start("cold_start", duration=5)
    runner.close()
    with tiny_server() as srv:
        ctx = FaultContext(target=srv.url, chaos_token=srv.chaos_token)
        with runner_factory(ctx) as runner:
            from aivitals.chaos._inproc import COLD_START, _inproc

            bad = _inproc("cold_start", "bad_params", COLD_START)(duration=5)
            with pytest.raises(ConfigError, match="refused the params"):
                runner.start(bad)
            # The refused start still sent its revert.
            assert srv.chaos_calls[-1]["action"] == "stop"


@pytest.mark.parametrize(
    "name,params,check",
    [
        ("overlong_inputs", {"rate": 20}, lambda b: b.startswith(b'{"input": "lorem ipsum')),
        (
            "malformed_inputs",
            {"rate": 20},
            lambda b: b"\\u0000" in b or b"\xff" in b or b"\x07" in b,
        ),
        ("traffic_surge", {"factor": 5}, lambda b: b.startswith(b'{"input"')),
    ],
)
def test_client_faults_send_from_a_helper(
    name, params, check, runner_factory, chaos_root: Path
) -> None:  # type: ignore[no-untyped-def]
    with tiny_server() as srv:
        ctx = FaultContext(target=srv.url, base_rate=10)
        with runner_factory(ctx) as runner:
            active = runner.start(name, duration=20, **params)
            assert _wait(lambda: len(srv.bodies) >= 10, timeout=15)
            assert any(check(b) for b in srv.bodies)
            runner.stop(active)
            assert run_processes(runner.run.run_id) == []
            n = len(srv.bodies)
            time.sleep(0.3)
            assert len(srv.bodies) == n  # nothing sent after the stop
            run_id = runner.run.run_id
    assert_clean(run_id, chaos_root)


@pytest.mark.parametrize(
    "name,remote",
    [
        ("gpu_memory_leak", "gpu_leak"),
        ("gpu_contention", "slow_inference"),
        ("event_loop_blocked", "event_loop_block"),
        ("worker_pool_saturated", "worker_pool_stuck"),
        ("process_memory_leak", "process_memory_leak"),
        ("timeouts_not_aborting", "no_abort_timeouts"),
        ("cold_start", "cold_start"),
        ("slow_dependency", "slow_dependency"),
        ("thread_leak", "thread_leak"),
    ],
)
def test_every_in_process_fault_maps_to_the_service_name(
    name: str, remote: str, runner_factory
) -> None:  # type: ignore[no-untyped-def]
    with tiny_server() as srv:
        ctx = FaultContext(target=srv.url, chaos_token=srv.chaos_token)
        with runner_factory(ctx) as runner:
            active = runner.start(name, duration=3)
            runner.stop(active)
    assert [(c["fault"], c["action"]) for c in srv.chaos_calls] == [
        (remote, "start"),
        (remote, "stop"),
    ]


@pytest.mark.slow
def test_a_surge_sends_a_new_prompt_every_request_unless_told_to_cycle(
    runner_factory, chaos_root: Path
) -> None:  # type: ignore[no-untyped-def]
    """A surge of x10 with 4096 prompts cycled was all cache hits after five minutes of
    a full-length run: the surge had faded. By default no prompt repeats; ``distinct``
    N still cycles N (so a cache can learn them)."""
    with tiny_server() as srv:
        ctx = FaultContext(target=srv.url, base_rate=10)
        with runner_factory(ctx) as runner:
            active = runner.start("traffic_surge", duration=20, factor=5)
            assert _wait(lambda: len(srv.bodies) >= 60, timeout=15)
            runner.stop(active)
            fresh = list(srv.bodies)
            srv.bodies.clear()
            active = runner.start("traffic_surge", duration=20, factor=5, distinct=4)
            assert _wait(lambda: len(srv.bodies) >= 20, timeout=15)
            runner.stop(active)
            cycled = list(srv.bodies)
            run_id = runner.run.run_id
    assert all(b.startswith(b'{"input"') for b in fresh + cycled)
    assert len(set(fresh)) == len(fresh)
    assert len(set(cycled)) == 4
    assert_clean(run_id, chaos_root)


def test_a_surge_too_long_to_build_fresh_is_refused_with_the_way_out(
    runner_factory,
) -> None:  # type: ignore[no-untyped-def]
    with tiny_server() as srv:
        ctx = FaultContext(target=srv.url, base_rate=10)
        with runner_factory(ctx) as runner:
            with pytest.raises(ConfigError, match="set distinct"):
                runner.start("traffic_surge", duration=900, factor=1000)
            assert run_processes(runner.run.run_id) == []
            assert srv.bodies == []
