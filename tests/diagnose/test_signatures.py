from __future__ import annotations

from pathlib import Path

import promql_parser
import pytest

from aivitals import signals
from aivitals.diagnose import Finding, load_signatures, parse_signatures
from aivitals.diagnose._signatures import LAYERS
from aivitals.errors import SignatureError

CONTRACT_FAULTS = {
    "gpu_memory_leak",
    "gpu_oom",
    "gpu_xid",
    "gpu_cotenant",
    "gpu_contention",
    "event_loop_blocked",
    "worker_pool_saturated",
    "connection_flood",
    "overlong_inputs",
    "malformed_inputs",
    "cache_stampede",
    "cpu_burn",
    "process_memory_leak",
    "disk_io_saturation",
    "network_loss",
    "network_latency",
    "traffic_surge",
    "cold_start",
    "timeouts_not_aborting",
}
ISSUE_EXTRAS = {
    "kv_cache_pressure",
    "qps_limiter_misplaced",
    "host_oom_kill",
    "swap_pressure",
    "input_length_shift",
    "semantic_degradation",
    "queue_saturation_idle_gpu",
    "cpu_bound_preprocessing",
    "dependency_down",
}

GOOD = """
id: my_fault
layer: service
title: My fault on {route}
required:
  - expr: sum(rate(errors_total[${rate}])) > ${limit}
    says: Errors happen.
params: {limit: 3}
commands: ["curl http://127.0.0.1:{port}/metrics"]
"""


def test_builtin_knowledge_base_has_at_least_25_signatures_covering_the_faults() -> None:
    sigs = load_signatures()
    ids = {s.id for s in sigs}
    assert len(sigs) >= 25
    assert ids >= CONTRACT_FAULTS
    assert ids >= ISSUE_EXTRAS
    # redis_down is named by its own signature (the fault's layer); dependency_down is the rest
    redis = next(s for s in sigs if s.id == "redis_down")
    assert redis.layer == "infrastructure"
    assert "redis_down" in next(s for s in sigs if s.id == "dependency_down").aliases


def test_every_signature_is_complete_and_every_expression_parses_after_rendering() -> None:
    for sig in load_signatures():
        assert sig.layer in LAYERS
        assert sig.commands, sig.id
        assert sig.stop_loss, sig.id
        assert sig.of_role("required") or any(e.role == "required" for e in sig.events)
        for ev in sig.render(rate="1m").evidence:
            assert ev.says.strip(), sig.id
            promql_parser.parse(ev.expr)


def test_evidence_uses_catalogue_metric_names_only() -> None:
    import re

    for sig in load_signatures():
        for ev in sig.render(rate="1m").evidence:
            for name in re.findall(
                r"\b([a-z_]+_(?:total|bytes|seconds|ratio|length|workers|"
                r"fds|connections|hertz|watts|xid|bucket))\b",
                ev.expr,
            ):
                assert name == "up" or signals.family_of(name) is not None, (sig.id, name)


def test_params_and_rate_are_filled_in() -> None:
    (sig,) = parse_signatures(GOOD)
    r = sig.render({"limit": 7}, rate="2m")
    assert r.evidence[0].expr == "sum(rate(errors_total[2m])) > 7"
    assert sig.render(rate="1m").evidence[0].expr.endswith("> 3")


def test_a_horizon_in_rate_windows_shrinks_with_the_window() -> None:
    (sig,) = parse_signatures(
        GOOD.replace(
            "sum(rate(errors_total[${rate}])) > ${limit}",
            "predict_linear(x_bytes[${rate}], ${limit} * ${rate_seconds}) < 0",
        )
    )
    assert "[1m], 3 * 60)" in sig.render(rate="1m").evidence[0].expr
    assert "[8s], 3 * 8)" in sig.render(rate="8s").evidence[0].expr


def test_invalid_expression_is_rejected_with_id_and_parse_error() -> None:
    bad = GOOD.replace("sum(rate(errors_total[${rate}]))", "sum(rate(errors_total[${rate}])")
    with pytest.raises(SignatureError, match=r"my_fault.*invalid PromQL"):
        parse_signatures(bad)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (("layer: service", "layer: gpu"), "layer must be one of"),
        (("id: my_fault", "id: My-Fault"), "lower_snake_case"),
        (("params: {limit: 3}", "params: {limit: many}"), "param 'limit' must be a number"),
        (("params: {limit: 3}", "params: {}"), r"params has no 'limit'"),
        (("title: My fault on {route}", "title: ''"), "title must be a non-empty string"),
        (("layer: service", "layer: service\nshapes: [slow]"), "unknown shapes"),
        (("layer: service", "layer: service\nfoo: 1"), "unknown keys"),
        (("layer: service", "layer: service\nprior: 2"), "prior must be"),
    ],
)
def test_bad_fields_are_rejected_naming_the_problem(change: tuple[str, str], message: str) -> None:
    with pytest.raises(SignatureError, match=message):
        parse_signatures(GOOD.replace(*change))


def test_a_signature_without_required_evidence_is_rejected() -> None:
    text = GOOD.replace("required:", "supporting:")
    with pytest.raises(SignatureError, match="at least one required"):
        parse_signatures(text)


def test_bad_event_regex_is_rejected() -> None:
    text = GOOD + "events:\n  - {kind: kernel, match: '(unclosed', says: x}\n"
    with pytest.raises(SignatureError, match="invalid event regex"):
        parse_signatures(text)


def test_not_yaml_is_a_signature_error() -> None:
    with pytest.raises(SignatureError, match="not valid YAML"):
        parse_signatures("id: [unclosed")


def test_extra_files_load_beside_the_builtin_ones_and_duplicates_are_refused(
    tmp_path: Path,
) -> None:
    (tmp_path / "mine.yaml").write_text(GOOD)
    sigs = load_signatures([tmp_path])
    assert "my_fault" in {s.id for s in sigs}
    (tmp_path / "again.yaml").write_text(GOOD)
    with pytest.raises(SignatureError, match="defined twice"):
        load_signatures([tmp_path])


def test_a_missing_signature_path_is_a_signature_error(tmp_path: Path) -> None:
    with pytest.raises(SignatureError, match="no such file"):
        load_signatures([tmp_path / "absent.yaml"])


def test_public_names_exist_once() -> None:
    import aivitals.diagnose as pkg

    assert len(pkg.__all__) == len(set(pkg.__all__))
    for name in pkg.__all__:
        assert hasattr(pkg, name), name


def _cache_store(hits: list[float], misses: list[float]) -> object:
    """Per-second hit and miss rates of one cache, 1 s apart, as counters."""
    from aivitals.tsdb import Store

    store = Store(retention=1e9)
    h = m = 0.0
    for i, (dh, dm) in enumerate(zip(hits, misses, strict=True)):
        h, m = h + dh, m + dm
        store.append("cache_requests_total", {"cache": "c", "result": "hit"}, h, float(i))
        store.append("cache_requests_total", {"cache": "c", "result": "miss"}, m, float(i))
    return store


def test_a_stampede_is_hits_turning_into_misses_not_hits_going_away() -> None:
    from aivitals.diagnose import diagnose

    # 4 min warm (4 hits/s, 2 misses/s); then keys expire: the hits become misses
    stampede = _cache_store([4.0] * 240 + [0.0] * 60, [2.0] * 240 + [6.0] * 60)
    # the same fall of the ratio, but the client whose requests hit left: misses as before
    client_left = _cache_store([4.0] * 240 + [0.0] * 60, [2.0] * 240 + [2.0] * 60)
    named = [f.signature for f in diagnose(stampede, end=299.0, window=120.0, step=1.0).findings]
    assert "cache_stampede" in named
    named = [f.signature for f in diagnose(client_left, end=299.0, window=120.0, step=1.0).findings]
    assert "cache_stampede" not in named


def test_a_surge_whose_refusals_take_the_hits_away_is_no_stampede() -> None:
    """Admission control refuses the surge and the clients whose lookups hit alike: the
    hits fall, new inputs miss, the ratio collapses; every required part of a stampede
    holds, but the lookups are ten times their usual number."""
    from aivitals.diagnose import diagnose

    def stampede_confidence(store: object) -> float:
        found = diagnose(store, end=299.0, window=120.0, step=1.0).findings
        return next((f.confidence for f in found if f.signature == "cache_stampede"), 0.0)

    expired = _cache_store([4.0] * 240 + [0.0] * 60, [2.0] * 240 + [6.0] * 60)
    surge = _cache_store([4.0] * 240 + [1.0] * 60, [2.0] * 240 + [60.0] * 60)
    assert stampede_confidence(expired) > 0
    # contradicted: half the confidence of the same evidence at the usual lookups
    assert 0 < stampede_confidence(surge) <= 0.5 * stampede_confidence(expired) + 1e-9


def _counters(store: object, series: dict[str, tuple[dict[str, str], list[float]]]) -> None:
    """Per-second increments as counters, 1 s apart."""
    for name, (labels, per_s) in series.items():
        total = 0.0
        for i, d in enumerate(per_s):
            total += d
            store.append(name, labels, total, float(i))  # type: ignore[attr-defined]


def test_a_rise_of_requests_the_input_guard_refuses_is_not_a_traffic_surge() -> None:
    from aivitals.diagnose import diagnose
    from aivitals.tsdb import Store

    def store(rejected: float) -> Store:
        s = Store(retention=1e9)
        _counters(
            s,
            {
                "http_request_duration_seconds_count": (
                    {"route": "/v1"},
                    [4.0] * 120 + [14.0] * 60,
                ),
                "input_rejections_total": ({"reason": "x"}, [0.0] * 120 + [rejected] * 60),
            },
        )
        return s

    def surge(s: Store) -> float:
        found = diagnose(s, end=179.0, window=120.0, step=1.0).findings
        return next((f.confidence for f in found if f.signature == "traffic_surge"), 0.0)

    # contradicted: half the confidence (it may still be listed, below what explains it)
    assert surge(store(10.0)) <= 0.5 * surge(store(0.0)) + 1e-9
    assert surge(store(0.0)) > 0


def test_a_small_pool_sampled_busy_in_its_baseline_still_shows_its_saturation() -> None:
    """Two workers at 0.2 s an inference are busy about 30 % of the time, but a scrape
    samples them at 0, 1 or 2: the instant gauge's baseline spans 0-1 and hides the rise
    to 1.0 that the busy-time counter shows plainly (validate's worker_pool_saturated
    case right after event_loop_blocked)."""
    from aivitals.diagnose import diagnose
    from aivitals.tsdb import Store

    s = Store(retention=1e9)
    pool = {"pool": "model"}
    cycle = [0.0, 1.0, 2.0, 1.0, 2.0]  # instant samples of a ~30 % busy pool of two
    for i in range(60):
        s.append("worker_pool_max_workers", pool, 2.0, float(i))
        s.append("worker_pool_active_workers", pool, cycle[i % 5] if i < 30 else 2.0, float(i))
    _counters(s, {"worker_pool_busy_seconds_total": (pool, [0.6] * 30 + [2.0] * 30)})
    found = diagnose(s, end=59.0, window=59.0, step=1.0, rate=8.0).findings
    assert found and found[0].signature == "worker_pool_saturated", found


def test_a_pool_full_of_work_whose_requests_left_is_not_the_pools_own_fault() -> None:
    """Timeouts that do not abort fill the pool with orphans: it is saturated, but the
    model runs longer than the requests wait for it, which a pool of stuck workers never
    does; the pool's own finding is contradicted there."""
    from aivitals.diagnose import diagnose
    from aivitals.tsdb import Store

    def store(model_s: float) -> Store:
        s = Store(retention=1e9)
        pool = {"pool": "model"}
        for i in range(60):
            s.append("worker_pool_max_workers", pool, 2.0, float(i))
        _counters(
            s,
            {
                "worker_pool_busy_seconds_total": (pool, [0.6] * 30 + [2.0] * 30),
                "http_request_duration_seconds_sum": ({"route": "/v1"}, [1.0] * 60),
                "model_inference_time_seconds_sum": ({"model": "m"}, [0.6] * 30 + [model_s] * 30),
            },
        )
        return s

    def pool_saturated(s: Store) -> float:
        found = diagnose(s, end=59.0, window=59.0, step=1.0, rate=8.0).findings
        return next((f.confidence for f in found if f.signature == "worker_pool_saturated"), 0.0)

    stuck, orphans = pool_saturated(store(0.2)), pool_saturated(store(1.6))
    assert stuck > 0
    assert orphans <= 0.5 * stuck + 1e-3  # contradicted: half (confidences keep 3 decimals)


def test_timeouts_that_abort_nothing_while_the_model_works_are_not_the_pools_own_fault() -> None:
    """The orphans counted rather than timed: requests leave at their deadline, nothing
    is aborted, and the model keeps finishing calls. Stuck workers finish none, and a
    service whose deadlines abort the work counts aborts: neither is contradicted."""
    from aivitals.diagnose import diagnose
    from aivitals.tsdb import Store

    def store(timeouts: float, aborts: float, calls: float) -> Store:
        s = Store(retention=1e9)
        pool = {"pool": "model"}
        for i in range(60):
            s.append("worker_pool_max_workers", pool, 2.0, float(i))
        late = [0.0] * 30
        _counters(
            s,
            {
                "worker_pool_busy_seconds_total": (pool, [0.6] * 30 + [2.0] * 30),
                # the requests' seconds stay above the model's: the timed orphan
                # contradiction does not hold, only the counted one can
                "http_request_duration_seconds_sum": ({"route": "/v1"}, [1.0] * 60),
                "model_inference_time_seconds_sum": ({"model": "m"}, [0.6] * 60),
                "model_inference_time_seconds_count": ({"model": "m"}, [3.0] * 30 + [calls] * 30),
                "request_timeouts_total": ({"reason": "deadline"}, late + [timeouts] * 30),
                "model_aborts_total": ({"model": "m", "reason": "deadline"}, late + [aborts] * 30),
            },
        )
        return s

    def pool_saturated(s: Store) -> float:
        found = diagnose(s, end=59.0, window=59.0, step=1.0, rate=8.0).findings
        return next((f.confidence for f in found if f.signature == "worker_pool_saturated"), 0.0)

    alone = pool_saturated(store(0.0, 0.0, 3.0))
    assert alone > 0
    orphans = pool_saturated(store(1.0, 0.0, 3.0))
    assert orphans <= 0.5 * alone + 1e-3  # contradicted: half (confidences keep 3 decimals)
    assert pool_saturated(store(1.0, 1.0, 3.0)) == alone  # the deadlines abort the work
    assert pool_saturated(store(1.0, 0.0, 0.0)) > orphans  # stuck: no call finishes


def test_memory_that_ran_out_is_an_oom_not_kv_cache_pressure() -> None:
    """An over-long request fills the device for a moment and fails, leaving the GPU idle:
    "memory near full while the GPU is not busy" holds, but the inference errors say the
    memory ran out (gpu_oom), which KV-cache pressure, absorbed by preempting, does not."""
    from aivitals.diagnose import diagnose
    from aivitals.tsdb import Store

    def store(ooms: float) -> Store:
        s = Store(retention=1e9)
        gpu = {"gpu": "0"}
        for i in range(60):
            s.append("gpu_memory_total_bytes", gpu, 24e9, float(i))
            s.append("gpu_memory_used_bytes", gpu, 14e9 if i < 30 else 23.5e9, float(i))
            s.append("gpu_utilization_ratio", gpu, 0.3 if i < 30 else 0.1, float(i))
        _counters(
            s,
            {
                "model_inference_errors_total": (
                    {"error_code": "CUDA_OOM"},
                    [0.0] * 30 + [ooms] * 30,
                ),
            },
        )
        return s

    def confidence(s: Store, signature: str) -> float:
        found = diagnose(s, end=59.0, window=59.0, step=1.0, rate=8.0).findings
        return next((f.confidence for f in found if f.signature == signature), 0.0)

    pressed, ran_out = store(0.0), store(1.0)
    assert confidence(pressed, "kv_cache_pressure") > 0
    assert (
        confidence(ran_out, "kv_cache_pressure")
        <= 0.5 * confidence(pressed, "kv_cache_pressure") + 1e-3
    )
    assert confidence(ran_out, "gpu_oom") > confidence(ran_out, "kv_cache_pressure")


def test_a_busy_gpu_whose_gauge_dips_between_generations_has_no_room_for_a_qps_cap() -> None:
    """429s with a GPU that has room is a QPS cap in the wrong place; a GPU busy 60 % of the
    time, its gauge dipping to 0 between generations, has no such room (timeouts that do
    not abort)."""
    from aivitals.diagnose import diagnose
    from aivitals.tsdb import Store

    def store(util: list[float]) -> Store:
        s = Store(retention=1e9)
        for i in range(60):
            s.append("gpu_utilization_ratio", {"gpu": "0"}, util[i % len(util)], float(i))
        _counters(s, {"admission_rejections_total": ({"reason": "queue"}, [0.0] * 30 + [3.0] * 30)})
        return s

    def capped(s: Store) -> float:
        found = diagnose(s, end=59.0, window=59.0, step=1.0, rate=8.0).findings
        return next((f.confidence for f in found if f.signature == "qps_limiter_misplaced"), 0.0)

    assert capped(store([0.1])) > 0
    assert capped(store([0.9, 0.9, 0.0, 0.9, 0.3])) == 0.0


# --- a pid's pod in the words of a finding ----------------------------------------------
POD = {"namespace": "team-a", "pod": "llm-0", "container": "server", "pod_uid": "6f1c2b3a"}


def _leak_with(labels: dict[str, str]) -> Finding:
    """The corpus's GPU memory leak (pid 4242), its per-process series carrying ``labels``."""
    from aivitals.diagnose import diagnose
    from aivitals.tsdb import Store
    from tests.diagnose import _corpus as corpus

    sc = corpus.scenario("gpu_memory_leak", seed=5, duration=600.0)
    store = Store(retention=7200.0)
    for name, lab, ts, vals in corpus.samples(sc):
        if name == "gpu_process_memory_used_bytes" and lab.get("pid") == "4242":
            lab = {**lab, **labels}
        for t, v in zip(ts.tolist(), vals.tolist(), strict=True):
            store.append(name, lab, v, t)
    d = diagnose(store, end=sc.end, window=600, events=sc.events)
    top = d.findings[0]
    assert top.signature == "gpu_memory_leak"
    return top


def test_a_finding_names_the_pod_of_its_pid() -> None:
    top = _leak_with(POD)
    assert top.title == "GPU memory leak in pid 4242 in pod team-a/llm-0 on GPU 0"
    assert any("pid 4242 in pod team-a/llm-0 out of rotation" in s for s in top.stop_loss)
    assert "py-spy dump --pid 4242" in top.commands  # commands keep the bare pid
    assert {"namespace": "team-a", "pod": "llm-0", "pod_uid": "6f1c2b3a"}.items() <= (
        top.where.items()
    )


def test_a_pod_known_by_uid_only_and_no_pod() -> None:
    assert _leak_with({"pod_uid": "6f1c2b3a"}).title == (
        "GPU memory leak in pid 4242 in pod uid 6f1c2b3a on GPU 0"
    )
    # a scrape's target labels name the scraped pod, not the pid's: no pod_uid, no pod
    plain = _leak_with({"namespace": "monitoring", "pod": "aivitals-agent-x7k2p"})
    assert plain.title == "GPU memory leak in pid 4242 on GPU 0"


def _filesystem_store(size: float, avail: list[float], writes_per_s: list[float]) -> object:
    """One writable ext4 mount sampled each second, and the disk's write counter."""
    from aivitals.tsdb import Store

    store = Store(retention=1e9)
    fs = {"mountpoint": "/var/log/app", "device": "/dev/loop0", "fstype": "ext4"}
    for i, a in enumerate(avail):
        store.append("host_filesystem_size_bytes", fs, size, float(i))
        store.append("host_filesystem_available_bytes", fs, a, float(i))
        store.append("host_filesystem_readonly", fs, 0.0, float(i))
    _counters(store, {"host_disk_writes_completed_total": ({"device": "vda"}, writes_per_s)})
    return store


_MIB = float(1 << 20)


def _filling(size: float, free: float, seconds: int, rate: float = 4 * _MIB) -> list[float]:
    """60 s steady at ``free`` bytes, then ``rate`` bytes a second written until full."""
    return [free] * 60 + [max(0.0, free - rate * (i + 1)) for i in range(seconds)]


def _named(store: object, end: float) -> list[str]:
    from aivitals.diagnose import diagnose

    found = diagnose(store, end=end, window=end, step=1.0, rate=8.0).findings
    return [f.signature for f in found]


def test_a_log_volume_filling_is_named_disk_full_while_it_fills_and_once_full() -> None:
    from aivitals.diagnose import diagnose

    size = 224e6  # a 256 MiB ext4 volume less its metadata
    avail = _filling(size, 0.92 * size, 80)  # under 40 % 28 s into the fill, full at 50 s
    store = _filesystem_store(size, avail, [5.0] * 60 + [70.0] * 80)
    assert "disk_full" not in _named(store, 74.0)  # falling, but 66 % is left
    found = diagnose(store, end=95.0, window=95.0, step=1.0, rate=8.0).findings
    assert found and found[0].signature == "disk_full", found  # 28 % left, 5 s of it a second
    assert found[0].title == "Filesystem /var/log/app full or filling"
    assert found[0].commands[0] == "df -h /var/log/app; df -i /var/log/app"
    assert found[0].confidence >= 0.6  # the share fell and the writes rose beside it
    # full and flat for 30 s: no longer falling, but out of space
    assert _named(store, 139.0)[:1] == ["disk_full"]


def test_a_big_disk_written_as_fast_with_plenty_free_is_not_disk_full() -> None:
    size = 2e12  # 2 TB, 60 % free: 4 MiB/s empties it in three days
    store = _filesystem_store(size, _filling(size, 0.6 * size, 80), [5.0] * 60 + [70.0] * 80)
    assert "disk_full" not in _named(store, 139.0)
    # under the floor too, the same rate still needs days: not "filling fast"
    store = _filesystem_store(size, _filling(size, 0.3 * size, 80), [5.0] * 60 + [70.0] * 80)
    assert "disk_full" not in _named(store, 139.0)


def test_a_healthy_store_has_no_disk_full() -> None:
    from aivitals.tsdb import Store

    size = 56e6
    steady = _filesystem_store(size, [0.9 * size] * 100, [5.0] * 100)
    assert "disk_full" not in _named(steady, 99.0)
    assert "disk_full" not in _named(Store(retention=1e9), 99.0)  # no filesystem series
