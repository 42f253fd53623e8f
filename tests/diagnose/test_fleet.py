"""A fleet diagnosis names where: the node (and GPU, pid, instance) of each finding,
one fleet-wide finding for a shared fault, the outlier first, a bounded number of
queries, and a clean answer from a backend that is down, slow, partial or picky.

The fleets are SYNTHETIC (aivitals.fleet's SynthFleet: series shaped by the H200
recording in tests/fixtures/gpu/h200/scenarios.csv) in the embedded store, or
behind a real HTTP server for the slow and down cases.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from aivitals.diagnose import diagnose
from aivitals.diagnose._where import localize
from aivitals.errors import BackendError, QueryError
from aivitals.fleet._synth import RecordedShapes, SynthFleet
from aivitals.tsdb import PrometheusBackend, QueryResult, RangeSeries, Store
from tests._servers import free_port

RECORDING = Path(__file__).resolve().parents[1] / "fixtures" / "gpu" / "h200" / "scenarios.csv"


@pytest.fixture(scope="module")
def shapes() -> RecordedShapes:
    return RecordedShapes.load(RECORDING)


def _fleet(shapes: RecordedShapes, fault: str | None, nodes: int = 6, **kw: Any) -> SynthFleet:
    return SynthFleet(shapes, nodes=nodes, gpus=2, fault=fault, faulty_node=2, faulty_gpu=1, **kw)


def _diagnose(sf: SynthFleet, backend: Any = None, **kw: Any) -> Any:
    window = sf.step * (sf.points - 1)
    return diagnose(backend or sf.to_store(), end=sf.end, window=window, step=sf.step, **kw)


def test_a_gpu_leak_on_one_node_is_named_there_and_the_others_are_healthy(
    shapes: RecordedShapes,
) -> None:
    d = _diagnose(_fleet(shapes, "gpu_memory_leak"))
    top = d.findings[0]
    assert top.signature == "gpu_memory_leak"
    assert top.scope == "node"
    assert top.where["node"] == "sim-node-2"
    assert top.where["gpu"] == "1"
    assert "sim-node-2" in top.title
    peer = [e for e in top.evidence if e.role == "peer"]
    assert peer and peer[0].held  # its peers are flat
    assert d.location == "node"
    assert d.nodes["sim-node-2"] == "gpu_memory_leak"
    assert all(v == "healthy" for k, v in d.nodes.items() if k != "sim-node-2")
    assert not any(f.signature == "gpu_memory_leak" and f.scope == "fleet" for f in d.findings)


def test_a_slow_replica_ranks_first_among_its_peers(shapes: RecordedShapes) -> None:
    d = _diagnose(_fleet(shapes, "slow_replica"))
    assert d.findings[0].where.get("node") == "sim-node-2"
    assert d.nodes["sim-node-2"] != "healthy"
    assert all(v == "healthy" for k, v in d.nodes.items() if k != "sim-node-2")


def test_a_node_a_quarter_off_two_agreeing_peers_does_not_stand_out() -> None:
    """Two peers that agree give a spread of 5 % of their median (the floor): a node a
    quarter off them scores 5, "far out" on the spread alone. A 3-node fleet's median
    latency differs that much between healthy nodes, so the peer evidence also needs the
    node twice its peers' median (a slow replica of the synthetic fleet is 2.9x)."""
    from aivitals.diagnose._engine import PEER_SCORE, _far_from_peers
    from aivitals.diagnose._where import peer_outlier

    score, value, med = peer_outlier({"a": 0.01, "b": 0.01, "c": 0.0125}, "c") or (0, 0, 0)
    assert score == pytest.approx(PEER_SCORE) and med == 0.01
    assert not _far_from_peers(value, med, "up")
    assert _far_from_peers(0.0229, 0.008, "up")  # the slow replica below
    assert not _far_from_peers(0.0229, 0.008, "down")
    assert _far_from_peers(0.004, 0.01, "down") and _far_from_peers(0.004, 0.01, None)
    assert not _far_from_peers(float("nan"), 0.01, None)
    assert _far_from_peers(0.5, 0.0, "up") and not _far_from_peers(0.0, 0.0, "up")


def test_a_shared_dependency_down_everywhere_is_one_fleet_wide_finding(
    shapes: RecordedShapes,
) -> None:
    d = _diagnose(_fleet(shapes, "redis_down"))
    redis = [f for f in d.findings if f.signature == "redis_down"]
    assert len(redis) == 1
    assert redis[0] is d.findings[0]
    assert redis[0].scope == "fleet"
    assert len(redis[0].nodes) == 6
    assert redis[0].title.startswith("Fleet-wide (6 of 6 nodes)")
    assert set(d.nodes.values()) == {"fleet-wide redis_down"}
    text = d.to_markdown()
    assert "fleet-wide on 6 nodes" in text and "## Nodes" in text


def test_the_number_of_queries_does_not_grow_with_the_fleet(shapes: RecordedShapes) -> None:
    small = _diagnose(_fleet(shapes, "gpu_memory_leak", nodes=3))
    large = _diagnose(_fleet(shapes, "gpu_memory_leak", nodes=12))
    assert small.queries == large.queries
    assert 0 < large.queries < 200
    assert f"with {large.queries} queries" in large.to_terminal()
    assert large.findings[0].where["node"] == "sim-node-2"


def test_a_single_machine_without_node_labels_is_diagnosed_as_before(
    shapes: RecordedShapes,
) -> None:
    sf = SynthFleet(shapes, nodes=1, gpus=2, fault="gpu_memory_leak", faulty_node=1, faulty_gpu=1)
    store = Store(retention=10_000)
    for name, labels, values in sf.series():
        labels = {k: v for k, v in labels.items() if k != "node"}
        for t, v in zip(sf.times.tolist(), values.tolist(), strict=True):
            store.append(name, labels, v, t)
    d = _diagnose(sf, store)
    assert d.location is None and d.nodes == {}
    assert d.findings[0].signature == "gpu_memory_leak"
    assert d.findings[0].scope == "local"
    assert d.findings[0].where["gpu"] == "1"


@pytest.mark.parametrize(
    ("expr", "want"),
    [
        ("sum(rate(x[1m]))", "sum by (node) (rate(x[1m]))"),
        (
            "histogram_quantile(0.99, sum by (le) (rate(b[1m])))",
            "histogram_quantile(0.99, sum by (le, node) (rate(b[1m])))",
        ),
        ("sum(x) by (le)", "sum(x) by (le, node)"),
        ("sum without (pid) (x)", "sum without (pid) (x)"),
        ("a and on () (max(b) > 1)", "a and on (node) (max by (node) (b) > 1)"),
        (
            "rate(http_request_duration_seconds_count[1m])",
            "rate(http_request_duration_seconds_count[1m])",
        ),
        ("sum by (node) (x)", "sum by (node) (x)"),
    ],
)
def test_localize_keeps_the_node_in_every_aggregation(expr: str, want: str) -> None:
    assert localize(expr, "node") == want


# --- bad input -------------------------------------------------------------------------
class _Wrapped:
    """A backend over a store that misbehaves for some expressions."""

    def __init__(self, inner: Store, **how: Any) -> None:
        self.inner, self.how = inner, how
        self.range_calls = 0

    def metric_names(self) -> list[str]:  # pragma: no cover - only the Store has it
        raise AttributeError

    def query(self, expr: str, at: float | None = None) -> QueryResult:
        return self.inner.query(expr, at)

    def query_range(self, expr: str, start: float, end: float, step: float) -> QueryResult:
        self.range_calls += 1
        for needle, exc in self.how.get("fail", {}).items():
            if needle in expr:
                raise exc
        res = self.inner.query_range(expr, start, end, step)
        gone = self.how.get("gone_after")
        if gone is not None and self.range_calls > gone[1]:
            # the node's agent stopped: its series end here
            res = replace(res, matrix=[s for s in res.matrix if s.labels.get("node") != gone[0]])
        warn = [w for needle, w in self.how.get("warn", {}).items() if needle in expr]
        return replace(res, warnings=tuple(warn)) if warn else res


def test_errors_and_partial_answers_for_some_queries_are_listed_and_the_rest_named(
    shapes: RecordedShapes,
) -> None:
    sf = _fleet(shapes, "gpu_memory_leak")
    sick = _Wrapped(
        sf.to_store(),
        fail={"cache_requests_total": BackendError("HTTP 500 internal error")},
        warn={"gpu_memory_used_bytes": "partial response: 1 of 3 storage nodes unavailable"},
    )
    d = _diagnose(sf, sick, workers=4)
    assert d.findings[0].signature == "gpu_memory_leak"
    assert d.findings[0].where["node"] == "sim-node-2"
    why = " | ".join(f"{u.what}: {u.why}" for u in d.unseen)
    assert "cache_requests_total" in why and "HTTP 500" in why
    assert "partial answer: partial response" in why
    assert "not sent" not in why  # error answers do not give the backend up


def test_a_query_victoriametrics_refuses_is_unseen_and_the_rest_still_names_the_node(
    shapes: RecordedShapes,
) -> None:
    sf = _fleet(shapes, "gpu_memory_leak")
    picky = _Wrapped(sf.to_store(), fail={"deriv(": QueryError("unsupported function", expr="")})
    d = _diagnose(sf, picky, workers=4)
    leak = [f for f in d.findings if f.signature == "gpu_memory_leak"]
    assert leak and leak[0].where["node"] == "sim-node-2"
    assert d.findings[0].where.get("node") == "sim-node-2"
    assert any("deriv(" in u.what and "QueryError" in u.why for u in d.unseen)


def test_a_node_whose_agent_stops_mid_diagnosis_is_reported_and_the_fault_still_named(
    shapes: RecordedShapes,
) -> None:
    sf = _fleet(shapes, "gpu_memory_leak")
    # sequential queries (workers=1): node 3's series vanish after the 5th range query
    flaky = _Wrapped(sf.to_store(), gone_after=("sim-node-3", 5))
    d = _diagnose(sf, flaky, workers=1)
    assert d.findings[0].where["node"] == "sim-node-2"
    assert d.nodes["sim-node-3"] == "no recent data"
    assert d.nodes["sim-node-1"] == "healthy"


def test_nodes_with_different_label_sets_and_duplicate_instances(shapes: RecordedShapes) -> None:
    sf = _fleet(shapes, "gpu_memory_leak")
    store = Store(retention=10_000)
    for name, labels, values in sf.series():
        labels = {**labels, "instance": "127.0.0.1:9478"}  # every node says the same instance
        if labels["node"] == "sim-node-3":
            if name == "gpu_process_memory_used_bytes":
                continue  # an older agent without per-process GPU memory
            labels.pop("backend", None)
        for t, v in zip(sf.times.tolist(), values.tolist(), strict=True):
            store.append(name, labels, v, t)
    d = _diagnose(sf, store)
    assert d.findings[0].signature == "gpu_memory_leak"
    assert d.findings[0].where["node"] == "sim-node-2"
    assert any(
        u.what.startswith("node=sim-node-3") and "gpu_process_memory_used_bytes" in u.what
        for u in d.unseen
    )
    assert d.nodes["sim-node-3"] == "healthy"


@contextmanager
def _slow_server(delay: float) -> Iterator[str]:
    class Slow(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            time.sleep(delay)
            body = b'{"status":"success","data":{"resultType":"matrix","result":[]}}'
            try:
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            except OSError:
                pass  # the client gave up (timeout): expected

    server = ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_backend_slower_than_the_timeout_is_given_up_quickly() -> None:
    with _slow_server(3.0) as url, PrometheusBackend(url, timeout=0.3) as backend:
        t0 = time.monotonic()
        d = diagnose(backend, end=1.8e9, window=600, step=15)
        took = time.monotonic() - t0
    assert took < 8.0  # 8 workers, 3 timeouts then nothing more is sent
    why = " | ".join(u.why for u in d.unseen)
    assert "BackendTimeout" in why
    assert "not sent: the backend failed 3 queries in a row" in why
    assert all(f.confidence < 0.5 for f in d.findings)


def test_a_backend_that_is_down_is_given_up_after_three_failures() -> None:
    with PrometheusBackend(f"http://127.0.0.1:{free_port()}", timeout=2.0) as backend:
        d = diagnose(backend, end=1.8e9, window=600, step=15, workers=1)
    assert d.queries == 3
    assert backend.queries == 3
    assert any("ConnectError" in u.why for u in d.unseen)
    assert any(u.why.startswith("not sent: the backend failed 3") for u in d.unseen)


def test_the_time_budget_bounds_a_diagnosis() -> None:
    with _slow_server(0.4) as url, PrometheusBackend(url, timeout=5.0) as backend:
        t0 = time.monotonic()
        d = diagnose(backend, end=1.8e9, window=600, step=15, budget=1.0, workers=2)
        took = time.monotonic() - t0
    assert took < 4.0
    assert any("budget ran out" in u.why for u in d.unseen)


def test_range_series_of_the_wrapper_are_real(shapes: RecordedShapes) -> None:
    # the wrappers above hand back the store's own answers: check one is not empty
    sf = _fleet(shapes, None, nodes=2)
    res = _Wrapped(sf.to_store()).query_range("up", sf.times[0], sf.end, sf.step)
    assert res.matrix and isinstance(res.matrix[0], RangeSeries)


def test_a_large_fleet_is_asked_per_node_and_the_top_finding_zooms_in(
    shapes: RecordedShapes,
) -> None:
    sf = SynthFleet(shapes, nodes=6, gpus=4, fault="gpu_memory_leak", faulty_node=2, faulty_gpu=3)
    fine = _diagnose(sf)
    coarse = _diagnose(sf, coarse_above=2)  # 6 nodes count as "large" here
    for d in (fine, coarse):
        top = d.findings[0]
        assert top.signature == "gpu_memory_leak"
        assert top.where["node"] == "sim-node-2"
        assert top.where["gpu"] == "3"
        assert top.where["pid"] == "1003"
    assert coarse.nodes == fine.nodes


def test_the_cli_names_where_from_a_fleet_snapshot_and_never_splits_with_by_none(
    shapes: RecordedShapes, tmp_path: Path
) -> None:
    import json

    from click.testing import CliRunner

    from aivitals.cli import cli

    sf = _fleet(shapes, "gpu_memory_leak", nodes=4)
    snap = tmp_path / "fleet.aivsnap"
    sf.to_store().save(str(snap), start=float(sf.times[0]), end=sf.end)
    args = ["diagnose", "--snapshot", str(snap), "--window", "30m", "--step", "15s"]
    by_node = CliRunner().invoke(cli, [*args, "--format", "json"])
    assert by_node.exit_code == 0, by_node.output
    d = json.loads(by_node.output)
    assert d["location"] == "node" and d["findings"][0]["where"]["node"] == "sim-node-2"
    assert d["nodes"]["sim-node-1"] == "healthy" and d["queries"] > 0
    flat = CliRunner().invoke(cli, [*args, "--by", "none", "--format", "json"])
    assert flat.exit_code == 0, flat.output
    d = json.loads(flat.output)
    assert d["location"] is None and d["nodes"] == {}
    assert d["findings"][0]["scope"] == "local"
    text = CliRunner().invoke(cli, args)
    assert "where: node=sim-node-2" in text.output and "Nodes" in text.output


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--prometheus", "http://a:1", "--victoriametrics", "http://b:2"], "choose one of"),
        (["--prometheus", "http://a:1", "--budget", "0"], "must be positive"),
    ],
)
def test_the_cli_refuses_bad_sources_and_budgets(extra: list[str], message: str) -> None:
    from click.testing import CliRunner

    from aivitals.cli import cli

    res = CliRunner().invoke(cli, ["diagnose", *extra])
    assert res.exit_code == 1
    assert message in str(res.exception)
