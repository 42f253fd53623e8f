"""The store: appends, refusals, staleness, retention, limits, snapshots, threads."""

from __future__ import annotations

import math
import threading
from pathlib import Path

import pytest

from aivitals.errors import (
    CardinalityLimitError,
    ConfigError,
    ExpositionError,
    SampleRejected,
    StoreError,
)
from aivitals.signals import Sample
from aivitals.tsdb import Backend, Store
from aivitals.tsdb._series import STALE_NAN, is_stale

T = 1_700_000_000.0


def test_store_satisfies_backend_protocol() -> None:
    assert isinstance(Store(), Backend)


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"retention": 0}, "retention"),
        ({"retention": -5.0}, "retention"),
        ({"retention": math.inf}, "retention"),
        ({"max_series": 0}, "max_series"),
        ({"max_series": 1.5}, "max_series"),
    ],
)
def test_bad_config_names_the_key(kwargs: dict[str, float], key: str) -> None:
    with pytest.raises(ConfigError, match=key):
        Store(**kwargs)  # type: ignore[arg-type]


def test_append_then_query_selector() -> None:
    store = Store()
    store.append("up", {"job": "api"}, 1.0, T)
    store.append("up", {"job": "db"}, 0.0, T)
    result = store.query('up{job="api"}', T + 10)
    assert result.type == "vector"
    assert [(dict(s.labels), s.value) for s in result.vector] == [
        ({"__name__": "up", "job": "api"}, 1.0)
    ]


def test_out_of_order_and_duplicate_are_rejected_and_counted() -> None:
    store = Store()
    store.append("x", {}, 1.0, T)
    with pytest.raises(SampleRejected, match="duplicate"):
        store.append("x", {}, 2.0, T)
    with pytest.raises(SampleRejected, match="out_of_order"):
        store.append("x", {}, 3.0, T - 1)
    with pytest.raises(SampleRejected, match="bad_timestamp"):
        store.append("x", {}, 3.0, math.inf)
    assert store.stats()["rejected"] == {"duplicate": 1, "out_of_order": 1, "bad_timestamp": 1}
    assert store.query("x", T).values() == [1.0]  # what was stored is kept


def test_append_samples_counts_instead_of_raising() -> None:
    store = Store()
    samples = [
        Sample("x", {"a": "1"}, 1.0, T),
        Sample("x", {"a": "1"}, 2.0, T),  # duplicate
        Sample("x", {"a": "1"}, 3.0, T - 5),  # out of order
        Sample("x", {"a": "2"}, 4.0),  # default timestamp
        Sample("x", {"a": "3"}, 5.0, math.nan),  # bad timestamp
        Sample("x", {"a": "4"}, "five", T),  # type: ignore[arg-type]  # not a number
    ]
    stats = store.append_samples(samples, default_timestamp=T + 1)
    assert stats.appended == 2
    assert stats.rejected == {
        "duplicate": 1,
        "out_of_order": 1,
        "bad_timestamp": 1,
        "bad_sample": 1,
    }
    assert stats.series_created == 2
    assert sorted(store.query("x", T + 1).values()) == [1.0, 4.0]


def test_nan_and_infinities_are_stored_as_values() -> None:
    store = Store()
    store.append("g", {"k": "nan"}, math.nan, T)
    store.append("g", {"k": "pinf"}, math.inf, T)
    store.append("g", {"k": "ninf"}, -math.inf, T)
    got = {s.labels["k"]: s.value for s in store.query("g", T).vector}
    assert math.isnan(got["nan"]) and got["pinf"] == math.inf and got["ninf"] == -math.inf


def test_cardinality_limit_refuses_new_series_and_keeps_old() -> None:
    store = Store(max_series=2)
    store.append("x", {"i": "1"}, 1.0, T)
    store.append("x", {"i": "2"}, 1.0, T)
    with pytest.raises(CardinalityLimitError):
        store.append("x", {"i": "3"}, 1.0, T)
    store.append("x", {"i": "1"}, 2.0, T + 1)  # existing series still accept samples
    stats = store.append_samples([Sample("y", {}, 1.0)], default_timestamp=T + 2)
    assert stats.rejected == {"cardinality_limit": 1}
    assert store.series_count == 2
    assert store.stats()["rejected"]["cardinality_limit"] == 2


def test_staleness_marker_ends_a_series_at_once() -> None:
    store = Store()
    store.ingest_exposition("a 1\nb 2\n", timestamp=T, target="t1")
    stats = store.ingest_exposition("a 1\n", timestamp=T + 15, target="t1")
    assert stats.stale_markers == 1
    assert {s.labels["__name__"] for s in store.query("{__name__=~'a|b'}", T + 16).vector} == {"a"}
    # Before the marker, b is visible through the 5-minute lookback.
    assert len(store.query("b", T + 14).vector) == 1
    # Range functions skip the marker.
    assert store.query("count_over_time(b[1m])", T + 16).values() == [1.0]


def test_a_collectors_missing_series_goes_stale_at_once() -> None:
    """append_samples with a target marks what that target stopped reporting, as a
    scrape does; another target's series and a call without a target are left alone."""
    store = Store()
    gpu = [Sample("gpu_process_memory_used_bytes", {"pid": p}, 1e9) for p in ("1", "2")]
    store.append_samples(gpu, default_timestamp=T, target="collector:gpu")
    store.append_samples([Sample("host_load1", {}, 1.0)], default_timestamp=T, target="c:host")
    store.append_samples([Sample("untargeted", {}, 1.0)], default_timestamp=T)
    stats = store.append_samples(gpu[:1], default_timestamp=T + 1, target="collector:gpu")
    assert stats.stale_markers == 1 and stats.appended == 1
    pids = [s.labels["pid"] for s in store.query("gpu_process_memory_used_bytes", T + 2).vector]
    assert pids == ["1"]  # pid 2 exited: gone now, not after the 5-minute look-back
    assert store.query("host_load1", T + 2).values() == [1.0]  # another target's
    store.append_samples([Sample("other", {}, 1.0)], default_timestamp=T + 1)
    assert store.query("untargeted", T + 2).values() == [1.0]  # no target: look-back
    # it comes back with its next sample; the range functions skip the marker
    store.append_samples(gpu, default_timestamp=T + 3, target="collector:gpu")
    assert len(store.query("gpu_process_memory_used_bytes", T + 3).vector) == 2
    assert store.query(
        'count_over_time(gpu_process_memory_used_bytes{pid="2"}[1m])', T + 3
    ).values() == [2.0]


def test_stale_marker_is_distinct_from_nan() -> None:
    assert is_stale(STALE_NAN)
    assert not is_stale(math.nan)


def test_retention_drops_old_samples_and_empty_series() -> None:
    store = Store(retention=60)
    store.append("old", {}, 1.0, T)
    for i in range(10):
        store.append("new", {}, float(i), T + 100 + i)
    store.expire()
    assert store.metric_names() == ["new"]
    assert store.stats()["samples"] == 10


def test_extra_labels_and_exported_prefix() -> None:
    store = Store()
    store.ingest_exposition(
        'up{job="inner"} 1\n', timestamp=T, extra_labels={"job": "outer", "instance": "h:1"}
    )
    (sample,) = store.query("up", T).vector
    assert sample.labels == {
        "__name__": "up",
        "job": "outer",
        "exported_job": "inner",
        "instance": "h:1",
    }


def test_label_values_and_metric_names() -> None:
    store = Store()
    store.append("a", {"x": "1"}, 1.0, T)
    store.append("b", {"x": "2"}, 1.0, T)
    assert store.metric_names() == ["a", "b"]
    assert store.label_values("x") == ["1", "2"]
    assert store.label_values("x", metric="b") == ["2"]


def test_malformed_exposition_stores_nothing() -> None:
    store = Store()
    store.ingest_exposition("good 1\n", timestamp=T)
    bad = "good 2\nother 3\nthis is { not valid\n"
    with pytest.raises(ExpositionError, match="not valid"):
        store.ingest_exposition(bad, timestamp=T + 15)
    assert store.metric_names() == ["good"]
    assert store.query("good", T + 15).values() == [1.0]


@pytest.mark.parametrize(
    "text",
    [
        'x{a="1" 1\n',
        "x 1 2 3\n",
        "x not_a_number\n",
        "x{a=1} 1\n",
        "# TYPE x counter\nx_total 1\n# EOF\ngarbage",
        "x 1_000\n",
    ],
)
def test_malformed_exposition_raises(text: str) -> None:
    with pytest.raises(ExpositionError):
        Store().ingest_exposition(text, timestamp=T)


def test_openmetrics_exposition() -> None:
    text = (
        "# TYPE req counter\n"
        'req_total{code="200"} 5 1700000000.5\n'
        "# TYPE lat histogram\n"
        'lat_bucket{le="0.1"} 1\nlat_bucket{le="+Inf"} 2\nlat_count 2\nlat_sum 0.3\n'
        "# EOF\n"
    )
    store = Store()
    stats = store.ingest_exposition(text, timestamp=T + 10)
    assert stats.appended == 5
    (req,) = store.query("req_total", T + 10).vector
    assert req.value == 5.0
    assert store.query("timestamp(req_total)", T + 10).values() == [1700000000.5]


def test_text_timestamps_are_milliseconds() -> None:
    store = Store()
    store.ingest_exposition("x 1 1700000000123\n", timestamp=T + 100)
    assert store.query("timestamp(x)", T + 100).values() == [1700000000.123]


def test_snapshot_roundtrip(tmp_path: Path) -> None:
    store = Store(retention=7200, max_series=50)
    for i in range(100):
        store.append("c_total", {"i": str(i % 3)}, float(i), T + i)
    store.append("s", {}, STALE_NAN, T + 50)
    path = tmp_path / "snap.aivsnap"
    assert store.save(path) == 101
    again = Store.load(path)
    assert again.retention == 7200 and again.max_series == 50
    expr = "sum by (i) (rate(c_total[1m]))"
    assert again.query(expr, T + 99) == store.query(expr, T + 99)
    assert again.stats()["samples"] == 101
    window = tmp_path / "part.aivsnap"
    assert store.save(window, start=T + 10, end=T + 19) == 10


def test_loading_a_bad_snapshot_raises(tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    bad.write_bytes(b"not a snapshot")
    with pytest.raises(StoreError):
        Store.load(bad)
    missing = tmp_path / "missing"
    with pytest.raises(StoreError):
        Store.load(missing)


def test_concurrent_appends_and_queries() -> None:
    store = Store()
    errors: list[BaseException] = []

    def writer(k: int) -> None:
        try:
            for i in range(2000):
                store.append("w", {"k": str(k)}, float(i), T + i)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for _ in range(50):
        store.query("sum(rate(w[1m]))", T + 1000)
    for t in threads:
        t.join(timeout=30)
    assert not errors
    assert store.stats()["samples"] == 8000


def test_retention_keeps_arrays_compact_at_steady_state() -> None:
    store = Store(retention=300)
    for i in range(20_000):
        store.append("x", {}, float(i), T + i)
        if i % 1000 == 999:
            store.expire()
    (series,) = store._all_series()
    assert len(series) <= 301 + 1000
    # the dead head is compacted away, not kept growing
    assert len(series.ts) <= (301 + 1000) * 9 // 8 + 256
    assert store.query("x", T + 19_999).values() == [19_999.0]


def test_concurrent_scrapes_expiry_and_queries() -> None:
    store = Store(retention=30)
    errors: list[BaseException] = []
    stop = threading.Event()

    def scraper(target: str) -> None:
        try:
            for k in range(300):
                text = "".join(f'm{{t="{target}",i="{i}"}} {k}\n' for i in range(k % 50 + 1))
                store.ingest_exposition(text, timestamp=T + k, target=target)
                if k % 50 == 0:
                    store.expire()
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    def querier() -> None:
        try:
            while not stop.is_set():
                store.query("sum by (t) (rate(m[20s]))", T + 150)
                store.query_range("count(m)", T, T + 300, 10)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=scraper, args=(t,)) for t in ("a", "b")]
    reader = threading.Thread(target=querier)
    reader.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    stop.set()
    reader.join(timeout=30)
    assert not errors, errors
    assert store.query("count(m)", T + 299).values() == [100.0]


def _histogram_store() -> Store:
    store = Store()
    for k in range(120):
        for le, share in (("0.1", 0.5), ("0.5", 0.9), ("+Inf", 1.0)):
            for inst in ("a", "b"):
                store.append("d_bucket", {"le": le, "instance": inst}, share * 2 * k, 1000.0 + k)
    return store


P50 = "histogram_quantile(0.5, sum by (le) (rate(d_bucket[30s])))"
P99 = "histogram_quantile(0.99, sum by (le) (rate(d_bucket[30s])))"


def test_reusing_results_gives_the_same_answers() -> None:
    store = _histogram_store()
    alone = [store.query_range(q, 1040, 1119, 1).matrix for q in (P50, P99, f"-{P50}")]
    with store.reusing_results():
        reused = [store.query_range(q, 1040, 1119, 1).matrix for q in (P50, P99, f"-{P50}")]
        again = store.query_range(P50, 1040, 1119, 1).matrix  # after -P50 used the sum
        other_steps = store.query_range(P50, 1040, 1119, 2).matrix
    assert reused == alone and again == alone[0]
    assert other_steps == store.query_range(P50, 1040, 1119, 2).matrix


def test_reused_aggregations_read_the_samples_as_they_were_until_the_block_ends() -> None:
    store = _histogram_store()
    count = 'sum(count_over_time(d_bucket{le="+Inf"}[1h]))'
    with store.reusing_results():
        before = store.query(count, at=1200).vector[0].value
        store.append("d_bucket", {"le": "+Inf", "instance": "c"}, 1.0, 1150.0)
        assert store.query(count, at=1200).vector[0].value == before  # computed once
        with store.reusing_results():  # an inner block shares the outer one's results
            assert store.query(count, at=1200).vector[0].value == before
        assert store.query(count, at=1200).vector[0].value == before
        # another thread's queries neither see nor fill this thread's results
        seen: list[float] = []
        t = threading.Thread(
            target=lambda: seen.append(store.query(count, at=1200).vector[0].value)
        )
        t.start()
        t.join()
        assert seen == [before + 1]
    assert store.query(count, at=1200).vector[0].value == before + 1  # dropped at the end


def test_reused_results_stay_within_their_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    from aivitals.tsdb import _engine

    store = _histogram_store()
    monkeypatch.setattr(_engine, "REUSE_MAX_CELLS", 3 * 80)  # one sum by (le): 3 x 80 steps
    with store.reusing_results():
        first = store.query_range(P50, 1040, 1119, 1).matrix
        other = store.query_range("sum by (instance) (rate(d_bucket[30s]))", 1040, 1119, 1)
        kept = store._reused()
        assert kept is not None and len(kept) == 1  # the second did not fit: computed, not kept
        assert store.query_range(P50, 1040, 1119, 1).matrix == first
        assert (
            other.matrix
            == store.query_range("sum by (instance) (rate(d_bucket[30s]))", 1040, 1119, 1).matrix
        )
