"""Faults on the run's own Redis (the service's cache): down, and a stampede."""

from __future__ import annotations

import shutil
import socket
import subprocess
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import psutil

from ..errors import FaultError, FaultRefused
from ._fault import Fault, FaultContext, FaultEffect, Touch
from ._journal import RunDir
from ._procs import kill_tree, start_time
from ._spec import FaultSpec, Grading, Knob, Needs, PhaseWindow, Runs, SweepBasis, down, peak

__all__ = ["CacheStampede", "RedisDown", "keeps_title", "redis_command"]


def keeps_title(binary: str) -> list[str]:
    """``--set-proc-title no`` where redis-server has it (6.2+): a rewritten title
    overwrites the process's environment and argv, and the run marker in that
    environment is how a cleanup after a crash finds the process."""
    try:
        out = subprocess.run(
            [binary, "--version"], capture_output=True, text=True, timeout=10, check=False
        ).stdout
        major, minor = (int(x) for x in out.split("v=", 1)[1].split(".")[:2])
    except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
        return []
    return ["--set-proc-title", "no"] if (major, minor) >= (6, 2) else []


def redis_command(port: int, *args: str, timeout: float = 2.0) -> bytes:
    """Send one command in RESP to 127.0.0.1:port and return the raw first reply."""
    payload = f"*{len(args)}\r\n" + "".join(f"${len(a)}\r\n{a}\r\n" for a in args)
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(payload.encode())
        return s.recv(65536)


def _nft(ruleset: str) -> None:
    r = subprocess.run(
        ["nft", "-f", "-"], input=ruleset, capture_output=True, text=True, timeout=15, check=False
    )
    if r.returncode != 0:
        raise FaultError(f"nft: {r.stderr.strip()}")


def _redis_server() -> str | None:
    """Why this machine cannot host a Redis fault (the stack starts its own), or None."""
    return (
        None
        if shutil.which("redis-server")
        else "needs redis-server (apt-get install redis-server)"
    )


# -- redis_down --------------------------------------------------------------------------
REDIS_DOWN = FaultSpec(
    name="redis_down",
    layer="infrastructure",
    description="the service's Redis cache is unreachable",
    alerts=("DependencyDown", "CacheErrorsHigh"),
    signature="redis_down",
    needs=Needs(
        "redis",
        _redis_server,
        # blocked, never killed: the run could not hand a restarted process back
        external_params={"method": 0},
    ),
    runs=Runs(error_codes=("DEPENDENCY_DOWN",)),
    grading=Grading(
        knob=lambda b: Knob(
            param=None,
            unit="share of cache lookups failing",
            bound=b.pack.cache_error_ratio,
            source=f"CacheErrorsHigh cache_error_ratio {b.pack.cache_error_ratio:g}",
            note="one magnitude: the cache answers or not (method 1, a kill, is the same outage)",
        ),
        measure=lambda w, b: peak(
            w.end(
                'sum(increase(cache_requests_total{result="error"}[W])) '
                "/ sum(increase(cache_requests_total[W]))"
            ),
            "cache_requests_total",
        ),
    ),
)


class RedisDown(Fault):
    """The service's Redis becomes unreachable.

    ``method`` 0 (``block``, the default): the run's own nftables table in the
    host namespace answers TCP to the Redis port on loopback with a reset, so
    clients see "connection refused/reset" while the redis-server process, which
    belongs to whoever started it, is left alone; revert deletes the table.
    ``method`` 1 (``kill``): the redis-server (``redis_pid``, which must listen
    on ``redis_port``) is terminated and, on stop, started again on the same
    port and directory. The new process is handed to the context's ``owner``
    (written into its ledger, passed to ``on_replace``), which stops it as its
    own. A redis-server with no owner in the context (one the user started) is
    refused, unless ``allow_foreign_restart`` hands the new process to the
    caller, who is told its pid.
    """

    name = "redis_down"
    spec = REDIS_DOWN
    params = {"method": (0, 0, 1)}
    choices = {"method": (0, 1)}
    touches = (
        Touch(
            "method=0",
            "adds an nft table of the run in the host namespace (TCP to the Redis port on "
            "loopback reset); the redis-server is left alone",
            "the table is deleted; nothing new remains",
        ),
        Touch(
            "method=1",
            "kills the redis-server (redis_pid) and starts a new one on the same port on revert",
            "the new redis-server belongs to the context's owner (the demo/validate stack "
            "stops it); refused for a redis-server the run cannot hand back, unless "
            "--allow-foreign-restart makes it the caller's",
            processes=True,
        ),
    )

    def _start(self, ctx: FaultContext) -> FaultEffect:
        port = int(ctx.require("redis_port"))
        if self.values["method"] == 0:
            return self._block(ctx, port)
        return self._kill(ctx, port)

    def _block(self, ctx: FaultContext, port: int) -> FaultEffect:
        assert self.run is not None
        table = f"aivitals_redis_{self.run.run_id[-6:]}"
        self.record("nft_table", family="inet", name=table, netns=None)
        _nft(
            f"table inet {table} {{\n"
            " chain c_out { type filter hook output priority 0; policy accept;\n"
            f'  oifname "lo" tcp dport {port} reject with tcp reset\n }}\n}}\n'
        )
        return FaultEffect(client_url=ctx.target, details={"method": "block", "table": table})

    def _kill(self, ctx: FaultContext, port: int) -> FaultEffect:
        pid = int(ctx.require("redis_pid"))
        if ctx.owner is None and not ctx.allow_foreign_restart:
            raise FaultRefused(
                f"redis_down method=1 kills redis-server pid {pid} and starts a new one on "
                "revert, but nothing in this run owns that redis-server, so no one would "
                "stop the new one. Use method=0 (block the port), run it through "
                "'aivitals validate' or 'aivitals demo' (their stack owns its Redis), or "
                "pass --allow-foreign-restart to take the restarted redis-server as yours"
            )
        if ctx.owner is not None and not RunDir(ctx.owner).owner_alive():
            raise FaultRefused(f"the owner of redis_pid {pid} ({ctx.owner}) is not running")
        started = start_time(pid)
        try:
            proc = psutil.Process(pid)
            # The title redis sets starts with the path it was run as; exe() would
            # name the multi-call binary (redis-check-rdb) instead.
            title, cwd = proc.cmdline(), proc.cwd()
            exe = title[0].split()[0] if title else proc.exe()
            ports = {c.laddr.port for c in proc.net_connections("tcp") if c.status == "LISTEN"}
        except psutil.Error as exc:
            raise FaultRefused(f"redis_pid {pid}: {exc}") from exc
        if "redis" not in Path(exe).name:
            raise FaultRefused(f"redis_pid {pid} is not a redis-server ({exe})")
        if port not in ports:
            # a stale or recycled pid: never kill what does not serve this port
            raise FaultRefused(f"redis_pid {pid} does not listen on redis_port {port}")
        if "--port" in title and " " not in title[0]:
            argv = list(title)  # its title was kept (--set-proc-title no): the real argv
        else:
            # redis-server rewrote its command line, so the original argv is lost; it
            # comes back as a throwaway loopback Redis on the same port and dir.
            argv = [exe, "--bind", "127.0.0.1", "--port", str(port), "--save", "",
                    "--appendonly", "no", "--dir", cwd, *keeps_title(exe)]  # fmt: skip
        owner = str(ctx.owner) if ctx.owner is not None else None
        self.record("restart", role="redis-server", argv=argv, cwd=cwd, port=port, owned_by=owner)
        kill_tree(pid, started)
        return FaultEffect(
            client_url=ctx.target,
            details={"method": "kill", "argv": argv, "killed": pid, "owner": owner},
        )


def _read_reply(f: Any) -> Any:
    """One RESP reply from a buffered socket file."""
    line = f.readline()
    kind, rest = line[:1], line[1:-2]
    if kind == b"-":
        raise FaultError(f"redis: {rest.decode(errors='replace')}")
    if kind in (b"+", b":"):
        return int(rest) if kind == b":" else rest.decode()
    if kind == b"$":
        n = int(rest)
        return None if n < 0 else f.read(n + 2)[:-2]
    if kind == b"*":
        n = int(rest)
        return None if n < 0 else [_read_reply(f) for _ in range(n)]
    raise FaultError(f"redis: unexpected reply {line[:50]!r}")


def _encode(*args: str | bytes) -> bytes:
    parts = [a if isinstance(a, bytes) else a.encode() for a in args]
    return b"*%d\r\n" % len(parts) + b"".join(b"$%d\r\n%s\r\n" % (len(p), p) for p in parts)


def expire_all(port: int, ttl_ms: int, *, max_keys: int = 1_000_000) -> int:
    """Give every key the same TTL so they all expire together; returns how many."""
    done = 0
    with socket.create_connection(("127.0.0.1", port), timeout=5.0) as sock:
        f = sock.makefile("rb")
        cursor = b"0"
        while done < max_keys:
            sock.sendall(_encode("SCAN", cursor, "COUNT", "1000"))
            cursor, keys = _read_reply(f)
            if keys:
                sock.sendall(b"".join(_encode("PEXPIRE", k, str(ttl_ms)) for k in keys))
                done += sum(_read_reply(f) for _ in keys)
            if cursor == b"0":
                break
    return done


# -- cache_stampede ----------------------------------------------------------------------
def _stampede_knob(b: SweepBasis) -> Knob:
    # CacheHitRatioDrop, the hit ratio under (1 - cache_hit_drop) of its best.
    drop, pool, emb = b.pack.cache_hit_drop, b.embeddings_pool, b.embeddings_rate
    return Knob(
        param="interval",
        unit="drop of the hit ratio (share of its warm level)",
        bound=drop,
        source=f"CacheHitRatioDrop cache_hit_drop {drop:g}; validate cycles {pool} "
        f"embeddings inputs at {emb:g}/s",
        # drop = pool / (emb * interval): the longest interval that still drops
        threshold={"interval": down(pool / (emb * drop), 0.5)},
        moderate={"interval": down(pool / (emb * min(1.0, 2 * drop)), 0.5)},
        note="moderate: a drop of 100 % (every lookup between flushes misses)",
    )


def _stampede_drop(p: Mapping[str, Any], b: SweepBasis) -> float:
    """Drop of the embeddings cache's hit ratio (share of its warm level) when every
    key is flushed each ``interval`` s: validate cycles its pool of inputs, so after
    each flush the next min(pool, rate*interval) lookups miss."""
    lookups = b.embeddings_rate * float(p["interval"])
    return min(1.0, b.embeddings_pool / lookups) if lookups > 0 else 1.0


def _stampede_measure(w: PhaseWindow, b: SweepBasis) -> float | str:
    expr = (
        'sum by (cache) (increase(cache_requests_total{result="hit"}[W])) '
        '/ sum by (cache) (increase(cache_requests_total{result=~"hit|miss"}[W]))'
    )
    during = {s.get("cache", ""): v for s, v in w.at(expr, w.t_end)}
    before = {s.get("cache", ""): v for s, v in w.start(expr)}
    # the caches that were warm (CacheHitRatioDrop's cache_hit_baseline_ratio)
    warm = {c: v for c, v in before.items() if v >= b.pack.cache_hit_baseline_ratio}
    drops = [1.0 - during[c] / v for c, v in warm.items() if c in during]
    if not drops:
        return "no warm cache (hit ratio over its baseline bound) before the fault"
    return max(drops)


CACHE_STAMPEDE = FaultSpec(
    name="cache_stampede",
    layer="service",
    description="every key of the service's Redis cache expires at once, repeatedly",
    alerts=("CacheHitRatioDrop",),
    signature="cache_stampede",
    needs=Needs(
        "redis",
        _redis_server,
        external="it flushes or expires every key of the Redis it acts on; aivitals does "
        "that only to a Redis its own run started",
    ),
    runs=Runs(
        quick_params={"interval": 1},
        # CacheHitRatioDrop compares with the best hit ratio of the last
        # baseline_window (30 s in quick runs): the warm cache must be seen first
        quick_baseline=35.0,
    ),
    grading=Grading(knob=_stampede_knob, magnitude=_stampede_drop, measure=_stampede_measure),
)


class CacheStampede(Fault):
    """Every key of the service's Redis expires at the same moment, again every
    ``interval`` seconds while the load goes on.

    ``method`` 0 (default): ``FLUSHALL``. ``method`` 1: every key gets the same
    ``ttl_ms`` (what a batch refresh without TTL jitter does), so they expire
    together a moment later.
    """

    name = "cache_stampede"
    spec = CACHE_STAMPEDE
    params = {"interval": (5, 0.5, 3600), "method": (0, 0, 1), "ttl_ms": (500, 1, 3_600_000)}
    choices = {"method": (0, 1)}
    touches = (
        Touch(
            "method=0",
            "flushes every key of the service's Redis (FLUSHALL now and every interval), "
            "from a thread of the runner",
            "nothing: the keys stay gone (a cache refills); the thread ends with the fault",
        ),
        Touch(
            "method=1",
            "sets the TTL of every key of the service's Redis to ttl_ms, from a thread of "
            "the runner",
            "nothing: the keys expire (a cache refills); the thread ends with the fault",
        ),
    )

    def _start(self, ctx: FaultContext) -> FaultEffect:
        port = int(ctx.require("redis_port"))
        hits = [self._once(port)]

        def loop() -> None:
            while not self._stopped.wait(self.values["interval"]):
                try:
                    hits.append(self._once(port))
                except (OSError, FaultError):
                    continue

        threading.Thread(target=loop, name="aivitals-stampede", daemon=True).start()
        return FaultEffect(client_url=ctx.target, details={"keys": hits})

    def _once(self, port: int) -> int:
        if self.values["method"] == 1:
            return expire_all(port, int(self.values["ttl_ms"]))
        keys = redis_command(port, "DBSIZE")
        reply = redis_command(port, "FLUSHALL")
        if not reply.startswith(b"+OK"):
            raise FaultError(f"FLUSHALL on redis port {port}: {reply[:100]!r}")
        return int(keys[1:].strip() or 0) if keys.startswith(b":") else 0
