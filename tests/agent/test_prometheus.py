"""A real Prometheus scrapes a running agent and answers for a host and a sim GPU metric."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest

from aivitals.agent import Agent, AgentConfig
from aivitals.collect.gpu import SimGPU
from tests._servers import prometheus, promtool

from .conftest import wait_for


@pytest.mark.integration
def test_prometheus_scrapes_the_agent(tmp_path: Path) -> None:
    sim = SimGPU(tmp_path, memory_total=16 * 2**30)
    sim.allocate(os.getpid(), 3 * 2**30, tag="test")
    config = AgentConfig(
        listen="127.0.0.1:0", gpu="sim", sim_gpu_dir=str(tmp_path), interval=0.5, exporter=True
    )
    with Agent(config) as agent:
        target = agent.url.removeprefix("http://")
        body = (
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
            "scrape_configs:\n"
            "  - job_name: aivitals\n"
            f"    static_configs:\n      - targets: ['{target}']\n"
        )
        with prometheus(body) as prom:

            def value(expr: str) -> float | None:
                r = httpx.get(prom.url + "/api/v1/query", params={"query": expr}, timeout=5)
                result = r.json()["data"]["result"]
                return float(result[0]["value"][1]) if result else None

            wait_for(lambda: value('gpu_memory_used_bytes{backend="sim"}') is not None, 40)
            assert value('gpu_memory_used_bytes{backend="sim",gpu="0"}') == 3 * 2**30
            assert value('gpu_memory_total_bytes{backend="sim"}') == 16 * 2**30
            assert (value("host_memory_total_bytes") or 0) > 0
            assert value('up{job="aivitals"}') == 1
            assert value('aivitals_collector_up{collector="host"}') == 1
            proc = value(f'gpu_process_memory_used_bytes{{pid="{os.getpid()}"}}')
            assert proc == 3 * 2**30


@pytest.mark.integration
def test_promtool_accepts_the_agents_metrics(tmp_path: Path) -> None:
    sim = SimGPU(tmp_path)
    sim.allocate(os.getpid(), 2**30)
    sim.inject_xid(0, 79)
    agent = Agent(AgentConfig(listen="127.0.0.1:0", gpu="sim", sim_gpu_dir=str(tmp_path)))
    agent.collect_once()
    text = agent.metrics_text()
    result = promtool("check", "metrics", input_text=text)
    # promtool exits 0 when only lint hints remain; 1 with problems it prints.
    assert result.returncode == 0, result.stdout + result.stderr
