"""Every dashboard query, sent to a real Prometheus that scrapes a running service.

The stack: the demo service (Redis cache, sim GPU) and ``aivitals agent
--exporter --gpu sim`` as its own process, both labelled ``node="node-1"``;
a fixed exposition in vLLM, TGI and DCGM names labelled ``node="node-2"``
(an ``engine-fixture`` job: it stands in for engines this machine cannot run
and proves the alias path, not the engines); a target nobody listens on, so
``TargetDown`` really fires; the rule pack loaded with time compressed. A
simulated Xid is injected on the sim GPU. Each query is rendered the way
Grafana renders it and sent as Grafana sends it (range or instant).
"""

from __future__ import annotations

import math
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from aivitals.alerts import default_pack
from aivitals.dashboards import build_dashboards, render_variables
from aivitals.demo._stack import QUICK_RULES, Stack, StackConfig, scale_for
from tests._servers import free_port, prometheus

pytestmark = [pytest.mark.integration, pytest.mark.slow]

#: Panel queries that have no data on this stack, each with why. They must still be
#: accepted by Prometheus, and must really be empty (a listed query that gains data
#: fails the test, so the list cannot grow stale). Every other query must have data.
NO_DATA_HERE: dict[tuple[str, str], str] = {
    ("GPU time vs wall time (P99)", "C"): "cuda_stream_wait_time_seconds needs a CUDA stream: "
    "the demo runs its models on the CPU here",
    ("Prefix cache hit ratio", "A"): "no engine with a prefix cache runs here (vLLM's "
    "vllm:prefix_cache_* fill it)",
    ("Inferences in progress, preemptions", "B"): "preemptions come from a paging engine "
    "(vllm:num_preemptions); none runs here",
    (
        "ECC errors and remapped rows",
        "A",
    ): "the sim GPU does not model ECC; NVML on a real GPU does",
    ("ECC errors and remapped rows", "B"): "the sim GPU does not model row remapping",
    ("PCIe throughput", "A"): "the sim GPU does not model PCIe; NVML and DCGM do",
    ("PCIe throughput", "B"): "as above, receive",
    ("Memory per pod", "A"): "no GPU process runs in a Kubernetes pod here (test_pods.py "
    "covers the labels on fixture /proc trees)",
    ("Memory per pod", "B"): "as above, for a pod known by UID only",
}
#: Queries whose data depends on the machine the test runs on, not on aivitals.
MAY_BE_EMPTY: dict[tuple[str, str], str] = {
    ("Host memory used share", "B"): "swap share: undefined on a machine without swap",
    ("Disk await", "A"): "no disk read may complete in the short window (0/0 is dropped)",
    ("Disk await", "B"): "as above, for writes",
    ("OOM kills", "B"): "the kernel log may be unreadable (no CAP_SYSLOG in a container)",
    ("Pressure stall (PSI)", "A"): "/proc/pressure is absent on kernels without PSI",
}

FIXTURE = """\
# A fixed exposition in engines' own names (see the module docstring).
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{model_name="fixture-llm"} 0.42
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="fixture-llm"} 3
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{model_name="fixture-llm",le="0.1"} {n1}
vllm:time_to_first_token_seconds_bucket{model_name="fixture-llm",le="1.0"} {n}
vllm:time_to_first_token_seconds_bucket{model_name="fixture-llm",le="+Inf"} {n}
vllm:time_to_first_token_seconds_sum{model_name="fixture-llm"} {s}
vllm:time_to_first_token_seconds_count{model_name="fixture-llm"} {n}
# TYPE tgi_queue_size gauge
tgi_queue_size 2
# TYPE DCGM_FI_DEV_FB_USED gauge
DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-fixture",GPU_I_ID="1",modelName="fixture"} 1024
# TYPE DCGM_FI_DEV_FB_FREE gauge
DCGM_FI_DEV_FB_FREE{gpu="0",UUID="GPU-fixture",GPU_I_ID="1",modelName="fixture"} 3072
# TYPE DCGM_FI_DEV_GPU_UTIL gauge
DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-fixture",GPU_I_ID="1",modelName="fixture"} 37
"""


@pytest.fixture
def engine_fixture() -> Iterator[str]:
    started = time.monotonic()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            n = int((time.monotonic() - started) * 10) + 1  # counters that grow
            body = (
                FIXTURE.replace("{n1}", str(n // 2))
                .replace("{n}", str(n))
                .replace("{s}", str(0.3 * n))
                .encode()
            )
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def _agent(port: int, service_port: int, sim_dir: Path, log: Path) -> subprocess.Popen[bytes]:
    argv = [
        sys.executable, "-c", "from aivitals.cli import main; main()", "agent",
        "--exporter", "--gpu", "sim", "--sim-gpu-dir", str(sim_dir),
        "--port", str(service_port), "--listen", f"127.0.0.1:{port}", "--interval", "1s",
    ]  # fmt: skip
    with log.open("wb") as out:
        return subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )


def _config(service: str, agent: str, engine: str, down: str, rules: Path) -> str:
    def job(name: str, target: str, node: str) -> str:
        return (
            f"  - job_name: {name}\n    static_configs:\n"
            f"      - targets: ['{target}']\n        labels: {{node: {node}}}\n"
        )

    return (
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        f"rule_files: ['{rules}']\nscrape_configs:\n"
        + job("ai-service", service, "node-1")
        + job("aivitals-agent", agent, "node-1")
        + job("engine-fixture", engine, "node-2")
        + job("down", down, "node-3")
    )


def _traffic(url: str, stop: threading.Event) -> None:
    with httpx.Client(base_url=url, timeout=30.0) as client:
        i = 0
        while not stop.is_set() and i < 2000:  # bounded
            i += 1
            try:
                client.post("/v1/embeddings", json={"input": [f"text {i % 7}", "x"]})
                client.post(
                    "/v1/completions",
                    json={"prompt": f"hello {i}", "max_tokens": 4, "stream": True},
                )
                client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 10**6})  # 4xx
            except httpx.HTTPError:
                pass
            stop.wait(0.2)


def ask(prom: str, target: dict[str, Any], expr: str, now: float) -> list[Any]:
    if target.get("instant"):
        r = httpx.get(f"{prom}/api/v1/query", params={"query": expr, "time": now}, timeout=30)
    else:
        params = {"query": expr, "start": now - 20, "end": now, "step": 1}
        r = httpx.get(f"{prom}/api/v1/query_range", params=params, timeout=30)
    body = r.json()
    assert r.status_code == 200 and body["status"] == "success", (expr, body)
    out: list[Any] = []
    for series in body["data"]["result"]:
        values = series.get("values") or [series.get("value")]
        if any(v and not math.isnan(float(v[1])) for v in values):
            out.append(series)
    return out


def test_every_panel_query_returns_data_from_a_real_prometheus(
    tmp_path: Path, engine_fixture: str
) -> None:
    pack = default_pack(**QUICK_RULES)
    rules = tmp_path / "aivitals-rules.yml"
    rules.write_text(scale_for(pack.text, 60.0))
    docs = build_dashboards(pack)
    agent_port, down_port = free_port(), free_port()
    stop = threading.Event()
    with Stack(StackConfig(quick=True, agent=False, workdir=tmp_path / "stack")) as stack:
        assert stack.service is not None
        agent = _agent(agent_port, stack.service.port, stack.sim_gpu_dir, tmp_path / "agent.log")
        traffic = threading.Thread(target=_traffic, args=(stack.service.url, stop), daemon=True)
        try:
            config = _config(
                f"127.0.0.1:{stack.service.port}",
                f"127.0.0.1:{agent_port}",
                engine_fixture,
                f"127.0.0.1:{down_port}",
                rules,
            )
            with prometheus(config) as prom:
                traffic.start()
                from aivitals.collect.gpu import SimGPU

                time.sleep(8)
                # simulated (backend="sim"); 48, a double-bit ECC error: a 79 would leave
                # the sim device lost and every later model call failing
                SimGPU(stack.sim_gpu_dir).inject_xid(0, 48)
                time.sleep(22)
                assert agent.poll() is None, (tmp_path / "agent.log").read_text()[-2000:]
                _check(prom.url, docs)
        finally:
            stop.set()
            traffic.join(timeout=60)
            agent.terminate()
            try:
                agent.wait(timeout=10)
            except subprocess.TimeoutExpired:
                agent.kill()
                agent.wait(timeout=5)


def _check(prom: str, docs: dict[str, dict[str, Any]]) -> None:
    now = time.time()
    values = {"node": ".*", "instance": ".*", "model": ".*", "gpu": ".*", "__rate_interval": "10s"}
    values |= {"namespace": ".*", "pod": ".*"}
    empty: list[str] = []
    gained: list[str] = []
    seen: set[tuple[str, str]] = set()
    missing_families: set[str] = set()
    for uid, doc in docs.items():
        for panel in doc["panels"]:
            for target in panel.get("targets", []):
                key = (panel["title"], target["refId"])
                seen.add(key)
                result = ask(prom, target, render_variables(target["expr"], values), now)
                if panel["title"] == "Not collected":
                    missing_families |= {s["metric"]["metric"] for s in result}
                    continue
                name = f"{uid} / {panel['title']} [{target['refId']}]"
                if key in NO_DATA_HERE and result:
                    gained.append(name)
                elif not result and key not in NO_DATA_HERE and key not in MAY_BE_EMPTY:
                    empty.append(f"{name}: {target['expr']}")
    assert not empty, "queries without data:\n" + "\n".join(empty)
    assert not gained, f"listed in NO_DATA_HERE but returned data (remove them): {gained}"
    stale = (set(NO_DATA_HERE) | set(MAY_BE_EMPTY)) - seen
    assert not stale, f"NO_DATA_HERE names queries no dashboard has: {stale}"
    # filled only through aliases (the vLLM/TGI/DCGM fixture), so never reported missing
    assert not missing_families & {"kv_cache_usage_ratio", "gpu_memory_used_bytes"}
    # and what is reported missing is what the sim GPU and the CPU models cannot export
    assert "gpu_ecc_errors_total" in missing_families
    assert missing_families <= {
        "gpu_ecc_errors_total",
        "gpu_remapped_rows",
        "gpu_pcie_tx_bytes_per_second",
        "gpu_pcie_rx_bytes_per_second",
        "cuda_stream_wait_time_seconds",
        "kv_cache_hits_total",
        "kv_cache_queries_total",
        "model_preemptions_total",
        # machine-dependent (MAY_BE_EMPTY)
        "kernel_oom_kills_total",
        "host_pressure_stalled_seconds_total",
    }, missing_families
    _check_aliases(prom, docs, now)


def _check_aliases(prom: str, docs: dict[str, dict[str, Any]], now: float) -> None:
    """node-2 is only the engine fixture: its panels carry our labels and units."""
    panels = {p["title"]: p for d in docs.values() for p in d["panels"]}
    node2 = {"node": "node-2", "instance": ".*", "model": ".*", "gpu": ".*"}
    node2 |= {"namespace": ".*", "pod": ".*"}
    node2["__rate_interval"] = "10s"

    def one(title: str, ref: int = 0) -> list[Any]:
        target = panels[title]["targets"][ref]
        return ask(prom, {"instant": True}, render_variables(target["expr"], node2), now)

    kv = one("KV cache in use")
    assert [(s["metric"]["model"], float(s["value"][1])) for s in kv] == [("fixture-llm", 0.42)]
    used = one("Memory used")
    # DCGM's MiB in bytes, the MIG instance label kept
    assert [(s["metric"]["GPU_I_ID"], float(s["value"][1])) for s in used] == [("1", 1024 * 2**20)]
    share = one("Memory used share")
    assert [float(s["value"][1]) for s in share] == [0.25]
    assert [float(s["value"][1]) for s in one("Utilization")] == [0.37]
    queues = {s["metric"]["queue"]: float(s["value"][1]) for s in one("Queue length")}
    assert queues == {"engine": 3.0} or queues == {"engine": 2.0}  # vLLM's or TGI's (same labels)
    assert one("Time to first token P50 / P99"), "vLLM's TTFT histogram fills the panel"
    # a vLLM-only node has no aivitals GPU exporter: the coverage panel says so by name
    target = panels["Not collected"]["targets"][0]
    gpu_missing = {s["metric"]["metric"] for s in one_doc(prom, target, node2, now)}
    assert "gpu_memory_used_bytes" not in gpu_missing


def one_doc(prom: str, target: dict[str, Any], values: dict[str, str], now: float) -> list[Any]:
    return ask(prom, {"instant": True}, render_variables(target["expr"], values), now)
