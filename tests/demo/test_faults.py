from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import psutil
from prometheus_client import CollectorRegistry

from aivitals.demo import DemoConfig, DemoModels, create_app
from tests.demo.test_app import client_for

TOKEN = "fault-test-token"
HDR = {"X-Aivitals-Token": TOKEN}


def app_with_chaos(models: DemoModels, tmp_path: Path, **changes: Any) -> Any:
    settings: dict[str, Any] = {
        "registry": CollectorRegistry(),
        "chaos_token": TOKEN,
        "sim_gpu_dir": tmp_path / "sim",
        "cache_enabled": False,
        "probe_interval": 0.5,
        "probe_timeout": 1.0,
    }
    cfg = DemoConfig(**(settings | changes))
    return create_app(cfg, models=models)


async def wait_status(c: Any, path: str, status: int, within: float) -> Any:
    deadline = time.monotonic() + within
    while True:
        r = await c.get(path)
        if r.status_code == status or time.monotonic() > deadline:
            return r
        await asyncio.sleep(0.2)


async def chaos(c: Any, fault: str, action: str, **params: Any) -> Any:
    body = {"fault": fault, "action": action, "params": params}
    r = await c.post("/_aivitals/chaos", json=body, headers=HDR)
    assert r.status_code == 200, r.text
    return r.json()


def test_worker_pool_stuck_fails_readiness_and_reverts(
    demo_models: DemoModels, tmp_path: Path
) -> None:
    async def body() -> None:
        app = app_with_chaos(demo_models, tmp_path, workers=1, queue_size=1)
        async with client_for(app) as c:
            assert (await wait_status(c, "/readyz", 200, 20)).status_code == 200
            await chaos(c, "worker_pool_stuck", "start")
            stuck = await wait_status(c, "/readyz", 503, 5)  # two probe periods + timeout
            live = await c.get("/healthz")
            await chaos(c, "worker_pool_stuck", "stop")
            again = await wait_status(c, "/readyz", 200, 20)
        assert stuck.status_code == 503 and "probe" in stuck.text
        assert live.status_code == 200  # liveness does not depend on the workers
        assert again.status_code == 200

    asyncio.run(body())


def test_cold_start_drops_and_reloads_the_models(tmp_path: Path) -> None:
    async def body() -> None:
        models = DemoModels.load(DemoConfig())
        app = app_with_chaos(models, tmp_path)
        async with client_for(app) as c:
            await chaos(c, "cold_start", "start")
            assert not app.service.models_loaded
            r = await c.post("/v1/embeddings", json={"input": "after a cold start"})
            assert app.service.models_loaded
            reloaded = app.service.models()
            load_s = app.service.registry.get_sample_value(
                "model_load_time_seconds",
                {"model": "all-MiniLM-L6-v2", "model_version": "v0.1.0"},
            )
        assert r.status_code == 200
        assert reloaded is not models  # the request paid for a fresh load
        assert load_s is not None and load_s > 0

    asyncio.run(body())


def test_a_planned_reload_swaps_warm_models_while_requests_are_served(tmp_path: Path) -> None:
    """The soak's reload: new models loaded and warmed beside the old, then swapped; the
    service stays ready throughout and nobody waits for a load (unlike cold_start)."""
    from aivitals.demo import RELOAD_PATH

    async def body() -> None:
        models = DemoModels.load(DemoConfig())
        # What is under test is that a planned reload never takes readiness away (the
        # model stays loaded and warm, the probe keeps being answered), not how fast a
        # probe runs beside a model load on a shared 2-core machine, where a 1 s probe
        # timeout can pass. A hung pool still fails a 30 s probe.
        app = app_with_chaos(models, tmp_path, probe_timeout=30.0)
        async with client_for(app) as c:
            assert (await wait_status(c, "/readyz", 200, 20)).status_code == 200
            refused = await c.post(RELOAD_PATH)  # no token: refused, nothing reloaded
            assert refused.status_code == 403 and app.service.models() is models
            task = asyncio.create_task(c.post(RELOAD_PATH, headers=HDR))
            during = []
            while not task.done():
                during.append(await c.get("/readyz"))
                await asyncio.sleep(0.05)
            r = await task
            after = app.service.models()
            load_s = app.service.registry.get_sample_value(
                "model_load_time_seconds",
                {"model": "all-MiniLM-L6-v2", "model_version": "v0.1.0"},
            )
            served = await c.post("/v1/embeddings", json={"input": "after a reload"})
        assert r.status_code == 200 and r.json()["reloaded_s"] > 0
        assert after is not models and app.service.models_loaded
        failed = [
            {k: v for k, v in x.json()["checks"].items() if not v["ok"]}
            for x in during
            if x.status_code != 200
        ]
        assert during and not failed, failed
        assert load_s is not None and load_s > 0
        assert served.status_code == 200

    asyncio.run(body())


def test_process_memory_leak_grows_rss_and_is_freed(
    demo_models: DemoModels, tmp_path: Path
) -> None:
    proc = psutil.Process()

    async def body() -> None:
        app = app_with_chaos(demo_models, tmp_path)
        async with client_for(app) as c:
            await chaos(c, "process_memory_leak", "start", mib_per_request=32)
            before = proc.memory_info().rss
            for _ in range(4):
                await c.post("/v1/embeddings", json={"input": "leak"})
            grown = proc.memory_info().rss - before
            await chaos(c, "process_memory_leak", "stop")
        assert grown > 100 * 2**20

    asyncio.run(body())


def test_event_loop_block_delays_other_requests(demo_models: DemoModels, tmp_path: Path) -> None:
    async def body() -> None:
        app = app_with_chaos(demo_models, tmp_path)
        async with client_for(app) as c:
            await chaos(c, "event_loop_block", "start", seconds=0.3)
            started = time.perf_counter()
            await asyncio.gather(
                *(c.post("/v1/embeddings", json={"input": f"x{i}"}) for i in range(3))
            )
            took = time.perf_counter() - started
        assert took >= 0.9  # three handlers slept one after the other on the loop

    asyncio.run(body())


def test_slow_dependency_slows_every_request_without_blocking_the_loop(
    demo_models: DemoModels, tmp_path: Path
) -> None:
    async def body() -> tuple[float, float, list[int]]:
        app = app_with_chaos(demo_models, tmp_path)
        async with client_for(app) as c:
            await c.post("/v1/embeddings", json={"input": "warm"})
            await chaos(c, "slow_dependency", "start", seconds=0.4)
            started = time.perf_counter()
            one = await c.post("/v1/embeddings", json={"input": "one"})
            single = time.perf_counter() - started
            started = time.perf_counter()
            many = await asyncio.gather(
                *(c.post("/v1/embeddings", json={"input": f"x{i}"}) for i in range(4))
            )
            together = time.perf_counter() - started
            await chaos(c, "slow_dependency", "stop")
            started = time.perf_counter()
            await c.post("/v1/embeddings", json={"input": "after"})
            after = time.perf_counter() - started
        assert after < 0.25  # stopped: the call is gone
        return single, together, [one.status_code, *(r.status_code for r in many)]

    single, together, codes = asyncio.run(body())
    assert codes == [200] * 5  # slower, not failing
    assert single >= 0.3  # 0.4 s x 0.75 at least
    # awaited, not slept on the loop: four requests wait side by side (blocked,
    # they would take 4 x 0.3 s at least)
    assert together < 1.1


def test_thread_leak_starts_threads_up_to_its_bound_and_ends_them(
    demo_models: DemoModels, tmp_path: Path
) -> None:
    import threading

    def leaked() -> int:
        return sum(t.name == "aivitals-chaos-leaked" for t in threading.enumerate())

    async def body() -> tuple[int, int, int, int]:
        app = app_with_chaos(demo_models, tmp_path)
        async with client_for(app) as c:
            await c.post("/v1/embeddings", json={"input": "warm"})
            os_before = psutil.Process().num_threads()
            await chaos(c, "thread_leak", "start", per_request=4, max_threads=10)
            await c.post("/v1/embeddings", json={"input": "a"})
            first = leaked()
            for i in range(5):
                await c.post("/v1/embeddings", json={"input": f"b{i}"})
            capped = leaked()
            os_grown = psutil.Process().num_threads() - os_before
            await chaos(c, "thread_leak", "stop")
            return first, capped, os_grown, leaked()

    first, capped, os_grown, left = asyncio.run(body())
    assert first == 4  # one request's share
    assert capped == 10  # never past max_threads
    assert os_grown >= 10  # real OS threads: what the process collector counts
    assert left == 0  # the revert ended them
