from __future__ import annotations

import socket
from pathlib import Path

import psutil
import pytest

from aivitals.chaos import FaultContext
from aivitals.chaos._redis import redis_command
from tests._servers import redis_server
from tests.chaos.conftest import assert_clean, require_root, require_tool

pytestmark = pytest.mark.integration


def _reachable(port: int) -> bool:
    try:
        return redis_command(port, "PING", timeout=1.0).startswith(b"+PONG")
    except OSError:
        return False


def test_redis_down_blocks_then_restores(runner_factory, chaos_root: Path) -> None:  # type: ignore[no-untyped-def]
    require_root()
    require_tool("nft")
    with redis_server() as redis:
        assert _reachable(redis.port)
        ctx = FaultContext(redis_port=redis.port, redis_pid=redis.proc.pid)
        with runner_factory(ctx) as runner:
            active = runner.start("redis_down", duration=30)
            assert not _reachable(redis.port)
            with pytest.raises(ConnectionError):
                socket.create_connection(("127.0.0.1", redis.port), timeout=1).recv(1)
            assert redis.proc.poll() is None  # the process itself is left alone
            runner.stop(active)
            assert _reachable(redis.port)
            run_id = runner.run.run_id
    assert_clean(run_id, chaos_root)


def test_redis_down_kill_method_restarts_it(runner_factory, chaos_root: Path) -> None:  # type: ignore[no-untyped-def]
    with redis_server() as redis:
        ctx = FaultContext(redis_port=redis.port, redis_pid=redis.proc.pid)
        with runner_factory(ctx) as runner:
            active = runner.start("redis_down", duration=30, method=1)
            redis.proc.wait(5)
            assert not _reachable(redis.port)
            runner.stop(active)
            assert _reachable(redis.port)
            run_id = runner.run.run_id
        # The restarted server is not the harness's child: stop it here.
        for conn in psutil.net_connections("tcp"):
            if conn.laddr and conn.laddr.port == redis.port and conn.status == "LISTEN":
                psutil.Process(conn.pid).terminate()
                psutil.Process(conn.pid).wait(5)
    assert_clean(run_id, chaos_root)


def test_cache_stampede_flushes_every_key(runner_factory, chaos_root: Path) -> None:  # type: ignore[no-untyped-def]
    with redis_server() as redis:
        for i in range(50):
            redis_command(redis.port, "SET", f"k{i}", "v", "EX", "3600")
        with runner_factory(FaultContext(redis_port=redis.port)) as runner:
            active = runner.start("cache_stampede", duration=30, interval=0.5)
            assert active.effect.details["keys"][0] == 50
            assert redis_command(redis.port, "DBSIZE") == b":0\r\n"
            redis_command(redis.port, "SET", "again", "v")
            import time

            time.sleep(1.2)
            assert redis_command(redis.port, "DBSIZE") == b":0\r\n"  # flushed again
            run_id = runner.run.run_id
    assert_clean(run_id, chaos_root)


def test_cache_stampede_can_expire_every_key_together(runner_factory, chaos_root: Path) -> None:  # type: ignore[no-untyped-def]
    import time

    with redis_server() as redis:
        for i in range(2500):  # more than one SCAN page
            redis_command(redis.port, "SET", f"k{i}", "v", "EX", "3600")
        with runner_factory(FaultContext(redis_port=redis.port)) as runner:
            active = runner.start("cache_stampede", duration=30, method=1, ttl_ms=300,
                                  interval=60)  # fmt: skip
            assert active.effect.details["keys"][0] == 2500
            ttl = int(redis_command(redis.port, "PTTL", "k7")[1:].strip())
            assert 0 < ttl <= 300
            time.sleep(0.5)
            # Expired keys are gone for readers at once (Redis evicts them lazily).
            keys = [f"k{i}" for i in range(0, 2500, 10)]
            assert redis_command(redis.port, "EXISTS", *keys) == b":0\r\n"
            run_id = runner.run.run_id
    assert_clean(run_id, chaos_root)
