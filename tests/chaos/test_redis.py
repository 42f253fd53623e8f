from __future__ import annotations

import socket
from pathlib import Path

import psutil
import pytest

from aivitals.chaos import FaultContext, Replacement, RunDir, cleanup
from aivitals.chaos._journal import replay
from aivitals.chaos._procs import kill_tree, start_time
from aivitals.chaos._redis import redis_command
from aivitals.errors import FaultRefused
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


def _listening_pids(port: int) -> list[int]:
    return sorted(
        {
            c.pid
            for c in psutil.net_connections("tcp")
            if c.laddr and c.laddr.port == port and c.status == "LISTEN" and c.pid
        }
    )


def _marker(pid: int) -> str | None:
    return psutil.Process(pid).environ().get("AIVITALS_CHAOS_RUN")


def test_redis_down_kill_method_hands_the_new_server_to_its_owner(  # type: ignore[no-untyped-def]
    runner_factory, chaos_root: Path
) -> None:
    handed: list[Replacement] = []
    owner = RunDir.create(chaos_root, kind="stack")  # this test plays the stack that owns Redis
    with redis_server() as redis:
        ctx = FaultContext(
            redis_port=redis.port, redis_pid=redis.proc.pid, owner=owner.path,
            on_replace=handed.append,
        )  # fmt: skip
        with runner_factory(ctx) as runner:
            active = runner.start("redis_down", duration=30, method=1)
            redis.proc.wait(5)
            assert not _reachable(redis.port)
            assert runner.stop(active) == []
            assert _reachable(redis.port)
            run_id = runner.run.run_id
        [rep] = handed
        assert active.fault.replacements == [rep]
        assert _listening_pids(redis.port) == [rep.pid]
        new = psutil.Process(rep.pid)
        assert new.cwd() == str(redis.workdir)  # the same dir, still there
        assert _marker(rep.pid) == owner.run_id  # the owner's cleanup finds it by marker
        [entry] = owner.journal.pending()  # ... and by its ledger, with its start time
        assert (entry["kind"], entry["pid"], entry["start"]) == ("process", rep.pid, rep.start)
        assert rep.owner == str(owner.path) and "handed to its owner" in rep.describe()
        # the owner stopping its ledger stops the replacement: nothing is left
        assert replay(owner) == []
        assert not psutil.pid_exists(rep.pid) or new.status() == psutil.STATUS_ZOMBIE
    assert_clean(run_id, chaos_root)


def test_redis_down_kill_method_refuses_a_redis_it_cannot_hand_back(  # type: ignore[no-untyped-def]
    runner_factory, chaos_root: Path
) -> None:
    with redis_server() as redis:
        ctx = FaultContext(redis_port=redis.port, redis_pid=redis.proc.pid)
        with runner_factory(ctx) as runner:
            with pytest.raises(FaultRefused, match="allow-foreign-restart"):
                runner.start("redis_down", duration=30, method=1)
            assert redis.proc.poll() is None and _reachable(redis.port)  # untouched
            run_id = runner.run.run_id
    assert_clean(run_id, chaos_root)


def test_redis_down_kill_method_refuses_a_pid_not_serving_the_port(  # type: ignore[no-untyped-def]
    runner_factory, chaos_root: Path
) -> None:
    owner = RunDir.create(chaos_root, kind="stack")
    with redis_server() as redis, redis_server() as other:
        # a stale pid (here: another redis-server) must never be killed for this port
        ctx = FaultContext(redis_port=redis.port, redis_pid=other.proc.pid, owner=owner.path)
        with (
            runner_factory(ctx) as runner,
            pytest.raises(FaultRefused, match="does not listen on redis_port"),
        ):
            runner.start("redis_down", duration=30, method=1)
        assert other.proc.poll() is None and redis.proc.poll() is None
    owner.remove()


def test_redis_down_kill_method_allowed_for_a_foreign_redis_names_the_new_pid(  # type: ignore[no-untyped-def]
    runner_factory, chaos_root: Path
) -> None:
    with redis_server() as redis:
        ctx = FaultContext(
            redis_port=redis.port, redis_pid=redis.proc.pid, allow_foreign_restart=True
        )
        with runner_factory(ctx) as runner:
            active = runner.start("redis_down", duration=30, method=1)
            redis.proc.wait(5)
            assert runner.stop(active) == []
            run_id = runner.run.run_id
        [rep] = active.fault.replacements
        try:
            assert rep.owner is None and "yours now" in rep.describe()
            assert _listening_pids(redis.port) == [rep.pid]
            assert _marker(rep.pid) is None  # no run's cleanup will touch it: it is the user's
        finally:
            assert kill_tree(rep.pid, rep.start)
    assert_clean(run_id, chaos_root)


def test_redis_down_restart_that_fails_says_so_and_leaves_nothing(  # type: ignore[no-untyped-def]
    runner_factory, chaos_root: Path
) -> None:
    owner = RunDir.create(chaos_root, kind="stack")
    with redis_server() as redis:
        ctx = FaultContext(redis_port=redis.port, redis_pid=redis.proc.pid, owner=owner.path)
        with runner_factory(ctx) as runner:
            active = runner.start("redis_down", duration=30, method=1)
            redis.proc.wait(5)
            # Someone binds the port while Redis is down (bound, not listening): the
            # new redis-server cannot bind it and exits.
            blocker = socket.socket()
            blocker.bind(("127.0.0.1", redis.port))
            try:
                [error] = runner.stop(active)
            finally:
                blocker.close()
            run_id = runner.run.run_id
        assert "could not restart redis-server" in error and "nothing of it is left" in error
        assert active.fault.replacements == []
        assert _listening_pids(redis.port) == []
        assert not [p for p in psutil.process_iter(["cmdline"])
                    if f"--port {redis.port}" in " ".join(p.info["cmdline"] or [])
                    and p.status() != psutil.STATUS_ZOMBIE]  # fmt: skip
        with socket.socket() as s:  # the port is free
            s.bind(("127.0.0.1", redis.port))
        assert owner.journal.pending() == []  # nothing half-started handed over
    owner.remove()
    # nothing is pending (a retry would fail the same way), so the run's dir is gone too
    assert cleanup(chaos_root).cleaned == []
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


def _dead_owner(root: Path) -> RunDir:
    """A ledger whose owner process has exited (a stack that was SIGKILLed)."""
    import json
    import subprocess

    owner = RunDir.create(root, kind="stack")
    gone = subprocess.Popen(["true"])
    gone.wait()
    (owner.path / "owner.json").write_text(json.dumps({"pid": gone.pid, "start": 1.0}))
    return owner


def test_cleanup_restarts_nothing_for_an_owner_that_is_gone(chaos_root: Path) -> None:
    owner = _dead_owner(chaos_root)
    run = _dead_owner(chaos_root)  # the crashed runner's own run dir
    port = _free_port()
    argv = ["redis-server", "--port", str(port)]
    run.journal.record("restart", role="redis-server", argv=argv, cwd="/", port=port,
                       owned_by=str(owner.path))  # fmt: skip
    report = cleanup(chaos_root)
    assert sorted(report.cleaned) == sorted([owner.run_id, run.run_id])
    assert report.replaced == [] and report.errors == []
    assert _listening_pids(port) == []


def test_cleanup_finishes_a_hand_over_cut_short(chaos_root: Path) -> None:
    import subprocess

    live = RunDir.create(chaos_root, kind="stack")  # owned by this (live) process
    dead = _dead_owner(chaos_root)
    run = _dead_owner(chaos_root)
    kept = subprocess.Popen(["sleep", "60"])
    stopped = subprocess.Popen(["sleep", "60"])
    try:
        for proc, owner in ((kept, live), (stopped, dead)):
            run.journal.record("replacement", pid=proc.pid, start=start_time(proc.pid),
                               owned_by=str(owner.path), role="redis-server", port=1)  # fmt: skip
        report = cleanup(chaos_root)
        assert report.errors == [] and live.run_id in report.skipped
        # the live owner got its process in its ledger; the dead one's was stopped
        [entry] = live.journal.pending()
        assert (entry["kind"], entry["pid"]) == ("process", kept.pid)
        assert kept.poll() is None
        assert stopped.wait(5) is not None
    finally:
        for p in (kept, stopped):
            p.kill()
            p.wait()
        live.remove()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
