"""The engine inside a real agent: its groups on the agent's clock, alerts on its HTTP API."""

from __future__ import annotations

import time

import httpx
from click.testing import CliRunner
from prometheus_client import CollectorRegistry

from aivitals.agent import Agent, AgentConfig
from aivitals.alerts import RuleEngine, load_rules
from aivitals.cli import cli

RULES = """
groups:
  - name: gpu
    interval: 200ms
    rules:
      - alert: GPUMemoryFull
        expr: gpu_memory_used_bytes / gpu_memory_total_bytes > 0.9
        labels: {severity: P1, layer: model}
        annotations: {summary: "GPU {{ $labels.gpu }} is {{ $value | humanizePercentage }} full"}
"""


def test_an_attached_engine_runs_on_the_agent_and_serves_its_alerts() -> None:
    agent = Agent(AgentConfig(listen="127.0.0.1:0", gpu="none", kernel_log=False, interval=0.2))
    engine = RuleEngine(agent.store, load_rules(RULES), registry=CollectorRegistry())
    engine.attach(agent)
    agent.start()
    try:
        now = time.time()
        for i in range(20):  # the GPU is 95% full over the next 4 seconds
            labels = {"gpu": "0", "backend": "test"}
            agent.store.append("gpu_memory_used_bytes", labels, 95.0, now + i * 0.2)
            agent.store.append("gpu_memory_total_bytes", labels, 100.0, now + i * 0.2)
        deadline = time.monotonic() + 10
        while not engine.firing() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [e.alertname for e in engine.firing()] == ["GPUMemoryFull"]
        body = httpx.get(agent.url + "/api/v1/alerts", timeout=5).json()
        (alert,) = body["data"]["alerts"]
        assert alert["labels"]["gpu"] == "0" and alert["state"] == "firing"
        assert alert["annotations"]["summary"] == "GPU 0 is 95% full"
        result = CliRunner().invoke(cli, ["alerts", "--agent", agent.url])
        assert result.exit_code == 0, result.output
        assert "GPUMemoryFull" in result.output and "GPU 0 is 95% full" in result.output
    finally:
        agent.stop()
