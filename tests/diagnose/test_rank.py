"""rank_changes: robust, scale-free ranking of what changed between two windows."""

from __future__ import annotations

import csv
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from aivitals.diagnose import ChangeRanking, rank_changes
from aivitals.errors import BackendError, ConfigError
from aivitals.tsdb import QueryResult, Store

T0 = 1_700_000_000.0
STEP = 5.0
BASE = (T0, T0 + 1200.0)  # 20 minutes
INC = (T0 + 1200.0 + STEP, T0 + 1800.0)  # the next 10 minutes
H200 = Path(__file__).parents[1] / "fixtures" / "gpu" / "h200" / "scenarios.csv"

Shape = Callable[[np.ndarray, np.ndarray], np.ndarray]


def _times() -> np.ndarray:
    return np.arange(T0, INC[1] + STEP / 2, STEP)


def _fill(store: Store, name: str, labels: dict[str, str], values: np.ndarray) -> None:
    for t, v in zip(_times(), values, strict=True):
        store.append(name, labels, float(v), float(t))


def _gauge(rng: np.random.Generator, level: float, rel: float, factor: float = 1.0) -> np.ndarray:
    """Noisy level; ``factor`` multiplies it from the incident's start on."""
    t = _times()
    x = level * (1 + rel * rng.standard_normal(len(t)))
    return np.where(t >= INC[0], x * factor, x)


def _counter(rng: np.random.Generator, rate: float, factor: float = 1.0) -> np.ndarray:
    """A counter whose per-second rate (Poisson) is multiplied by ``factor`` in the incident."""
    t = _times()
    lam = np.where(t >= INC[0], rate * factor, rate) * STEP
    return np.cumsum(rng.poisson(lam)).astype(float)


def _noise_store(seed: int = 0) -> Store:
    rng = np.random.default_rng(seed)
    store = Store(retention=1e7)
    for r in range(50):
        _fill(store, "api_latency_seconds", {"route": f"r{r}"}, _gauge(rng, 0.2, 0.1))
    _fill(store, "jobs_done_total", {}, _counter(rng, 20.0))
    _fill(store, "queue_depth", {}, _gauge(rng, 50.0, 0.1))
    return store


def _rank(store: object, **kw: object) -> ChangeRanking:
    return rank_changes(store, baseline=BASE, incident=INC, step=STEP, **kw)  # type: ignore[arg-type]


# ----------------------------------------------------------------- ranking


def test_noise_only_ranks_nothing() -> None:
    store = _noise_store()
    assert _rank(store).changes == ()
    everything = _rank(store, min_score=0.0, limit=100, per_family=100)
    assert everything.series == 52
    assert max(c.score for c in everything.changes) < 1.0


def test_a_lone_spike_is_not_a_change_but_a_burst_is() -> None:
    rng = np.random.default_rng(14)
    store = Store(retention=1e7)
    t = _times()
    spike = _gauge(rng, 0.2, 0.1)
    spike[np.searchsorted(t, INC[0] + 300)] = 200.0  # one point, a thousand times the level
    burst = _gauge(rng, 0.2, 0.1)
    burst[(t >= INC[0] + 200) & (t < INC[0] + 320)] *= 5  # two minutes of the ten
    _fill(store, "api_latency_seconds", {"route": "spike"}, spike)
    _fill(store, "api_latency_seconds", {"route": "burst"}, burst)
    res = _rank(store)
    assert [dict(c.labels) for c in res.changes] == [{"route": "burst"}]
    assert res.changes[0].beyond == pytest.approx(0.2, abs=0.03)


def test_a_shift_that_holds_outranks_a_louder_one_that_flickers() -> None:
    rng = np.random.default_rng(15)
    store = Store(retention=1e7)
    t = _times()
    held = _gauge(rng, 0.2, 0.1)
    held[t >= INC[0]] += 30 * 0.02  # +30 sigma, the whole incident
    flicker = _gauge(rng, 0.2, 0.1)
    flick = (t >= INC[0]) & (rng.random(len(t)) < 0.35)
    flicker[flick] += 1000 * 0.02  # +1000 sigma, a third of the points
    _fill(store, "api_latency_seconds", {"route": "held"}, held)
    _fill(store, "api_latency_seconds", {"route": "flicker"}, flicker)
    res = _rank(store)
    assert [c.labels["route"] for c in res.changes] == ["held", "flicker"]
    assert res.changes[0].beyond > 0.95 and 0.2 < res.changes[1].beyond < 0.5
    assert res.changes[1].score > 1.0  # still a change worth reading


def test_a_3x_latency_shift_in_one_of_50_noisy_series_ranks_first() -> None:
    rng = np.random.default_rng(1)
    store = Store(retention=1e7)
    for r in range(50):
        _fill(store, "api_latency_seconds", {"route": f"r{r}"}, _gauge(rng, 0.2, 0.1))
    _fill(store, "api_latency_seconds", {"route": "shifted"}, _gauge(rng, 0.2, 0.1, factor=3.0))
    res = _rank(store)
    top = res.changes[0]
    assert (top.metric, dict(top.labels), top.direction) == (
        "api_latency_seconds",
        {"route": "shifted"},
        "up",
    )
    assert top.beyond > 0.9 and top.siblings == 0
    assert top.incident_median == pytest.approx(0.6, rel=0.05)
    assert len(res.changes) == 1
    # A selector with matchers narrows the family's one query.
    calm = _rank(store, selector='api_latency_seconds{route=~"r.*"}', min_score=0.0, limit=100)
    assert calm.series == 50 and calm.queries == 1
    assert all(c.labels["route"] != "shifted" and c.score < 1.0 for c in calm.changes)


def test_a_counter_whose_rate_doubles_outranks_a_gauge_wiggling_within_noise() -> None:
    rng = np.random.default_rng(2)
    store = Store(retention=1e7)
    _fill(store, "jobs_done_total", {}, _counter(rng, 20.0, factor=2.0))
    _fill(store, "queue_depth", {}, _gauge(rng, 50.0, 0.1, factor=1.05))  # +0.5 sigma
    res = _rank(store, min_score=0.0)
    assert [c.metric for c in res.changes] == ["jobs_done_total", "queue_depth"]
    rate = res.changes[0]
    assert (rate.stat, rate.kind, rate.direction) == ("rate", "counter", "up")
    assert rate.incident_median == pytest.approx(2 * rate.baseline_median, rel=0.15)
    assert res.changes[1].score < 1.0


def test_a_flat_zero_baseline_turning_slightly_nonzero_does_not_outrank_a_real_shift() -> None:
    rng = np.random.default_rng(3)
    store = Store(retention=1e7)
    t = _times()
    after = t >= INC[0]
    _fill(store, "api_latency_seconds", {}, _gauge(rng, 0.2, 0.1, factor=1.6))
    # 4 KiB of swap, 0.2 ms of backlog, one error in ten minutes: each from exactly zero.
    _fill(store, "host_swap_used_bytes", {}, np.where(after, 4096.0, 0.0))
    _fill(store, "worker_backlog_seconds", {}, np.where(after, 2e-4 * rng.random(len(t)), 0.0))
    _fill(store, "http_server_errors_total", {}, np.where(t >= INC[0] + 100, 1.0, 0.0))
    res = _rank(store, min_score=0.0)
    assert res.changes[0].metric == "api_latency_seconds"
    assert res.changes[0].score > 5.0
    for c in res.changes[1:]:
        assert c.score < 1.0, c


def test_the_ranking_does_not_depend_on_a_metrics_scale() -> None:
    def build(scale: float) -> list[str]:
        rng = np.random.default_rng(4)
        store = Store(retention=1e7)
        _fill(store, "widget_level", {}, scale * _gauge(rng, 3.0, 0.1, factor=1.8))
        _fill(store, "api_latency_seconds", {}, _gauge(rng, 0.2, 0.1, factor=2.0))
        _fill(store, "pool_in_use", {}, _gauge(rng, 40.0, 0.05, factor=1.3))
        _fill(store, "jobs_done_total", {}, _counter(rng, 20.0, factor=1.5))
        return [c.metric for c in _rank(store, min_score=0.0).changes]

    plain, scaled = build(1.0), build(1e6)
    assert plain == scaled
    assert plain.index("widget_level") < 3


def test_each_change_names_its_layer_and_the_layer_that_moved() -> None:
    rng = np.random.default_rng(5)
    store = Store(retention=1e7)
    t = _times()
    # CPU burn: the host's busy CPU seconds rate triples; the GPU and the service are calm.
    _fill(store, "host_cpu_seconds_total", {"mode": "user"}, _counter(rng, 2.0, factor=3.0))
    _fill(store, "gpu_memory_used_bytes", {"gpu": "0"}, _gauge(rng, 8e9, 0.01))
    _fill(store, "http_requests_in_flight", {}, _gauge(rng, 4.0, 0.2))
    _fill(store, "mystery_level", {}, np.where(t >= INC[0], 5.0, 1.0) + 0.01 * rng.random(len(t)))
    res = _rank(store)
    layers = {c.metric: c.layer for c in res.changes}
    assert layers == {"host_cpu_seconds_total": "infrastructure", "mystery_level": None}
    assert res.top_layer == "infrastructure"
    assert [layer for layer, _ in res.layers] == ["infrastructure"]


def test_a_foreign_name_gets_its_layer_and_unit_floor_from_the_alias_table() -> None:
    t = _times()
    after = t >= INC[0]
    store = Store(retention=1e7)
    # DCGM reports MiB: half a MiB from exactly zero is under the 1 MiB floor, 2 GiB is not.
    _fill(store, "DCGM_FI_DEV_FB_USED", {"gpu": "0"}, np.where(after, 0.5, 0.0))
    _fill(store, "DCGM_FI_DEV_FB_USED", {"gpu": "1"}, np.where(after, 2048.0, 0.0))
    res = _rank(store)
    assert [(dict(c.labels), c.layer, c.unit, c.kind) for c in res.changes] == [
        ({"gpu": "1"}, "model", "bytes", "gauge")
    ]
    assert res.top_layer == "model"


def test_a_histogram_is_compared_by_its_quantiles_and_rate_in_one_query_per_family() -> None:
    rng = np.random.default_rng(6)
    store = Store(retention=1e7)
    buckets = (0.05, 0.1, 0.2, 0.5, 1.0, 2.0, math.inf)
    counts = dict.fromkeys(buckets, 0.0)
    total = 0.0
    for t in _times():
        slow = t >= INC[0]
        lat = rng.lognormal(math.log(0.4 if slow else 0.08), 0.3, size=int(rng.poisson(50)))
        for le in buckets:
            counts[le] += float(np.count_nonzero(lat <= le))
            le_s = "+Inf" if le == math.inf else f"{le:g}"
            store.append("http_request_duration_seconds_bucket", {"le": le_s}, counts[le], t)
        total += float(lat.sum())
        store.append("http_request_duration_seconds_count", {}, counts[math.inf], t)
        store.append("http_request_duration_seconds_sum", {}, total, t)
    _fill(store, "queue_depth", {}, _gauge(rng, 50.0, 0.1))
    calls: list[str] = []

    class Counting:
        def query(self, expr: str, at: float | None = None) -> QueryResult:
            calls.append(expr)
            return store.query(expr, at)

        def query_range(self, expr: str, start: float, end: float, step: float) -> QueryResult:
            calls.append(expr)
            return store.query_range(expr, start, end, step)

    res = _rank(Counting())
    # No label_values here: one instant query to discover, one range query per family.
    assert res.queries == len(calls) == 3 and res.families == 2
    top = res.changes[0]
    assert (top.metric, top.stat, top.kind, top.layer) == (
        "http_request_duration_seconds",
        "p99",
        "histogram",
        "service",
    )
    assert top.direction == "up" and len(res.changes) == 1


def test_an_unknown_monotone_series_is_taken_for_a_counter_and_a_leak_stays_a_gauge() -> None:
    rng = np.random.default_rng(7)
    store = Store(retention=1e7)
    t = _times()
    _fill(store, "jobs_processed", {}, _counter(rng, 10.0, factor=3.0))
    leak = np.where(t >= INC[0], 1e6 * (t - INC[0]), 0.0) + 5e8
    _fill(store, "arena_used", {}, leak)
    res = _rank(store)
    kinds = {c.metric: (c.kind, c.stat) for c in res.changes}
    assert kinds == {
        "jobs_processed": ("counter (inferred)", "rate"),
        "arena_used": ("gauge", "value"),
    }


def test_a_counter_scraped_slower_than_the_step_is_not_a_change() -> None:
    # Points every 5 s from a counter scraped every 15 s: rising on one step in three.
    rng = np.random.default_rng(13)
    store = Store(retention=1e7)
    t = np.arange(T0, INC[1] + 1, 15.0)
    v = np.cumsum(rng.poisson(20 * 15, len(t))).astype(float)
    for name in ("jobs_processed", "jobs_done_total"):
        for ts, x in zip(t, v, strict=True):
            store.append(name, {}, float(x), float(ts))
    res = _rank(store, min_score=0.0)
    assert {c.metric: c.kind for c in res.changes} == {
        "jobs_processed": "counter (inferred)",
        "jobs_done_total": "counter",
    }
    assert all(c.score < 1.0 and c.unit == "1/s" for c in res.changes)
    assert all(c.baseline_median == pytest.approx(20, rel=0.1) for c in res.changes)


def test_a_wide_family_does_not_flood_the_top() -> None:
    rng = np.random.default_rng(8)
    store = Store(retention=1e7)
    for r in range(40):
        _fill(store, "api_latency_seconds", {"route": f"r{r}"}, _gauge(rng, 0.2, 0.05, factor=4))
    _fill(store, "pool_in_use", {}, _gauge(rng, 40.0, 0.05, factor=1.5))
    res = _rank(store, limit=5, per_family=3)
    metrics = [c.metric for c in res.changes]
    assert metrics.count("api_latency_seconds") == 3 and "pool_in_use" in metrics
    assert res.changes[0].siblings == 39


# ----------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("baseline", "incident", "match"),
    [
        ((T0, T0), INC, "baseline window is empty"),
        ((T0 + 10, T0), INC, "baseline window is reversed"),
        (BASE, (INC[1], INC[0]), "incident window is reversed"),
        ((T0, INC[0] + 60), INC, "must end before the incident"),
        (INC, BASE, "must end before the incident"),
        ((T0, math.nan), INC, "finite"),
        ((T0,), INC, "pair"),
    ],
)
def test_bad_windows_are_refused(
    baseline: tuple[float, float], incident: tuple[float, float], match: str
) -> None:
    with pytest.raises(ConfigError, match=match):
        rank_changes(Store(), baseline=baseline, incident=incident)


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"step": 0}, "step"),
        ({"step": 400.0}, "fewer than 3 points"),
        ({"limit": 0}, "limit"),
        ({"workers": 0}, "workers"),
        ({"band": -1}, "band"),
        ({"relative_floor": math.inf}, "relative_floor"),
        ({"quantiles": (1.5,)}, "quantiles"),
        ({"selector": []}, "selector is empty"),
        ({"selector": ["not a metric!"]}, "not a metric name"),
        ({"rate_window": -5.0}, "rate_window"),
        ({"rate_window": "5m"}, "rate_window"),
        ({"step": 0.01}, "over 10000"),
    ],
)
def test_bad_settings_are_refused(kw: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        rank_changes(Store(), baseline=BASE, incident=INC, **kw)  # type: ignore[arg-type]


def test_something_that_is_not_a_backend_is_refused() -> None:
    with pytest.raises(ConfigError, match="backend"):
        rank_changes("http://prom:9090", baseline=BASE, incident=INC)  # type: ignore[arg-type]


def test_no_data_gives_an_empty_ranking_that_says_why() -> None:
    res = _rank(Store())
    assert res.changes == () and res.top_layer is None
    assert [u.what for u in res.unseen] == ["metrics"]
    res = _rank(Store(), selector=["nothing_here"])
    assert res.changes == () and res.unseen[0].why == "no points in either window"
    # Discovered, but only around long before: not something the ranking failed to see.
    store = Store(retention=1e7)
    for i in range(5):
        store.append("old_level", {}, 1.0, T0 - 10_000 + i)
    res = _rank(store)
    assert res.changes == () and res.unseen == () and res.series == 0


def test_a_series_with_no_baseline_is_listed_not_scored() -> None:
    store = Store(retention=1e7)
    t = _times()
    late = t >= INC[0]
    for ts, v in zip(t[late], np.full(int(late.sum()), 3.0), strict=True):
        store.append("new_level", {}, float(v), float(ts))
    res = _rank(store)
    assert res.changes == ()
    assert "under 3 finite points in the baseline" in res.unseen[0].why


def test_nan_and_inf_samples_are_dropped_not_scored() -> None:
    rng = np.random.default_rng(9)
    store = Store(retention=1e7)
    x = _gauge(rng, 0.2, 0.1, factor=3.0)
    x[::7] = np.nan
    x[3::11] = np.inf
    x[5::13] = -np.inf
    _fill(store, "api_latency_seconds", {}, x)
    top = _rank(store).changes[0]
    assert math.isfinite(top.score) and math.isfinite(top.baseline_median)
    assert top.incident_median == pytest.approx(0.6, rel=0.05)


@pytest.mark.parametrize("workers", [1, 4])
def test_a_family_whose_query_fails_is_skipped_and_reported(workers: int) -> None:
    store = _noise_store(10)
    rng = np.random.default_rng(10)
    _fill(store, "pool_in_use", {}, _gauge(rng, 40.0, 0.05, factor=2.0))

    class Flaky:
        def label_values(self, label: str) -> list[str]:
            return store.label_values(label)

        def query(self, expr: str, at: float | None = None) -> QueryResult:
            return store.query(expr, at)

        def query_range(self, expr: str, start: float, end: float, step: float) -> QueryResult:
            if "queue_depth" in expr:
                raise BackendError("prom:9090: HTTP 503 unavailable")
            return store.query_range(expr, start, end, step)

    res = _rank(Flaky(), workers=workers)
    assert [c.metric for c in res.changes] == ["pool_in_use"]
    assert res.queries == res.families == 4
    assert [(u.what, u.why) for u in res.unseen] == [
        ("queue_depth", "BackendError: prom:9090: HTTP 503 unavailable")
    ]
    assert res.to_dict()["unseen"][0]["what"] == "queue_depth"


def test_far_apart_windows_cost_two_queries_per_family() -> None:
    store = _noise_store(11)
    near = _rank(store, selector=["queue_depth", "jobs_done_total"])
    far = rank_changes(
        store,
        baseline=(T0, T0 + 300),
        incident=(T0 + 1500, T0 + 1800),
        step=STEP,
        selector="queue_depth",
    )
    assert (near.queries, far.queries) == (2, 2)


# ----------------------------------------------------------------- recorded run


def _h200() -> tuple[Store, dict[str, tuple[float, float]]]:
    """The real H200 recording: every column a gauge at its own timestamp."""
    store = Store(retention=1e7)
    phases: dict[str, tuple[float, float]] = {}
    with H200.open() as f:
        for row in csv.DictReader(f):
            t = T0 + float(row.pop("t"))
            phase = row.pop("phase")
            first, _ = phases.get(phase, (t, t))
            phases[phase] = (first, t)
            for col, value in row.items():
                if value != "":
                    store.append(col, {}, float(value), t)
    return store, phases


#: fault phase -> the metrics that show it (the recording's README).
EXPECTED = {
    "leak": {"mem_used", "server_proc_mem"},
    "cotenant": {"other_procs_mem"},
    "contention": {"util_gpu", "util_mem", "power_w", "sm_mhz", "lat_p99_ms"},
    "oom": {"oom_errors"},
}
#: Each fault against the nearest fault-free phase before it, and against the opening one.
CASES = [
    ("leak", "normal"),
    ("cotenant", "recover"),
    ("contention", "recover"),
    ("oom", "recover"),
    ("cotenant", "normal"),
    ("contention", "normal"),
    ("oom", "normal"),
]


def test_recorded_h200_faults_rank_their_metric_in_the_top_three() -> None:
    store, phases = _h200()
    hits = []
    for fault, normal in CASES:
        res = rank_changes(store, baseline=phases[normal], incident=phases[fault], step=0.5)
        top3 = [c.metric for c in res.changes[:3]]
        hits.append(bool(EXPECTED[fault] & set(top3)))
        print(f"{fault} vs {normal}: top 3 {top3}")
    share = sum(hits) / len(hits)
    print(f"recorded H200 run: expected metric in the top 3 in {sum(hits)}/{len(hits)} = {share}")
    assert share == 1.0, list(zip(CASES, hits, strict=True))


# ----------------------------------------------------------------- a real Prometheus


def _mixed(seed: int) -> list[tuple[str, dict[str, str], np.ndarray]]:
    """A service whose latency histogram shifts, a counter whose rate doubles, calm gauges."""
    rng = np.random.default_rng(seed)
    t = _times()
    buckets = (0.05, 0.1, 0.2, 0.5, 1.0, 2.0, math.inf)
    cum = np.zeros((len(buckets), len(t)))
    for j, ts in enumerate(t):
        lat = rng.lognormal(math.log(0.4 if ts >= INC[0] else 0.08), 0.3, int(rng.poisson(50)))
        cum[:, j] = [np.count_nonzero(lat <= le) for le in buckets]
    cum = np.cumsum(cum, axis=1)
    out = [
        ("http_request_duration_seconds_bucket", {"le": "+Inf" if le == math.inf else f"{le:g}"}, c)
        for le, c in zip(buckets, cum, strict=True)
    ]
    out.append(("http_request_duration_seconds_count", {}, cum[-1]))
    out.append(("jobs_done_total", {}, _counter(rng, 20.0, factor=2.0)))
    for r in range(5):
        out.append(("pool_in_use", {"pool": f"p{r}"}, _gauge(rng, 40.0, 0.05)))
    return out


def _openmetrics(data: list[tuple[str, dict[str, str], np.ndarray]]) -> str:
    by_name: dict[str, list[str]] = {}
    for name, labels, values in data:
        lab = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        head = f"{name}{{{lab}}}" if lab else name
        by_name.setdefault(name, []).extend(
            f"{head} {v!r} {ts:.3f}" for ts, v in zip(_times(), values.tolist(), strict=True)
        )
    lines: list[str] = []
    for name in sorted(by_name):
        kind = "unknown" if name.endswith(("_bucket", "_count", "_total")) else "gauge"
        lines.append(f"# TYPE {name} {kind}")
        lines += by_name[name]
    return "\n".join([*lines, "# EOF"]) + "\n"


@pytest.mark.integration
@pytest.mark.slow
def test_a_real_prometheus_gives_the_same_ranking_as_the_embedded_store(tmp_path: Path) -> None:
    from aivitals.tsdb import PrometheusBackend
    from tests._servers import prometheus, promtool

    data = _mixed(12)
    store = Store(retention=1e7)
    for name, labels, values in data:
        _fill(store, name, labels, values)
    om = tmp_path / "mixed.om"
    om.write_text(_openmetrics(data))
    blocks = tmp_path / "data"
    made = promtool("tsdb", "create-blocks-from", "openmetrics", str(om), str(blocks))
    assert made.returncode == 0, made.stderr
    embedded = _rank(store)
    with prometheus(data_dir=blocks) as prom, PrometheusBackend(prom.url) as backend:
        remote = _rank(backend, workers=4)
        sent = backend.queries

    def key(r: ChangeRanking) -> list[tuple[str, str, str]]:
        return [(c.metric, c.stat, c.direction) for c in r.changes]

    assert (
        key(remote)
        == key(embedded)
        == [
            ("http_request_duration_seconds", "p99", "up"),
            ("jobs_done_total", "rate", "up"),
        ]
    )
    for a, b in zip(remote.changes, embedded.changes, strict=True):
        assert a.score == pytest.approx(b.score, rel=0.1)
    # One instant query to discover the names, one range query per family.
    assert remote.queries == sent == 1 + remote.families == 4


def test_derived_series_and_the_monitors_own_are_left_out_unless_asked() -> None:
    rng = np.random.default_rng(3)
    store = Store(retention=1e7)
    _fill(store, "queue_depth", {}, _gauge(rng, 50.0, 0.05, factor=3.0))
    # the same change, recorded by a rule, and the monitor's own ingest moving with it
    _fill(store, "job:queue_depth:avg", {}, _gauge(rng, 50.0, 0.05, factor=3.5))
    _fill(store, "aivitals_tsdb_samples_appended_total", {}, _counter(rng, 100.0, factor=8.0))
    default = {c.metric for c in _rank(store).changes}
    assert default == {"queue_depth"}
    everything = {c.metric for c in _rank(store, exclude=None).changes}
    assert everything == {
        "queue_depth",
        "job:queue_depth:avg",
        "aivitals_tsdb_samples_appended_total",
    }
    only = {c.metric for c in _rank(store, exclude="queue_depth").changes}
    assert only == {"job:queue_depth:avg", "aivitals_tsdb_samples_appended_total"}
    with pytest.raises(ConfigError, match="not a regex"):
        _rank(store, exclude="(")
