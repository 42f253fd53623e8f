from __future__ import annotations

import asyncio
import time

import pytest
from prometheus_client import CollectorRegistry

from aivitals.errors import ConfigError
from aivitals.protect import (
    AdmissionConfig,
    AdmissionController,
    AdmissionRefused,
    GradientLimit,
    default_memory_estimator,
    kv_cache_estimator,
)

from ._asgi import sample

pytestmark = pytest.mark.anyio


def refusals(registry: CollectorRegistry, reason: str, priority: str = "interactive") -> float:
    return sample(registry, "admission_rejections_total", priority=priority, reason=reason)


def controller(registry: CollectorRegistry | None = None, **kwargs: object) -> AdmissionController:
    kwargs.setdefault("adaptive", False)
    return AdmissionController(
        AdmissionConfig(**kwargs),  # type: ignore[arg-type]
        registry=registry or CollectorRegistry(),
    )


async def hold(ctl: AdmissionController, release: asyncio.Event, **kwargs: object) -> str:
    async with ctl.admit(**kwargs):  # type: ignore[arg-type]
        await release.wait()
    return str(kwargs.get("priority", "interactive"))


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_slots_are_granted_up_to_the_limit_then_queued() -> None:
    registry = CollectorRegistry()
    ctl = controller(registry, initial_limit=2, queue_size=4)
    release = asyncio.Event()
    tasks = [asyncio.ensure_future(hold(ctl, release)) for _ in range(3)]
    await settle()
    assert ctl.in_flight == 2 and ctl.queue_length == 1
    assert registry.get_sample_value("admission_in_flight") == 2
    assert sample(registry, "admission_queue_length", priority="interactive") == 1
    assert sample(registry, "queue_length", queue="admission") == 1
    release.set()
    await asyncio.gather(*tasks)
    assert ctl.in_flight == 0 and ctl.queue_length == 0
    assert sample(registry, "admission_queue_wait_seconds_count", priority="interactive") == 3


async def test_full_queue_refuses_at_once_with_retry_after_and_counts() -> None:
    registry = CollectorRegistry()
    ctl = controller(registry, initial_limit=1, queue_size=1)
    release = asyncio.Event()
    tasks = [asyncio.ensure_future(hold(ctl, release)) for _ in range(2)]
    await settle()
    began = time.monotonic()
    with pytest.raises(AdmissionRefused) as refused:
        async with ctl.admit():
            pass
    assert time.monotonic() - began < 0.05
    assert refused.value.reason == "queue_full"
    assert refused.value.code == "QUEUE_FULL"
    assert refused.value.retry_after >= 1
    assert (
        sample(registry, "admission_rejections_total", priority="interactive", reason="queue_full")
        == 1
    )
    release.set()
    await asyncio.gather(*tasks)


async def test_queue_of_zero_still_admits_into_free_slots() -> None:
    ctl = controller(initial_limit=1, queue_size=0)
    async with ctl.admit():
        with pytest.raises(AdmissionRefused):
            async with ctl.admit():
                pass
    async with ctl.admit():
        pass


async def test_interactive_goes_ahead_of_batch() -> None:
    ctl = controller(initial_limit=1, queue_size=8)
    order: list[str] = []
    first = asyncio.Event()

    async def job(priority: str) -> None:
        async with ctl.admit(priority=priority):
            order.append(priority)

    holder = asyncio.ensure_future(hold(ctl, first))
    await settle()
    batch = [asyncio.ensure_future(job("batch")) for _ in range(2)]
    await settle()
    interactive = asyncio.ensure_future(job("interactive"))
    await settle()
    first.set()
    await asyncio.gather(holder, *batch, interactive)
    assert order == ["interactive", "batch", "batch"]


async def test_interactive_evicts_the_newest_batch_when_the_queue_is_full() -> None:
    registry = CollectorRegistry()
    ctl = controller(registry, initial_limit=1, queue_size=2)
    release = asyncio.Event()
    holder = asyncio.ensure_future(hold(ctl, release))
    await settle()
    old_batch = asyncio.ensure_future(hold(ctl, release, priority="batch"))
    await settle()
    new_batch = asyncio.ensure_future(hold(ctl, release, priority="batch"))
    await settle()
    interactive = asyncio.ensure_future(hold(ctl, release, priority="interactive"))
    await settle()
    with pytest.raises(AdmissionRefused, match="higher-priority"):
        await new_batch
    assert ctl.queue_length == 2
    assert refusals(registry, "queue_full", priority="batch") == 1
    # a batch request meeting a full queue of interactive ones is simply refused
    with pytest.raises(AdmissionRefused):
        async with ctl.admit(priority="batch"):
            pass
    release.set()
    await asyncio.gather(holder, old_batch, interactive)


async def learn_latency(ctl: AdmissionController, seconds: float, n: int = 8) -> None:
    for _ in range(n):
        async with ctl.admit():
            await asyncio.sleep(seconds)


async def test_predicted_wait_past_the_deadline_is_refused_at_once() -> None:
    registry = CollectorRegistry()
    ctl = controller(registry, initial_limit=1, queue_size=10)
    await learn_latency(ctl, 0.02)
    release = asyncio.Event()
    tasks = [asyncio.ensure_future(hold(ctl, release)) for _ in range(4)]
    await settle()
    assert ctl.predicted_wait() > 0.05
    began = time.monotonic()
    with pytest.raises(AdmissionRefused) as refused:
        async with ctl.admit(timeout=0.05):
            pass
    assert time.monotonic() - began < 0.02
    assert refused.value.code == "DEADLINE_UNMEETABLE"
    assert refusals(registry, "deadline") == 1
    release.set()
    await asyncio.gather(*tasks)


async def test_a_queued_request_leaves_before_its_deadline_passes() -> None:
    ctl = controller(initial_limit=1, queue_size=10)
    # service takes 0.1 s (with two samples the estimate is their maximum): a waiter leaves
    # one service time before its deadline, a margin wider than a loaded machine's delay
    # in waking a task
    await learn_latency(ctl, 0.1, n=2)
    release = asyncio.Event()
    holder = asyncio.ensure_future(hold(ctl, release))
    await settle()
    began = time.monotonic()
    with pytest.raises(AdmissionRefused) as refused:
        async with ctl.admit(timeout=0.4):
            pass
    waited = time.monotonic() - began
    assert refused.value.reason == "deadline"
    assert waited < 0.4  # left with enough time to say so, not after the deadline
    assert waited > 0.05  # and not at once: it waited until a slot could no longer help
    assert ctl.queue_length == 0
    release.set()
    await holder


async def test_memory_reservation_refuses_and_is_released_after_the_request() -> None:
    registry = CollectorRegistry()
    ctl = controller(registry, initial_limit=8, memory_capacity=1000)
    async with ctl.admit(cost=600):
        assert ctl.reserved == 600
        with pytest.raises(AdmissionRefused) as refused:
            async with ctl.admit(cost=600):
                pass
        assert refused.value.code == "MEMORY_RESERVATION"
    assert ctl.reserved == 0
    with pytest.raises(RuntimeError):
        async with ctl.admit(cost=1000):
            raise RuntimeError("handler failed")
    assert ctl.reserved == 0 and ctl.in_flight == 0
    assert refusals(registry, "memory") == 1


async def test_memory_capacity_may_be_a_live_reading() -> None:
    free = {"bytes": 100}
    ctl = controller(memory_capacity=lambda: free["bytes"])
    with pytest.raises(AdmissionRefused):
        async with ctl.admit(cost=200):
            pass
    free["bytes"] = 300
    async with ctl.admit(cost=200):
        pass


async def test_a_cancelled_waiter_leaves_the_queue_and_frees_its_memory() -> None:
    ctl = controller(initial_limit=1, queue_size=4, memory_capacity=10_000)
    release = asyncio.Event()
    holder = asyncio.ensure_future(hold(ctl, release))
    await settle()
    waiter = asyncio.ensure_future(hold(ctl, release, cost=500))
    await settle()
    assert ctl.queue_length == 1 and ctl.reserved == 500
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert ctl.queue_length == 0 and ctl.reserved == 0
    release.set()
    await holder
    assert ctl.in_flight == 0


async def test_retry_after_follows_the_drain_rate() -> None:
    ctl = controller(initial_limit=1, queue_size=100)
    await learn_latency(ctl, 0.1, n=3)
    release = asyncio.Event()
    tasks = [asyncio.ensure_future(hold(ctl, release)) for _ in range(31)]
    await settle()
    # 30 queued at ~10 per second: about 3 seconds
    assert 2 <= ctl.retry_after() <= 5
    release.set()
    await asyncio.gather(*tasks)


async def test_snapshot_reports_what_health_shows() -> None:
    ctl = controller(initial_limit=3, queue_size=7)
    async with ctl.admit():
        snap = ctl.snapshot()
    assert snap["queue_capacity"] == 7 and snap["limit"] == 3 and snap["in_flight"] == 1
    assert ctl.snapshot()["queue_wait_p99_seconds"] is not None


def test_priority_and_timeout_parsing() -> None:
    ctl = controller()
    assert ctl.parse_priority(None) == "interactive"
    assert ctl.parse_priority(" Batch ") == "batch"
    with pytest.raises(ConfigError, match="unknown priority 'urgent'"):
        ctl.parse_priority("urgent")
    assert ctl.parse_timeout(None) == 30.0
    assert ctl.parse_timeout("2.5") == 2.5
    for bad, needle in [
        ("-1", "positive"),
        ("0", "positive"),
        ("abc", "number"),
        ("nan", "positive"),
        ("inf", "positive"),
        ("1e9", "maximum"),
        ("", "number"),
    ]:
        with pytest.raises(ConfigError, match=needle):
            ctl.parse_timeout(bad)


async def test_admit_with_an_unknown_priority_raises_config_error() -> None:
    ctl = controller()
    with pytest.raises(ConfigError):
        async with ctl.admit(priority="vip"):
            pass
    assert ctl.in_flight == 0


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"initial_limit": 0}, "initial_limit"),
        ({"min_limit": 10, "initial_limit": 5}, "min_limit"),
        ({"queue_size": -1}, "queue_size"),
        ({"tolerance": 0.5}, "tolerance"),
        ({"default_timeout": 0}, "default_timeout"),
        ({"default_timeout": 100, "max_timeout": 10}, "max_timeout"),
        ({"priorities": ("a", "a")}, "priorities"),
        ({"default_priority": "gold"}, "default_priority"),
        ({"memory_capacity": -5}, "memory_capacity"),
        ({"memory_estimator": 3}, "memory_estimator"),
    ],
)
def test_bad_admission_config_names_the_key(kwargs: dict[str, object], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        AdmissionConfig(**kwargs)  # type: ignore[arg-type]


def test_default_memory_estimator_is_llama3_8b_kv_cache() -> None:
    assert default_memory_estimator(1000, 24) == 1024 * 128 * 1024
    tiny = kv_cache_estimator(layers=1, kv_heads=1, head_dim=1, dtype_bytes=1)
    assert tiny(3, 2) == 10 and tiny(-5, 2) == 4


def test_gradient_limit_grows_while_latency_holds_and_is_capped() -> None:
    limit = GradientLimit(initial=10, floor=2, ceiling=40, window_samples=5, window_seconds=0)
    now = 0.0
    for _ in range(400):
        now += 0.01
        limit.on_sample(0.1, in_flight=int(limit.limit), now=now)
    assert limit.limit == 40


def test_gradient_limit_shrinks_when_latency_passes_tolerance_and_keeps_the_floor() -> None:
    limit = GradientLimit(initial=50, floor=4, ceiling=100, window_samples=5, window_seconds=0)
    now = 0.0
    for _ in range(10):
        now += 0.01
        limit.on_sample(0.1, in_flight=50, now=now)
    before = limit.limit
    for _ in range(20):
        now += 0.01
        limit.on_sample(0.3, in_flight=50, now=now)  # 3x the baseline
    assert limit.limit < before * 0.8
    for _ in range(2000):
        now += 0.01
        limit.on_sample(1.0, in_flight=50, now=now)
    assert limit.limit == 4


def test_gradient_limit_does_not_grow_when_the_service_is_idle() -> None:
    limit = GradientLimit(initial=20, floor=1, ceiling=100, window_samples=5, window_seconds=0)
    now = 0.0
    for _ in range(200):
        now += 0.01
        limit.on_sample(0.1, in_flight=2, now=now)
    assert limit.limit == 20


def test_gradient_limit_baseline_forgets_after_the_horizon() -> None:
    limit = GradientLimit(initial=10, window_samples=1, window_seconds=0, baseline_horizon=10.0)
    limit.on_sample(0.05, in_flight=10, now=0.0)
    limit.on_sample(0.2, in_flight=10, now=20.0)
    assert limit.baseline == 0.2


@pytest.mark.parametrize(
    "kwargs",
    [{"floor": 0}, {"initial": 500}, {"tolerance": 0.9}, {"smoothing": 0}, {"window_samples": 0}],
)
def test_gradient_limit_rejects_bad_settings(kwargs: dict[str, float]) -> None:
    with pytest.raises(ConfigError):
        GradientLimit(**kwargs)  # type: ignore[arg-type]


async def test_an_idle_service_admits_even_after_learning_slow_latencies() -> None:
    # Otherwise an estimate learnt under overload would refuse everything forever.
    ctl = controller(initial_limit=1, queue_size=4)
    await learn_latency(ctl, 0.05, n=3)
    admitted = False
    async with ctl.admit(timeout=0.01):
        admitted = ctl.in_flight == 1
    assert admitted and ctl.in_flight == 0


class _SteppedClock:
    """``time.monotonic`` plus the seconds a test steps it by: latencies the controller
    learns are the steps, not how fast a loaded machine ran the test's sleeps."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.monotonic() + self.offset


async def test_a_request_granted_too_late_to_finish_is_refused_and_hands_the_slot_on() -> None:
    registry = CollectorRegistry()
    clock = _SteppedClock()
    ctl = AdmissionController(
        AdmissionConfig(adaptive=False, initial_limit=1, queue_size=4),
        registry=registry,
        clock=clock,
    )
    for _ in range(3):  # three requests of 20 ms
        async with ctl.admit():
            clock.offset += 0.02
    release = asyncio.Event()
    holder = asyncio.ensure_future(hold(ctl, release))
    await settle()
    waiter = asyncio.ensure_future(hold(ctl, release, timeout=0.5))
    await settle()
    # the holder takes 0.35 s: when it finishes, the estimate has grown past the time left
    clock.offset += 0.35
    release.set()
    await holder
    with pytest.raises(AdmissionRefused, match="at the grant"):
        await waiter
    assert ctl.in_flight == 0 and ctl.queue_length == 0
    assert refusals(registry, "deadline") == 1


@pytest.mark.parametrize("instrument_first", [True, False])
async def test_shares_queue_metrics_with_the_instrumentation(instrument_first: bool) -> None:
    from aivitals.instrument import InstrumentedQueue

    registry = CollectorRegistry()

    def make_queue() -> InstrumentedQueue[int]:
        return InstrumentedQueue(8, name="generate", registry=registry)

    queue = make_queue() if instrument_first else None
    ctl = controller(registry, initial_limit=1)
    queue = queue or make_queue()
    async with ctl.admit():
        pass
    queue.put_nowait(1)
    assert sample(registry, "queue_length", queue="generate") == 1
    assert sample(registry, "queue_capacity", queue="admission") == 64
    assert sample(registry, "queue_wait_seconds_count", queue="admission") == 1
