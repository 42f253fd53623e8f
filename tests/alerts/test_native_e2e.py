"""A real Prometheus scraping vLLM-, DCGM- and node_exporter-shaped targets directly, with
no aivitals agent in between: the exported pack plus the native-name recording rules
fire, and ``aivitals diagnose --prometheus`` names the fault, with the rules loaded and,
on a second Prometheus scraping the same targets, without them (the diagnosis's own
fallback).

The targets serve the exporters' published expositions (tests/fixtures/exporters)
with a fault drawn into the series over time: the values of the vLLM and DCGM samples
below are SIMULATED by this test (names, types, label sets and the rest of the
exposition are the projects' own).
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from click.testing import CliRunner

from aivitals.alerts import default_pack, native_rules_text
from aivitals.cli import cli
from aivitals.demo import for_floors, scale_for
from aivitals.timescale import QUICK
from tests._paths import FIXTURES
from tests._servers import prometheus

EXPORTERS = FIXTURES / "exporters"
MODEL = 'model_name="meta-llama/Llama-3.1-8B-Instruct"'
#: dcgm-exporter's label set, in its template's order (render_metrics.go)
GPU = (
    'gpu="0",UUID="GPU-604ac76c-d9cf-fef3-62e9-d92044ab6e52",pci_bus_id="00000000:01:00.0",'
    'device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-node-1"'
)
TOTAL_MIB = 81559.0
FAULTS = ("KVCacheHigh", "QueueBacklog", "GPUMemoryHigh")


def _published(path: Path) -> str:
    lines = path.read_text().splitlines()
    return "\n".join(ln for ln in lines if not ln.startswith("$ ") and ln != "...") + "\n"


def _dcgm_help() -> dict[str, tuple[str, str]]:
    out = {}
    for line in (EXPORTERS / "dcgm-exporter/default-counters.csv").read_text().splitlines():
        if line.startswith("DCGM_"):
            field, kind, help_ = (p.strip() for p in line.split(",", 2))
            out[field] = (kind, help_)
    return out


def _node_text() -> str:
    keep = ("node_cpu_", "node_memory_", "node_load", "node_vmstat_")
    text = (EXPORTERS / "node_exporter/e2e-output.txt").read_text()
    out = [ln for ln in text.splitlines() if re.sub(r"^# (HELP|TYPE) ", "", ln).startswith(keep)]
    return "\n".join(out) + "\n"


class Targets:
    """vLLM, DCGM and node_exporter on one local server (/vllm, /dcgm, /node); the fault
    starts with ``fault()`` and grows over ``ramp`` seconds."""

    def __init__(self, ramp: float = 4.0) -> None:
        self.ramp = ramp
        self.since: float | None = None
        self.vllm_base = _published(EXPORTERS / "vllm/metrics-example.txt")
        self.dcgm_help = _dcgm_help()
        self.node = _node_text()

    def fault(self) -> None:
        self.since = time.time()

    def _level(self) -> float:
        if self.since is None:
            return 0.0
        return min(1.0, (time.time() - self.since) / self.ramp)

    def vllm(self) -> str:
        f = self._level()
        kv = 0.30 + (0.99 - 0.30) * f
        waiting = round(2 + 78 * f)
        return self.vllm_base + (
            "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.\n"
            "# TYPE vllm:kv_cache_usage_perc gauge\n"
            f"vllm:kv_cache_usage_perc{{{MODEL}}} {kv}\n"
            "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n"
            "# TYPE vllm:num_requests_waiting gauge\n"
            f"vllm:num_requests_waiting{{{MODEL}}} {waiting}\n"
        )

    def dcgm(self) -> str:
        f = self._level()
        used = TOTAL_MIB * (0.40 + (0.97 - 0.40) * f)
        reserved = 559.0
        values = {
            "DCGM_FI_DEV_FB_USED": used,
            "DCGM_FI_DEV_FB_FREE": TOTAL_MIB - reserved - used,
            "DCGM_FI_DEV_FB_RESERVED": reserved,
            "DCGM_FI_DEV_GPU_UTIL": 93.0,
            "DCGM_FI_DEV_GPU_TEMP": 61.0,
            "DCGM_FI_DEV_POWER_USAGE": 540.0,
        }
        out = []
        for field, value in values.items():
            kind, help_ = self.dcgm_help[field]
            out += [f"# HELP {field} {help_}", f"# TYPE {field} {kind}"]
            out.append(f"{field}{{{GPU}}} {value}")
        return "\n".join(out) + "\n"


@contextmanager
def serve(targets: Targets) -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            page = {"/vllm": targets.vllm, "/dcgm": targets.dcgm, "/node": lambda: targets.node}
            make = page.get(self.path)
            if make is None:
                self.send_error(404)
                return
            body = make().encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def _config(target: str) -> str:
    jobs = [("vllm", "/vllm"), ("dcgm-exporter", "/dcgm"), ("node-exporter", "/node")]
    doc = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [
            {"job_name": job, "metrics_path": path, "static_configs": [{"targets": [target]}]}
            for job, path in jobs
        ],
    }
    return yaml.safe_dump(doc, sort_keys=False)


def _query(url: str, expr: str) -> list[dict[str, Any]]:
    r = httpx.get(url + "/api/v1/query", params={"query": expr}, timeout=5)
    r.raise_for_status()
    result: list[dict[str, Any]] = r.json()["data"]["result"]
    return result


def _wait(fn: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = fn()
        if value:
            return value
        time.sleep(0.25)
    raise AssertionError(f"timed out waiting for {what}")


def _diagnose(url: str) -> dict[str, Any]:
    args = ["diagnose", "--prometheus", url, "--window", "40s", "--format", "json"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    doc: dict[str, Any] = json.loads(result.output)
    return doc


@pytest.mark.slow
def test_native_exporters_fire_the_pack_and_the_diagnosis_names_the_fault(
    tmp_path: Path,
) -> None:
    # the pack at the quick time scale (windows shortened, every for: / 60, 1 s ticks)
    pack = default_pack(**QUICK.rule_windows)
    rules = tmp_path / "aivitals-rules.yml"
    rules.write_text(scale_for(pack.text, QUICK.for_factor, floors=for_floors(pack.params)))
    native = tmp_path / "aivitals-native.yml"
    native.write_text(native_rules_text(pack))
    targets = Targets()
    with serve(targets) as target, ExitStack() as stack:
        ruled = stack.enter_context(prometheus(_config(target), rule_files=[native, rules]))
        bare = stack.enter_context(prometheus(_config(target)))
        for url in (ruled.url, bare.url):
            _wait(lambda u=url: len(_query(u, "up == 1")) == 3, 30, "the first scrapes")
        # recorded under our names, with our labels, from the native series
        kv = _wait(lambda: _query(ruled.url, "kv_cache_usage_ratio"), 15, "recorded KV cache")
        assert kv[0]["metric"]["model"] == "meta-llama/Llama-3.1-8B-Instruct"
        assert kv[0]["metric"]["aivitals_source"] == "vllm"
        total = _wait(lambda: _query(ruled.url, "gpu_memory_total_bytes"), 15, "GPU total")
        assert float(total[0]["value"][1]) == TOTAL_MIB * 1024 * 1024
        assert total[0]["metric"]["node"] == "gpu-node-1"
        cpu = _wait(lambda: _query(ruled.url, 'host_cpu_seconds_total{mode="idle"}'), 15, "CPU")
        assert len(cpu) == 1 and "cpu" not in cpu[0]["metric"]
        time.sleep(6)  # a healthy baseline
        # (ServiceMetricsAbsent may fire: the documented vLLM example has no e2e latency)
        faults = "|".join(FAULTS)
        assert not _query(ruled.url, f'ALERTS{{alertname=~"{faults}"}}')
        targets.fault()

        def firing() -> set[str]:
            found = _query(ruled.url, 'ALERTS{alertstate="firing"}')
            names = {a["metric"]["alertname"] for a in found}
            return names if set(FAULTS) <= names else set()

        names = _wait(firing, 40, f"{FAULTS} firing")
        assert "TargetDown" not in names
        for url in (ruled.url, bare.url):
            doc = _diagnose(url)
            top = doc["findings"][0]
            assert top["signature"] == "kv_cache_pressure", [
                (f["signature"], f["confidence"]) for f in doc["findings"]
            ]
            unseen = " ".join(str(u) for u in doc.get("unseen", []))
            assert "kv_cache_usage_ratio" not in unseen
        # the bare Prometheus never had our names: the fallback read the native series
        assert not _query(bare.url, "kv_cache_usage_ratio")
