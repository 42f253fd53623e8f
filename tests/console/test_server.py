"""The console's server side: static files (traversal refused), the JSON API, read-only."""

from __future__ import annotations

import gzip
import http.client
import json
import math
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from aivitals.agent import Agent, AgentConfig
from aivitals.alerts import default_pack
from aivitals.console import (
    MAX_POINTS,
    STATIC_DIR,
    ConsoleServer,
    RemoteSource,
    choose_step,
    expr_threshold,
    normalize_alerts,
    range_payload,
    resolve_static,
    respond,
)
from aivitals.console._api import meta_payload, rate_window
from aivitals.console._source import _pack_rules, evidence_chart
from aivitals.errors import ConfigError
from aivitals.signals import Sample
from aivitals.tsdb import Store


def _source(store: Store, tick: float = 1.0) -> Any:
    rules = _pack_rules(default_pack().groups)
    return SimpleNamespace(
        kind="agent",
        url="(test)",
        backend=store,
        tick=tick,
        rules=lambda: rules,
        alerts=lambda: {"alerts": [], "history": []},
        diagnosis=lambda s, e: {"shape": "healthy", "findings": []},
    )


def _store(now: float, seconds: int = 600) -> Store:
    store = Store(retention=86400 * 2)
    for i in range(seconds):
        t = now - seconds + i
        store.append_samples(
            [
                Sample("queue_length", {"queue": "a"}, float(i % 7), t),
                Sample("http_requests_total", {"route": "/x"}, float(i * 3), t),
            ],
            default_timestamp=t,
        )
    return store


def _raw_get(url: str, path: str) -> tuple[int, bytes]:
    """GET with the path sent byte for byte (httpx would normalise ``..`` away)."""
    host, port = url.split("//")[1].split("/")[0].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.putrequest("GET", path, skip_accept_encoding=True)
        conn.endheaders()
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


# --- static files ------------------------------------------------------------------------
TRAVERSALS = [
    "../_api.py",
    "..%2f_api.py",
    "%2e%2e/_api.py",
    "%2E%2E%2F_app.py",
    "js/../../_app.py",
    "js/%2e%2e/%2e%2e/_source.py",
    "/etc/passwd",
    "%2fetc%2fpasswd",
    "..\\_api.py",
    "js\\..\\..\\_api.py",
    "index.html%00.js",
    ".hidden.css",
    "js/.x.js",
    "vendor/../../__init__.py",
    "%c0%ae%c0%ae/_api.py",  # overlong UTF-8 dots: not valid UTF-8, refused
    "",
    "js",
    "js/",
    "app.css/",
]


@pytest.mark.parametrize("rel", TRAVERSALS)
def test_resolve_static_refuses_paths_outside_or_odd(rel: str) -> None:
    assert resolve_static(rel) is None


def test_resolve_static_refuses_a_symlink_out(tmp_path: Path) -> None:
    root = tmp_path / "static"
    root.mkdir()
    (tmp_path / "secret.css").write_text("x")
    (root / "link.css").symlink_to(tmp_path / "secret.css")
    (root / "ok.css").write_text("y")
    assert resolve_static("link.css", root) is None
    assert resolve_static("ok.css", root) == (root / "ok.css").resolve()


def test_resolve_static_finds_the_shipped_files() -> None:
    for rel in ("index.html", "app.css", "js/app.js", "vendor/uPlot.iife.min.js"):
        path = resolve_static(rel)
        assert path is not None and path.is_relative_to(STATIC_DIR)
    assert (STATIC_DIR / "vendor" / "uPlot.LICENSE.txt").read_text().startswith("The MIT License")


def test_static_answers_gzip_etag_and_security_headers() -> None:
    r = respond(None, "GET", "/", "", {"accept-encoding": "gzip, br"})
    assert r is not None and r.status == 200
    assert r.headers["Content-Encoding"] == "gzip"
    assert b"<title>aivitals console</title>" in gzip.decompress(r.body)
    assert "script-src 'self'" in r.headers["Content-Security-Policy"]
    assert r.headers["X-Content-Type-Options"] == "nosniff"
    again = respond(None, "GET", "/", "", {"if-none-match": r.headers["ETag"]})
    assert again is not None and again.status == 304 and again.body == b""
    plain = respond(None, "GET", "/console/js/app.js", "", {})
    assert plain is not None and plain.status == 200
    assert plain.content_type.startswith("text/javascript") and b"import" in plain.body
    assert respond(None, "GET", "/api/v1/query", "", {}) is None  # not the console's path


def test_console_is_read_only() -> None:
    for method in ("POST", "PUT", "DELETE", "PATCH"):
        for path in ("/", "/console/app.css", "/console/api/meta"):
            r = respond(None, method, path, "", {})
            assert r is not None and r.status == 405, (method, path)


# --- the range API -----------------------------------------------------------------------
def test_choose_step_caps_points_per_series() -> None:
    assert choose_step(0, 300, 1) == 1.0
    assert choose_step(0, 3600, 1) == 5.0
    assert choose_step(0, 86400, 1) == 60.0
    for span in (60, 3600, 86400, 7 * 86400):
        step = choose_step(0, span, 1)
        assert span / step + 1 <= MAX_POINTS
    assert choose_step(0, 86400, 1, max_points=100) == 900.0
    for bad in ((0, 10, 0), (0, 10, -1), (10, 0, 1), (0, math.inf, 1), (0, 10, math.nan)):
        with pytest.raises(ConfigError):
            choose_step(*bad)
    with pytest.raises(ConfigError, match="limit"):
        choose_step(0, 30 * 86400, 60)


def test_range_payload_on_one_grid_with_gaps_as_null() -> None:
    now = float(int(time.time()))
    src = _source(_store(now, 120))
    data = range_payload(src, ["queue_length", "rate(http_requests_total[$W])"], now - 300, now, 1)
    times = data["times"]
    assert data["step"] == 1.0 and data["rate_window"] == "4s"
    assert times[0] == now - 300 and times[-1] >= now and len(times) == 301
    q, r = data["results"]
    [series] = q["series"]
    assert series["metric"] == {"__name__": "queue_length", "queue": "a"}
    assert len(series["values"]) == len(times)
    assert series["values"][0] is None  # before the data: null, not 0
    assert series["values"][-2] is not None
    assert r["series"][0]["values"][-2] == pytest.approx(3.0)  # $W became a real window


def test_range_payload_downsamples_a_huge_range_on_the_server() -> None:
    now = float(int(time.time()))
    src = _source(_store(now, 60))
    data = range_payload(src, ["queue_length"], now - 7 * 86400, now, 1)
    assert len(data["times"]) <= MAX_POINTS
    assert data["step"] >= 7 * 86400 / MAX_POINTS
    few = range_payload(src, ["queue_length"], now - 3600, now, 1, max_points=50)
    assert len(few["times"]) <= 50


def test_range_payload_reports_a_bad_query_and_keeps_the_others() -> None:
    now = time.time()
    src = _source(_store(now, 30))
    data = range_payload(src, ["sum(", "queue_length", "  ", "no_such_metric"], now - 60, now, 1)
    bad, good, empty, missing = data["results"]
    assert "QueryError" in bad["error"] and bad["series"] == []
    assert good["series"] and "error" not in good
    assert empty["error"] == "empty expression"
    assert missing["series"] == [] and "error" not in missing  # "not collected" in the page


def test_range_payload_refuses_too_many_queries_and_none() -> None:
    src = _source(Store())
    with pytest.raises(ConfigError):
        range_payload(src, [], 0, 10, 1)
    with pytest.raises(ConfigError):
        range_payload(src, ["up"] * 13, 0, 10, 1)


def test_rate_window_spans_four_scrapes() -> None:
    assert rate_window(1.0, 1.0) == "4s"
    assert rate_window(15.0, 1.0) == "60s"
    assert rate_window(1.0, 60.0) == "120s"
    assert rate_window(1.0, 0.3) == "4s"


# --- thresholds, alerts, evidence ----------------------------------------------------------
def test_thresholds_come_from_the_rule_pack_parameters() -> None:
    rules = _pack_rules(default_pack(queue_limit=33, gpu_memory_ratio=0.8).groups)
    assert rules["QueueBacklog"]["value"] == 33 and rules["QueueBacklog"]["op"] == ">"
    assert rules["GPUMemoryHigh"]["value"] == 0.8
    assert rules["InferenceLatencyHigh"]["value"] == 2.0  # 2 x the 1 s SLA
    assert rules["GPUProcessMemoryGrowth"]["value"] == 2**30
    meta = meta_payload(SimpleNamespace(**{**vars(_source(Store())), "rules": lambda: rules}))
    assert meta["thresholds"]["queue_length"][0]["value"] == 33
    assert {t["alert"] for t in meta["thresholds"]["gpu_util"]} == {
        "GPUUtilizationHigh",
        "GPUUtilizationLow",
    }


def test_expr_threshold_cases() -> None:
    assert expr_threshold("a > 1") == (">", 1.0)
    assert expr_threshold("(a) <= (2 * 3)") == ("<=", 6.0)
    assert expr_threshold("a > 1 and on () b > 5") == (">", 1.0)
    # two sources of one quantity against one limit (an alert on either)
    assert expr_threshold('a > 20 or label_replace(b, "q", "$1", "p", "(.+)") > 20') == (">", 20.0)
    assert expr_threshold("a > b") is None
    assert expr_threshold("rate(a[5m])") is None
    assert expr_threshold("sum(") is None


def test_evidence_chart_strips_the_comparison_and_maps_vitals() -> None:
    c = evidence_chart("deriv(gpu_process_memory_used_bytes[10s]) > 2000000", {})
    assert c["threshold"] == {"op": ">", "value": 2000000.0}
    assert c["expr"].startswith("deriv(gpu_process_memory_used_bytes")
    assert evidence_chart("p99_latency", {"p99_latency": "hq"}) == {"expr": "hq", "threshold": None}
    assert evidence_chart("sum(", {})["expr"] == "sum("


def test_normalize_alerts_of_an_agent_and_of_prometheus() -> None:
    rules = _pack_rules(default_pack().groups)
    agent = normalize_alerts(
        {
            "alerts": [
                {
                    "alertname": "QueueBacklog",
                    "labels": {"severity": "P0", "layer": "service", "queue": "<b>q</b>"},
                    "annotations": {"summary": "<script>x</script>"},
                    "state": "firing",
                    "active_at": 100.0,
                    "fired_at": 160.0,
                    "resolved_at": None,
                    "value": 31.0,
                }
            ],
            "history": [],
        },
        rules,
    )
    [a] = agent["alerts"]
    assert a["threshold"]["value"] == 20 and a["value"] == 31.0 and a["severity"] == "P0"
    # markup stays data: escaping is the page's job (textContent), never the server's guess
    assert a["labels"]["queue"] == "<b>q</b>"
    assert a["annotations"]["summary"] == "<script>x</script>"
    prom = normalize_alerts(
        {
            "alerts": [
                {
                    "labels": {"alertname": "GPUMemoryHigh", "severity": "P1", "gpu": "0"},
                    "annotations": {},
                    "state": "firing",
                    "activeAt": "2026-01-01T00:00:00Z",
                    "value": "9.5e-01",
                }
            ]
        },
        rules,
    )
    [p] = prom["alerts"]
    assert p["alertname"] == "GPUMemoryHigh" and p["layer"] == "model"
    assert p["active_at"] == 1767225600.0 and p["value"] == 0.95
    assert normalize_alerts({"alerts": ["junk", None]}, rules)["alerts"] == []


# --- served by a real agent, and by `aivitals console` over it -----------------------------
@pytest.fixture(scope="module")
def agent() -> Any:
    with Agent(AgentConfig(listen="127.0.0.1:0", interval=0.2, gpu="none")) as a:
        now = time.time()
        a.store.append_samples(
            [Sample("queue_length", {"queue": "q"}, float(i), now - 30 + i) for i in range(30)],
            default_timestamp=now,
        )
        yield a


def test_agent_serves_the_console_and_refuses_traversal(agent: Any) -> None:
    r = httpx.get(agent.url + "/")
    assert r.status_code == 200 and "aivitals console" in r.text
    assert r.headers["content-security-policy"]
    for rel in [*TRAVERSALS, "../agent/_http.py", "../../errors.py"]:
        status, body = _raw_get(agent.url, "/console/" + rel)
        assert status == 404, rel
        assert b"import" not in body and b"root:" not in body
    status, _ = _raw_get(agent.url, "/console/../../pyproject.toml")
    assert status == 404
    assert httpx.post(agent.url + "/console/api/meta").status_code == 405
    assert httpx.get(agent.url + "/api/v1/query", params={"query": "1"}).status_code == 200


def test_agent_console_api(agent: Any) -> None:
    meta = httpx.get(agent.url + "/console/api/meta").json()["data"]
    assert meta["backend"]["kind"] == "agent" and meta["thresholds"]["queue_length"]
    now = time.time()
    r = httpx.get(
        agent.url + "/console/api/range",
        params={"q": "queue_length", "start": now - 60, "end": now, "points": 30},
    )
    data = r.json()["data"]
    assert len(data["times"]) <= 30 and data["results"][0]["series"]
    alerts = httpx.get(agent.url + "/console/api/alerts").json()["data"]
    assert alerts["alerts"] == [] and "no alert rules" in alerts["note"]
    d = httpx.get(agent.url + "/console/api/diagnosis", params={"start": now - 60, "end": now})
    assert d.status_code == 200 and d.json()["data"]["shape"]
    for params in (
        {"q": "queue_length", "start": now, "end": now - 10},
        {"q": "queue_length", "start": "yesterday", "end": now},
        {"q": "queue_length", "start": now - 10, "end": now, "points": "-3"},
        {"q": "queue_length", "start": now - 10, "end": now, "step": "nan"},
        {"q": "queue_length", "start": 0, "end": now},
    ):
        bad = httpx.get(agent.url + "/console/api/range", params=params)
        assert bad.status_code == 400, params
        assert bad.json()["status"] == "error"
    bad = httpx.get(agent.url + "/console/api/diagnosis", params={"start": now})
    assert bad.status_code == 400
    bad = httpx.get(agent.url + "/console/api/diagnosis", params={"start": 0, "end": now})
    assert bad.status_code == 400 and "limit" in bad.json()["error"]
    assert httpx.get(agent.url + "/console/api/nope").status_code == 404


def test_console_server_over_a_remote_agent(agent: Any) -> None:
    with ConsoleServer(RemoteSource(agent.url, kind="agent", tick=1.0)) as server:
        assert httpx.get(server.url).status_code == 200
        now = time.time()
        r = httpx.get(
            server.url + "console/api/range",
            params={"q": "queue_length", "start": now - 60, "end": now},
        )
        assert r.json()["data"]["results"][0]["series"]
        d = httpx.get(server.url + "console/api/diagnosis", params={"start": now - 60, "end": now})
        assert d.status_code == 200 and "findings" in d.json()["data"]
        report = httpx.get(server.url + "console/api/report", timeout=30).json()["data"]
        assert report["peak_queue"] == 29.0
        status, _ = _raw_get(server.url, "/console/../_server.py")
        assert status == 404


def test_remote_prometheus_source_computes_the_diagnosis_here(agent: Any) -> None:
    # the agent speaks the Prometheus API; as kind="prometheus" nothing agent-only is used
    source = RemoteSource(agent.url, kind="prometheus", tick=1.0)
    try:
        d = source.diagnosis(None, None)
        assert d["end"] - d["start"] == pytest.approx(900.0)
        assert "findings" in d and d["shape"]
        # no /api/v1/rules on an agent: the shipped pack's thresholds
        assert source.rules()["QueueBacklog"]["value"] == 20
        with pytest.raises(ConfigError, match="end must be after start"):
            source.diagnosis(10.0, 5.0)
    finally:
        source.close()


def test_the_latest_diagnosis_of_a_prometheus_is_computed_once_per_tick(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The Diagnosis and Fleet pages both poll it: one computation serves both per tick."""
    from aivitals.console import _source

    windows: list[tuple[float, float]] = []

    from aivitals.diagnose import Diagnosis, Shape

    def counted(
        backend: Any, start: float, end: float, alerts: Any, events: Any, hold: float = 0.0
    ) -> Any:
        windows.append((start, end))
        return Diagnosis(Shape.HEALTHY, start, end, 1.0, [], [], [])

    monkeypatch.setattr(_source, "_run_diagnosis", counted)
    source = RemoteSource("http://127.0.0.1:9", kind="prometheus", tick=3.0, timeout=1.0)
    try:
        first = source.diagnosis(None, None)
        time.sleep(1.1)  # a new second: a key made of the window would miss here
        assert source.diagnosis(None, None) is first
        assert len(windows) == 1 and windows[0][1] - windows[0][0] == pytest.approx(900.0)
        source.diagnosis(100.0, 200.0)  # a chosen window is its own computation
        assert windows[-1] == (100.0, 200.0)
    finally:
        source.close()


def test_console_server_when_the_backend_is_down() -> None:
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    with ConsoleServer(RemoteSource(dead, kind="prometheus", tick=1.0, timeout=2.0)) as server:
        assert httpx.get(server.url).status_code == 200  # the page itself still loads
        now = time.time()
        r = httpx.get(
            server.url + "console/api/range",
            params={"q": "up", "start": now - 60, "end": now},
        )
        # the query's error is reported in its result, the request itself succeeds
        assert "BackendError" in r.json()["data"]["results"][0]["error"]
        a = httpx.get(server.url + "console/api/alerts")
        assert a.status_code == 502 and "BackendError" in a.json()["error"]
        meta = httpx.get(server.url + "console/api/meta")
        assert meta.status_code == 200 and meta.json()["data"]["gpu_backends"] == []


def test_a_stopped_agent_stops_answering_on_kept_alive_connections() -> None:
    a = Agent(AgentConfig(listen="127.0.0.1:0", interval=0.2, gpu="none"))
    a.start()
    host, port = a.url.split("//")[1].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request("GET", "/")
        first = conn.getresponse()
        assert first.status == 200 and first.read()
        a.stop()
        conn.request("GET", "/api/v1/query?query=1")
        second = conn.getresponse()
        assert second.status == 503 and b"stopped" in second.read()
    finally:
        conn.close()
        a.stop()


def test_json_never_carries_nan() -> None:
    src = _source(Store())
    src.diagnosis = lambda s, e: {"x": math.nan, "findings": [{"confidence": math.inf}]}
    r = respond(src, "GET", "/console/api/diagnosis", "", {})
    assert r is not None and r.status == 200
    assert json.loads(r.body)["data"] == {"x": None, "findings": [{"confidence": None}]}
