from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

import pytest
from prometheus_client import CollectorRegistry

from aivitals.errors import ConfigError
from aivitals.instrument import InstrumentedExecutor, InstrumentedQueue, PoolSaturated


def _value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    value = registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def test_queue_reports_length_capacity_wait_and_rejections() -> None:
    reg = CollectorRegistry()

    async def run() -> None:
        queue: InstrumentedQueue[str] = InstrumentedQueue(2, name="gen", registry=reg)
        queue.put_nowait("a")
        await queue.put("b")
        assert _value(reg, "queue_length", queue="gen") == 2
        with pytest.raises(asyncio.QueueFull):
            queue.put_nowait("c")
        await asyncio.sleep(0.02)
        assert await queue.get() == "a"
        assert queue.get_nowait() == "b"

    asyncio.run(run())
    assert _value(reg, "queue_capacity", queue="gen") == 2
    assert _value(reg, "queue_length", queue="gen") == 0
    assert _value(reg, "queue_rejections_total", queue="gen", reason="full") == 1
    assert _value(reg, "queue_wait_seconds_count", queue="gen") == 2
    assert _value(reg, "queue_wait_seconds_sum", queue="gen") >= 0.04


def test_queue_bad_arguments() -> None:
    with pytest.raises(ConfigError, match="maxsize"):
        InstrumentedQueue(-1, registry=CollectorRegistry())
    with pytest.raises(ConfigError, match="name"):
        InstrumentedQueue(1, name="", registry=CollectorRegistry())


def test_thread_executor_reports_active_workers_wait_and_rejections() -> None:
    reg = CollectorRegistry()
    gate = threading.Event()
    pool = InstrumentedExecutor(ThreadPoolExecutor(2), name="tok", max_queue=1, registry=reg)
    try:
        futures = [pool.submit(gate.wait, 5) for _ in range(3)]
        deadline = time.monotonic() + 5
        while pool.active < 2 and time.monotonic() < deadline:
            time.sleep(0.005)
        assert _value(reg, "worker_pool_active_workers", pool="tok") == 2
        assert _value(reg, "worker_pool_max_workers", pool="tok") == 2
        assert _value(reg, "queue_length", queue="pool:tok") == 1
        with pytest.raises(PoolSaturated):
            pool.submit(gate.wait, 5)
        gate.set()
        assert all(f.result(5) for f in futures)
    finally:
        pool.shutdown()
    assert _value(reg, "worker_pool_rejections_total", pool="tok") == 1
    assert _value(reg, "worker_pool_active_workers", pool="tok") == 0
    assert _value(reg, "queue_wait_seconds_count", queue="pool:tok") == 3
    with pytest.raises(RuntimeError):
        pool.submit(print)  # shut down: refused, counted
    assert _value(reg, "worker_pool_rejections_total", pool="tok") == 2


def test_busy_time_counts_a_running_task_before_it_ends() -> None:
    """A stuck worker never reaches its task's end: its time must still count, or a
    stuck pool would read as idle to rate(worker_pool_busy_seconds_total)."""
    reg = CollectorRegistry()
    gate = threading.Event()
    pool = InstrumentedExecutor(ThreadPoolExecutor(2), name="stuck", registry=reg)
    started = time.monotonic()
    try:
        future = pool.submit(gate.wait, 10)
        deadline = started + 5
        while _value(reg, "worker_pool_busy_seconds_total", pool="stuck") < 0.3:
            assert time.monotonic() < deadline, "the running task's time was never credited"
            time.sleep(0.02)
        assert not future.done()
        # one worker busy: never more than the wall time since the submit
        assert _value(reg, "worker_pool_busy_seconds_total", pool="stuck") <= (
            time.monotonic() - started
        )
    finally:
        gate.set()
        pool.shutdown()


def test_busy_time_is_the_integral_of_the_busy_workers_and_stops_when_idle() -> None:
    reg = CollectorRegistry()
    pool = InstrumentedExecutor(ThreadPoolExecutor(2), name="b", registry=reg)
    started = time.monotonic()
    try:
        for future in [pool.submit(time.sleep, 0.2) for _ in range(2)]:
            future.result(5)
        wall = time.monotonic() - started
    finally:
        pool.shutdown()
    busy = _value(reg, "worker_pool_busy_seconds_total", pool="b")
    assert 0.4 <= busy <= 2 * wall  # both tasks' sleep, at most both workers all along
    time.sleep(0.3)  # idle: nothing more is credited
    assert _value(reg, "worker_pool_busy_seconds_total", pool="b") == busy


def test_a_forked_child_gets_its_own_busy_ticker() -> None:
    """A fork can happen while another thread holds the ticker's lock (gunicorn forks
    its workers from a parent that may have served): the child must not inherit it."""
    import os

    from aivitals.instrument import _queue

    parent = _queue._TICKER
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report, then leave without running pytest's teardown
        ok = _queue._TICKER is not parent and not _queue._TICKER._lock.locked()
        os.write(write, b"1" if ok else b"0")
        os._exit(0)
    os.close(write)
    try:
        assert os.read(read, 1) == b"1"
    finally:
        os.close(read)
        os.waitpid(pid, 0)
    assert _queue._TICKER is parent


def test_executor_works_with_run_in_executor_and_propagates_errors() -> None:
    reg = CollectorRegistry()
    pool = InstrumentedExecutor(ThreadPoolExecutor(1), name="x", registry=reg)

    async def run() -> int:
        loop = asyncio.get_running_loop()
        with pytest.raises(ZeroDivisionError):
            await loop.run_in_executor(pool, divmod, 1, 0)
        return await loop.run_in_executor(pool, sum, [1, 2, 3])

    try:
        assert asyncio.run(run()) == 6
    finally:
        pool.shutdown()


@pytest.mark.slow
def test_process_executor_relays_results_and_wait() -> None:
    reg = CollectorRegistry()
    pool = InstrumentedExecutor(ProcessPoolExecutor(1), name="proc", registry=reg)
    try:
        assert pool.submit(pow, 2, 10).result(30) == 1024
        with pytest.raises(ZeroDivisionError):
            pool.submit(divmod, 1, 0).result(30)
    finally:
        pool.shutdown()
    assert _value(reg, "queue_wait_seconds_count", queue="pool:proc") == 1
    assert _value(reg, "worker_pool_active_workers", pool="proc") == 0
    assert _value(reg, "worker_pool_busy_seconds_total", pool="proc") > 0


def test_executor_bad_arguments() -> None:
    with ThreadPoolExecutor(1) as inner:
        with pytest.raises(ConfigError, match="max_queue"):
            InstrumentedExecutor(inner, max_queue=-1, registry=CollectorRegistry())
        with pytest.raises(ConfigError, match="max_workers"):
            InstrumentedExecutor(inner, max_workers=0, registry=CollectorRegistry())


def test_thread_pool_tasks_see_the_submitters_request_id() -> None:
    from aivitals.instrument import REQUEST_ID, current_request_id

    reg = CollectorRegistry()
    pool = InstrumentedExecutor(ThreadPoolExecutor(1), name="ctx", registry=reg)
    bare = InstrumentedExecutor(
        ThreadPoolExecutor(1), name="noctx", propagate_context=False, registry=reg
    )
    token = REQUEST_ID.set("rid-7")
    try:
        assert pool.submit(current_request_id).result(5) == "rid-7"
        assert bare.submit(current_request_id).result(5) is None
    finally:
        REQUEST_ID.reset(token)
        pool.shutdown()
        bare.shutdown()
