from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from aivitals.errors import ConfigError
from aivitals.protect import Health, HealthConfig, HealthMiddleware

from ._asgi import call, sample

pytestmark = pytest.mark.anyio


async def not_found(scope: dict[str, Any], receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 404, "headers": []})
    await send({"type": "http.response.body", "body": b""})


async def get(app: Any, path: str) -> tuple[int, dict[str, Any]]:
    reply = await call(app, method="GET", path=path)
    return reply.status, reply.json()


class Worker:
    """A one-thread inference pool, like a model server's; ``hang()`` blocks it."""

    def __init__(self) -> None:
        self.pool = ThreadPoolExecutor(max_workers=1)
        self.unblock = threading.Event()
        self.inferences = 0

    def infer(self) -> str:
        self.inferences += 1
        time.sleep(0.005)
        return "ok"

    async def probe(self) -> str:
        return await asyncio.get_running_loop().run_in_executor(self.pool, self.infer)

    def hang(self) -> None:
        self.pool.submit(self.unblock.wait)

    def close(self) -> None:
        self.unblock.set()
        self.pool.shutdown(wait=True)


async def wait_for_status(app: Any, path: str, status: int, limit: float) -> float:
    began = time.monotonic()
    while time.monotonic() - began < limit:
        if (await get(app, path))[0] == status:
            return time.monotonic() - began
        await asyncio.sleep(0.01)
    raise AssertionError(f"{path} never answered {status} within {limit} s")


async def test_hung_worker_turns_readyz_503_within_two_probe_periods_healthz_stays_200() -> None:
    registry = CollectorRegistry()
    worker = Worker()
    period = 0.4
    health = Health(
        HealthConfig(probe=worker.probe, probe_interval=period, probe_timeout=0.1),
        registry=registry,
    )
    app = HealthMiddleware(not_found, health)
    try:
        await wait_for_status(app, "/readyz", 200, 2.0)
        worker.hang()
        hung_at = time.monotonic()
        flipped = await wait_for_status(app, "/readyz", 503, 4 * period)
        flip = time.monotonic() - hung_at
        assert flip <= 2 * period, f"readiness flipped after {flip:.3f} s"
        assert flipped <= 2 * period
        status, body = await get(app, "/readyz")
        assert status == 503 and body["checks"]["probe"]["ok"] is False
        assert body["checks"]["probe"]["detail"]
        assert (await get(app, "/healthz"))[0] == 200
        assert registry.get_sample_value("service_ready") == 0
        assert sample(registry, "health_check_up", check="probe") == 0
    finally:
        worker.close()
        await health.stop()


def test_a_probe_overrunning_at_request_time_reads_down_in_the_gauge_too() -> None:
    """/readyz judges a probe still running past its timeout as failed before the probe's
    own timeout is recorded: the gauge must not say up meanwhile, nor for a success
    older than ``probe_max_age``."""
    from aivitals.protect._health import CheckResult

    now = [100.0]
    registry = CollectorRegistry()
    health = Health(
        HealthConfig(probe=lambda: True, probe_timeout=0.1, probe_max_age=30.0),
        registry=registry,
        clock=lambda: now[0],
    )
    health.warmed = True
    health._record("probe", CheckResult(True, "ok", 99.0, 0.01))
    assert health.readiness()[0] is True
    assert sample(registry, "health_check_up", check="probe") == 1
    health._running["probe"] = 100.0  # the next run started and hangs
    now[0] = 100.5
    ok, body = health.readiness()
    assert not ok and "running for" in body["checks"]["probe"]["detail"]
    assert sample(registry, "health_check_up", check="probe") == 0
    assert registry.get_sample_value("service_ready") == 0
    # a success older than max_age: stale in the verdict and in the gauge alike
    health._running.clear()
    now[0] = 140.0
    ok, body = health.readiness()
    assert not ok and "last success" in body["checks"]["probe"]["detail"]
    assert sample(registry, "health_check_up", check="probe") == 0


async def test_not_ready_until_the_warmup_inference_ran() -> None:
    warmed = asyncio.Event()
    calls: list[str] = []

    async def warmup() -> None:
        calls.append("warmup")
        await warmed.wait()

    async def probe() -> None:
        calls.append("probe")

    health = Health(
        HealthConfig(warmup=warmup, probe=probe, probe_interval=0.05),
        registry=CollectorRegistry(),
    )
    app = HealthMiddleware(not_found, health)
    try:
        status, body = await get(app, "/readyz")
        await asyncio.sleep(0.1)
        status, body = await get(app, "/readyz")
        assert status == 503
        assert body["checks"]["warmup"] == {"ok": False, "detail": "warm-up not finished"}
        warmed.set()
        await wait_for_status(app, "/readyz", 200, 1.0)
        assert calls[0] == "warmup" and "probe" in calls
    finally:
        await health.stop()


async def test_failing_dependency_names_itself() -> None:
    def redis_ping() -> bool:
        raise ConnectionRefusedError("Connection refused")

    async def cache_ping() -> bool:
        return True

    health = Health(
        HealthConfig(dependencies={"redis": redis_ping, "cache": cache_ping}, probe_interval=0.05),
        registry=CollectorRegistry(),
    )
    app = HealthMiddleware(not_found, health)
    try:
        await get(app, "/readyz")
        await asyncio.sleep(0.1)
        status, body = await get(app, "/readyz")
        assert status == 503
        assert body["checks"]["dependency:redis"]["ok"] is False
        assert "ConnectionRefusedError" in body["checks"]["dependency:redis"]["detail"]
        assert body["checks"]["dependency:cache"]["ok"] is True
    finally:
        await health.stop()


async def test_a_hanging_dependency_fails_after_its_timeout() -> None:
    async def hangs() -> None:
        await asyncio.sleep(10)

    health = Health(
        HealthConfig(dependencies={"db": hangs}, dependency_timeout=0.05),
        registry=CollectorRegistry(),
    )
    await health.run_checks()
    ok, body = health.readiness()
    assert not ok
    assert "no answer within 0.05 s" in body["checks"]["dependency:db"]["detail"]


@pytest.mark.parametrize(
    ("reading", "ok"), [((95, 100), False), ((50, 100), True), (None, True), ((0, 0), False)]
)
async def test_gpu_memory_headroom(reading: tuple[int, int] | None, ok: bool) -> None:
    health = Health(
        HealthConfig(gpu_memory=lambda: reading, min_gpu_free_ratio=0.1),
        registry=CollectorRegistry(),
    )
    ready, body = health.readiness()
    assert ready is ok
    assert body["checks"]["gpu_memory"]["ok"] is ok


async def test_model_not_loaded_is_not_ready() -> None:
    loaded = {"yes": False}
    health = Health(HealthConfig(model_loaded=lambda: loaded["yes"]), registry=CollectorRegistry())
    assert health.readiness()[0] is False
    loaded["yes"] = True
    assert health.readiness()[0] is True


async def test_a_stale_probe_result_is_not_trusted() -> None:
    now = {"t": 100.0}
    health = Health(
        HealthConfig(probe=lambda: True, probe_interval=1.0),
        registry=CollectorRegistry(),
        clock=lambda: now["t"],
    )
    await health.run_warmup()
    assert health.readiness()[0] is True
    now["t"] += 2.5  # more than two probe periods without a new probe result
    ok, body = health.readiness()
    assert not ok and "ago" in body["checks"]["probe"]["detail"]


async def test_healthz_reports_event_loop_lag_over_budget() -> None:
    health = Health(HealthConfig(liveness_budget=0.1), registry=CollectorRegistry())
    app = HealthMiddleware(not_found, health)
    try:
        assert (await get(app, "/healthz"))[0] == 200
        await asyncio.sleep(0.15)
        time.sleep(0.3)  # block the loop, as a sync call in a handler would
        await asyncio.sleep(0.15)
        status, body = await get(app, "/healthz")
        assert status == 503
        assert "lag" in body["checks"]["event_loop"]["detail"]
    finally:
        await health.stop()


async def test_other_paths_and_methods_go_to_the_app() -> None:
    health = Health(HealthConfig(), registry=CollectorRegistry())
    app = HealthMiddleware(not_found, health)
    try:
        assert (await call(app, method="GET", path="/other")).status == 404
        assert (await call(app, method="POST", path="/healthz")).status == 404
        status, body = await get(app, "/health/queue")
        assert status == 200 and body["queue"] is None
    finally:
        await health.stop()


async def test_lifespan_starts_and_stops_the_schedule() -> None:
    health = Health(HealthConfig(probe=lambda: True, probe_interval=0.05), registry=None)

    async def lifespan_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return

    app = HealthMiddleware(lifespan_app, health)
    inbox: asyncio.Queue[dict[str, str]] = asyncio.Queue()
    inbox.put_nowait({"type": "lifespan.startup"})
    sent: list[str] = []

    async def send(message: dict[str, str]) -> None:
        sent.append(message["type"])

    task = asyncio.ensure_future(app({"type": "lifespan"}, inbox.get, send))
    await asyncio.sleep(0.1)
    assert health.running and health.warmed
    inbox.put_nowait({"type": "lifespan.shutdown"})
    await task
    assert not health.running
    assert sent == ["lifespan.startup.complete", "lifespan.shutdown.complete"]


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"probe_interval": 0}, "probe_interval"),
        ({"probe_timeout": -1}, "probe_timeout"),
        ({"min_gpu_free_ratio": 1.5}, "min_gpu_free_ratio"),
        ({"probe": "not callable"}, "probe"),
        ({"dependencies": {"redis": 42}}, "redis"),
        ({"probe_max_age": 0}, "probe_max_age"),
    ],
)
def test_bad_health_config_names_the_key(kwargs: dict[str, Any], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        HealthConfig(**kwargs)


async def test_a_hung_sync_probe_is_not_started_again_and_ready_returns_after() -> None:
    stuck = threading.Event()
    stuck.set()
    unblock = threading.Event()
    calls: list[float] = []

    def probe() -> str:  # a sync model call on a thread
        calls.append(time.monotonic())
        if not stuck.is_set():
            unblock.wait(5)
        return "ok"

    period = 0.3
    health = Health(
        HealthConfig(probe=probe, probe_interval=period, probe_timeout=0.08),
        registry=CollectorRegistry(),
    )
    app = HealthMiddleware(not_found, health)
    try:
        await wait_for_status(app, "/readyz", 200, 2.0)
        stuck.clear()
        hung_at = time.monotonic()
        await wait_for_status(app, "/readyz", 503, 4 * period)
        assert time.monotonic() - hung_at <= 2 * period
        before = len(calls)
        await asyncio.sleep(4 * period)
        assert len(calls) == before  # the hung thread is waited for, not joined by more
        body = (await get(app, "/readyz"))[1]
        detail = body["checks"]["probe"]["detail"]
        assert "running for" in detail or "still going" in detail, detail
        stuck.set()
        unblock.set()
        await wait_for_status(app, "/readyz", 200, 4 * period)
    finally:
        unblock.set()
        await health.stop()


async def test_a_check_that_ended_while_the_loop_was_blocked_is_not_still_running() -> None:
    # a handler's synchronous sleep blocks the event loop; the Redis ping's thread ends
    # meanwhile. A check started before the loop heard that must not read it as "previous
    # run still going" (a healthy dependency reported down while the loop was blocked)
    def ping() -> bool:
        return True

    health = Health(
        HealthConfig(dependencies={"redis": ping}, dependency_timeout=0.5),
        registry=CollectorRegistry(),
    )
    details: list[str] = []
    record = health._record
    health._record = lambda name, result: (details.append(result.detail), record(name, result))  # type: ignore[method-assign]
    first = asyncio.create_task(health.run_checks())
    await asyncio.sleep(0)  # run_checks starts its checks
    await asyncio.sleep(0)  # the ping's thread is submitted
    time.sleep(0.1)  # blocked: the thread has answered, the loop has not heard it
    await health._guarded("dependency:redis", ping, 0.5)  # a check before the loop caught up
    await first
    assert details and not [d for d in details if "still going" in d], details
    assert health.readiness()[0]


@pytest.mark.slow
async def test_an_answer_in_time_is_not_a_timeout_because_the_loop_heard_it_late() -> None:
    # the ping's thread answers in a millisecond; the loop, blocked by a handler's
    # synchronous sleep past the check's timeout, wakes to both the timeout and the answer.
    # The thread's clock decides: the dependency answered in time, it is not down
    def ping() -> bool:
        return True

    health = Health(
        HealthConfig(dependencies={"redis": ping}, dependency_timeout=0.2),
        registry=CollectorRegistry(),
    )
    for _ in range(5):  # whichever of the two callbacks the loop runs first
        task = asyncio.create_task(health.run_checks())
        await asyncio.sleep(0)  # run_checks starts its checks
        await asyncio.sleep(0)  # the ping's thread is submitted (and answers at once)
        time.sleep(0.5)  # blocked past the timeout
        await task
        result = health.results["dependency:redis"]
        assert result.ok, result.detail

    # a ping that really takes longer than the timeout is still down
    def slow() -> bool:
        time.sleep(0.4)
        return True

    health = Health(
        HealthConfig(dependencies={"redis": slow}, dependency_timeout=0.2),
        registry=CollectorRegistry(),
    )
    await health.run_checks()
    assert not health.results["dependency:redis"].ok
    assert "no answer within" in health.results["dependency:redis"].detail


async def test_a_ping_never_waits_behind_the_application_s_threads() -> None:
    # the loop's default executor is full of the application's blocking work
    # (asyncio.to_thread): a ping queued behind it would time out before it ever ran
    loop = asyncio.get_running_loop()
    release = threading.Event()
    busy = [loop.run_in_executor(None, release.wait, 5.0) for _ in range(64)]
    try:
        health = Health(
            HealthConfig(dependencies={"redis": lambda: True}, dependency_timeout=0.3),
            registry=CollectorRegistry(),
        )
        await health.run_checks()
        result = health.results["dependency:redis"]
        assert result.ok, result.detail
    finally:
        release.set()
        await asyncio.gather(*busy)


async def test_no_readiness_is_exported_until_it_was_evaluated() -> None:
    # A service that uses the guard or admission control but never serves /readyz must
    # not export service_ready 0: ServiceNotReady would page for a check nobody ran.
    from aivitals.protect import GuardConfig, InputGuard

    registry = CollectorRegistry()
    InputGuard(not_found, config=GuardConfig(), registry=registry)
    assert registry.get_sample_value("service_ready") is None
    health = Health(HealthConfig(model_loaded=lambda: True), registry=registry)
    assert registry.get_sample_value("service_ready") is None
    app = HealthMiddleware(not_found, health)
    status, _ = await get(app, "/readyz")
    assert status == 200
    assert registry.get_sample_value("service_ready") == 1
