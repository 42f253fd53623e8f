from __future__ import annotations

import functools
from typing import Any

import numpy as np
import pytest

from aivitals.diagnose import HIGH_CONFIDENCE, Event, Shape, diagnose
from aivitals.errors import BackendError, BackendTimeout, ConfigError
from aivitals.tsdb import QueryResult, Store
from tests.diagnose import _corpus as corpus

DURATION = 600.0


@functools.cache
def _loaded(fault: str | None, seed: int = 1, partial: bool = False) -> tuple[Any, Store]:
    sc = corpus.scenario(fault, seed=seed, duration=DURATION, partial=partial)
    store = corpus.to_store(sc)
    assert isinstance(store, Store)
    return sc, store


@pytest.mark.parametrize(
    ("fault", "expected", "layer"),
    [
        ("gpu_memory_leak", "gpu_memory_leak", "model"),
        ("connection_flood", "connection_flood", "service"),
        ("disk_io_saturation", "disk_io_saturation", "infrastructure"),
        ("malformed_inputs", "malformed_inputs", "business"),
        ("redis_down", "redis_down", "infrastructure"),
    ],
)
def test_a_fault_is_named_first_with_its_layer(fault: str, expected: str, layer: str) -> None:
    sc, store = _loaded(fault)
    d = diagnose(store, end=sc.end, events=sc.events)
    top = d.findings[0]
    assert (top.signature, top.layer) == (expected, layer)
    assert top.confidence >= HIGH_CONFIDENCE
    assert top.first_deviation is not None and top.first_deviation >= sc.fault_start - 5
    assert top.commands and top.stop_loss
    assert all(e.held for e in top.evidence if e.role == "required")


def test_leak_runbook_names_the_real_pid_and_gpu() -> None:
    sc, store = _loaded("gpu_memory_leak")
    top = diagnose(store, end=sc.end).findings[0]
    assert "pid 4242" in top.title and "GPU 0" in top.title
    assert any("py-spy dump --pid 4242" in c for c in top.commands)


def test_fault_free_traffic_has_no_high_confidence_finding() -> None:
    sc, store = _loaded(None)
    d = diagnose(store, end=sc.end)
    assert [f.signature for f in d.findings if f.confidence >= HIGH_CONFIDENCE] == []
    assert d.shape is Shape.HEALTHY


def test_counter_reset_after_restart_is_read_as_a_cold_start() -> None:
    sc, store = _loaded("cold_start")
    d = diagnose(store, end=sc.end)
    assert d.findings[0].signature == "cold_start"


class _Failing:
    """A backend that fails like a sick Prometheus: every query, or some."""

    def __init__(self, inner: Store | None, exc: Exception, when: str = "") -> None:
        self.inner, self.exc, self.when = inner, exc, when

    def query(self, expr: str, at: float | None = None) -> QueryResult:
        if self.inner is None or self.when in expr:
            raise self.exc
        return self.inner.query(expr, at)

    def query_range(self, expr: str, start: float, end: float, step: float) -> QueryResult:
        if self.inner is None or self.when in expr:
            raise self.exc
        return self.inner.query_range(expr, start, end, step)


def test_a_backend_that_times_out_gives_a_diagnosis_that_says_so() -> None:
    d = diagnose(_Failing(None, BackendTimeout("no answer in 10 s")), end=1e9)
    assert all(f.confidence < 0.5 for f in d.findings)
    assert any("BackendTimeout" in u.why for u in d.unseen)


def test_failing_gpu_queries_hide_gpu_findings_and_keep_the_rest() -> None:
    sc, store = _loaded("connection_flood")
    d = diagnose(_Failing(store, BackendError("500 from server"), when="gpu_"), end=sc.end)
    assert d.findings[0].signature == "connection_flood"
    assert any("gpu_" in u.what and "BackendError" in u.why for u in d.unseen)


def test_missing_exporters_are_listed_and_lower_confidence() -> None:
    sc, full = _loaded("connection_flood")
    store = Store(retention=7200)
    for name, labels, ts, vals in corpus.samples(sc):
        if name.startswith(("service_process_", "http_request_duration")):
            continue  # the process collector and the HTTP middleware are missing
        for t, v in zip(ts.tolist(), vals.tolist(), strict=True):
            store.append(name, labels, v, t)
    d = diagnose(store, end=sc.end)
    whole = diagnose(full, end=sc.end)
    assert any("service_process_open_fds" in u.what for u in d.unseen)
    mine = next(f for f in d.findings if f.signature == "connection_flood")
    assert mine.confidence < whole.findings[0].confidence
    assert any(not e.seen for e in mine.evidence)


def test_connections_that_carry_requests_are_not_a_flood() -> None:
    """A flood holds its connections idle. Give every connection of the flood a request in
    flight (a blocked loop or a slow model holding each caller's connection, callers that
    give up reconnecting) and the rise is requests waiting: connection_flood is
    contradicted and no longer named with high confidence."""
    sc, _ = _loaded("connection_flood")
    idle, busy = Store(retention=7200), Store(retention=7200)
    for name, labels, ts, vals in corpus.samples(sc):
        for t, v in zip(ts.tolist(), vals.tolist(), strict=True):
            idle.append(name, labels, v, t)
            busy.append(name, labels, v, t)
            if name == "host_tcp_connections" and labels.get("state") == "established":
                busy.append("http_requests_in_flight", {"route": "/v1/slow"}, v, t)

    def flood(store: Store) -> Any:
        findings = diagnose(store, end=sc.end).findings
        return next(f for f in findings if f.signature == "connection_flood")

    named, waiting = flood(idle), flood(busy)
    assert named.confidence >= HIGH_CONFIDENCE
    assert not any(e.held for e in named.evidence if e.role == "contradicting")
    assert any(e.held and "in flight" in e.says for e in waiting.evidence)
    assert waiting.confidence < HIGH_CONFIDENCE


def test_contradicting_evidence_lowers_confidence() -> None:
    sc, store = _loaded("gpu_memory_leak")
    clean = next(
        f for f in diagnose(store, end=sc.end).findings if f.signature == "gpu_memory_leak"
    )
    # the same leak while traffic doubles: the leak is still there, but less certain
    sc2 = corpus.scenario("gpu_memory_leak", seed=1, duration=DURATION)
    corpus.FAULTS["traffic_surge"][0](sc2.state, int(DURATION - 180), np.random.default_rng(0), [])
    mixed = diagnose(corpus.to_store(sc2), end=sc2.end)  # type: ignore[arg-type]
    leak = next(f for f in mixed.findings if f.signature == "gpu_memory_leak")
    assert leak.confidence < clean.confidence
    assert any(e.role == "contradicting" and e.held for e in leak.evidence)


def test_gaps_and_out_of_order_samples_do_not_break_the_diagnosis() -> None:
    sc = corpus.scenario("network_loss", seed=3, duration=DURATION)
    store = Store(retention=7200)
    for name, labels, ts, vals in corpus.samples(sc):
        keep = (ts < sc.start + 300) | (ts > sc.start + 360)  # a one-minute gap
        for t, v in zip(ts[keep].tolist(), vals[keep].tolist(), strict=True):
            store.append(name, labels, v, t)
    from aivitals.signals import Sample

    late = [Sample("host_load1", {}, 99.0, sc.start + 10.0)]  # a clock that went back
    stats = store.append_samples(late, default_timestamp=sc.end)
    assert stats.rejected_total == 1
    d = diagnose(store, end=sc.end)
    assert d.findings[0].signature == "network_loss"


def test_loopback_traffic_does_not_hide_packet_loss() -> None:
    # 8% of the segments on the real link are lost; four times as many go over loopback
    # (a local Redis, scrapes), which never loses one: of all segments under 2% are resent
    sc = corpus.scenario("network_loss", seed=3, duration=DURATION)
    store = Store(retention=7200)
    for name, labels, ts, vals in corpus.samples(sc):
        if name == "host_tcp_out_segments_total":
            lo = 4.0 * vals
            for t, v in zip(ts.tolist(), lo.tolist(), strict=True):
                store.append("host_network_transmit_packets_total", {"interface": "lo"}, v, t)
            vals = vals + lo
        for t, v in zip(ts.tolist(), vals.tolist(), strict=True):
            store.append(name, labels, v, t)
    diluted = (
        "sum(rate(host_tcp_retransmitted_segments_total[1m]))"
        " / sum(rate(host_tcp_out_segments_total[1m]))"
    )
    assert 0 < store.query(diluted, sc.end).values()[0] < 0.02
    d = diagnose(store, end=sc.end)
    top = d.findings[0]
    assert (top.signature, top.layer) == ("network_loss", "infrastructure")
    ratio = next(e for e in top.evidence if e.role == "required")
    assert ratio.held and ratio.values[0][1] > 0.05


def test_loss_in_a_proxys_namespace_is_read_there_not_diluted_by_the_hosts_acks() -> None:
    # at full length the fault's proxy resends its answers in its own namespace; the host
    # sends mostly ACKs of them (3.7 % resent of its link's segments).
    # The namespace's counters (HostCollector netns=) are judged on their own
    sc = corpus.scenario("network_loss", seed=3, duration=DURATION)
    store = Store(retention=7200)
    for name, labels, ts, vals in corpus.samples(sc):
        if name.startswith("host_tcp_"):
            # the host: five times the segments, its own resends a fifth of the proxy's
            host = 5.0 * vals if name == "host_tcp_out_segments_total" else 0.2 * vals
            for t, v, h in zip(ts.tolist(), vals.tolist(), host.tolist(), strict=True):
                store.append(name, {**labels, "netns": "aivitals-x-loss"}, v, t)
                store.append(name, labels, h, t)
            continue
        for t, v in zip(ts.tolist(), vals.tolist(), strict=True):
            store.append(name, labels, v, t)
    summed = (
        "sum(rate(host_tcp_retransmitted_segments_total[1m]))"
        " / sum(rate(host_tcp_out_segments_total[1m]))"
    )
    assert 0 < store.query(summed, sc.end).values()[0] < 0.05  # the old reading: diluted
    d = diagnose(store, end=sc.end)
    top = d.findings[0]
    assert (top.signature, top.layer) == ("network_loss", "infrastructure")
    ratio = next(e for e in top.evidence if e.role == "required")
    held = {lab.get("netns", ""): v for lab, v in ratio.values}
    assert held["aivitals-x-loss"] > 0.05 and "" not in held  # the namespace's, not the host's


def test_kernel_events_are_evidence() -> None:
    sc, store = _loaded("gpu_xid")
    d = diagnose(store, end=sc.end, events=sc.events)
    top = d.findings[0]
    assert top.signature == "gpu_xid" and "Xid 79" in top.title
    assert any(e.held and "kernel" in e.expr for e in top.evidence)
    assert d.events and d.events[0].kind == "kernel"


def test_alerts_are_taken_as_events() -> None:
    sc, store = _loaded("gpu_memory_leak")

    class Alert:
        alertname = "GPUMemoryHigh"
        labels = {"gpu": "0"}
        state = "firing"
        active_at = sc.fault_start + 30
        fired_at = sc.fault_start + 60

    d = diagnose(store, end=sc.end, alerts=[Alert()])
    assert any(e.kind == "alert" and "GPUMemoryHigh" in e.text for e in d.events)


def test_an_unknown_fault_still_gets_the_anomalous_layer() -> None:
    sc = corpus.scenario(None, seed=4, duration=DURATION, after=180)
    at = int(DURATION - 180)
    sc.state.disk_util[at:] = 0.6  # busy, but under every disk signature's threshold
    d = diagnose(corpus.to_store(sc), end=sc.end)  # type: ignore[arg-type]
    top = d.findings[0]
    assert top.signature == "anomaly_infrastructure"
    assert top.confidence < 0.5
    assert any("disk_busy" in e.says for e in top.evidence)


def test_events_outside_the_window_are_ignored() -> None:
    sc, store = _loaded(None)
    old = Event(sc.start - 3600, "kernel", "NVRM: Xid (PCI:0000:3b:00): 79")
    d = diagnose(store, end=sc.end, events=[old])
    assert d.events == []
    assert all(f.signature != "gpu_xid" for f in d.findings)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"window": 0.0}, "window"),
        ({"window": float("nan")}, "window"),
        ({"step": -1.0}, "step"),
        ({"step": 1000.0, "window": 1800.0}, "step"),
        ({"end": float("inf")}, "end"),
        ({"params": {"no_such_signature": {"x": 1.0}}}, "no_such_signature"),
    ],
)
def test_bad_arguments_raise_config_error_naming_them(kwargs: dict[str, Any], message: str) -> None:
    from aivitals.errors import ConfigError

    with pytest.raises(ConfigError, match=message):
        diagnose(Store(), **{"end": 1e9, **kwargs})


def test_param_overrides_change_a_threshold() -> None:
    sc, store = _loaded("connection_flood")
    # with a threshold above the flood, that supporting evidence no longer holds
    d = diagnose(store, end=sc.end, params={"connection_flood": {"connections": 1e9}})
    f = next(f for f in d.findings if f.signature == "connection_flood")
    assert not any(e.held for e in f.evidence if "threshold of established" in e.says)


def test_an_empty_store_is_healthy_and_lists_every_missing_source() -> None:
    d = diagnose(Store(), end=1e9)
    assert d.shape is Shape.HEALTHY
    assert d.findings == []
    sources = {u.what.split(":")[0] for u in d.unseen}
    assert {"collect.gpu", "collect.host", "instrument"} <= sources


def _steady_store(extra: dict[str, float], seconds: int = 900) -> tuple[Store, float]:
    """A quiet service plus ``extra`` gauges/counters held constant for ``seconds``."""
    store = Store()
    t0 = 1_700_000_000.0
    for k in range(seconds):
        t = t0 + k
        store.append("up", {"job": "demo"}, 1.0, t)
        for name, value in extra.items():
            store.append(name, {"gpu": "0", "backend": "sim"}, value, t)
    return store, t0 + seconds - 1


def test_a_sticky_last_xid_gauge_without_new_xids_names_no_xid() -> None:
    # the sim device keeps gpu_last_xid at 79 after the xid fault; the count stopped rising
    store, end = _steady_store({"gpu_last_xid": 79.0, "gpu_xid_errors_total": 3.0})
    d = diagnose(store, end=end, window=600)
    assert "gpu_xid" not in {f.signature for f in d.findings}


def test_a_rising_xid_count_names_gpu_xid() -> None:
    store, end = _steady_store({"gpu_last_xid": 79.0}, seconds=600)
    for k in range(120):  # the count rises in the last two minutes
        store.append(
            "gpu_xid_errors_total", {"gpu": "0", "xid": "79"}, float(k // 10), end - 119 + k
        )
    d = diagnose(store, end=end, window=600)
    assert "gpu_xid" in {f.signature for f in d.findings}


@pytest.mark.parametrize(
    ("window", "step", "rate"), [(1800.0, 3.0, "60s"), (30.0, 1.0, "7s"), (40.0, 1.0, "10s")]
)
def test_the_rate_window_is_a_minute_or_a_quarter_of_a_short_window(
    window: float, step: float, rate: str
) -> None:
    from aivitals.diagnose._engine import _rate_window

    assert _rate_window(window, step) == rate


# --- what a fault-free soak named (issue #14): each is a case the old rule got wrong ----------
def _healthy_with(change: Any, seed: int = 2) -> tuple[Any, Any]:
    """Fault-free traffic over ``DURATION`` s with ``change(state, n)`` applied."""
    sc = corpus.scenario(None, seed=seed, duration=DURATION, after=0.0)
    change(sc.state, sc.state.n)
    return sc, diagnose(corpus.to_store(sc), end=sc.end)


def _high(d: Any) -> set[str]:
    return {f.signature for f in d.findings if f.confidence >= HIGH_CONFIDENCE}


def test_a_scrape_that_fails_now_and_then_is_not_a_service_down() -> None:
    # a loop blocked by sync work misses a scrape now and then (two failed 1 s scrapes in
    # a quick run would name service_down over event_loop_blocked)
    def flicker(s: Any, n: int) -> None:  # one scrape in five fails over the last 2 minutes
        k = np.arange(n)
        s.up = np.where((k >= n - 120) & (k % 5 == 0), 0.0, 1.0)

    _, d = _healthy_with(flicker)
    assert "service_down" not in {f.signature for f in d.findings}


def test_a_target_that_fails_every_scrape_is_down() -> None:
    def down(s: Any, n: int) -> None:  # down for the last 2 minutes (the rate window: 1m)
        s.up = np.where(np.arange(n) >= n - 120, 0.0, 1.0)

    _, d = _healthy_with(down)
    assert d.findings and d.findings[0].signature == "service_down", [
        (f.signature, f.confidence) for f in d.findings
    ]


def test_a_traffic_rise_the_service_absorbs_is_not_a_surge() -> None:
    def rise(s: Any, n: int) -> None:  # +65 % over the last 3 minutes, nothing else moves
        s.rps = s.rps * np.where(np.arange(n) >= n - 180, 1.65, 1.0)

    _, d = _healthy_with(rise)
    assert "traffic_surge" not in _high(d), [(f.signature, f.confidence) for f in d.findings]

    # doubled, with a longer queue and latency: a surge
    def surge(s: Any, n: int) -> None:
        late = np.arange(n) >= n - 180
        s.rps = s.rps * np.where(late, 2.5, 1.0)
        s.queue = s.queue + np.where(late, 20.0, 0.0)
        s.lat_median = s.lat_median * np.where(late, 2.0, 1.0)

    _, d = _healthy_with(surge)
    assert d.findings[0].signature == "traffic_surge"


def test_one_observation_without_any_effect_it_should_have_is_a_lead_not_a_finding() -> None:
    from aivitals.diagnose._engine import LEAD_CONFIDENCE, _confidence
    from aivitals.diagnose._model import EvidenceResult

    def ev(role: str, held: bool) -> EvidenceResult:
        return EvidenceResult(role, "", "", held=held, seen=True, since=0.0, new=True)

    alone = _confidence([ev("required", True), ev("supporting", False), ev("supporting", False)])
    assert alone == LEAD_CONFIDENCE < HIGH_CONFIDENCE
    felt = [ev("required", True), ev("supporting", True), ev("supporting", False)]
    with_effect = _confidence(felt)
    assert with_effect >= HIGH_CONFIDENCE
    # two required observations that agree are specific enough on their own
    both = _confidence([ev("required", True), ev("required", True), ev("supporting", False)])
    assert both >= HIGH_CONFIDENCE


def test_a_model_load_minutes_before_a_latency_rise_is_not_its_cold_start() -> None:
    def late_slowdown(s: Any, n: int) -> None:
        t = np.arange(n)
        s.load_time = np.where(t >= n - 480, 8.2, s.load_time)  # reloaded 8 minutes back
        s.lat_median = s.lat_median * np.where(t >= n - 120, 3.0, 1.0)

    _, d = _healthy_with(late_slowdown)
    assert "cold_start" not in _high(d), [(f.signature, f.confidence) for f in d.findings]

    def reload_then_slow(s: Any, n: int) -> None:  # the same reload, the spike right after it
        t = np.arange(n)
        s.load_time = np.where(t >= n - 60, 8.2, s.load_time)
        s.lat_median = s.lat_median * np.where(t >= n - 60, 3.0, 1.0)

    _, d = _healthy_with(reload_then_slow)
    assert "cold_start" in _high(d)


@pytest.mark.slow
def test_a_warm_swap_that_slows_requests_is_not_a_cold_start() -> None:
    """The planned reload of validate's soak: new weights loaded beside the serving copy,
    a 0.6 s load after a start-up load that took 8.6 s, and a P99 rise from the load's CPU.
    Neither the start-up load's time nor the rise makes it a cold start; the same load
    counted cold does."""

    def swap(mode: int) -> Any:
        def change(s: Any, n: int) -> None:
            t = np.arange(n)
            s.load_time = np.where(t >= n - 60, 0.6, 8.6)
            s.lat_median = s.lat_median * np.where(t >= n - 60, 3.0, 1.0)
            counts = [np.ones(n), np.zeros(n)]  # the start-up load, cold
            counts[mode] = counts[mode] + (t >= n - 60)
            s.loads = (counts[0], counts[1])

        return change

    _, d = _healthy_with(swap(1))
    named = [(f.signature, f.confidence) for f in d.findings]
    assert "cold_start" not in _high(d), named
    (found,) = [f for f in d.findings if f.signature == "cold_start"]
    said = {e.says: e.held for e in found.evidence}
    assert said["Loading the model takes over a second."] is False, said
    assert said["The load was a warm swap (loaded beside the serving copy), not a cold one."]

    _, d = _healthy_with(swap(0))
    assert "cold_start" in _high(d), [(f.signature, f.confidence) for f in d.findings]

    # a fleet: one node swapped warm, one loaded cold, two did nothing. The swap excuses
    # only its own node
    store = Store(retention=1e9)
    for node, mode in (("a", 1), ("b", 0), ("c", None), ("d", None)):
        sc = corpus.scenario(None, seed=2, duration=DURATION, after=0.0)
        if mode is not None:
            swap(mode)(sc.state, sc.state.n)
        corpus.to_store(sc, store, extra_labels={"node": node})
    fleet = diagnose(store, end=sc.end, location="node")
    cold = [f for f in fleet.findings if f.signature == "cold_start"]
    high = {f.where.get("node") for f in cold if f.confidence >= HIGH_CONFIDENCE}
    assert high == {"b"}, [(f.where, f.confidence) for f in cold]


def _filled_device(ramp_s: int) -> tuple[Store, float, float]:
    """Process 4242's GPU memory grows over ``ramp_s`` seconds (0: one step) until the
    device is full, then calls fail with CUDA_OOM: a store 30 minutes long, the fill's
    time and the start of a window a minute before the growth began."""
    sc = corpus.scenario(None, seed=2, duration=1800.0, after=0.0)
    s, t, at = sc.state, np.arange(sc.state.n), 1000
    room = s.gpu_total - s.proc_mem["4242"][0] - 1.5 * 2**30
    grow = np.clip((t - at) * room / ramp_s, 0, room) if ramp_s else np.where(t >= at, room, 0.0)
    s.proc_mem["4242"] = s.proc_mem["4242"] + grow
    s.counters["CUDA_OOM"] = np.where(t >= at + ramp_s, 0.7, 0.0)
    s.status["503"] = np.where(t >= at + ramp_s, 0.7, 0.0)
    return corpus.to_store(sc), sc.start + at + ramp_s, sc.start + at - 60


@pytest.mark.slow
def test_a_leak_that_fills_the_device_is_still_the_leak_once_calls_fail_oom() -> None:
    """The full-length validate run's leak (7 minutes of growth, then CUDA_OOM on 18 % of
    calls): once the device was full the rate-window slope fell to 0 and gpu_oom was
    named from the first OOM on. The leak is the cause and its runbook the one that
    helps; a single large allocation before the OOMs is no leak."""
    store, full, base = _filled_device(420)
    for after in (0, 60, 180, 300):
        d = diagnose(store, end=full + after, window=full + after - base)
        named = [(f.signature, f.confidence) for f in d.findings[:3]]
        assert d.findings[0].signature == "gpu_memory_leak", (after, named)
        assert "gpu_oom" not in _high(d), (after, named)
    store, full, base = _filled_device(0)
    for after in (60, 300):
        d = diagnose(store, end=full + after, window=full + after - base)
        named = [(f.signature, f.confidence) for f in d.findings[:3]]
        assert d.findings[0].signature == "gpu_oom", (after, named)


def test_cpu_that_follows_the_traffic_is_not_cpu_bound_preprocessing() -> None:
    def busier(s: Any, n: int) -> None:  # twice the requests, twice the CPU, a slower P99
        late = np.arange(n) >= n - 180
        s.rps = s.rps * np.where(late, 1.9, 1.0)
        s.proc_cpu = s.proc_cpu * np.where(late, 1.9, 1.0)
        s.lat_median = s.lat_median * np.where(late, 1.5, 1.0)
        s.gpu_util = np.minimum(s.gpu_util, 0.2)

    _, d = _healthy_with(busier)
    named = [(f.signature, f.confidence) for f in d.findings]
    assert "cpu_bound_preprocessing" not in _high(d), named


def _heavier_requests(s: Any, n: int) -> None:
    """The same request rate, each request heavier for the model (longer prompts, more
    generation calls in the mix): the server's CPU per request and the model's own time
    per request rise together, the sim GPU idles and P99 rises."""
    late = np.arange(n) >= n - 180
    s.proc_cpu = s.proc_cpu * np.where(late, 1.8, 1.0)
    s.infer_median = s.infer_median * np.where(late, 1.8, 1.0)
    s.lat_median = s.lat_median * np.where(late, 1.8, 1.0)
    s.gpu_util = np.minimum(s.gpu_util, 0.2)


def test_cpu_that_goes_into_the_model_call_is_not_cpu_bound_preprocessing() -> None:
    # CPU time per request is an average over a mix: in the recorded quick soaks (18, 486
    # polls) its rises tracked the model's own time per request (correlation 0.95), and
    # every rise of 30 % or more came with a larger rise of the model's time
    _, d = _healthy_with(_heavier_requests)
    cpu = next((f for f in d.findings if f.signature == "cpu_bound_preprocessing"), None)
    named = [(f.signature, f.confidence) for f in d.findings]
    assert "cpu_bound_preprocessing" not in _high(d), named
    assert cpu is None or any(
        e.role == "contradicting" and e.held and "model's own time" in e.says for e in cpu.evidence
    ), named

    # the same CPU rise around a model call that keeps its time is preprocessing
    def around(s: Any, n: int) -> None:
        _heavier_requests(s, n)
        s.infer_median = s.infer_median / np.where(np.arange(n) >= n - 180, 1.8, 1.0)

    _, d = _healthy_with(around)
    named = [(f.signature, f.confidence) for f in d.findings]
    assert "cpu_bound_preprocessing" in _high(d), named


def test_a_gpu_lost_after_an_xid_79_is_named_while_inference_still_fails() -> None:
    # the Xid counter first appears (at its value) 150 s back; the GPU stays gone and every
    # model call fails with XID since. A rate window later the Xid itself is old news,
    # the failing inference is not
    store, end = _steady_store({}, seconds=300)
    for k in range(150):
        t = end - 149 + k
        store.append("gpu_xid_errors_total", {"gpu": "0", "xid": "79"}, 1.0, t)
        store.append("errors_total", {"error_code": "XID"}, float(3 * k + 3), t)
    d = diagnose(store, end=end, window=300)
    assert "gpu_xid" in _high(d), [(f.signature, f.confidence) for f in d.findings]
    # an Xid 200 s back, the device reset 20 s after it (no failure since): not named
    store, end = _steady_store({}, seconds=300)
    for k in range(200):
        t = end - 199 + k
        store.append("gpu_xid_errors_total", {"gpu": "0", "xid": "79"}, 1.0, t)
        store.append("errors_total", {"error_code": "XID"}, float(min(3 * k + 3, 60)), t)
    d = diagnose(store, end=end, window=300)
    assert "gpu_xid" not in {f.signature for f in d.findings}


@pytest.mark.parametrize("rate", [0.5, -1.0, float("nan"), True])
def test_a_rate_window_under_two_steps_or_not_a_number_is_refused(rate: Any) -> None:
    with pytest.raises(ConfigError, match="rate"):
        diagnose(Store(), end=1e9, window=60, step=1.0, rate=rate)


def test_the_rate_window_can_be_set_for_a_short_window() -> None:
    # a compressed run's 15 s window reads rates over its rule pack's 8 s, not 4 s
    from aivitals.diagnose import parse_signatures

    (sig,) = parse_signatures(
        """
- id: scraped
  layer: service
  title: Scraped
  summary: The target answers.
  shapes: [unavailable]
  required:
    - expr: count(rate(up[${rate}]) >= 0) > 0
      says: The target was scraped.
  commands: [true]
  stop_loss: [none]
"""
    )
    store, end = _steady_store({}, seconds=120)
    for rate, text in ((None, "[4s]"), (8.0, "[8s]")):
        d = diagnose(store, end=end, window=15, step=1.0, rate=rate, signatures=[sig])
        assert text in d.findings[0].evidence[0].expr


def test_a_client_whose_added_requests_fail_out_of_memory_is_gpu_oom_not_a_surge() -> None:
    # the over-long client doubles the request rate, and its calls fail with CUDA_OOM
    sc = corpus.scenario("gpu_oom", seed=1, duration=DURATION)
    late = np.arange(sc.state.n) >= sc.state.n - 180
    sc.state.rps = sc.state.rps * np.where(late, 2.5, 1.0)
    sc.state.queue = sc.state.queue + np.where(late, 10.0, 0.0)
    d = diagnose(corpus.to_store(sc), end=sc.end)
    named = [(f.signature, f.confidence) for f in d.findings]
    assert d.findings[0].signature == "gpu_oom", named
    surge = next((f for f in d.findings if f.signature == "traffic_surge"), None)
    assert surge is None or any(e.role == "contradicting" and e.held for e in surge.evidence)


def test_a_small_pool_full_at_some_scrapes_of_a_burst_is_not_saturated() -> None:
    # two workers; in the last 3 minutes a bursty load fills both at one scrape in four
    # (the soak's replayed trace did this every minute), half of them busy otherwise
    store = Store()
    t0 = 1_700_000_000.0
    n = 600
    rng = np.random.default_rng(3)
    for k in range(n):
        t = t0 + k
        late = k >= n - 180
        active = (2.0 if k % 4 == 0 else 1.0) if late else float(rng.random() < 0.05)
        store.append("up", {"job": "demo"}, 1.0, t)
        store.append("worker_pool_active_workers", {"pool": "model"}, active, t)
        store.append("worker_pool_max_workers", {"pool": "model"}, 2.0, t)
    d = diagnose(store, end=t0 + n - 1, window=600)
    assert "worker_pool_saturated" not in _high(d), [
        (f.signature, f.confidence) for f in d.findings
    ]


def test_a_two_minute_swing_of_input_length_is_not_a_shift() -> None:
    # the 60-minute soak's replayed Azure conversations: the median input swings by
    # half for a minute or two, now and then; a 3-minute poll window that starts in a
    # trough read the next crest as a shift (input_length_shift 0.90 at 2070 s)
    sc = corpus.scenario(None, seed=4, duration=1200.0, after=0.0)
    k = np.arange(sc.state.n)
    crests = (k % 240) >= 120  # 2 minutes of every 4 at x1.4 for the first 17 minutes
    swing = np.where(crests, 1.4, 1.0)
    swing[-180:] = np.where(k[-180:] >= sc.state.n - 90, 1.6, 1.0)  # a trough, then a crest
    sc.state.in_tokens = sc.state.in_tokens * swing
    d = diagnose(corpus.to_store(sc), end=sc.end, window=180)
    assert "input_length_shift" not in _high(d), [(f.signature, f.confidence) for f in d.findings]
    shift = next((f for f in d.findings if f.signature == "input_length_shift"), None)
    assert shift is None or any(
        e.role == "contradicting" and e.held and "4 minutes" in e.says for e in shift.evidence
    )

    # the same crest held after 15 steady minutes is a shift
    sc = corpus.scenario("input_length_shift", seed=4, duration=1200.0)
    d = diagnose(corpus.to_store(sc), end=sc.end, window=180)
    assert d.findings and d.findings[0].signature == "input_length_shift"


def test_long_inputs_that_run_the_gpu_out_of_memory_are_gpu_oom_not_a_length_shift() -> None:
    # gpu_oom's over-long client raises the median input too (enough to rank
    # input_length_shift 0.90 over gpu_oom 0.73): the OOMs name the sharper cause
    sc = corpus.scenario("gpu_oom", seed=1, duration=DURATION)
    late = np.arange(sc.state.n) >= sc.state.n - 180
    sc.state.in_tokens = sc.state.in_tokens * np.where(late, 3.0, 1.0)
    d = diagnose(corpus.to_store(sc), end=sc.end, events=sc.events)
    named = [(f.signature, f.confidence) for f in d.findings]
    assert d.findings[0].signature == "gpu_oom", named
    shift = next((f for f in d.findings if f.signature == "input_length_shift"), None)
    assert shift is None or any(e.role == "contradicting" and e.held for e in shift.evidence)


def test_a_saturated_disk_whose_requests_take_more_cpu_is_disk_io_not_preprocessing() -> None:
    # while fio saturates the disk, the server's CPU time per request rises by half, the
    # sim GPU idles and P99 rises (all of cpu_bound_preprocessing's required items): enough
    # to rank it 0.75 over disk_io_saturation 0.74
    sc = corpus.scenario("disk_io_saturation", seed=2, duration=DURATION)
    late = np.arange(sc.state.n) >= sc.state.n - 180
    sc.state.proc_cpu = sc.state.proc_cpu * np.where(late, 1.8, 1.0)
    sc.state.gpu_util = sc.state.gpu_util * np.where(late, 0.3, 1.0)
    sc.state.lat_median = sc.state.lat_median * np.where(late, 2.0, 1.0)
    d = diagnose(corpus.to_store(sc), end=sc.end)
    named = [(f.signature, f.confidence) for f in d.findings]
    assert d.findings[0].signature == "disk_io_saturation", named
    cpu = next((f for f in d.findings if f.signature == "cpu_bound_preprocessing"), None)
    assert cpu is None or any(
        e.role == "contradicting" and e.held and "disk" in e.says for e in cpu.evidence
    ), named

    # the same CPU rise on an idle disk is preprocessing
    sc = corpus.scenario("cpu_bound_preprocessing", seed=2, duration=DURATION)
    d = diagnose(corpus.to_store(sc), end=sc.end)
    assert d.findings[0].signature == "cpu_bound_preprocessing"
    assert not any(e.role == "contradicting" and e.held for e in d.findings[0].evidence)


def test_a_process_seen_by_the_agent_and_by_its_own_service_counts_once() -> None:
    """A multiprocess service exports its workers' ``service_process_*`` and the agent
    follows the same pids: the vital sums take each (node, pid) once."""
    from aivitals.diagnose._engine import VITALS

    exprs = {name: expr for name, _, expr in VITALS}
    store = Store()
    for t in range(60):
        for job in ("agent", "encode"):  # two sources, the same two workers
            for pid, rss in (("41", 1e9), ("42", 2e9)):
                labels = {"job": job, "pid": pid, "process": "gunicorn"}
                store.append("service_process_resident_memory_bytes", labels, rss, float(t))
                store.append("service_process_cpu_seconds_total", labels, 0.5 * t, float(t))
    rss = store.query(exprs["process_rss"], 59.0)
    cpu = store.query(exprs["process_cpu"].replace("${rate}", "20s"), 59.0)
    assert rss.values() == [3e9]
    assert [round(v, 6) for v in cpu.values()] == [1.0]
