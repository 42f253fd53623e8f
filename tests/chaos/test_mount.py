"""The chaos hook ``aivitals.chaos.mount`` on a bare ASGI app: its gate, its wire
protocol, and each fault it runs by itself measured where it shows."""

from __future__ import annotations

import asyncio
import gc
import shutil
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from aivitals.chaos import (
    CHAOS_ENV,
    CHAOS_PATH,
    ChaosMount,
    InProcessFaults,
    mount,
    mount_wsgi,
)
from aivitals.errors import ConfigError, FaultError, FaultUnsupported

TOKEN = "mount-test-token"
HDR = {"X-Aivitals-Token": TOKEN}
ON = {CHAOS_ENV: TOKEN}
MIB = 2**20


class Recorder:
    """The user's app: answers 200 and records every path it was asked for."""

    def __init__(self) -> None:
        self.paths: list[str] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        self.paths.append(scope["path"])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


@asynccontextmanager
async def client(app: Any) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://svc") as c:
        yield c


async def chaos(c: httpx.AsyncClient, fault: str, action: str, **params: Any) -> httpx.Response:
    body = {"fault": fault, "action": action, "params": params}
    return await c.post(CHAOS_PATH, json=body, headers=HDR)


def run(fn: Callable[[], Any]) -> Any:
    return asyncio.run(fn())


# -- the gate -----------------------------------------------------------------------------
def test_without_the_variable_the_path_answers_403_naming_it_and_never_reaches_the_app(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(CHAOS_ENV, raising=False)
    app = Recorder()
    mounted = mount(app)  # reads the process environment

    async def body() -> list[httpx.Response]:
        async with client(mounted) as c:
            return [
                await c.get(CHAOS_PATH, headers=HDR),
                await c.post(CHAOS_PATH, json={"fault": "thread_leak", "action": "start"}),
                await c.post(CHAOS_PATH + "/", headers=HDR, json={}),
            ]

    answers = run(body)
    assert [r.status_code for r in answers] == [403, 403, 403]
    assert all(r.json()["env"] == CHAOS_ENV and CHAOS_ENV in r.json()["error"] for r in answers)
    assert app.paths == [] and not mounted.enabled
    assert mounted.faults.listing() == []  # nothing was started through the closed door


def test_the_variable_in_the_process_environment_turns_it_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(CHAOS_ENV, TOKEN)
    mounted = mount(Recorder())

    async def body() -> httpx.Response:
        async with client(mounted) as c:
            return await c.get(CHAOS_PATH, headers=HDR)

    assert mounted.enabled and run(body).status_code == 200
    with pytest.raises(ConfigError, match=CHAOS_ENV):
        mount(Recorder(), environ={CHAOS_ENV: "short"})  # a guessable token is refused


def test_a_wrong_or_missing_token_is_403_and_the_app_is_not_reached() -> None:
    app = Recorder()
    mounted = mount(app, environ=ON)

    async def body() -> list[httpx.Response]:
        async with client(mounted) as c:
            start = {"fault": "thread_leak", "action": "start"}
            return [
                await c.post(CHAOS_PATH, json=start),
                await c.post(CHAOS_PATH, json=start, headers={"X-Aivitals-Token": TOKEN + "x"}),
                await c.get(CHAOS_PATH, headers={"X-Aivitals-Token": ""}),
            ]

    answers = run(body)
    assert [r.status_code for r in answers] == [403, 403, 403]
    assert all("X-Aivitals-Token" in r.json()["error"] and "env" not in r.json() for r in answers)
    assert app.paths == [] and not mounted.faults.active("thread_leak")


# -- the wire protocol ----------------------------------------------------------------------
def test_start_list_stop_and_what_this_service_supports() -> None:
    calls: list[tuple[bool, dict[str, float]]] = []
    mounted = mount(
        Recorder(), environ=ON, hooks={"cold_start": lambda on, p: calls.append((on, p))}
    )

    async def body() -> dict[str, Any]:
        async with client(mounted) as c:
            out: dict[str, Any] = {}
            out["start"] = await chaos(c, "slow_dependency", "start", seconds=0.01, duration=30)
            out["hooked"] = await chaos(c, "cold_start", "start")
            out["listed"] = (await c.get(CHAOS_PATH, headers=HDR)).json()
            out["stop"] = await chaos(c, "slow_dependency", "stop")
            out["again"] = await chaos(c, "slow_dependency", "stop")
            out["after"] = (await c.get(CHAOS_PATH, headers=HDR)).json()
            out["put"] = await c.put(CHAOS_PATH, headers=HDR)
            out["action"] = await chaos(c, "slow_dependency", "pause")
            out["json"] = await c.post(CHAOS_PATH, content=b"{", headers=HDR)
            out["name"] = await chaos(c, "nope", "start")
            return out

    out = run(body)
    started = out["start"].json()["started"]
    assert out["start"].status_code == 200
    assert started["params"] == {"seconds": 0.01}
    assert 29 < started["until"] - started["started_at"] <= 30
    assert out["hooked"].status_code == 200 and calls == [(True, {})]
    listed = out["listed"]
    assert [f["fault"] for f in listed["active"]] == ["cold_start", "slow_dependency"]
    assert listed["supported"] == {
        "cold_start": "hook",
        "event_loop_block": "generic",
        "gpu_leak": "generic",
        "process_memory_leak": "generic",
        "slow_dependency": "generic",
        "thread_leak": "generic",
    }
    assert set(listed["available"]) == set(listed["supported"])
    assert set(listed["unsupported"]) == {
        "no_abort_timeouts",
        "slow_inference",
        "worker_pool_stuck",
    }
    assert out["stop"].json() == {"stopped": True, "fault": "slow_dependency"}
    assert out["again"].json()["stopped"] is False
    assert [f["fault"] for f in out["after"]["active"]] == ["cold_start"]
    assert out["put"].status_code == 405
    assert out["action"].status_code == 400 and "start or stop" in out["action"].json()["error"]
    assert out["json"].status_code == 400 and "JSON" in out["json"].json()["error"]
    assert out["name"].status_code == 400 and "thread_leak" in out["name"].json()["error"]
    mounted.faults.stop_all()
    assert calls[-1][0] is False


def test_a_fault_without_a_hook_is_answered_unsupported_and_a_hook_makes_it_run() -> None:
    seen: list[tuple[bool, dict[str, float]]] = []
    bare = mount(Recorder(), environ=ON)
    hooked = mount(
        Recorder(), environ=ON, hooks={"worker_pool_stuck": lambda on, p: seen.append((on, p))}
    )

    async def body() -> tuple[httpx.Response, httpx.Response, httpx.Response, httpx.Response]:
        async with client(bare) as c:
            refused = await chaos(c, "worker_pool_stuck", "start", workers=2)
            stop = await chaos(c, "worker_pool_stuck", "stop")  # a revert finds nothing on
        async with client(hooked) as c:
            ok = await chaos(c, "worker_pool_stuck", "start", workers=2)
            off = await chaos(c, "worker_pool_stuck", "stop")
        return refused, stop, ok, off

    refused, stop, ok, off = run(body)
    assert refused.status_code == 409
    assert refused.json()["unsupported"] == "worker_pool_stuck"
    assert "does not support fault 'worker_pool_stuck' (no hook)" in refused.json()["error"]
    assert stop.status_code == 200 and stop.json()["stopped"] is False
    assert ok.status_code == 200 and off.json()["stopped"] is True
    assert seen == [(True, {"workers": 2.0}), (False, {"workers": 2.0})]
    with pytest.raises(FaultUnsupported):
        bare.faults.start("worker_pool_stuck")  # the same answer without HTTP
    with pytest.raises(ConfigError, match="nope"):
        mount(Recorder(), hooks={"nope": lambda on, p: None})


def test_a_hook_that_fails_answers_500_and_leaves_the_fault_off() -> None:
    def broken(on: bool, params: dict[str, float]) -> None:
        raise RuntimeError("the pool is not started")

    mounted = mount(Recorder(), environ=ON, hooks={"worker_pool_stuck": broken})

    async def body() -> httpx.Response:
        async with client(mounted) as c:
            return await chaos(c, "worker_pool_stuck", "start")

    r = run(body)
    assert r.status_code == 500 and "RuntimeError: the pool is not started" in r.json()["error"]
    assert not mounted.faults.active("worker_pool_stuck")


def test_bad_params_are_refused_with_the_bound_named() -> None:
    mounted = mount(Recorder(), environ=ON)
    cases = [
        ("event_loop_block", {"seconds": 10}, "seconds=10 outside [0.001, 5]"),
        ("thread_leak", {"max_threads": 100_000}, "max_threads=100000 outside [1, 4000]"),
        ("thread_leak", {"threads": 5}, "unknown params threads"),
        ("slow_dependency", {"duration": 10_000}, "duration=10000 outside [0.001, 3600]"),
        ("gpu_leak", {"mib_per_request": "a lot"}, "not a finite number"),
    ]

    async def body() -> list[httpx.Response]:
        async with client(mounted) as c:
            return [await chaos(c, name, "start", **params) for name, params, _ in cases]

    for r, (name, _, why) in zip(run(body), cases, strict=True):
        assert r.status_code == 400 and why in r.json()["error"], (name, r.text)
        assert not mounted.faults.active(name)


def test_a_fault_ends_by_itself_after_its_duration() -> None:
    seen: list[bool] = []
    faults = InProcessFaults(on_change={"slow_inference": lambda on, p: seen.append(on)})
    faults.start("slow_inference", {"factor": 2, "duration": 0.2})
    assert faults.param("slow_inference", "factor") == 2.0
    time.sleep(0.5)
    assert not faults.active("slow_inference") and seen == [True, False]


def test_lifespan_shutdown_reverts_every_fault() -> None:
    mounted = mount(Recorder(), environ=ON)

    async def body() -> None:
        messages = iter([{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}])
        sent: list[str] = []

        async def receive() -> dict[str, Any]:
            return next(messages)

        async def send(message: Any) -> None:
            sent.append(message["type"])

        mounted.faults.start("thread_leak", {"per_request": 1})
        await mounted({"type": "lifespan"}, receive, send)
        assert sent == ["lifespan.startup.complete", "lifespan.shutdown.complete"]

    run(body)
    assert mounted.faults.listing() == []


# -- each generic fault, measured -----------------------------------------------------------
async def _loop_stall(during: Callable[[], Any]) -> tuple[float, Any]:
    """The longest the event loop left a 10 ms ticker waiting while ``during`` ran."""
    worst = 0.0
    done = asyncio.Event()

    async def ticker() -> None:
        nonlocal worst
        while not done.is_set():
            t0 = time.perf_counter()
            await asyncio.sleep(0.01)
            worst = max(worst, time.perf_counter() - t0 - 0.01)

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0.02)
    try:
        result = await during()
    finally:
        done.set()
        await task
    return worst, result


def test_event_loop_block_stalls_every_other_coroutine() -> None:
    mounted = mount(Recorder(), environ=ON)

    async def body() -> tuple[float, float, float]:
        async with client(mounted) as c:
            calm, _ = await _loop_stall(lambda: c.get("/v1/x"))
            await chaos(c, "event_loop_block", "start", seconds=0.25)
            t0 = time.perf_counter()
            stall, _ = await _loop_stall(
                lambda: asyncio.gather(c.get("/v1/a"), c.get("/v1/b"), c.get("/v1/c"))
            )
            return calm, stall, time.perf_counter() - t0

    calm, stall, took = run(body)
    assert calm < 0.1
    assert stall >= 0.2  # the ticker could not run while a request slept on the loop
    assert took >= 0.7  # three sleeps one after the other: the loop is one thread


def test_slow_dependency_delays_each_request_while_the_loop_stays_free() -> None:
    mounted = mount(Recorder(), environ=ON)

    async def body() -> tuple[float, float, float, float]:
        async with client(mounted) as c:
            await chaos(c, "slow_dependency", "start", seconds=0.3)
            t0 = time.perf_counter()
            await c.get("/v1/one")
            single = time.perf_counter() - t0
            t0 = time.perf_counter()
            stall, _ = await _loop_stall(
                lambda: asyncio.gather(*(c.get("/v1/x") for _ in range(4)))
            )
            together = time.perf_counter() - t0
            await chaos(c, "slow_dependency", "stop")
            t0 = time.perf_counter()
            await c.get("/v1/after")
            return single, stall, together, time.perf_counter() - t0

    single, stall, together, after = run(body)
    assert single >= 0.22  # 0.3 s x 0.75 at least
    assert stall < 0.1  # awaited: the ticker ran on meanwhile
    assert together < 0.9  # four waits side by side (one after the other: 0.9 s at least)
    assert after < 0.1


def test_per_request_faults_act_only_on_the_paths_given() -> None:
    app = Recorder()
    mounted = mount(app, environ=ON, paths=("/v1/", "/predict"))

    async def body() -> dict[str, float]:
        took = {}
        async with client(mounted) as c:
            await chaos(c, "slow_dependency", "start", seconds=0.2)
            for path in ("/v1/embeddings", "/predict", "/metrics", "/predictions"):
                t0 = time.perf_counter()
                await c.get(path)
                took[path] = time.perf_counter() - t0
        return took

    took = run(body)
    assert took["/v1/embeddings"] >= 0.15 and took["/predict"] >= 0.15
    assert took["/metrics"] < 0.1 and took["/predictions"] < 0.1
    assert app.paths == ["/v1/embeddings", "/predict", "/metrics", "/predictions"]


def test_thread_leak_starts_threads_up_to_its_bound_and_ends_them_at_stop() -> None:
    mounted = mount(Recorder(), environ=ON)

    def leaked() -> int:
        return sum(t.name == "aivitals-chaos-leaked" for t in threading.enumerate())

    async def body() -> tuple[int, int, int, int]:
        async with client(mounted) as c:
            os_before = psutil.Process().num_threads()
            await chaos(c, "thread_leak", "start", per_request=4, max_threads=10)
            await c.get("/v1/a")
            first = leaked()
            for _ in range(5):
                await c.get("/v1/b")
            capped = leaked()
            os_grown = psutil.Process().num_threads() - os_before
            await chaos(c, "thread_leak", "stop")
            return first, capped, os_grown, leaked()

    first, capped, os_grown, left = run(body)
    assert first == 4  # one request's share
    assert capped == 10  # never past max_threads
    assert os_grown >= 10  # real OS threads: what the process collector counts
    assert left == 0  # the stop ended them


def test_process_memory_leak_is_held_up_to_max_mib_and_released_at_stop() -> None:
    # a process that has freed a big block once serves later ones from malloc's heap
    # (its mmap threshold rises), as a long test session or a long-lived service has
    freed = bytearray(24 * MIB)
    del freed
    mounted = mount(Recorder(), environ=ON)
    proc = psutil.Process()

    async def body() -> tuple[int, int]:
        async with client(mounted) as c:
            await chaos(c, "process_memory_leak", "start", mib_per_request=16, max_mib=40)
            # in a long test session other objects come and go: collect them first, so
            # the RSS moves by what the fault holds
            gc.collect()
            before = proc.memory_info().rss
            for _ in range(4):
                await c.get("/v1/a")
            peak = proc.memory_info().rss
            await chaos(c, "process_memory_leak", "stop")
            gc.collect()
            return peak - before, peak - proc.memory_info().rss

    grown, released = run(body)
    # two 16 MiB chunks fit under 40 MiB, a third would not: 32 MiB held, pages touched
    assert 24 * MIB < grown < 46 * MIB
    # chunks this size are their own mappings: freed at stop, RSS falls by them
    assert released > 24 * MIB


def test_gpu_leak_goes_on_the_sim_device_without_torch_and_is_freed_at_stop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from aivitals.collect.gpu import SimGPU

    monkeypatch.setenv("AIVITALS_SIM_GPU_DIR", str(tmp_path / "sim"))
    # a process without torch: the leak must fall back to the simulated device even
    # when this test process has torch with CUDA
    monkeypatch.setitem(sys.modules, "torch", None)
    mounted = mount(Recorder(), environ=ON)
    sim = SimGPU(tmp_path / "sim")
    base = sim.device(0).memory_used

    async def body() -> tuple[dict[str, Any], int, int]:
        async with client(mounted) as c:
            r = await chaos(c, "gpu_leak", "start", mib_per_request=8)
            for _ in range(3):
                await c.get("/v1/a")
            leaked = sim.device(0).memory_used - base
            await chaos(c, "gpu_leak", "stop")
            return r.json()["started"], leaked, sim.device(0).memory_used - base

    started, leaked, left = run(body)
    assert started["device"].startswith("sim:0") and str(tmp_path / "sim") in started["device"]
    assert leaked == 3 * 8 * MIB
    assert left == 0


def test_gpu_leak_holds_real_cuda_memory_where_torch_has_a_gpu() -> None:
    if shutil.which("nvidia-smi") is None:
        pytest.skip("no NVIDIA driver here: the sim device test covers this machine")
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here")
    mounted = mount(Recorder(), environ=ON)

    async def body() -> tuple[str, int, int]:
        async with client(mounted) as c:
            base = torch.cuda.memory_allocated()
            r = await chaos(c, "gpu_leak", "start", mib_per_request=64)
            for _ in range(2):
                await c.get("/v1/a")
            held = torch.cuda.memory_allocated() - base
            await chaos(c, "gpu_leak", "stop")
            return r.json()["started"]["device"], held, torch.cuda.memory_allocated() - base

    device, held, left = run(body)
    assert device.startswith("cuda:")
    assert held == 2 * 64 * MIB and left == 0


# -- the client's reading of the answers ----------------------------------------------------
def test_the_in_process_client_says_what_each_refusal_means(
    runner_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from aivitals.chaos import FaultContext

    target: list[ChaosMount] = []

    def post(url: str, **kw: Any) -> httpx.Response:
        async def send() -> httpx.Response:
            async with client(target[0]) as c:
                return await c.post(CHAOS_PATH, json=kw["json"], headers=kw["headers"])

        return asyncio.run(send())

    monkeypatch.setattr(httpx, "post", post)
    ctx = FaultContext(target="http://127.0.0.1:9", chaos_token=TOKEN)
    with runner_factory(ctx) as runner:
        target[:] = [mount(Recorder(), environ={})]
        with pytest.raises(FaultError, match=f"hook is off: start the service with {CHAOS_ENV}"):
            runner.start("thread_leak", duration=5)
        target[:] = [mount(Recorder(), environ={CHAOS_ENV: "another-token"})]
        with pytest.raises(FaultError, match="refused the token"):
            runner.start("thread_leak", duration=5)
        target[:] = [mount(Recorder(), environ=ON)]
        with pytest.raises(FaultUnsupported, match="does not support 'worker_pool_stuck'"):
            runner.start("worker_pool_saturated", duration=5)
        active = runner.start("thread_leak", duration=5, per_request=1)
        assert target[0].faults.active("thread_leak")
        runner.stop(active)
        assert not target[0].faults.active("thread_leak")


# -- the WSGI twin --------------------------------------------------------------------------
def _wsgi_app(seen: list[str]) -> Any:
    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        seen.append(environ["PATH_INFO"])
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"ok"]

    return app


def test_the_wsgi_hook_has_the_same_gate_and_protocol() -> None:
    seen: list[str] = []
    off = httpx.Client(
        transport=httpx.WSGITransport(app=mount_wsgi(_wsgi_app(seen), environ={})),
        base_url="http://svc",
    )
    refused = off.post(CHAOS_PATH, json={"fault": "thread_leak", "action": "start"}, headers=HDR)
    assert refused.status_code == 403 and refused.json()["env"] == CHAOS_ENV
    mounted = mount_wsgi(_wsgi_app(seen), environ=ON, hooks={"cold_start": lambda on, p: None})
    c = httpx.Client(transport=httpx.WSGITransport(app=mounted), base_url="http://svc")
    wrong = c.get(CHAOS_PATH, headers={"X-Aivitals-Token": "not-the-token"})
    start = {"fault": "thread_leak", "action": "start", "params": {"per_request": 0}}
    bad = c.post(CHAOS_PATH, json=start, headers=HDR)
    listed = c.get(CHAOS_PATH, headers=HDR).json()
    # no event loop in a WSGI worker: blocking it needs the app's own hook
    loop = c.post(CHAOS_PATH, json={"fault": "event_loop_block", "action": "start"}, headers=HDR)
    assert wrong.status_code == 403 and "X-Aivitals-Token" in wrong.json()["error"]
    assert bad.status_code == 400 and "per_request=0 outside [1, 64]" in bad.json()["error"]
    assert listed["supported"] == {
        "cold_start": "hook",
        "gpu_leak": "generic",
        "process_memory_leak": "generic",
        "slow_dependency": "generic",
        "thread_leak": "generic",
    }
    assert loop.status_code == 409 and loop.json()["unsupported"] == "event_loop_block"
    assert seen == []  # the hook's path never reached the app


def test_the_wsgi_hook_runs_its_generic_faults_in_the_request() -> None:
    seen: list[str] = []
    mounted = mount_wsgi(_wsgi_app(seen), environ=ON)
    c = httpx.Client(transport=httpx.WSGITransport(app=mounted), base_url="http://svc")

    def leaked() -> int:
        return sum(t.name == "aivitals-chaos-leaked" for t in threading.enumerate())

    def start(fault: str, **params: Any) -> None:
        body = {"fault": fault, "action": "start", "params": params}
        assert c.post(CHAOS_PATH, json=body, headers=HDR).status_code == 200

    start("slow_dependency", seconds=0.3)
    start("thread_leak", per_request=3, max_threads=5)
    t0 = time.perf_counter()
    assert c.get("/v1/a").status_code == 200
    slow = time.perf_counter() - t0
    c.get("/v1/b")
    held = leaked()
    mounted.faults.stop_all()
    t0 = time.perf_counter()
    c.get("/v1/c")
    assert slow >= 0.22 and time.perf_counter() - t0 < 0.1
    assert held == 5 and leaked() == 0
    assert seen == ["/v1/a", "/v1/b", "/v1/c"]
