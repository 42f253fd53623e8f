from __future__ import annotations

import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from aivitals.agent import Agent, AgentConfig, ScrapeTarget
from aivitals.errors import ConfigError, StoreError

from .conftest import Counting, Hanging, Raising, WithEvents, target_server, wait_for


def cfg(**kw: object) -> AgentConfig:
    base: dict[str, object] = {"listen": "127.0.0.1:0", "interval": 0.2, "gpu": "none"}
    base.update(kw)
    return AgentConfig(**base)  # type: ignore[arg-type]


def test_metrics_and_query_api() -> None:
    with Agent(cfg(), collectors=[Counting()]) as agent:
        wait_for(lambda: agent.store.query("host_load1").values() not in ([], [1.0]))
        wait_for(lambda: agent.ready)
        with httpx.Client(base_url=agent.url, timeout=5) as c:
            _check_api(c)


def _check_api(c: httpx.Client) -> None:
    metrics = c.get("/metrics")
    assert metrics.status_code == 200
    assert metrics.headers["content-type"].startswith("text/plain; version=0.0.4")
    assert "# TYPE host_load1 gauge\nhost_load1 " in metrics.text
    assert 'aivitals_collector_up{collector="counting"} 1\n' in metrics.text
    q = c.get("/api/v1/query", params={"query": "host_load1"}).json()
    assert q["status"] == "success" and q["data"]["resultType"] == "vector"
    assert float(q["data"]["result"][0]["value"][1]) >= 2
    now = time.time()
    r = c.post(
        "/api/v1/query_range",
        data={"query": "host_load1", "start": now - 2, "end": now, "step": "200ms"},
    ).json()
    assert r["data"]["resultType"] == "matrix" and len(r["data"]["result"][0]["values"]) >= 2
    assert "collector" in c.get("/api/v1/labels").json()["data"]
    names = c.get("/api/v1/label/__name__/values").json()["data"]
    assert "host_load1" in names and "aivitals_collector_up" in names
    series = c.get("/api/v1/series", params={"match[]": "aivitals_collector_up"}).json()
    assert series["data"] == [{"__name__": "aivitals_collector_up", "collector": "counting"}]
    assert c.get("/-/ready").status_code == 200
    assert c.get("/-/healthy").status_code == 200


def _raw_post(url: str, length: str) -> bytes:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(
            b"POST /api/v1/query HTTP/1.1\r\nHost: x\r\n"
            b"Content-Type: application/x-www-form-urlencoded\r\n"
            + f"Content-Length: {length}\r\nConnection: close\r\n\r\nquery=up".encode()
        )
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


@pytest.mark.parametrize(
    ("length", "says"), [(str(2 << 20), b"1 MiB"), ("lots", b"is not a number")]
)
def test_post_with_a_bad_or_huge_form_is_refused(length: str, says: bytes) -> None:
    with Agent(cfg(), collectors=[Counting()]) as agent:
        answer = _raw_post(agent.url, length)
    assert answer.startswith(b"HTTP/1.1 400") and says in answer


@pytest.mark.parametrize(
    ("method", "path", "params", "status"),
    [
        ("GET", "/api/v1/query", {"query": "sum("}, 400),
        ("GET", "/api/v1/query", {}, 400),
        ("GET", "/api/v1/query", {"query": "up", "time": "yesterday"}, 400),
        ("GET", "/api/v1/query_range", {"query": "up", "start": "1", "end": "2"}, 400),
        ("GET", "/api/v1/query_range", {"query": "up", "start": 2, "end": 1, "step": 1}, 400),
        ("GET", "/api/v1/query_range", {"query": "up", "start": 0, "end": 1e6, "step": 1}, 400),
        ("GET", "/api/v1/series", {}, 400),
        ("GET", "/nope", {}, 404),
        ("GET", "/api/v1/diagnosis", {}, 404),  # no provider registered
        ("GET", "/api/v1/rules", {"type": "alerts"}, 400),
        ("PUT", "/api/v1/query", {}, 405),
        ("DELETE", "/metrics", {}, 405),
        ("POST", "/metrics", {}, 405),
    ],
)
def test_bad_requests(method: str, path: str, params: dict[str, object], status: int) -> None:
    with Agent(cfg(), collectors=[Counting()]) as agent:
        r = httpx.request(method, agent.url + path, params=params, timeout=5)  # type: ignore[arg-type]
        assert r.status_code == status
        if path.startswith("/api/"):
            assert r.json()["status"] == "error"


@dataclass
class _Alert:
    alertname: str
    labels: dict[str, str]
    annotations: dict[str, str]
    state: str
    active_at: float
    value: float
    fired_at: float | None = None
    resolved_at: float | None = None


@dataclass
class _Diagnosis:
    findings: list[str] = field(default_factory=lambda: ["gpu_memory_leak"])

    def to_json(self) -> str:
        return '{"shape": "gradual", "findings": ["gpu_memory_leak"]}'


def test_alerts_and_diagnosis_providers() -> None:
    with Agent(cfg(), collectors=[Counting()]) as agent:
        agent.set_alerts_provider(
            lambda: [
                _Alert("GPUMemoryHigh", {"severity": "page"}, {"summary": "s"}, "firing", 0.0, 0.93)
            ]
        )
        agent.set_diagnosis_provider(_Diagnosis)
        alerts = httpx.get(agent.url + "/api/v1/alerts", timeout=5).json()["data"]["alerts"]
        assert alerts == [
            {
                "labels": {"alertname": "GPUMemoryHigh", "severity": "page"},
                "annotations": {"summary": "s"},
                "state": "firing",
                "activeAt": "1970-01-01T00:00:00+00:00",
                "value": "0.93",
            }
        ]
        diag = httpx.get(agent.url + "/api/v1/diagnosis", timeout=5).json()
        assert diag == {
            "status": "success",
            "data": {"shape": "gradual", "findings": ["gpu_memory_leak"]},
        }


def test_without_a_rule_engine_alerts_and_rules_answer_empty_with_the_reason() -> None:
    with Agent(cfg(), collectors=[Counting()]) as agent:
        agent.rules_off_reason = "rules are off: a test says so"
        for path, key in (("/api/v1/alerts", "alerts"), ("/api/v1/rules", "groups")):
            body = httpx.get(agent.url + path, timeout=5).json()
            assert body == {
                "status": "success",
                "data": {key: []},
                "warnings": ["rules are off: a test says so"],
            }


_RULES = {
    "groups": [
        {
            "name": "g",
            "rules": [
                {"name": "r:x", "type": "recording", "health": "ok"},
                {"name": "XHigh", "type": "alerting", "alerts": [{"state": "firing"}]},
            ],
        },
        {"name": "h", "rules": [{"name": "YLow", "type": "alerting", "alerts": []}]},
    ]
}


@pytest.mark.parametrize(
    ("params", "expect"),
    [
        ({}, {"g": ["r:x", "XHigh"], "h": ["YLow"]}),
        ({"type": "alert"}, {"g": ["XHigh"], "h": ["YLow"]}),
        ({"type": "record"}, {"g": ["r:x"]}),  # a group the filter empties is left out
        ({"rule_name[]": ["YLow", "r:x"]}, {"g": ["r:x"], "h": ["YLow"]}),
        ({"rule_group[]": "h"}, {"h": ["YLow"]}),
    ],
)
def test_rules_are_filtered_as_prometheus_filters_them(
    params: dict[str, object], expect: dict[str, list[str]]
) -> None:
    with Agent(cfg(), collectors=[Counting()]) as agent:
        agent.set_rules_provider(lambda: _RULES)
        body = httpx.get(agent.url + "/api/v1/rules", params=params, timeout=5).json()  # type: ignore[arg-type]
        assert body["status"] == "success" and "warnings" not in body
        got = {g["name"]: [r["name"] for r in g["rules"]] for g in body["data"]["groups"]}
        assert got == expect
        bare = httpx.get(
            agent.url + "/api/v1/rules", params={"exclude_alerts": "true"}, timeout=5
        ).json()
        assert all("alerts" not in r for g in bare["data"]["groups"] for r in g["rules"])


def test_the_agent_declares_its_gpu_backend_before_anything_runs(tmp_path: Path) -> None:
    sim = Agent(cfg(gpu="sim", sim_gpu_dir=str(tmp_path), kernel_log=False))
    none = Agent(cfg(), collectors=[Counting()])
    assert (sim.gpu_backend, none.gpu_backend) == ("sim", "none")
    sim.stop()  # never started: closes its collectors
    none.start()
    try:
        # published by start() itself, not by the first scheduled run
        assert 'aivitals_gpu_backend_info{backend="none"} 1' in none.metrics_text()
        assert none.store.query("aivitals_gpu_backend_info").values() == [1.0]
    finally:
        none.stop()


def test_hanging_and_raising_collectors_do_not_stop_the_others() -> None:
    hanging, good = Hanging(), Counting()
    agent = Agent(cfg(collector_timeout=0.3), collectors=[hanging, good, Raising()])
    agent.start()
    try:
        wait_for(lambda: 'aivitals_collector_up{collector="hanging"} 0' in agent.metrics_text())
        runs = good.runs
        wait_for(lambda: good.runs >= runs + 3)  # the good one keeps its schedule
        text = agent.metrics_text()
        assert 'aivitals_collector_errors_total{collector="hanging",reason="timeout"} 1' in text
        assert 'aivitals_collector_up{collector="raising"} 0' in text
        assert 'aivitals_collector_errors_total{collector="raising",reason="exception"}' in text
        assert 'aivitals_collector_up{collector="counting"} 1' in text
        up = agent.store.query('aivitals_collector_up{collector="hanging"}').values()
        assert up == [0.0]
    finally:
        hanging.release.set()
        agent.stop()


def test_scrape_targets_into_the_store() -> None:
    with target_server() as base:
        targets = (
            ScrapeTarget.parse(f"vllm={base}/metrics"),
            ScrapeTarget.parse(f"junk={base}/garbage"),
            ScrapeTarget.parse(f"slow={base}/hang"),
        )
        config = cfg(scrape=targets, scrape_interval=0.3, scrape_timeout=0.5)
        with Agent(config, collectors=[Counting()]) as agent:
            wait_for(lambda: agent.store.query('queue_length{job="vllm"}').values() == [3.0])
            result = agent.store.query('queue_length{job="vllm"}').vector[0]
            assert result.labels["queue"] == "engine"  # the alias's label
            assert result.labels["instance"] == base.removeprefix("http://")
            wait_for(lambda: 'up{job="slow"' in agent.metrics_text())
            wait_for(lambda: 'up{job="junk"' in agent.metrics_text())
            ups = {s.labels["job"]: s.value for s in agent.store.query("up").vector}
            assert ups == {"vllm": 1.0, "junk": 0.0, "slow": 0.0}
            text = agent.metrics_text()
            assert 'aivitals_scrape_errors_total{job="junk",' in text and 'reason="parse"' in text
            assert 'reason="timeout"' in text
            assert agent.store.query("other_metric").values() == [1.0]


def test_exporter_mode_has_no_store_and_no_api() -> None:
    with Agent(cfg(exporter=True), collectors=[Counting()]) as agent:
        wait_for(lambda: "host_load1" in agent.metrics_text())
        assert httpx.get(agent.url + "/metrics", timeout=5).status_code == 200
        assert httpx.get(agent.url + "/api/v1/query?query=up", timeout=5).status_code == 404
        assert not agent.has_store
        with pytest.raises(StoreError, match="exporter"):
            agent.store  # noqa: B018


def test_periodic_jobs_and_events() -> None:
    seen: list[float] = []
    with Agent(cfg(), collectors=[WithEvents()]) as agent:
        agent.add_periodic("rules", 0.1, seen.append)
        wait_for(lambda: len(seen) >= 3)
        assert abs(seen[0] - time.time()) < 5  # called with the wall time
        with pytest.raises(ValueError, match="already"):
            agent.add_periodic("rules", 1.0, seen.append)
        wait_for(lambda: len(agent.events()) == 1)
        assert agent.events()[0].fields["xid"] == "79"
        assert agent.events(start=2000.0) == []


def test_stop_is_idempotent_and_final() -> None:
    agent = Agent(cfg(), collectors=[Counting()])
    agent.start()
    agent.stop()
    agent.stop()
    with pytest.raises(RuntimeError, match="restarted"):
        agent.start()


def test_collect_once_without_starting() -> None:
    agent = Agent(cfg(), collectors=[Counting()])
    agent.collect_once()
    assert agent.store.query("host_load1").values() == [1.0]


def test_a_series_a_collector_stops_reporting_goes_stale_at_once() -> None:
    """A GPU process that exits leaves its collector's output: the agent's store answers
    without it at the next collection (it lingered 5 minutes through the look-back)."""
    from aivitals.collect import BaseCollector
    from aivitals.signals import Sample

    class Processes(BaseCollector):
        name = "processes"

        def __init__(self) -> None:
            super().__init__()
            self.pids = ["10", "11"]

        def _collect(self) -> list[Sample]:
            return [Sample("gpu_process_memory_used_bytes", {"pid": p}, 1e9) for p in self.pids]

    procs = Processes()
    agent = Agent(cfg(), collectors=[procs])
    agent.collect_once()
    assert len(agent.store.query("gpu_process_memory_used_bytes").vector) == 2
    time.sleep(0.01)  # the next collection's timestamp is later
    procs.pids = ["10"]
    agent.collect_once()
    got = agent.store.query("gpu_process_memory_used_bytes").vector
    assert [s.labels["pid"] for s in got] == ["10"]


def test_default_collectors_with_sim_gpu(tmp_path: Path) -> None:
    agent = Agent(cfg(gpu="sim", sim_gpu_dir=str(tmp_path), kernel_log=False))
    assert [c.name for c in agent.collectors] == ["host", "gpu"]
    agent.collect_once()
    vector = agent.store.query("gpu_memory_total_bytes").vector
    assert vector[0].labels["backend"] == "sim"
    assert agent.store.query("host_memory_total_bytes").values()[0] > 0


def test_duplicate_collector_names_refused() -> None:
    with pytest.raises(ValueError, match="unique"):
        Agent(cfg(), collectors=[Counting(), Counting()])


@pytest.mark.parametrize(
    ("kw", "word"),
    [
        ({"listen": "0.0.0.0:9478"}, "allow-remote"),
        ({"listen": "nonsense"}, "listen"),
        ({"listen": "127.0.0.1:99999"}, "listen"),
        ({"interval": 0}, "interval"),
        ({"scrape_interval": -1}, "scrape_interval"),
        ({"gpu": "tpu"}, "gpu"),
        ({"pid": 1, "port": 80}, "pid and port"),
        ({"pid": -4}, "pid"),
        ({"port": 0}, "port"),
        ({"tcp_ports": [70000]}, "tcp_ports"),
        ({"collector_timeout": 0}, "collector_timeout"),
        ({"scrape_max_bytes": 10}, "scrape_max_bytes"),
        ({"exporter": True, "scrape": (ScrapeTarget("http://x/metrics"),)}, "scrape"),
    ],
)
def test_config_validation_names_the_key(kw: dict[str, object], word: str) -> None:
    with pytest.raises(ConfigError, match=word):
        cfg(**kw)


def test_remote_listen_needs_the_flag() -> None:
    assert cfg(listen="0.0.0.0:0", allow_remote=True).allow_remote
    assert cfg(listen="[::1]:0").listen == "[::1]:0"


@pytest.mark.parametrize("text", ["ftp://x", "job=", "x=notaurl"])
def test_bad_scrape_target(text: str) -> None:
    with pytest.raises(ConfigError, match="scrape"):
        ScrapeTarget.parse(text)


def test_collectors_without_sim_gpu_never_resolve_the_sim_dir(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A read-only container root has no temp dir; only the sim backend may need one.
    from aivitals.agent import _config

    def no_tmp() -> str:
        raise FileNotFoundError("no usable temporary directory")

    monkeypatch.setattr(_config, "default_sim_dir", no_tmp)
    from aivitals.agent._build import build_collectors

    collectors = build_collectors(_config.AgentConfig(gpu="none", kernel_log=False))
    assert all("Gpu" not in type(c).__name__ for c in collectors)


def test_the_gpu_collector_places_processes_in_pods(tmp_path: Path) -> None:
    """Pod labels from the cgroups always; names only from the source --kubelet-pods gives."""
    from aivitals.agent._build import build_collectors
    from aivitals.collect import KubeletPodsFile
    from aivitals.collect.gpu import GpuCollector

    def gpu_of(config: AgentConfig) -> GpuCollector:
        (gpu,) = [c for c in build_collectors(config) if isinstance(c, GpuCollector)]
        return gpu

    pods = Path(__file__).parents[1] / "collect" / "fixtures" / "pods" / "kubelet-pods.json"
    sim = str(tmp_path)
    named = gpu_of(
        AgentConfig(gpu="sim", sim_gpu_dir=sim, kernel_log=False, kubelet_pods=str(pods))
    )
    assert named.pods is not None and isinstance(named.pods.source, KubeletPodsFile)
    assert str(named.pods.proc_root) == "/proc"
    plain = gpu_of(AgentConfig(gpu="sim", sim_gpu_dir=sim, kernel_log=False))
    assert plain.pods is not None and plain.pods.source is None
    with pytest.raises(ConfigError, match="ftp"):
        AgentConfig(kubelet_pods="ftp://node/pods")


def test_the_agent_serves_its_own_diagnosis_with_memory() -> None:
    with Agent(cfg(), collectors=[Counting()]) as agent:
        memory = agent.serve_diagnosis(window=60.0, hold=16.0)
        wait_for(lambda: agent.ready)
        body = httpx.get(agent.url + "/api/v1/diagnosis", timeout=30).json()
        assert body["status"] == "success"
        data = body["data"]
        assert data["end"] - data["start"] == pytest.approx(60.0)
        assert "findings" in data and "unseen" in data
        assert memory.hold == 16.0
    with pytest.raises(ConfigError, match="window must be > 0"):
        Agent(cfg()).serve_diagnosis(window=0.0)
    with pytest.raises(StoreError):
        Agent(cfg(exporter=True)).serve_diagnosis()


def test_auto_without_a_readable_gpu_on_nvidia_hardware_declares_it_unreadable(
    tmp_path: Path,
) -> None:
    """GPUMetricsAbsent must still page on a node whose NVIDIA driver or devices are there
    but which no backend could read; a node with no sign of a GPU declares none."""
    from aivitals.agent._agent import _gpu_backend

    driver = tmp_path / "driver-nvidia"
    assert _gpu_backend([Counting()], asked="auto", signs=[driver]) == "none"
    driver.mkdir()
    assert _gpu_backend([Counting()], asked="auto", signs=[driver]) == "unreadable"
    # asked for none: no GPU is expected, whatever the node has
    assert _gpu_backend([Counting()], asked="none", signs=[driver]) == "none"
