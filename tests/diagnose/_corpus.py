"""SYNTHETIC labelled scenarios for testing and benchmarking the diagnosis.

Everything here is generated, and says so: a simulated model-serving service
(HTTP histograms, queue, pool, model timings and tokens, GPU, host, process,
cache, kernel counters) at 1 s resolution with noise and a slow daily-like
swing, plus a fault model per fault name that changes the *physical* state
(memory grows, connections pile up, the GPU is shared...) from which every
metric is derived. Scenarios add distractors (an unrelated short spike
elsewhere) and partial signals (metric families missing). The fault model is
written from DOMAIN.md, not from the signatures' expressions.

It lives with the tests, not in the package: only the tests and
``benchmarks/diagnosis_accuracy.py`` (which puts the repository root on
``sys.path``) use it, and generated faults have no place in what users install.

Two scenarios come from a REAL recording: the H200 fault run in
``tests/fixtures/gpu/h200/scenarios.csv`` (leak, cotenant, contention, oom), its
rows time-stretched (one 0.5 s row becomes ``stretch`` seconds) so the short
phases last long enough for 1-minute rates, and embedded in a synthetic
service.

**Usage**::

    from tests.diagnose import _corpus as corpus
    sc = corpus.scenario("gpu_memory_leak", seed=1)
    store = corpus.to_store(sc)
    diagnose(store, end=sc.fault_start + 120)
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from aivitals.diagnose import Event
from aivitals.signals import LATENCY_BUCKETS, SIZE_BUCKETS, TOKEN_BUCKETS

__all__ = [
    "FAULTS",
    "Scenario",
    "h200_scenarios",
    "healthy",
    "scenario",
    "to_store",
]

GiB = float(2**30)
T0 = 1_767_000_000.0  # a fixed epoch so scenarios are reproducible


@dataclass
class _State:
    """The simulated service's physical state over time (arrays of length n)."""

    n: int
    rps: np.ndarray
    lat_median: np.ndarray
    lat_sigma: np.ndarray
    lat_add: np.ndarray
    #: a blackbox probe's round trip through the callers' path, seconds
    probe: np.ndarray
    status: dict[str, np.ndarray]
    queue: np.ndarray
    queue_wait: np.ndarray
    pool_active: np.ndarray
    pool_max: float
    infer_median: np.ndarray
    wall_extra: np.ndarray
    in_tokens: np.ndarray
    out_tokens: np.ndarray
    body_bytes: np.ndarray
    gpu_util: np.ndarray
    gpu_mem: np.ndarray
    gpu_total: float
    proc_mem: dict[str, np.ndarray]
    sm_mhz: np.ndarray
    power: np.ndarray
    kv_usage: np.ndarray
    host_busy: np.ndarray
    iowait: np.ndarray
    proc_cpu: np.ndarray
    rss: np.ndarray
    fds: np.ndarray
    conns: np.ndarray
    hit_ratio: np.ndarray
    cache_error: np.ndarray
    disk_util: np.ndarray
    disk_await: np.ndarray
    retrans_ratio: np.ndarray
    drops: np.ndarray
    mem_avail: np.ndarray
    swap_rate: np.ndarray
    psi_mem: np.ndarray
    in_progress: np.ndarray
    admitted: np.ndarray
    load_time: np.ndarray
    ready: np.ndarray
    redis_ok: np.ndarray
    up: np.ndarray
    scrape_s: np.ndarray  # the agent's scrape of /metrics, answered on the server's event loop
    counters: dict[str, np.ndarray] = field(default_factory=dict)  # extra error rates per key
    restart_at: int | None = None
    xid_at: int | None = None
    oom_kill_at: int | None = None
    io_errors: np.ndarray | None = None
    #: ``model_loads_total`` by mode (cumulative), ``(cold, warm)``; None: not exported
    loads: tuple[np.ndarray, np.ndarray] | None = None


@dataclass
class Scenario:
    """A labelled window: the fault (None = healthy), when it started, and the state."""

    name: str
    fault: str | None
    fault_start: float
    start: float
    end: float
    state: _State
    events: list[Event]
    missing: tuple[str, ...] = ()
    source: str = "synthetic"


def _noise(rng: np.random.Generator, n: int, rel: float) -> np.ndarray:
    return 1.0 + rel * rng.standard_normal(n)


def _baseline(n: int, rng: np.random.Generator) -> _State:
    t = np.arange(n)
    swing = 1.0 + 0.08 * np.sin(2 * math.pi * t / 3600.0 + rng.uniform(0, 6.28))
    z = np.zeros(n)
    return _State(
        n=n,
        rps=50.0 * swing * _noise(rng, n, 0.05),
        lat_median=0.25 * _noise(rng, n, 0.03),
        lat_sigma=np.full(n, 0.45),
        lat_add=z.copy(),
        status={"500": np.full(n, 0.001)},
        queue=np.clip(2.0 * swing + rng.normal(0, 1.0, n), 0, None).round(),
        queue_wait=0.02 * _noise(rng, n, 0.1),
        pool_active=np.clip(5 * swing + rng.normal(0, 1.0, n), 0, 16).round(),
        pool_max=16.0,
        infer_median=0.15 * _noise(rng, n, 0.03),
        wall_extra=0.02 * _noise(rng, n, 0.05),
        in_tokens=300.0 * _noise(rng, n, 0.04),
        out_tokens=120.0 * _noise(rng, n, 0.04),
        body_bytes=1500.0 * _noise(rng, n, 0.05),
        gpu_util=np.clip(0.6 * swing + rng.normal(0, 0.04, n), 0, 1),
        gpu_mem=z.copy(),
        gpu_total=80 * GiB,
        proc_mem={"4242": 28 * GiB + rng.normal(0, 20e6, n)},
        sm_mhz=1980.0 + rng.normal(0, 5, n),
        power=400.0 * _noise(rng, n, 0.03),
        kv_usage=np.clip(0.45 + rng.normal(0, 0.03, n), 0, 1),
        host_busy=np.clip(0.35 + rng.normal(0, 0.03, n), 0, 1),
        iowait=np.clip(0.01 + rng.normal(0, 0.003, n), 0, 1),
        proc_cpu=1.2 * _noise(rng, n, 0.05),
        rss=2.0 * GiB + rng.normal(0, 5e6, n),
        fds=120.0 + rng.normal(0, 3, n).round(),
        conns=60.0 * swing + rng.normal(0, 4, n).round(),
        hit_ratio=np.clip(0.9 + rng.normal(0, 0.01, n), 0, 1),
        cache_error=z.copy(),
        disk_util=np.clip(0.15 + rng.normal(0, 0.03, n), 0, 1),
        disk_await=0.004 * _noise(rng, n, 0.1),
        retrans_ratio=np.clip(0.002 + rng.normal(0, 0.0005, n), 0, 1),
        drops=np.clip(rng.normal(0, 0.2, n), 0, None),
        mem_avail=0.55 + rng.normal(0, 0.005, n),
        swap_rate=z.copy(),
        psi_mem=np.clip(rng.normal(0.001, 0.0005, n), 0, None),
        in_progress=np.clip(5 * swing + rng.normal(0, 1, n), 0, None).round(),
        admitted=np.clip(5 * swing + rng.normal(0, 1, n), 0, None).round(),
        load_time=np.full(n, 4.0),
        ready=np.ones(n),
        redis_ok=np.ones(n),
        up=np.ones(n),
        scrape_s=0.005 * _noise(rng, n, 0.1),
        # its own generator: drawing from ``rng`` would shift every scenario's
        # later draws, and the corpus must stay what the benchmarks measured
        probe=0.004 * _noise(np.random.default_rng(n), n, 0.1),
    )


def _ramp(n: int, at: int, seconds: float) -> np.ndarray:
    """0 before ``at``, rising linearly to 1 over ``seconds``."""
    t = np.arange(n) - at
    return np.clip(t / max(seconds, 1.0), 0.0, 1.0)


Fault = Callable[[_State, int, np.random.Generator, list[Event]], None]


def _leak(s: _State, at: int, rng: np.random.Generator, ev: list[Event]) -> None:
    grow = np.clip(np.arange(s.n) - at, 0, None) * 9e6  # ~9 MB/s: 2 GB -> 12 GB in ~20 min
    s.proc_mem["4242"] = s.proc_mem["4242"] + grow
    s.rss = s.rss + grow * 0.02  # the misleading clue: RSS creeps a little too
    full = np.clip((28 * GiB + grow) / s.gpu_total - 0.85, 0, None) * 10
    s.lat_median *= 1 + full


def _oom(s: _State, at: int, rng: np.random.Generator, ev: list[Event]) -> None:
    on = np.arange(s.n) >= at
    bursts = on & (rng.random(s.n) < 0.6)
    s.counters["CUDA_OOM"] = np.where(bursts, 2.0 * _noise(rng, s.n, 0.2), 0.0)
    s.status["503"] = np.where(bursts, 0.04, 0.0)
    s.proc_mem["4242"] = np.where(bursts, s.proc_mem["4242"] + 45 * GiB, s.proc_mem["4242"])
    for i in np.flatnonzero(bursts)[::15][:20]:
        ev.append(
            Event(
                T0 + i,
                "log",
                "CUDA out of memory. Tried to allocate 20.00 GiB",
                {"error_code": "CUDA_OOM", "pid": "4242"},
            )
        )


def _xid(s: _State, at: int, rng: np.random.Generator, ev: list[Event]) -> None:
    r = _ramp(s.n, at, 5)
    s.xid_at = at
    s.gpu_util = s.gpu_util * (1 - r)
    s.counters["CUDA_ERROR"] = 3.0 * r
    s.status["500"] = s.status["500"] + 0.3 * r
    ev.append(
        Event(
            T0 + at,
            "kernel",
            "NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, GPU has fallen off the bus.",
            {"gpu": "0", "xid": "79"},
        )
    )


def _kv(s: _State, at: int, rng: np.random.Generator, ev: list[Event]) -> None:
    r = _ramp(s.n, at, 60)
    s.kv_usage = s.kv_usage + (0.97 - s.kv_usage) * r
    s.counters["preempt"] = 1.5 * r
    s.lat_median *= 1 + 0.6 * r
    s.gpu_util = s.gpu_util - 0.15 * r
    s.out_tokens *= 1 - 0.1 * r


def _cotenant(s: _State, at: int, rng: np.random.Generator, ev: list[Event]) -> None:
    on = np.arange(s.n) >= at
    s.proc_mem["5151"] = np.where(on, 40 * GiB + rng.normal(0, 50e6, s.n), np.nan)
    s.lat_median *= 1 + 0.3 * on
    s.gpu_util = np.clip(s.gpu_util + 0.15 * on, 0, 1)


def _contention(s: _State, at: int, rng: np.random.Generator, ev: list[Event]) -> None:
    r = _ramp(s.n, at, 10)
    s.gpu_util = s.gpu_util + (1.0 - s.gpu_util) * r
    s.sm_mhz = s.sm_mhz - 510 * r
    s.power = s.power + 290 * r
    s.wall_extra = s.wall_extra + 0.12 * r
    s.lat_median *= 1 + 0.5 * r


def _cold(s: _State, at: int, rng: np.random.Generator, ev: list[Event]) -> None:
    s.restart_at = at
    s.load_time = np.where(np.arange(s.n) >= at, 8.2, s.load_time)
    spike = np.exp(-np.clip(np.arange(s.n) - at, 0, None) / 20.0) * (np.arange(s.n) >= at)
    s.lat_median *= 1 + 20 * spike
    s.ready = np.where(spike > 0.6, 0.0, 1.0)
    s.gpu_util = s.gpu_util * (1 - 0.8 * spike)


def _flood(s: _State, at: int, rng: np.random.Generator, ev: list[Event]) -> None:
    r = _ramp(s.n, at, 20)
    s.conns = s.conns + 2050 * r
    s.fds = s.fds + 2050 * r
    s.status["503"] = 0.03 * r
    s.lat_median *= 1 + 0.4 * r


def _loop(s: _State, at: int, rng: np.random.Generator, ev: list[Event]) -> None:
    r = _ramp(s.n, at, 5)
    s.rps *= 1 - 0.45 * r
    s.lat_median *= 1 + 1.5 * r
    s.lat_sigma = s.lat_sigma + 0.4 * r
    s.gpu_util = s.gpu_util * (1 - 0.5 * r)
    s.ready = np.where((r > 0) & (rng.random(s.n) < 0.3), 0.0, s.ready)
    s.scrape_s = s.scrape_s * (1 + 100 * r)  # /metrics waits behind the blocking handler


def _pool(s: _State, at: int, rng: np.random.Generator, ev: list[Event]) -> None:
    r = _ramp(s.n, at, 20)
    s.pool_active = np.maximum(s.pool_active, np.where(r >= 1, s.pool_max, s.pool_active + r * 11))
    s.queue = s.queue + 60 * r
    s.queue_wait = s.queue_wait + 2.0 * r
    s.lat_median *= 1 + 3 * r
    s.gpu_util = s.gpu_util * (1 - 0.6 * r)


def _queue_idle(s: _State, at: int, rng: np.random.Generator, ev: list[Event]) -> None:
    r = _ramp(s.n, at, 30)
    s.queue = s.queue + 45 * r
    s.queue_wait = s.queue_wait + 3.0 * r
    s.gpu_util = s.gpu_util * (1 - 0.8 * r)
    s.lat_median *= 1 + 3 * r


def _limiter(s: _State, at: int, rng: np.random.Generator, ev: list[Event]) -> None:
    r = _ramp(s.n, at, 10)
    s.status["429"] = 0.25 * r
    s.gpu_util = s.gpu_util * (1 - 0.45 * r)
    s.status["504"] = 0.01 * r


def _no_abort(s: _State, at: int, rng: np.random.Generator, ev: list[Event]) -> None:
    r = _ramp(s.n, at, 30)
    s.status["504"] = 0.12 * r
    s.counters["TIMEOUT"] = 6.0 * r
    s.gpu_util = s.gpu_util + (0.97 - s.gpu_util) * r
    s.in_progress = s.in_progress + 40 * r
    # the orphans share the GPU with new work: every inference runs longer
    s.infer_median = s.infer_median * (1 + 2 * r)
    s.lat_median *= 1 + 2 * r


def _rss_leak(s: _State, at: int, rng: np.random.Generator, ev: list[Event]) -> None:
    grow = np.clip(np.arange(s.n) - at, 0, None) * 4e6
    s.rss = s.rss + grow
    s.mem_avail = s.mem_avail - grow / (128 * GiB)


def _stampede(s: _State, at: int, rng: np.random.Generator, ev: list[Event]) -> None:
    r = _ramp(s.n, at, 10)
    s.hit_ratio = s.hit_ratio - 0.6 * r
    s.proc_cpu = s.proc_cpu + 2.5 * r
    s.host_busy = s.host_busy + 0.15 * r
    s.gpu_util = s.gpu_util * (1 - 0.5 * r)
    s.lat_median *= 1 + 1.5 * r


def _cpu_bound(s: _State, at: int, rng: np.random.Generator, ev: list[Event]) -> None:
    r = _ramp(s.n, at, 30)
    s.proc_cpu = s.proc_cpu + 2.0 * r
    s.host_busy = s.host_busy + 0.12 * r
    s.gpu_util = s.gpu_util * (1 - 0.7 * r)
    s.lat_median *= 1 + 1.2 * r


def _cpu_burn(s: _State, at: int, rng: np.random.Generator, ev: list[Event]) -> None:
    r = _ramp(s.n, at, 10)
    s.host_busy = s.host_busy + (0.98 - s.host_busy) * r
    s.lat_median *= 1 + 0.5 * r


def _disk_sat(s: _State, at: int, rng: np.random.Generator, ev: list[Event]) -> None:
    r = _ramp(s.n, at, 10)
    s.disk_util = s.disk_util + (0.995 - s.disk_util) * r
    s.disk_await = s.disk_await * (1 + 15 * r)
    s.iowait = s.iowait + 0.15 * r
    s.lat_median *= 1 + 0.2 * r


def _disk_fail(s: _State, at: int, rng: np.random.Generator, ev: list[Event]) -> None:
    r = _ramp(s.n, at, 5)
    s.disk_await = s.disk_await + 0.8 * r
    s.disk_util = s.disk_util + 0.4 * r
    s.io_errors = np.where(r > 0, 0.2, 0.0)
    for k in range(at, s.n, 30):
        ev.append(
            Event(
                T0 + k,
                "kernel",
                "blk_update_request: I/O error, dev sda, sector 123",
                {"device": "sda"},
            )
        )


def _net_loss(s: _State, at: int, rng: np.random.Generator, ev: list[Event]) -> None:
    on = np.arange(s.n) >= at
    s.retrans_ratio = np.where(on, 0.08 * _noise(rng, s.n, 0.2), s.retrans_ratio)
    s.drops = s.drops + 30 * on
    s.lat_sigma = s.lat_sigma + 0.5 * on


def _net_latency(s: _State, at: int, rng: np.random.Generator, ev: list[Event]) -> None:
    # delay between callers and the service: only a probe on the callers' path
    # sees it; the service's own request times start when a request reaches it
    r = _ramp(s.n, at, 5)
    s.probe = s.probe + 0.3 * r * _noise(rng, s.n, 0.05)


def _host_oom(s: _State, at: int, rng: np.random.Generator, ev: list[Event]) -> None:
    s.mem_avail = s.mem_avail - 0.5 * _ramp(s.n, at - 120, 115)
    s.mem_avail = np.where(np.arange(s.n) >= at, 0.5, s.mem_avail)
    s.oom_kill_at = at
    s.restart_at = at + 2
    ev.append(
        Event(
            T0 + at,
            "kernel",
            "Out of memory: Killed process 4242 (python)",
            {"pid": "4242", "process": "python"},
        )
    )


def _swap(s: _State, at: int, rng: np.random.Generator, ev: list[Event]) -> None:
    r = _ramp(s.n, at, 30)
    s.swap_rate = 500 * r * _noise(rng, s.n, 0.2)
    s.mem_avail = s.mem_avail - 0.51 * r
    s.psi_mem = s.psi_mem + 0.2 * r
    s.lat_median *= 1 + 0.8 * r


def _redis(s: _State, at: int, rng: np.random.Generator, ev: list[Event]) -> None:
    on = (np.arange(s.n) >= at).astype(float)
    s.cache_error = on
    s.redis_ok = 1 - on
    s.counters["DEPENDENCY_DOWN"] = 5.0 * on
    s.status["503"] = 0.05 * on
    s.lat_median *= 1 + 0.5 * on


def _overlong(s: _State, at: int, rng: np.random.Generator, ev: list[Event]) -> None:
    on = (np.arange(s.n) >= at).astype(float)
    s.counters["INPUT_TOO_LARGE"] = 1.0 * on
    s.body_bytes = s.body_bytes * (1 + 30 * on * (rng.random(s.n) < 0.3))


def _malformed(s: _State, at: int, rng: np.random.Generator, ev: list[Event]) -> None:
    on = (np.arange(s.n) >= at).astype(float)
    s.counters["INPUT_CONTROL_CHARS"] = 2.0 * on
    s.status["422"] = 0.04 * on
    for k in range(at, s.n, 20):
        ev.append(
            Event(
                T0 + k,
                "log",
                "input rejected: control characters",
                {"error_code": "INPUT_CONTROL_CHARS", "client": "10.0.0.7"},
            )
        )


def _length_shift(s: _State, at: int, rng: np.random.Generator, ev: list[Event]) -> None:
    r = _ramp(s.n, at, 30)
    s.in_tokens = s.in_tokens * (1 + 2 * r)
    s.infer_median = s.infer_median * (1 + 0.8 * r)
    s.lat_median *= 1 + 0.5 * r


def _surge(s: _State, at: int, rng: np.random.Generator, ev: list[Event]) -> None:
    r = _ramp(s.n, at, 20)
    s.rps = s.rps * (1 + 1.2 * r)
    s.queue = s.queue + 25 * r
    s.lat_median *= 1 + 0.8 * r
    s.gpu_util = s.gpu_util + (0.93 - s.gpu_util) * r
    s.conns = s.conns * (1 + 1.1 * r)
    s.pool_active = np.clip(s.pool_active * (1 + 1.0 * r), 0, 15)
    s.proc_cpu = s.proc_cpu * (1 + 0.8 * r)
    s.in_progress = s.in_progress * (1 + 1.0 * r)
    s.admitted = s.admitted * (1 + 1.0 * r)


def _semantic(s: _State, at: int, rng: np.random.Generator, ev: list[Event]) -> None:
    r = _ramp(s.n, at, 20)
    s.out_tokens = s.out_tokens * (1 - 0.75 * r)
    s.infer_median = s.infer_median * (1 - 0.5 * r)


def _down(s: _State, at: int, rng: np.random.Generator, ev: list[Event]) -> None:
    s.up = np.where(np.arange(s.n) >= at, 0.0, 1.0)


#: Fault name -> fault model; the diagnosis signature id expected for it.
FAULTS: dict[str, tuple[Fault, str]] = {
    "gpu_memory_leak": (_leak, "gpu_memory_leak"),
    "gpu_oom": (_oom, "gpu_oom"),
    "gpu_xid": (_xid, "gpu_xid"),
    "kv_cache_pressure": (_kv, "kv_cache_pressure"),
    "gpu_cotenant": (_cotenant, "gpu_cotenant"),
    "gpu_contention": (_contention, "gpu_contention"),
    "cold_start": (_cold, "cold_start"),
    "connection_flood": (_flood, "connection_flood"),
    "event_loop_blocked": (_loop, "event_loop_blocked"),
    "worker_pool_saturated": (_pool, "worker_pool_saturated"),
    "queue_saturation_idle_gpu": (_queue_idle, "queue_saturation_idle_gpu"),
    "qps_limiter_misplaced": (_limiter, "qps_limiter_misplaced"),
    "timeouts_not_aborting": (_no_abort, "timeouts_not_aborting"),
    "process_memory_leak": (_rss_leak, "process_memory_leak"),
    "cache_stampede": (_stampede, "cache_stampede"),
    "cpu_bound_preprocessing": (_cpu_bound, "cpu_bound_preprocessing"),
    "cpu_burn": (_cpu_burn, "cpu_burn"),
    "disk_io_saturation": (_disk_sat, "disk_io_saturation"),
    "disk_failing": (_disk_fail, "disk_failing"),
    "network_loss": (_net_loss, "network_loss"),
    "network_latency": (_net_latency, "network_latency"),
    "host_oom_kill": (_host_oom, "host_oom_kill"),
    "swap_pressure": (_swap, "swap_pressure"),
    "redis_down": (_redis, "redis_down"),
    "overlong_inputs": (_overlong, "overlong_inputs"),
    "malformed_inputs": (_malformed, "malformed_inputs"),
    "input_length_shift": (_length_shift, "input_length_shift"),
    "traffic_surge": (_surge, "traffic_surge"),
    "semantic_degradation": (_semantic, "semantic_degradation"),
    "service_down": (_down, "service_down"),
}

#: Families a scenario may lose ("partial signals"): never the one a fault acts through.
_OPTIONAL = (
    "host_tcp_connections",
    "kv_cache_usage_ratio",
    "http_requests_in_flight",
    "host_pressure_stalled_seconds_total",
    "gpu_power_watts",
    "host_load1",
    "http_request_body_size_bytes",
    "model_preemptions_total",
)


def scenario(
    fault: str | None,
    *,
    seed: int = 0,
    duration: float = 1800.0,
    after: float = 180.0,
    distractor: bool = True,
    partial: bool = False,
) -> Scenario:
    """A SYNTHETIC window of ``duration`` s whose fault starts ``after`` s before its end."""
    rng = np.random.default_rng(seed)
    n = int(duration)
    state = _baseline(n, rng)
    events: list[Event] = []
    at = n - int(after)
    if fault is not None:
        if fault not in FAULTS:
            raise KeyError(f"unknown fault {fault!r}; known: {sorted(FAULTS)}")
        FAULTS[fault][0](state, at, rng, events)
    if distractor:
        _distract(state, rng, at)
    missing: tuple[str, ...] = ()
    if partial:
        needed = _needed(fault)
        pool = [m for m in _OPTIONAL if m not in needed]
        missing = tuple(rng.choice(pool, size=min(3, len(pool)), replace=False).tolist())
    name = f"{fault or 'healthy'}#{seed}{'-partial' if partial else ''}"
    return Scenario(name, fault, T0 + at, T0, T0 + n - 1, state, events, missing)


def _needed(fault: str | None) -> set[str]:
    return {
        "connection_flood": {"host_tcp_connections"},
        "kv_cache_pressure": {"kv_cache_usage_ratio", "model_preemptions_total"},
        "swap_pressure": {"host_pressure_stalled_seconds_total"},
        "overlong_inputs": {"http_request_body_size_bytes"},
        "event_loop_blocked": {"http_requests_in_flight"},
        "gpu_contention": {"gpu_power_watts"},
    }.get(fault or "", set())


def _distract(s: _State, rng: np.random.Generator, at: int) -> None:
    """A short unrelated blip well before the fault: a CPU spike or a retransmit burst."""
    where = int(rng.integers(300, max(301, at - 400)))
    width = int(rng.integers(20, 60))
    sl = slice(where, where + width)
    if rng.random() < 0.5:
        s.host_busy[sl] = np.clip(s.host_busy[sl] + 0.3, 0, 1)
    else:
        s.retrans_ratio[sl] = s.retrans_ratio[sl] * 5


def healthy(*, seed: int = 0, duration: float = 1800.0) -> Scenario:
    """30 minutes of fault-free traffic with normal variation (and a distractor blip)."""
    return scenario(None, seed=seed, duration=duration, after=0.0)


# --- from state to samples ------------------------------------------------------------


def _lognorm_cdf(x: float, median: np.ndarray, sigma: np.ndarray) -> np.ndarray:
    if x <= 0:
        return np.zeros_like(median)
    z = (math.log(x) - np.log(np.maximum(median, 1e-12))) / (sigma * math.sqrt(2.0))
    return 0.5 * (1.0 + _erf(z))


def _erf(z: np.ndarray) -> np.ndarray:
    # Abramowitz-Stegun 7.1.26; vectorised, good to 1e-7
    sign = np.sign(z)
    a = np.abs(z)
    t = 1.0 / (1.0 + 0.3275911 * a)
    y = 1.0 - (
        ((((1.061405429 * t - 1.453152027) * t) + 1.421413741) * t - 0.284496736) * t + 0.254829592
    ) * t * np.exp(-a * a)
    return np.asarray(sign * y, dtype=np.float64)


def _hist(
    name: str,
    labels: dict[str, str],
    per_s: np.ndarray,
    median: np.ndarray,
    sigma: np.ndarray | float,
    buckets: tuple[float, ...],
    shift: np.ndarray | None = None,
    active: np.ndarray | None = None,
) -> Iterator[tuple[str, dict[str, str], np.ndarray]]:
    sig = np.broadcast_to(np.asarray(sigma, dtype=float), per_s.shape)
    count = np.cumsum(per_s)
    for le in buckets:
        x = le - (shift if shift is not None else 0.0)
        frac = (
            np.where(x > 0, _lognorm_cdf(1.0, median / np.maximum(x, 1e-12), sig), 0.0)
            if shift is not None
            else _lognorm_cdf(le, median, sig)
        )
        yield f"{name}_bucket", {**labels, "le": _le(le)}, np.cumsum(per_s * frac)
    yield f"{name}_bucket", {**labels, "le": "+Inf"}, count
    mean = median * np.exp(sig**2 / 2) + (shift if shift is not None else 0.0)
    yield f"{name}_count", labels, count
    yield f"{name}_sum", labels, np.cumsum(per_s * mean)


def _le(v: float) -> str:
    return repr(float(v))


def _series(sc: Scenario) -> Iterator[tuple[str, dict[str, str], np.ndarray]]:
    s = sc.state
    n = s.n
    route = {"method": "POST", "route": "/v1/generate"}
    other = 1.0 - sum(s.status.values())
    shares = {"200": other, **s.status}
    klass = {"200": "2xx", "429": "4xx", "422": "4xx", "500": "5xx", "503": "5xx", "504": "5xx"}
    for code, share in shares.items():
        per_s = s.rps * np.clip(share, 0, 1)
        if code != "200" and not (per_s > 0).any():
            continue
        labels = {**route, "status_class": klass[code], "status": code}
        yield from _hist(
            "http_request_duration_seconds",
            labels,
            per_s,
            s.lat_median,
            s.lat_sigma,
            LATENCY_BUCKETS,
            shift=s.lat_add,
        )
    yield "http_requests_in_flight", route, s.rps * (s.lat_median * 1.1 + s.lat_add)
    yield from _hist("http_request_body_size_bytes", route, s.rps, s.body_bytes, 0.5, SIZE_BUCKETS)
    yield "queue_length", {"queue": "inference"}, s.queue
    yield from _hist(
        "queue_wait_seconds", {"queue": "inference"}, s.rps, s.queue_wait, 0.5, LATENCY_BUCKETS
    )
    yield "worker_pool_active_workers", {"pool": "inference"}, s.pool_active
    yield "worker_pool_max_workers", {"pool": "inference"}, np.full(n, s.pool_max)
    m = {"model": "demo", "model_version": "1", "device": "cuda:0"}
    yield from _hist("model_inference_time_seconds", m, s.rps, s.infer_median, 0.3, LATENCY_BUCKETS)
    yield from _hist(
        "model_inference_wall_time_seconds",
        m,
        s.rps,
        s.infer_median + s.wall_extra,
        0.3,
        LATENCY_BUCKETS,
    )
    yield from _hist(
        "model_input_tokens", {"model": "demo"}, s.rps, s.in_tokens, 0.5, TOKEN_BUCKETS
    )
    yield from _hist(
        "model_output_tokens", {"model": "demo"}, s.rps, s.out_tokens, 0.4, TOKEN_BUCKETS
    )
    yield "model_inferences_in_progress", {"model": "demo"}, s.in_progress
    yield "admission_in_flight", {}, s.admitted
    yield "model_aborts_total", {"model": "demo", "reason": "deadline"}, np.zeros(n)
    yield "model_load_time_seconds", {"model": "demo", "model_version": "1"}, s.load_time
    if s.loads is not None:
        for mode, count in zip(("cold", "warm"), s.loads, strict=True):
            labels = {"model": "demo", "model_version": "1", "mode": mode}
            yield "model_loads_total", labels, count
    yield "kv_cache_usage_ratio", {"model": "demo"}, s.kv_usage
    yield (
        "model_preemptions_total",
        {"model": "demo"},
        np.cumsum(s.counters.get("preempt", np.zeros(n))),
    )
    for code in ("CUDA_OOM", "CUDA_ERROR"):
        yield (
            "model_inference_errors_total",
            {"model": "demo", "error_code": code},
            np.cumsum(s.counters.get(code, np.zeros(n))),
        )
    for code in ("TIMEOUT", "DEPENDENCY_DOWN", "CUDA_OOM"):
        yield "errors_total", {"error_code": code}, np.cumsum(s.counters.get(code, np.zeros(n)))
    for reason in ("INPUT_TOO_LARGE", "INPUT_CONTROL_CHARS"):
        yield (
            "input_rejections_total",
            {"route": "/v1/generate", "reason": reason},
            np.cumsum(s.counters.get(reason, np.zeros(n))),
        )
    cache_total = s.rps * 0.8
    for result, share in (
        ("hit", s.hit_ratio * (1 - s.cache_error)),
        ("miss", (1 - s.hit_ratio) * (1 - s.cache_error)),
        ("error", s.cache_error),
    ):
        yield (
            "cache_requests_total",
            {"cache": "redis", "result": result},
            np.cumsum(cache_total * share),
        )
    yield "health_check_up", {"check": "model"}, s.ready
    yield "health_check_up", {"check": "redis"}, s.redis_ok
    yield "service_ready", {}, s.ready * s.redis_ok
    yield from _gpu(s)
    yield from _host(s)
    pid = {"pid": "4242", "process": "python"}
    yield "service_process_resident_memory_bytes", pid, s.rss
    yield "service_process_open_fds", pid, s.fds
    yield "service_process_max_fds", pid, np.full(n, 65536.0)
    yield "service_process_cpu_seconds_total", pid, np.cumsum(s.proc_cpu)


def _gpu(s: _State) -> Iterator[tuple[str, dict[str, str], np.ndarray]]:
    g = {"gpu": "0", "backend": "sim"}
    procs = sum(np.nan_to_num(v) for v in s.proc_mem.values())
    used = np.minimum(procs + 1.5 * GiB + s.gpu_mem, s.gpu_total)
    yield "gpu_memory_used_bytes", g, used
    yield "gpu_memory_total_bytes", g, np.full(s.n, s.gpu_total)
    yield "gpu_utilization_ratio", g, np.clip(s.gpu_util, 0, 1)
    yield "gpu_sm_clock_hertz", g, s.sm_mhz * 1e6
    yield "gpu_power_watts", g, s.power
    for pid, mem in s.proc_mem.items():
        yield (
            "gpu_process_memory_used_bytes",
            {**g, "pid": pid, "process": "python" if pid == "4242" else "batch_job"},
            mem,
        )
    if s.xid_at is not None:
        x = np.where(np.arange(s.n) >= s.xid_at, 1.0, 0.0)
        x[: s.xid_at] = np.nan  # the counter appears with the first Xid, as collectors do
        yield "gpu_xid_errors_total", {**g, "xid": "79", "meaning": "fallen off the bus"}, x


def _host(s: _State) -> Iterator[tuple[str, dict[str, str], np.ndarray]]:
    cpus = 16.0
    busy = np.clip(s.host_busy, 0, 1)
    io = np.clip(s.iowait, 0, 1)
    yield "host_cpu_seconds_total", {"mode": "idle"}, np.cumsum(cpus * np.clip(1 - busy - io, 0, 1))
    yield "host_cpu_seconds_total", {"mode": "user"}, np.cumsum(cpus * busy * 0.8)
    yield "host_cpu_seconds_total", {"mode": "system"}, np.cumsum(cpus * busy * 0.2)
    yield "host_cpu_seconds_total", {"mode": "iowait"}, np.cumsum(cpus * io)
    yield "host_cpu_count", {}, np.full(s.n, cpus)
    yield "host_load1", {}, cpus * (busy + io) * 1.1
    total = 128 * GiB
    yield "host_memory_total_bytes", {}, np.full(s.n, total)
    yield "host_memory_available_bytes", {}, np.clip(s.mem_avail, 0.01, 1) * total
    yield "host_swap_in_pages_total", {}, np.cumsum(s.swap_rate / 2)
    yield "host_swap_out_pages_total", {}, np.cumsum(s.swap_rate / 2)
    yield (
        "host_pressure_stalled_seconds_total",
        {"resource": "memory", "kind": "some"},
        np.cumsum(s.psi_mem),
    )
    oom = np.zeros(s.n)
    if s.oom_kill_at is not None:
        oom[s.oom_kill_at :] = 1.0
    yield "host_oom_kills_total", {}, oom
    d = {"device": "sda"}
    ops = 200.0
    yield "host_disk_io_time_seconds_total", d, np.cumsum(np.clip(s.disk_util, 0, 1))
    yield "host_disk_reads_completed_total", d, np.cumsum(np.full(s.n, ops / 2))
    yield "host_disk_writes_completed_total", d, np.cumsum(np.full(s.n, ops / 2))
    yield "host_disk_read_time_seconds_total", d, np.cumsum(ops / 2 * s.disk_await)
    yield "host_disk_write_time_seconds_total", d, np.cumsum(ops / 2 * s.disk_await)
    yield (
        "kernel_io_errors_total",
        d,
        np.cumsum(s.io_errors if s.io_errors is not None else np.zeros(s.n)),
    )
    seg = 5000.0 * s.rps / 50.0
    yield "host_tcp_out_segments_total", {}, np.cumsum(seg)
    yield "host_tcp_retransmitted_segments_total", {}, np.cumsum(seg * s.retrans_ratio)
    yield "host_network_receive_drops_total", {"interface": "eth0"}, np.cumsum(s.drops)
    yield "host_network_transmit_drops_total", {"interface": "eth0"}, np.zeros(s.n)
    yield "host_tcp_connections", {"port": "8000", "state": "established"}, np.round(s.conns)
    yield "probe_duration_seconds", {"target": "client"}, s.probe
    yield "probe_success", {"target": "client"}, np.ones(s.n)


_SERVICE_PREFIXES = (
    "http_",
    "queue_",
    "worker_pool_",
    "model_",
    "input_",
    "admission_",
    "errors_",
    "cache_",
    "health_",
    "service_",
    "kv_cache_",
)


def samples(sc: Scenario) -> Iterator[tuple[str, dict[str, str], np.ndarray, np.ndarray]]:
    """(name, labels, timestamps, values) per series, restarts, gaps and outages applied."""
    s = sc.state
    ts = sc.start + np.arange(s.n, dtype=np.float64)
    for name, labels, values in _series(sc):
        if any(name.startswith(m) for m in sc.missing):
            continue
        v = np.asarray(values, dtype=np.float64)
        service = name.startswith(_SERVICE_PREFIXES)
        if (
            s.restart_at is not None
            and service
            and name.endswith(("_total", "_bucket", "_count", "_sum"))
        ):
            v = v.copy()
            v[s.restart_at :] -= v[s.restart_at]  # the restarted process counts from zero
        keep = np.isfinite(v)
        if service and (s.up < 1).any():
            keep &= s.up >= 1  # a dead target exposes nothing
        yield name, labels, ts[keep], v[keep]
    job = {"job": "demo", "instance": "127.0.0.1:8000"}
    yield "up", job, ts, s.up
    yield "aivitals_scrape_duration_seconds", job, ts[s.up >= 1], s.scrape_s[s.up >= 1]


def to_store(
    sc: Scenario, store: object | None = None, *, extra_labels: dict[str, str] | None = None
) -> object:
    """Load a scenario into an embedded ``Store`` (a new one unless given).

    ``extra_labels`` (e.g. ``{"instance": "node7"}``) lets several scenarios share a
    store as replicas of one service.
    """
    from aivitals.tsdb import Store

    st = store if store is not None else Store(retention=max(7200.0, sc.end - sc.start + 600))
    assert isinstance(st, Store)
    extra = extra_labels or {}
    for name, labels, ts, vals in samples(sc):
        full = {**labels, **extra}
        for t, v in zip(ts.tolist(), vals.tolist(), strict=True):
            st.append(name, full, v, t)
    return st


def to_openmetrics(sc: Scenario) -> str:
    """The scenario as OpenMetrics text with timestamps (``promtool tsdb create-blocks-from``)."""
    by_name: dict[str, list[str]] = {}
    for name, labels, ts, vals in samples(sc):
        lab = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        head = f"{name}{{{lab}}}" if lab else name
        by_name.setdefault(name, []).extend(
            f"{head} {v!r} {t:.3f}" for t, v in zip(ts.tolist(), vals.tolist(), strict=True)
        )
    lines: list[str] = []
    for name in sorted(by_name):  # OpenMetrics wants each family's samples together
        lines.append(f"# TYPE {name} {_family_type(name)}")
        lines += by_name[name]
    lines.append("# EOF")
    return "\n".join(lines) + "\n"


def _family_type(name: str) -> str:
    # counters and histogram parts go in as "unknown" so each sample name is its own
    # family; Prometheus stores them the same way.
    return "unknown" if name.endswith(("_bucket", "_count", "_sum", "_total")) else "gauge"


# --- the real H200 recording --------------------------------------------------------


LATENCY_SCALE = 100.0


def h200_scenarios(csv_path: str | Path, *, stretch: float = 6.0, seed: int = 0) -> list[Scenario]:
    """Scenarios built from the REAL H200 recording: leak, cotenant, contention, oom.

    Each 0.5 s row of a fault phase becomes ``stretch`` seconds; the baseline
    before it is the recording's own ``normal`` rows, tiled. GPU memory,
    utilization, power, clocks, per-process memory and OOM counts are the
    recorded values; latencies are scaled by ``LATENCY_SCALE`` (see below).
    """
    with Path(csv_path).open() as fh:
        rows = list(csv.DictReader(fh))
    # rows with no request are the recorder pausing between phases: gaps, not zeros
    rows = [r for r in rows if _f(r["requests"]) > 0 and r["lat_p50_ms"]]
    normal = [r for r in rows if r["phase"] == "normal"][2:]
    out = []
    for phase, fault in (
        ("leak", "gpu_memory_leak"),
        ("cotenant", "gpu_cotenant"),
        ("contention", "gpu_contention"),
        ("oom", "gpu_oom"),
    ):
        fault_rows = [r for r in rows if r["phase"] == phase]
        out.append(_h200_scenario(normal, fault_rows, fault, stretch, seed))
    return out


def _h200_scenario(
    normal: list[dict[str, str]],
    fault_rows: list[dict[str, str]],
    fault: str,
    stretch: float,
    seed: int,
) -> Scenario:
    rng = np.random.default_rng(seed)
    fault_len = int(len(fault_rows) * stretch)
    n = 1800
    at = n - fault_len
    base_idx = [i % len(normal) for i in range(math.ceil(at / stretch) + 1)]
    seq = [normal[i] for i in base_idx]
    rows = [seq[int(i / stretch)] for i in range(at)]
    rows += [fault_rows[min(int(i / stretch), len(fault_rows) - 1)] for i in range(fault_len)]
    col = {k: np.array([_f(r[k]) for r in rows]) for k in rows[0] if k != "phase"}
    s = _baseline(n, rng)
    s.gpu_total = float(col["mem_total"][0])
    s.gpu_util = col["util_gpu"] / 100.0
    s.power = col["power_w"]
    s.sm_mhz = col["sm_mhz"]
    s.proc_mem = {"4242": col["server_proc_mem"]}
    other = col["other_procs_mem"]
    if (other > 0).any():
        s.proc_mem["5151"] = np.where(np.cumsum(other > 0) > 0, other, np.nan)
    s.gpu_mem = col["mem_used"] - col["server_proc_mem"] - np.nan_to_num(other) - 1.5 * GiB
    s.rps = col["requests"] * 2.0
    # The recording's "inference" is one ~1 ms matmul; a service call is ~100 of them.
    # Scaling times by LATENCY_SCALE keeps every ratio and lets the catalogue's
    # buckets (smallest 5 ms) resolve the changes.
    p50 = col["lat_p50_ms"] * LATENCY_SCALE / 1000.0
    p99 = col["lat_p99_ms"] * LATENCY_SCALE / 1000.0
    s.lat_median = p50
    s.lat_sigma = np.clip(np.log(np.maximum(p99, p50 * 1.01) / p50) / 2.326, 0.05, 2.0)
    s.infer_median = col["gpu_p50_ms"] * LATENCY_SCALE / 1000.0
    s.wall_extra = np.maximum(p50 - s.infer_median, 0.0)
    s.counters["CUDA_OOM"] = col["oom_errors"] * 2.0
    s.status["503"] = np.where(
        col["requests"] > 0,
        col["oom_errors"] / np.maximum(col["requests"] + col["oom_errors"], 1),
        0.0,
    )
    name = f"h200-real:{fault}"
    return Scenario(name, fault, T0 + at, T0, T0 + n - 1, s, [], (), "h200-recording")


def _f(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return math.nan
