"""The severity sweep: every graded fault at threshold, moderate and severe, every other
fault once, and whether a run reached the magnitude it asked for.

*threshold* is the magnitude at which the knowledge's bound for the fault's defining
signal is just crossed, and *moderate* twice that magnitude; where twice does not fit
under what the system can take (a share of the device, of the fd limit), moderate is
halfway from the threshold to that limit. *severe* is today's scenario
(``Scenario.quick_params`` or ``Scenario.params``, merged onto the fault's defaults),
except where the knob sets it: at the limit where moderate is capped, and at twice
moderate where today's asks less than moderate; so severe >= moderate >= threshold for
every graded fault.
No value here is tuned to make a case pass: each is computed below from a bound of
the rule pack (``PackParams`` defaults, with validate's demo SLA), of a diagnosis
signature (``load_signatures()``), or of DOMAIN.md, and from what validate's run is
made of (``LoadPlan``'s request rates, the demo's sim GPU, the stack's fd limit).
Where the rule pack and the signature disagree, the lower bound is the threshold
(the first point where the knowledge calls it a fault): the issue's own examples are
a GPU leak of 2e6 bytes/s (the signature), P99 over twice the SLA, 5 % packet loss and
100 ms of added latency (the signature's 0.2 s probe round trip).

A fault whose parameter does not change its signal's size (an Xid happens or not)
has one magnitude, and so does a fault the knowledge base has no threshold for: the
sweep runs it once, at today's values, as ``fault@single`` (``SINGLE``), never three
times under three names.

``reached`` measures, after the fault phase, the magnitude the fault achieved from
the agent's store and compares it with the one asked. ``summarize_sweep`` turns a
sweep's JSON report into the benchmark's numbers, counting every case run: one that
did not reach its magnitude is *not reached* and one whose alerts were not tested is
*diagnosis only*, neither of them caught.
"""

from __future__ import annotations

import math
import os
import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from ..errors import ConfigError
from ._report import Check
from ._target import ValidateTarget

__all__ = [
    "NOMINAL_EMBEDDINGS_RPS",
    "OUTCOMES",
    "SEVERITIES",
    "SINGLE",
    "TOLERANCE",
    "Knob",
    "beyond_reach",
    "knob",
    "magnitude",
    "reached",
    "severities",
    "severity_params",
    "severity_table",
    "summarize_sweep",
    "surge_factor",
    "surge_load",
]

#: the severities of a graded fault, weakest first
SEVERITIES = ("threshold", "moderate", "severe")
#: the one severity of a fault without a graded parameter: today's values, run once
SINGLE = "single"

#: A graded fault reached its severity when the measured magnitude is at least this
#: close to the one asked: validate's load is a few Poisson requests a second, so a
#: rate measured over a 10-60 s fault phase carries noise of about this size.
TOLERANCE = 0.1

_MIB = float(1 << 20)


# -- what the derivations stand on -------------------------------------------------------
def _request_rate() -> float:
    """Validate's own requests per second: every one calls the service's per-request
    fault hooks (the leaks) and counts in the job's HTTP rates."""
    from ._load import LoadPlan

    plan = LoadPlan()
    return plan.completions_rate + plan.embeddings_rate


@cache
def _pack() -> Any:
    """The rule pack's bounds as validate runs it (the demo's SLA, the pack's defaults)."""
    from ..alerts import PackParams
    from ._runner import _demo_rule_params

    return PackParams(**_demo_rule_params())


@cache
def _signature_param(signature: str, key: str) -> float:
    from ..diagnose import load_signatures

    for sig in load_signatures():
        if sig.id == signature:
            return float(sig.params[key])
    raise ConfigError(f"the diagnosis has no signature {signature!r}")


#: The demo model's inference time on validate's completions (12 tokens, CPU), nominal:
#: ~0.1 s, the figure the SLA ratio was set from (``SLA_PER_MEDIAN``). A run measures the
#: model and sets its SLA to that ratio times the median it measured, so the contention
#: factor that reaches 2 x SLA (x5, x10) is the same on any machine; the seconds this
#: module states for it are at the nominal speed (the run's report has the measured one).
DEMO_INFERENCE_S = 0.1

#: Of the malformed-input fault's five bodies (``MALFORMED_BODIES``), two are refused
#: for the same reason, control characters (one as JSON escapes, one raw); the others
#: as invalid UTF-8, broken JSON or full-width text. InputRejectionsHigh is per reason.
MALFORMED_TOP_REASON_SHARE = 2 / 5


def _up(x: float, step: float) -> float:
    """``x`` rounded up to the parameter's step (the fault asks at least the bound)."""
    return round(math.ceil(x / step - 1e-9) * step, 6)


def _down(x: float, step: float) -> float:
    return round(math.floor(x / step + 1e-9) * step, 6)


def _capped(threshold: float, twice: float, limit: float, step: float) -> float:
    """Moderate's value: ``twice`` the threshold's magnitude, or where that passes the
    ``limit``, halfway from the threshold to it (the limit itself is severe's)."""
    if twice <= limit:
        return _up(twice, step)
    return _up((threshold + limit) / 2, step)


# -- the table ---------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Knob:
    """How one fault is swept.

    ``param`` is the parameter the severities change (None: the fault has one
    magnitude and runs once, as ``SINGLE``); ``threshold`` and ``moderate`` the values
    they set (the other parameters stay today's); ``severe`` the values severe sets
    instead of today's (the limit of a capped knob, or twice moderate where today's
    ask less; empty: today's); ``unit`` and ``bound`` the
    magnitude in the measured signal's terms and the knowledge's bound on it;
    ``source`` where that bound comes from; ``note`` a cap or a caveat.
    """

    fault: str
    param: str | None
    unit: str
    bound: float | None
    source: str
    threshold: Mapping[str, float]
    moderate: Mapping[str, float]
    note: str = ""
    severe: Mapping[str, float] = field(default_factory=dict)


def _loop_outside(seconds: float, rate: float) -> float:
    """Mean time a request spends outside the model when each of ``rate`` Poisson
    requests a second holds the event loop ``seconds``: the sleep plus the M/D/1 wait
    for the loop (infinite once the loop is busier than it can be)."""
    rho = rate * seconds
    if rho >= 1:
        return math.inf
    return seconds + rho * seconds / (2 * (1 - rho))


def _loop_seconds(outside: float, rate: float) -> float:
    """The sleep per request whose mean time outside the model is ``outside`` (the
    inverse of ``_loop_outside``: a root of rate*s^2 - 2(1+T*rate)s + 2T = 0)."""
    a = 1 + outside * rate
    return (a - math.sqrt(a * a - 2 * rate * outside)) / rate


def _stampede_drop(interval: float, embeddings_rate: float, pool: int) -> float:
    """Drop of the embeddings cache's hit ratio (share of its warm level) when every
    key is flushed each ``interval`` s: validate cycles ``pool`` inputs, so after each
    flush the next min(pool, rate*interval) lookups miss."""
    lookups = embeddings_rate * interval
    return min(1.0, pool / lookups) if lookups > 0 else 1.0


#: The demo's embeddings throughput with its two workers busy, nominal: a sweep measures
#: its own at the start (``calibrate_capacity``); quick sweeps on a shared 2-core machine
#: serve 41-47 fresh inputs a second saturated.
NOMINAL_EMBEDDINGS_RPS = 40.0


def _pool(capacity: Mapping[str, Any] | None) -> tuple[int, float, float]:
    """The worker pool: workers, and seconds of one worker per fresh embeddings input
    and per validate completion (``capacity`` as ``calibrate_capacity`` measured it;
    None: the nominal figures)."""
    from ..demo import StackConfig

    cap = capacity or {}
    workers = int(cap.get("workers") or StackConfig().workers)
    per_embedding = workers / float(cap.get("embeddings_rps") or NOMINAL_EMBEDDINGS_RPS)
    per_completion = float(cap.get("completion_s") or DEMO_INFERENCE_S)
    return workers, per_embedding, per_completion


def surge_load(factor: float, capacity: Mapping[str, Any] | None) -> float:
    """The load a surge of ``factor`` offers the worker pool, as a multiple of its
    capacity: validate's completions and the surge's fresh embeddings (validate's own
    embeddings are cache hits and cost the pool nothing)."""
    from ._load import LoadPlan

    workers, per_embedding, per_completion = _pool(capacity)
    work = LoadPlan().completions_rate * per_completion + factor * _base_rate() * per_embedding
    return work / workers


def surge_factor(load: float, capacity: Mapping[str, Any] | None) -> float:
    """The surge factor that offers ``load`` (x capacity), rounded up to the fault's
    0.1 step, at least its smallest (the inverse of ``surge_load``)."""
    from ._load import LoadPlan

    workers, per_embedding, per_completion = _pool(capacity)
    room = load * workers - LoadPlan().completions_rate * per_completion
    factor = room / (_base_rate() * per_embedding)
    return max(_fault_minimum("traffic_surge", "factor"), _up(factor, 0.1))


def _base_rate() -> float:
    from ..chaos import FaultContext

    # validate gives its fault context no base_rate: the context's default
    return FaultContext().base_rate


def _cpus() -> int:
    return os.cpu_count() or 1


@cache
def _knobs() -> dict[str, Knob]:
    from ..demo import DemoConfig, StackConfig
    from ._load import LoadPlan

    pack, rate, plan = _pack(), _request_rate(), LoadPlan()
    demo, stack = DemoConfig(), StackConfig()
    out: list[Knob] = []

    # GPU leak: the signature's steady growth (deriv) of one process's GPU memory.
    # mib_per_request = bytes/s / (MiB x requests/s). The pack's GPUProcessMemoryGrowth
    # asks 1 GiB over leak_window (30 m; 10 s in quick runs), far more than this.
    leak = _signature_param("gpu_memory_leak", "growth_bytes_per_s")
    out.append(
        Knob(
            "gpu_memory_leak",
            "mib_per_request",
            "bytes/s of GPU memory growth",
            leak,
            "signature gpu_memory_leak growth_bytes_per_s (the issue's 2e6 B/s); "
            f"{rate:g} requests/s",
            {"mib_per_request": _up(leak / (_MIB * rate), 0.01)},
            {"mib_per_request": _up(2 * leak / (_MIB * rate), 0.01)},
            "GPUProcessMemoryGrowth asks 1 GiB over leak_window: ~107 MB/s in quick runs",
        )
    )
    # Process leak: the signature's RSS growth, converted the same way.
    rss = _signature_param("process_memory_leak", "growth_bytes_per_s")
    out.append(
        Knob(
            "process_memory_leak",
            "mib_per_request",
            "bytes/s of RSS growth",
            rss,
            f"signature process_memory_leak growth_bytes_per_s; {rate:g} requests/s",
            {"mib_per_request": _up(rss / (_MIB * rate), 0.01)},
            {"mib_per_request": _up(2 * rss / (_MIB * rate), 0.01)},
            "ProcessMemoryGrowth predicts 4 h ahead against 90 % of host memory: its rate "
            "bound depends on the host",
        )
    )
    # Co-tenant: GPUMemoryHigh (device > gpu_memory_ratio) with the service's weights
    # on the device; the co-tenant's share is what is left to the bound.
    weights = demo.sim_weights_bytes / demo.sim_gpu_memory_total
    need = pack.gpu_memory_ratio - weights
    free = 1.0 - weights
    # twice the share does not fit beside the weights (the sim refuses the whole
    # allocation): the most that fits, a step below the free share for the KV
    # reservations of requests in flight, is severe, and moderate lies halfway to it
    most = _down(free - 0.01, 0.01)
    out.append(
        Knob(
            "gpu_cotenant",
            "share",
            "share of the device taken by the co-tenant",
            need,
            f"GPUMemoryHigh gpu_memory_ratio {pack.gpu_memory_ratio:g} minus the demo's "
            f"weights ({weights:.3f} of the sim device)",
            {"share": _up(need, 0.01)},
            {"share": _capped(_up(need, 0.01), 2 * need, most, 0.01)},
            f"capped: 2 x {need:.3f} does not fit in the {free:.3f} left free; severe is "
            f"the most that fits ({most:g}), moderate halfway to it",
            severe={"share": most},
        )
    )
    # Contention: InferenceLatencyHigh, P99 over 2 x SLA; the slowdown multiplies the
    # demo model's ~0.1 s.
    p99 = 2 * pack.sla_seconds
    out.append(
        Knob(
            "gpu_contention",
            "factor",
            "s of inference P99",
            p99,
            f"InferenceLatencyHigh: 2 x the demo SLA {pack.sla_seconds:g} s; the model "
            f"answers in ~{DEMO_INFERENCE_S:g} s",
            {"factor": _up(p99 / DEMO_INFERENCE_S, 0.1)},
            {"factor": _up(2 * p99 / DEMO_INFERENCE_S, 0.1)},
            "the scenario's factor asks less than moderate: severe is twice moderate",
            severe={"factor": _up(4 * p99 / DEMO_INFERENCE_S, 0.1)},
        )
    )
    # Blocked loop: LatencyHighWorkersIdle, mean time outside the model over
    # outside_model_seconds; the sleep per request that makes it (M/D/1 wait).
    outside = pack.outside_model_seconds
    out.append(
        Knob(
            "event_loop_blocked",
            "seconds",
            "s outside the model per request (mean)",
            outside,
            f"LatencyHighWorkersIdle outside_model_seconds {outside:g}; {rate:g} Poisson "
            "requests/s on one loop (M/D/1)",
            {"seconds": _up(_loop_seconds(outside, rate), 0.001)},
            {"seconds": _up(_loop_seconds(2 * outside, rate), 0.001)},
            "near the loop's saturation: doubling the time outside takes a 15 % longer "
            "sleep; today's 0.3 s overloads the loop",
        )
    )
    # Binary: all workers stuck or not.
    need_workers = math.ceil(pack.worker_saturation_ratio * stack.workers)
    out.append(
        Knob(
            "worker_pool_saturated",
            None,
            "busy share of the pool",
            pack.worker_saturation_ratio,
            f"WorkerPoolSaturated {pack.worker_saturation_ratio:g} of {stack.workers} "
            f"workers needs {need_workers}: every worker (the fault's default)",
            {},
            {},
            "one magnitude: fewer stuck workers stay under the bound",
        )
    )
    # Connections: FdsNearLimit, open fds over fd_ratio of the service's limit.
    limit = float(stack.service_max_fds or 0) or 2200.0
    out.append(
        Knob(
            "connection_flood",
            "connections",
            "share of the service's fd limit",
            pack.fd_ratio,
            f"FdsNearLimit fd_ratio {pack.fd_ratio:g} of the stack's {limit:g} fds",
            {"connections": _up(pack.fd_ratio * limit, 1)},
            {
                "connections": _capped(
                    _up(pack.fd_ratio * limit, 1), 2 * pack.fd_ratio * limit, limit, 1
                )
            },
            "capped: a share of the fd limit cannot pass 1, so severe is the limit and "
            "moderate halfway to it; the service's own fds come on top",
            severe={"connections": limit},
        )
    )
    # Inputs: InputRejectionsHigh, refused share of all requests per reason.
    share = pack.input_rejection_ratio

    def rejections(fault: str, per_reason: float, why: str) -> Knob:
        # per_reason * r / (r + rate) = share  ->  r = share * rate / (per_reason - share)
        return Knob(
            fault,
            "rate",
            "share of requests refused (one reason)",
            share,
            f"InputRejectionsHigh input_rejection_ratio {share:g}; {rate:g} other "
            f"requests/s; {why}",
            {"rate": _up(share * rate / (per_reason - share), 0.01)},
            {"rate": _up(2 * share * rate / (per_reason - 2 * share), 0.01)},
        )

    out.append(rejections("overlong_inputs", 1.0, "every request refused as too large"))
    out.append(
        rejections(
            "malformed_inputs",
            MALFORMED_TOP_REASON_SHARE,
            f"{MALFORMED_TOP_REASON_SHARE:g} of them for the same reason",
        )
    )
    # Stampede: CacheHitRatioDrop, the hit ratio under (1 - cache_hit_drop) of its best.
    drop = pack.cache_hit_drop
    pool, emb = plan.embeddings_pool, plan.embeddings_rate
    out.append(
        Knob(
            "cache_stampede",
            "interval",
            "drop of the hit ratio (share of its warm level)",
            drop,
            f"CacheHitRatioDrop cache_hit_drop {drop:g}; validate cycles {pool} "
            f"embeddings inputs at {emb:g}/s",
            # drop = pool / (emb * interval): the longest interval that still drops
            {"interval": _down(pool / (emb * drop), 0.5)},
            {"interval": _down(pool / (emb * min(1.0, 2 * drop)), 0.5)},
            "moderate: a drop of 100 % (every lookup between flushes misses)",
        )
    )
    # CPU: HostCPUSaturated, busy share over cpu_busy_ratio; demand = workers x load.
    busy = pack.cpu_busy_ratio
    cpus = _cpus()
    out.append(
        Knob(
            "cpu_burn",
            "load",
            "share of the host's CPU time busy (the burner asks workers x load)",
            busy,
            f"HostCPUSaturated cpu_busy_ratio {busy:g}; {cpus} CPUs",
            {"workers": 0, "load": _up(100 * busy, 1)},
            # twice the demand: twice the workers at the same load (a busy share cannot
            # pass 100 %, a run queue can)
            {"workers": 2 * cpus, "load": _up(100 * busy, 1)},
            "today's value (every CPU at 100 %) is 1.1 x the threshold, under moderate's "
            "demand: severe is twice moderate's",
            severe={"workers": 4 * cpus, "load": _up(100 * busy, 1)},
        )
    )
    out.append(
        Knob(
            "disk_io_saturation",
            None,
            "busy share of the disk",
            pack.disk_util_ratio,
            f"DiskSaturated disk_util_ratio {pack.disk_util_ratio:g} (DOMAIN: %util > 95 %)",
            {},
            {},
            "one magnitude: fio writes flat out (one job already keeps the disk busy); "
            "jobs and size change the queue, not the busy share",
        )
    )
    loss = pack.tcp_retransmit_ratio
    out.append(
        Knob(
            "network_loss",
            "percent",
            "share of TCP segments retransmitted on real links",
            loss,
            f"TCPRetransmitsHigh tcp_retransmit_ratio {loss:g} (DOMAIN: packet loss > 5 %)",
            {"percent": _up(100 * loss, 1)},
            {"percent": _up(200 * loss, 1)},
        )
    )
    signature_probe = _signature_param("network_latency", "probe_seconds")
    alert_probe = float(pack.probe_latency_seconds)
    probe = min(signature_probe, alert_probe)
    out.append(
        Knob(
            "network_latency",
            "delay_ms",
            "s added to the probe's round trip",
            probe,
            f"signature network_latency probe_seconds {signature_probe:g} and "
            f"ProbeLatencyHigh {alert_probe:g} s (the issue's 100 ms): the request and its "
            "answer each cross the delaying proxy",
            {"delay_ms": _up(1000 * probe / 2, 1)},
            {"delay_ms": _up(1000 * probe, 1)},
            ""
            if signature_probe == alert_probe
            else f"ProbeLatencyHigh asks {alert_probe:g} s: {1000 * alert_probe / 2:g} ms each way",
        )
    )
    out.append(
        Knob(
            "redis_down",
            None,
            "share of cache lookups failing",
            pack.cache_error_ratio,
            f"CacheErrorsHigh cache_error_ratio {pack.cache_error_ratio:g}",
            {},
            {},
            "one magnitude: the cache answers or not (method 1, a kill, is the same outage)",
        )
    )
    # Surge: its expected alerts (QueueBacklog, HTTP429RateHigh) judge the load against
    # the service's capacity, not against the rate before it. Past capacity the queue
    # fills, and once it is full the share refused is 1 - 1/load: HTTP429RateHigh's
    # http_429_ratio is just crossed at load 1 / (1 - ratio). The surge's fresh
    # embeddings inputs are sized against the worker pool's capacity the run measures
    # (``surge_factor``); here, before a run, at the nominal one.
    limit = 1.0 / (1.0 - pack.http_429_ratio)
    floor = _fault_minimum("traffic_surge", "factor")
    out.append(
        Knob(
            "traffic_surge",
            "factor",
            "offered load on the worker pool (x its measured capacity)",
            limit,
            f"HTTP429RateHigh http_429_ratio {pack.http_429_ratio:g}: past the pool's "
            f"capacity QueueBacklog's queue fills, then 1/(1 - {pack.http_429_ratio:g}) = "
            f"{limit:.3f} x capacity refuses that share; the fault adds factor x "
            f"{_base_rate():g} fresh embeddings/s to validate's {rate:g} requests/s",
            {"factor": surge_factor(limit, None)},
            {"factor": surge_factor(2 * limit, None)},
            f"sized at run time against the pool's measured capacity (here the nominal "
            f"{NOMINAL_EMBEDDINGS_RPS:g} embeddings/s); the fault's smallest surge is "
            f"factor {floor:g}",
        )
    )
    for name, bound, unit, source in (
        ("gpu_xid", 1.0, "Xid events", "GPUXidError: any Xid"),
        ("gpu_oom", 1.0, "CUDA_OOM errors", "GPUOutOfMemoryErrors: any CUDA OOM"),
        ("cold_start", 1.0, "model loads", "ModelReloaded: any reload"),
        (
            "timeouts_not_aborting",
            pack.unaborted_timeout_ratio,
            "share of timed-out requests whose model work ran on",
            f"TimedOutWorkNotAborted unaborted_timeout_ratio {pack.unaborted_timeout_ratio:g}",
        ),
    ):
        out.append(Knob(name, None, unit, bound, source, {}, {}, "one magnitude: an event"))
    for name, unit in (
        ("slow_dependency", "s added to each model request"),
        ("thread_leak", "threads leaked"),
        ("disk_fill", "MiB/s written"),
    ):
        out.append(
            Knob(
                name,
                None,
                unit,
                None,
                "no threshold: no alert and no signature knows this fault",
                {},
                {},
                "today's values at every severity",
            )
        )
    return {k.fault: k for k in out}


@cache
def _fault_minimum(fault: str, param: str) -> float:
    from ..chaos import get_fault

    return float(get_fault(fault).params[param][1])


def knob(fault: str) -> Knob:
    """How ``fault`` is swept; ``ConfigError`` for a fault the table does not know."""
    table = _knobs()
    if fault not in table:
        raise ConfigError(
            f"no severity table for fault {fault!r}; known: {', '.join(sorted(table))}"
        )
    return table[fault]


def severities(fault: str) -> tuple[str, ...]:
    """The severities the sweep runs ``fault`` at: ``SEVERITIES`` for a graded fault,
    ``(SINGLE,)`` for one with a single magnitude; ``ConfigError`` for an unknown fault."""
    return SEVERITIES if knob(fault).param is not None else (SINGLE,)


def _check_severity(fault: str, severity: str) -> None:
    if severity not in (*SEVERITIES, SINGLE):
        known = ", ".join((*SEVERITIES, SINGLE))
        raise ConfigError(f"unknown severity {severity!r}; expected one of {known}")
    allowed = severities(fault)
    if severity not in allowed:
        raise ConfigError(
            f"{fault} runs at {', '.join(allowed)}, not {severity!r}: "
            + (
                "it has one magnitude, run once"
                if allowed == (SINGLE,)
                else "it has a graded parameter"
            )
        )


def _defaults(fault: str) -> dict[str, Any]:
    """The fault's parameter defaults: its class's, or for an in-process fault the
    demo service's (the class passes them through and the service checks them)."""
    from ..chaos import get_fault

    cls = get_fault(fault)
    remote = getattr(cls, "remote", None)
    if remote is not None:
        from ..demo import IN_PROCESS_FAULTS

        return {k: v[0] for k, v in IN_PROCESS_FAULTS[remote].params.items()}
    return {k: v[0] for k, v in cls.params.items()}


def severity_params(
    fault: str, severity: str, *, quick: bool, capacity: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The fault's parameters at ``severity`` (one of ``severities(fault)``) for a quick
    or a full run; ``ConfigError`` for an unknown fault or severity, or a severity the
    fault does not run at. ``capacity`` (what ``calibrate_capacity`` measured) sizes a
    surge against this machine's service; None, against the nominal one.

    **Usage**::

        severity_params("network_loss", "threshold", quick=True)   # {"percent": 5}
    """
    from ._scenarios import scenario

    k = knob(fault)
    _check_severity(fault, severity)
    s = scenario(fault)
    today = {**_defaults(fault), **(s.quick_params if quick else s.params)}
    if severity == SINGLE:
        return today
    if fault == "traffic_surge":  # capacity None: the nominal pool, as the knob's own
        return {**today, "factor": _surge_at(severity, float(today["factor"]), capacity)}
    if severity == "severe":
        return {**today, **k.severe}
    return {**today, **(k.threshold if severity == "threshold" else k.moderate)}


def _surge_at(severity: str, today: float, capacity: Mapping[str, Any] | None) -> float:
    """A surge's factor at ``severity`` against ``capacity``: the load of the threshold,
    twice it, and today's factor unless a larger pool makes that less than moderate's
    load (then twice moderate's)."""
    limit = knob("traffic_surge").bound or 1.0
    if severity == "threshold":
        return surge_factor(limit, capacity)
    if severity == "moderate":
        return surge_factor(2 * limit, capacity)
    if surge_load(today, capacity) >= surge_load(surge_factor(2 * limit, capacity), capacity):
        return today
    return surge_factor(4 * limit, capacity)


def magnitude(
    fault: str, params: Mapping[str, Any], capacity: Mapping[str, Any] | None = None
) -> float | None:
    """The magnitude ``params`` ask of ``fault``, in its knob's unit (None for a fault
    with one magnitude: then the bound is what a run must cross); a surge's against
    ``capacity`` (None: the nominal one)."""
    k = knob(fault)
    if k.param is None:
        return None
    p = {**_defaults(fault), **params}
    rate = _request_rate()
    if fault in ("gpu_memory_leak", "process_memory_leak"):
        return float(p["mib_per_request"]) * _MIB * rate
    if fault == "gpu_cotenant":
        return float(p["share"])
    if fault == "gpu_contention":
        return float(p["factor"]) * DEMO_INFERENCE_S
    if fault == "event_loop_blocked":
        return _loop_outside(float(p["seconds"]), rate)
    if fault == "connection_flood":
        from ..demo import StackConfig

        return min(1.0, float(p["connections"]) / float(StackConfig().service_max_fds or 2200))
    if fault in ("overlong_inputs", "malformed_inputs"):
        r = float(p["rate"])
        per = 1.0 if fault == "overlong_inputs" else MALFORMED_TOP_REASON_SHARE
        return per * r / (r + rate)
    if fault == "cache_stampede":
        from ._load import LoadPlan

        plan = LoadPlan()
        return _stampede_drop(float(p["interval"]), plan.embeddings_rate, plan.embeddings_pool)
    if fault == "cpu_burn":
        cpus = _cpus()
        workers = int(p["workers"]) or cpus
        return workers * float(p["load"]) / 100.0 / cpus
    if fault == "network_loss":
        return float(p["percent"]) / 100.0
    if fault == "network_latency":
        return 2 * float(p["delay_ms"]) / 1000.0
    if fault == "traffic_surge":
        return surge_load(float(p["factor"]), capacity)
    raise ConfigError(f"fault {fault!r}: no magnitude for its knob {k.param!r}")


def beyond_reach(
    fault: str, severity: str, params: Mapping[str, Any], *, pack: Any, fault_s: float
) -> dict[str, str]:
    """The fault table's expected alerts that ``params`` cannot make fire within a fault
    phase of ``fault_s`` seconds under the rule pack ``pack`` (a ``PackParams``): alert
    name -> why, said with the numbers. Empty at severe (today's values, which every
    alert is expected to catch).

    A GPU leak's alerts count the bytes it has grown, not its rate: GPUProcessMemoryGrowth
    asks ``gpu_process_growth_bytes`` over ``leak_window`` (1 GiB over quick runs' 10 s:
    107 MB/s), GPUMemoryHigh the device past ``gpu_memory_ratio`` (7.6 GiB more than the
    demo's 14 GiB of weights). A leak at the signature's 2 MB/s, or twice it, reaches neither
    within a quick phase of 60 s (nor GPUMemoryHigh within a full one), so at threshold and
    moderate those alerts are reported as out of reach rather than missed; the diagnosis
    still has to name the leak.
    """
    _check_severity(fault, severity)
    if severity == "severe" or fault != "gpu_memory_leak":
        return {}
    import promql_parser

    from ..demo import DemoConfig

    rate = magnitude(fault, params)
    if rate is None or not rate > 0:
        return {}
    out: dict[str, str] = {}
    window = promql_parser.parse_duration(pack.leak_window).total_seconds()
    growth = float(pack.gpu_process_growth_bytes)
    if rate * window < growth:
        out["GPUProcessMemoryGrowth"] = (
            f"asks {growth / _MIB:.0f} MiB over leak_window {pack.leak_window} "
            f"({growth / window / 1e6:.3g} MB/s); this leak grows {rate / 1e6:.2f} MB/s"
        )
    demo = DemoConfig()
    to_bound = float(pack.gpu_memory_ratio) * demo.sim_gpu_memory_total - demo.sim_weights_bytes
    if to_bound / rate > fault_s:
        out["GPUMemoryHigh"] = (
            f"the device passes {float(pack.gpu_memory_ratio):.0%} after "
            f"{to_bound / 1e9:.1f} GB more than the weights: {to_bound / rate:.0f} s at "
            f"{rate / 1e6:.2f} MB/s, past the {fault_s:.0f} s fault phase"
        )
    return out


def severity_table(*, quick: bool) -> list[dict[str, Any]]:
    """One row per fault: the parameter swept, the severities it runs at and their
    values (a single-magnitude fault: ``single``, its scenario's), the bound and its
    source."""
    from ._scenarios import SCENARIOS

    rows = []
    for fault in SCENARIOS:
        k = knob(fault)
        sevs = severities(fault)
        values = {sev: severity_params(fault, sev, quick=quick) for sev in sevs}
        shown = [k.param] if k.param else []
        if fault == "cpu_burn":
            shown = ["workers", "load"]
        rows.append(
            {
                "fault": fault,
                "param": ", ".join(shown) or "-",
                "severities": list(sevs),
                **{sev: {p: values[sev].get(p) for p in shown} for sev in sevs},
                "unit": k.unit,
                "bound": k.bound,
                "source": k.source,
                "note": k.note,
            }
        )
    return rows


# -- reached -----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class _Window:
    """The fault phase in the agent's store: values of an expression at its end (with
    ``W`` the phase's length as the range), over it, or just before it."""

    store: Any
    tick: float
    t_fault: float
    t_end: float
    #: when a leak would reach its bound (the device full, the fault's max_mib)
    full_at: float = math.inf

    @property
    def w(self) -> str:
        return f"{max(int(self.t_end - self.t_fault), int(2 * self.tick) + 1)}s"

    @property
    def before_s(self) -> float:
        # the last 8 s before the fault (validate's quick baseline is 10 s, a full
        # run's 60 s): the calm under the same load the fault's reach is measured from
        return max(8.0, 4 * self.tick)

    def _eval(self, expr: str, start: float, end: float) -> list[tuple[Mapping[str, str], float]]:
        res = self.store.query_range(expr, start, end, self.tick)
        return [(s.labels, v) for s in res.matrix for _, v in s.points if v == v]

    def at(self, expr: str, t: float) -> list[tuple[Mapping[str, str], float]]:
        return self._eval(expr.replace("[W]", f"[{self.w}]"), t, t)

    def end(self, expr: str) -> list[float]:
        return [v for _, v in self.at(expr, self.t_end)]

    def end_from_before(self, expr: str) -> list[float]:
        """``expr`` at the end, ``[W]`` reaching one tick before the injection: a counter
        of events such as ``changes()`` must see the last sample before the fault, or an
        event at the injection's first tick leaves no change inside the range (a range cut
        to the phase reads 0 model loads for every cold_start)."""
        w = f"{math.ceil(self.t_end - self.t_fault + self.tick)}s"
        return [v for _, v in self._eval(expr.replace("[W]", f"[{w}]"), self.t_end, self.t_end)]

    def start(self, expr: str) -> list[tuple[Mapping[str, str], float]]:
        """``expr`` at the injection, ``[W]`` standing for the calm just before it."""
        return self._eval(
            expr.replace("[W]", f"[{int(self.before_s)}s]"), self.t_fault, self.t_fault
        )

    def over(self, expr: str) -> list[float]:
        return [v for _, v in self._eval(expr, self.t_fault, self.t_end)]

    def before(self, expr: str) -> list[float]:
        return [v for _, v in self._eval(expr, self.t_fault - self.before_s, self.t_fault)]

    def delta(self, expr: str) -> float:
        """How much a sum of counters grew over the phase (a series that appears
        during it, such as a first Xid, counts from zero)."""
        end = self.at(expr, self.t_end)
        start = self.at(expr, self.t_fault - self.tick)
        return (end[0][1] if end else 0.0) - (start[0][1] if start else 0.0)


#: achieved magnitude, or why it cannot be measured (a string)
Measured = float | str
_NO_DATA = "no {} series in the agent's store during the fault"


def _peak(values: list[float], metric: str) -> Measured:
    return max(values) if values else _NO_DATA.format(metric)


def _rise(w: _Window, expr: str, metric: str) -> Measured:
    during, before = w.over(expr), w.before(expr)
    if not during or not before:
        return _NO_DATA.format(metric)
    return max(during) - statistics.median(before)


def _slope(w: _Window, metric: str) -> Measured:
    # the least-squares slope from the injection to the phase's end, or to when the
    # leak reached its bound (a full device, the fault's max_mib) and stopped growing:
    # it averages out the per-request KV reservations that come and go on the device
    end = min(w.t_end, max(w.t_fault + 4 * w.tick, w.full_at))
    span = max(int(end - w.t_fault), int(2 * w.tick) + 1)
    values = [v for _, v in w._eval(f"max(deriv({metric}[{span}s]))", end, end)]
    return _peak(values, metric)


def _full_at(fault: str, params: Mapping[str, Any], t_fault: float) -> float:
    """When a leak asked at ``params`` reaches what bounds it (90 % of the way, for
    the requests' own rate to vary): the sim device's free memory, or max_mib."""
    if fault not in ("gpu_memory_leak", "process_memory_leak"):
        return math.inf
    p = {**_defaults(fault), **params}
    rate = float(p["mib_per_request"]) * _MIB * _request_rate()
    if fault == "process_memory_leak":
        room = float(p["max_mib"]) * _MIB
    else:
        from ..demo import DemoConfig

        demo = DemoConfig()
        room = float(demo.sim_gpu_memory_total - demo.sim_weights_bytes)
    return t_fault + 0.9 * room / rate if rate > 0 else math.inf


def _change(w: _Window, expr: str, metric: str, *, relative: bool) -> Measured:
    """``expr`` over the phase against the calm before: the difference, or the rise
    as a share of the before."""
    during, before = w.end(expr), [v for _, v in w.start(expr)]
    if not during or not before:
        return _NO_DATA.format(metric)
    if relative:
        return during[0] / before[0] - 1.0 if before[0] > 0 else _NO_DATA.format(metric)
    return during[0] - before[0]


def _probe(w: _Window) -> Measured:
    # the probe's mean round trip over 4 probes, its peak in the phase against the calm
    expr = f"max(avg_over_time(probe_duration_seconds[{int(4 * w.tick)}s]))"
    return _rise(w, expr, "probe_duration_seconds")


def _stampede(w: _Window) -> Measured:
    expr = (
        'sum by (cache) (increase(cache_requests_total{result="hit"}[W])) '
        '/ sum by (cache) (increase(cache_requests_total{result=~"hit|miss"}[W]))'
    )
    during = {s.get("cache", ""): v for s, v in w.at(expr, w.t_end)}
    before = {s.get("cache", ""): v for s, v in w.start(expr)}
    # the caches that were warm (CacheHitRatioDrop's cache_hit_baseline_ratio)
    warm = {c: b for c, b in before.items() if b >= _pack().cache_hit_baseline_ratio}
    drops = [1.0 - during[c] / b for c, b in warm.items() if c in during]
    if not drops:
        return "no warm cache (hit ratio over its baseline bound) before the fault"
    return max(drops)


def _surge(w: _Window, capacity: Mapping[str, Any] | None) -> Measured:
    """The load offered to the worker pool over the phase (x its capacity): the requests
    that arrived, answered or refused, less the embeddings the cache answered."""
    workers, per_embedding, per_completion = _pool(capacity)
    arrived = 'sum(rate(http_request_duration_seconds_count{{route="/v1/{}"}}[W]))'
    completions = w.end(arrived.format("completions"))
    embeddings = w.end(arrived.format("embeddings"))
    hits = w.end('sum(rate(cache_requests_total{cache="embeddings",result="hit"}[W]))')
    if not completions or not embeddings:
        return _NO_DATA.format("http_request_duration_seconds_count")
    fresh = max(0.0, embeddings[0] - (hits[0] if hits else 0.0))
    return (completions[0] * per_completion + fresh * per_embedding) / workers


def _timeouts(w: _Window) -> Measured:
    timed = w.delta('sum(request_timeouts_total{reason="deadline"})')
    if timed <= 0:
        return 0.0  # no request passed its deadline: the fault had nothing to act on
    aborted = w.delta('sum(model_aborts_total{reason="deadline"})')
    return max(0.0, timed - aborted) / timed


def _threads(w: _Window) -> Measured:
    return _rise(w, "max(service_process_threads)", "service_process_threads")


_MEASURES: dict[str, Callable[[_Window], Measured]] = {
    "gpu_memory_leak": lambda w: _slope(w, "gpu_process_memory_used_bytes"),
    "process_memory_leak": lambda w: _slope(w, "service_process_resident_memory_bytes"),
    "gpu_cotenant": lambda w: _rise(
        w, "max(gpu_memory_used_bytes / gpu_memory_total_bytes)", "gpu_memory_used_bytes"
    ),
    "gpu_contention": lambda w: _peak(
        w.end(
            "max(histogram_quantile(0.99, sum by (job, model, le) "
            "(rate(model_inference_time_seconds_bucket[W]))))"
        ),
        "model_inference_time_seconds",
    ),
    # LatencyHighWorkersIdle's left side over the phase
    "event_loop_blocked": lambda w: _peak(
        w.end(
            "max(sum by (job) (rate(http_request_duration_seconds_sum[W])) "
            "/ sum by (job) (rate(http_request_duration_seconds_count[W])) "
            "- on (job) (sum by (job) (rate(model_inference_time_seconds_sum[W])) "
            "/ sum by (job) (rate(model_inference_time_seconds_count[W]))))"
        ),
        "http_request_duration_seconds",
    ),
    "worker_pool_saturated": lambda w: _peak(
        w.end(
            "max(avg_over_time(worker_pool_active_workers[W]) "
            "/ avg_over_time(worker_pool_max_workers[W]))"
        ),
        "worker_pool_active_workers",
    ),
    "connection_flood": lambda w: _peak(
        w.over("max(service_process_open_fds / service_process_max_fds)"),
        "service_process_open_fds",
    ),
    **{
        name: (
            lambda w: _peak(
                w.end(
                    "max(sum by (reason) (increase(input_rejections_total[W]))) "
                    "/ sum(increase(http_request_duration_seconds_count[W]))"
                ),
                "input_rejections_total",
            )
        )
        for name in ("overlong_inputs", "malformed_inputs")
    },
    "cache_stampede": _stampede,
    # HostCPUSaturated's left side over the phase
    "cpu_burn": lambda w: _peak(
        w.end(
            'max(1 - sum without (mode) (rate(host_cpu_seconds_total{mode=~"idle|iowait"}[W])) '
            '/ sum without (mode) (rate(host_cpu_seconds_total{mode!~"guest|guest_nice"}[W])))'
        ),
        "host_cpu_seconds_total",
    ),
    # DiskSaturated's left side: a busy share cannot pass 100 % (io_ticks jumps can)
    "disk_io_saturation": lambda w: _peak(
        w.end("max(clamp_max(rate(host_disk_io_time_seconds_total[W]), 1))"),
        "host_disk_io_time_seconds_total",
    ),
    # TCPRetransmitsHigh's ratio (segments sent on real links: loopback left out), in the
    # namespace where it is highest (the host's, or the fault proxy's the agent reads)
    "network_loss": lambda w: _peak(
        w.end(
            "max(sum by (netns) (rate(host_tcp_retransmitted_segments_total[W])) / ((sum by "
            "(netns) (rate(host_tcp_out_segments_total[W])) - sum by (netns) (rate("
            'host_network_transmit_packets_total{interface="lo"}[W]))) or sum by (netns) '
            "(rate(host_tcp_out_segments_total[W]))))"
        ),
        "host_tcp_retransmitted_segments_total",
    ),
    "network_latency": _probe,
    "redis_down": lambda w: _peak(
        w.end(
            'sum(increase(cache_requests_total{result="error"}[W])) '
            "/ sum(increase(cache_requests_total[W]))"
        ),
        "cache_requests_total",
    ),
    "gpu_xid": lambda w: w.delta("sum(gpu_xid_errors_total)"),
    "gpu_oom": lambda w: w.delta('sum(model_inference_errors_total{error_code="CUDA_OOM"})'),
    "cold_start": lambda w: _peak(
        w.end_from_before("sum(changes(model_load_time_seconds[W]))"), "model_load_time_seconds"
    ),
    "timeouts_not_aborting": _timeouts,
    "slow_dependency": lambda w: _change(
        w,
        'sum(rate(http_request_duration_seconds_sum{route=~"/v1/.*"}[W])) '
        '/ sum(rate(http_request_duration_seconds_count{route=~"/v1/.*"}[W]))',
        "http_request_duration_seconds",
        relative=False,
    ),
    "thread_leak": _threads,
}

#: faults whose magnitude the agent does not collect, and why
_UNMEASURED: dict[str, str] = {
    "disk_fill": "the agent collects disk operations and busy time, not bytes written",
}

#: faults whose signal the agent collects but which under-reads their magnitude: the
#: value is reported, not judged. A quick sweep on a 2-core machine measures
#: TCPRetransmitsHigh's ratio over the phase at 2.4 %, 3.2 % and 18.4 % for 5, 10 and
#: 30 % of the link's packets dropped (nftables drops exactly that share): the host's
#: pure ACKs for the streamed answers count among the segments sent but are never
#: resent, and connections stalled on a retransmission timeout send fewer segments.
_INDIRECT: dict[str, str] = {
    "network_loss": "the retransmitted share under-reads the packets dropped (pure ACKs "
    "count among the segments sent, stalled connections send fewer)",
}


def _asked(
    fault: str,
    severity: str,
    params: Mapping[str, Any],
    t: float,
    capacity: Mapping[str, Any] | None = None,
) -> float | None:
    """The magnitude the case asked, in the measured signal's terms."""
    k = knob(fault)
    if fault == "slow_dependency":
        return float(params.get("seconds", _defaults(fault)["seconds"]))
    if fault == "thread_leak":
        p = {**_defaults(fault), **params}
        return min(float(p["max_threads"]), float(p["per_request"]) * _request_rate() * t)
    m = magnitude(fault, params, capacity)
    if m is None:
        return k.bound
    if fault == "event_loop_blocked" and not math.isfinite(m):
        # past the loop's saturation the model has no steady state: at least what
        # moderate asks (twice the bound, rounded up to the sleep's step), never less
        return max(2 * (k.bound or 0.0), magnitude(fault, {**params, **k.moderate}) or 0.0)
    if fault == "cpu_burn":
        return min(1.0, m)  # a busy share cannot pass 100 %
    return m


def _fmt(value: float, unit: str) -> str:
    if "bytes/s" in unit:
        return f"{value / 1e6:.2f} MB/s"
    if unit.startswith(("share", "drop", "rise")):
        return f"{value:.1%}"
    if unit.startswith("s "):
        return f"{value:.3f} s"
    if unit.startswith("offered load"):
        return f"x{value:.2f}"
    return f"{value:.4g}"


def reached(
    stack: ValidateTarget,
    fault: str,
    severity: str,
    params: dict[str, Any],
    *,
    quick: bool,
    t_fault: float,
    t_end: float,
    capacity: Mapping[str, Any] | None = None,
) -> Check | None:
    """Did the fault reach the magnitude ``severity`` asked, on this machine?

    Measured from the agent's store over ``[t_fault, t_end]``. ``ok`` True: reached
    (a graded fault within ``TOLERANCE`` of the magnitude asked, a fault with one
    magnitude past its bound); False: "could not reach the <severity> magnitude on
    this machine: achieved X, asked Y"; ``ok`` None: the magnitude cannot be measured
    here (the text says why). ``None`` only for a fault whose magnitude is not a
    number the agent collects.
    """
    k = knob(fault)
    _check_severity(fault, severity)
    if fault in _UNMEASURED:
        return None
    del quick  # the magnitude asked is in params; the phase times set the windows
    full = _full_at(fault, params, t_fault)
    window = _Window(stack.agent.store, float(stack.config.tick), t_fault, t_end, full)
    try:
        if fault == "traffic_surge":
            achieved = _surge(window, capacity)
        else:
            achieved = _MEASURES[fault](window)
    except Exception as exc:  # a query error is reported, never raised into the run
        achieved = f"the measurement failed: {type(exc).__name__}: {exc}"
    asked = _asked(fault, severity, params, t_end - t_fault, capacity)
    if isinstance(achieved, str) or asked is None:
        why = achieved if isinstance(achieved, str) else "nothing asked"
        return Check(
            "severity",
            None,
            f"{severity} magnitude not measured: {why}",
            {"severity": severity, "unit": k.unit, "asked": asked},
        )
    data = {"severity": severity, "unit": k.unit, "achieved": achieved, "asked": asked,
            "bound": k.bound}  # fmt: skip
    if fault in _INDIRECT:
        text = (
            f"{severity} magnitude not judged: {_fmt(achieved, k.unit)} ({k.unit}) with "
            f"{_fmt(asked, k.unit)} asked; {_INDIRECT[fault]}"
        )
        return Check("severity", None, text, data)
    counted = k.param is None and k.bound == 1.0
    if k.param is None and k.bound is not None and not counted:
        ok = achieved > k.bound  # one magnitude: the fault must cross its bound
    elif counted:
        ok = achieved >= 1.0
    else:
        ok = achieved >= (1.0 - TOLERANCE) * asked
    got, want = _fmt(achieved, k.unit), _fmt(asked, k.unit)
    if ok:
        text = f"{severity} magnitude reached: {got} ({k.unit}), asked {want}"
    else:
        text = (
            f"could not reach the {severity} magnitude on this machine: achieved {got}, "
            f"asked {want} ({k.unit})"
        )
    return Check("severity", ok, text, data)


# -- the benchmark's numbers -------------------------------------------------------------
def _quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    pos = q * (len(s) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


#: What became of a sweep case, each counted once, in the order they are judged: not run
#: (skipped, or cut short by Ctrl-C), crashed, short of the magnitude it asked, missed by
#: an expected alert or by the diagnosis, named by the diagnosis with no alert to test (the
#: fault has none, or its magnitude cannot make them fire in the phase), caught.
OUTCOMES = ("not tested", "error", "not reached", "missed", "diagnosis only", "caught")


def _outcome(case: Mapping[str, Any]) -> str:
    if case.get("skipped") or case.get("error") == "interrupted":
        return "not tested"
    if case.get("error"):
        return "error"
    if case.get("reached") is False:
        return "not reached"
    if not case.get("diag_ok") or case.get("alerts_ok") is False:
        return "missed"
    if not case.get("alerts_tested"):
        return "diagnosis only"
    return "caught"


def _severity_of(name: Any, fault: str, severity: Any) -> tuple[str, str | None]:
    """The case's severity as the sweep counts it, and the one the report named where
    they differ: a report from before single-magnitude faults ran once names their three
    runs threshold, moderate and severe; they count as three runs at ``SINGLE``."""
    if severity not in (*SEVERITIES, SINGLE):
        raise ConfigError(f"case {name!r}: unknown severity {severity!r}")
    if severity in SEVERITIES and fault in _knobs() and knob(fault).param is None:
        return SINGLE, severity
    return severity, None


def _case_of_report(s: Mapping[str, Any]) -> dict[str, Any] | None:
    """One sweep case of a validate report (None for a pair or a plain case beside it)."""
    if s.get("severity") is None:
        return None
    fault = "+".join(s.get("faults") or [str(s.get("fault", "")).split("@")[0]])
    sev, ran_as = _severity_of(s.get("fault"), fault, s.get("severity"))
    checks = {c["name"]: c for c in s.get("checks", [])}
    alerts = [c for n, c in checks.items() if n.startswith("alert:")]
    diag = checks.get("diagnosis")
    sev_check = checks.get("severity")
    diag_ok = bool(diag and diag.get("ok"))
    fired = [c["data"]["after_s"] for c in alerts if c.get("ok") and "after_s" in c["data"]]
    t0, t1 = s.get("t_fault"), s.get("t_revert") or s.get("ended_at")
    phase = (
        float(t1) - float(t0)
        if isinstance(t0, int | float) and isinstance(t1, int | float)
        else 0.0
    )
    return {
        "case": s.get("fault"),
        "fault": fault,
        "severity": sev,
        "ran_as": ran_as,
        "skipped": s.get("skipped"),
        "error": s.get("error"),
        # expected alerts this magnitude cannot make fire in its phase (``beyond_reach``)
        # are not among the alert checks: they were not tested
        "alerts_tested": len(alerts),
        "alerts_ok": all(c.get("ok") for c in alerts),
        "diag_ok": diag_ok,
        "first_alert_s": min(fired) if fired else None,
        "finding_s": diag["data"].get("after_s") if diag_ok and diag else None,
        "stable_share": (diag or {}).get("data", {}).get("stable_share"),
        "reached": None if sev_check is None else sev_check.get("ok"),
        "reached_text": None if sev_check is None else sev_check.get("text"),
        "false_p0p1": list(
            (checks.get("other_alerts") or {}).get("data", {}).get("false_paging", [])
        ),
        "beyond_reach": sorted(n.split(":", 1)[1] for n in checks if n.startswith("beyond_reach:")),
        "fault_s": max(0.0, phase),
    }


def _case_of_summary(c: Mapping[str, Any]) -> dict[str, Any]:
    """One case of an earlier ``summarize_sweep`` answer (a detection_sweep results
    file), for its report to be counted again under these rules. An answer from before
    the outcomes were kept says only whether the case was caught: the alerts it tested
    are the fault table's less those out of reach, and a case the diagnosis named but
    did not catch missed an alert."""
    fault = str(c.get("fault", ""))
    sev, ran_as = _severity_of(c.get("case"), fault, c.get("ran_as") or c.get("severity"))
    out = dict(c)
    out.update(severity=sev, ran_as=ran_as)
    out.setdefault("false_p0p1", [])
    out.setdefault("beyond_reach", [])
    if "diag_ok" not in c:
        from ..chaos import FAULT_TABLE

        faults = fault.split("+")
        unknown = [f for f in faults if f not in FAULT_TABLE]
        if unknown:
            raise ConfigError(f"case {c.get('case')!r}: no fault table row for {unknown[0]!r}")
        expected = {a for f in faults for a in FAULT_TABLE[f].alerts}
        diag_ok = c.get("caught") is True or c.get("finding_s") is not None
        out["diag_ok"] = diag_ok
        out["alerts_tested"] = len(expected - set(out["beyond_reach"]))
        out["alerts_ok"] = True if c.get("caught") else (False if diag_ok else None)
    return out


def _cases(report: Mapping[str, Any]) -> tuple[list[dict[str, Any]], Mapping[str, Any] | None]:
    """The sweep cases of a validate report, or of an earlier summary (then also it)."""
    if not isinstance(report, Mapping):
        raise ConfigError("not a validate report: no 'scenarios' list")
    if isinstance(report.get("scenarios"), list):
        got = (_case_of_report(s) for s in report["scenarios"])
        return [c for c in got if c is not None], None
    earlier = report.get("summary")
    if isinstance(earlier, Mapping) and isinstance(earlier.get("cases"), list):
        return [_case_of_summary(c) for c in earlier["cases"]], earlier
    raise ConfigError(
        "not a validate report: no 'scenarios' list (nor a detection_sweep result's "
        "'summary' with its 'cases')"
    )


def summarize_sweep(report: Mapping[str, Any]) -> dict[str, Any]:
    """The sweep's numbers from a validate report (``Report.to_dict()`` / its JSON), or
    from a detection_sweep results file (its ``summary``, counted again).

    Per case (fault x severity, or a single-magnitude fault's one run): its outcome
    (``OUTCOMES``; caught means every expected alert fired and the diagnosis named the
    fault, and kept naming it, at the magnitude asked), the time from injection to the
    first expected alert and to the stable correct finding, and whether the severity was
    reached. Per severity (``SEVERITIES`` and ``SINGLE``): the cases caught, tested and
    not tested, and the outcomes of the others; ``caught`` is each one's caught share over
    every case tested (a crash, a case short of its magnitude and one with no alert to
    test all count, as not caught). Time-to-detection percentiles over the caught
    cases; false P0/P1 alerts per hour of fault phase; ``consequences``, the allowed
    consequence entries of the fault table. ``ConfigError`` for a report without sweep
    cases.
    """
    from ..chaos import FAULT_TABLE

    cases, earlier = _cases(report)
    if not cases:
        raise ConfigError("the report holds no sweep case (run 'aivitals validate --sweep')")
    for c in cases:
        c["outcome"] = _outcome(c)
        c["caught"] = None if c["outcome"] == "not tested" else c["outcome"] == "caught"
    tested = [c for c in cases if c["outcome"] != "not tested"]
    by_severity: dict[str, dict[str, int]] = {}
    shares: dict[str, float | None] = {}
    for sev in (*SEVERITIES, SINGLE):
        at = [c for c in cases if c["severity"] == sev]
        n = {o: sum(c["outcome"] == o for c in at) for o in OUTCOMES}
        by_severity[sev] = {
            "caught": n["caught"],
            "tested": len(at) - n["not tested"],
            "not_tested": n["not tested"],
            **{o.replace(" ", "_"): n[o] for o in OUTCOMES[1:-1]},
        }
        shares[sev] = (
            n["caught"] / by_severity[sev]["tested"] if by_severity[sev]["tested"] else None
        )
    ttd = [c["first_alert_s"] for c in tested if c["caught"] and c.get("first_alert_s") is not None]
    false_alerts = sum(len(c["false_p0p1"]) for c in tested)
    if earlier is not None and not all("fault_s" in c for c in tested):
        fault_s = float(earlier.get("fault_hours") or 0.0) * 3600.0
    else:
        fault_s = sum(float(c.get("fault_s") or 0.0) for c in tested)
    count = {o: sum(c["outcome"] == o for c in cases) for o in OUTCOMES}
    return {
        "cases": cases,
        "caught": shares,
        "by_severity": by_severity,
        "not_reached": count["not reached"],
        "diagnosis_only": count["diagnosis only"],
        "errors": count["error"],
        "missed": count["missed"],
        "not_tested": count["not tested"],
        "consequences": sum(len(i.consequences) for i in FAULT_TABLE.values()),
        "ttd_p50_s": _quantile(ttd, 0.5),
        "ttd_p90_s": _quantile(ttd, 0.9),
        "false_p0p1": false_alerts,
        "fault_hours": fault_s / 3600.0,
        "false_p0p1_per_h": false_alerts / (fault_s / 3600.0) if fault_s > 0 else None,
        "ran": len(tested),
        "interrupted": bool(report.get("interrupted") or (earlier or {}).get("interrupted")),
    }
