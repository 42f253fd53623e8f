"""The engine inside a real agent: its groups on the agent's clock, alerts on its HTTP API."""

from __future__ import annotations

import time
from types import SimpleNamespace

import httpx
import pytest
from click.testing import CliRunner
from prometheus_client import CollectorRegistry

from aivitals.agent import Agent, AgentConfig
from aivitals.alerts import RuleEngine, default_pack, load_rules
from aivitals.cli import cli
from aivitals.signals import Sample

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
        # attach() serves the rules too
        listed = CliRunner().invoke(cli, ["alerts", "--agent", agent.url, "--rules"])
        assert listed.exit_code == 0, listed.output
        assert "rules: 1 in 1 groups" in listed.output
        assert "  gpu  every 0.2s" in listed.output
        assert "firing   ok      alert  GPUMemoryFull" in listed.output
        assert "for 0s, 1 active" in listed.output
    finally:
        agent.stop()


class _SilentGpu:
    """A GPU collector whose backend loaded but reports nothing (a driver gone wrong)."""

    name = "gpu"
    backend = SimpleNamespace(name="nvml")

    def collect(self) -> list[Sample]:
        return []


@pytest.mark.parametrize(
    ("collectors", "fires"),
    [([], False), ([_SilentGpu()], True)],
    ids=["gpu-none", "gpu-expected-and-silent"],
)
def test_gpu_metrics_absent_pages_only_where_the_agent_runs_a_gpu_collector(
    collectors: list[object], fires: bool
) -> None:
    """The shipped pack on a real agent's store: with no GPU collector the agent declares
    backend none and GPUMetricsAbsent stays inactive through its whole for: 2m; with one
    that reports nothing it pages, labelled with the backend."""
    agent = Agent(
        AgentConfig(listen="127.0.0.1:0", gpu="none", kernel_log=False), collectors=collectors
    )  # type: ignore[arg-type]
    engine = RuleEngine(agent.store, default_pack(), registry=CollectorRegistry())
    now = time.time()
    for step in range(10):  # 2m15s of collections and evaluations, 15 s apart
        agent.collect_once(now + 15.0 * step)
        engine.evaluate(now + 15.0 * step)
    gpu = [e for e in engine.active() if e.alertname == "GPUMetricsAbsent"]
    if fires:
        assert [(e.state, e.labels["backend"]) for e in gpu] == [("firing", "nvml")]
    else:
        assert gpu == []
        assert not [e for e in engine.history() if e.alertname == "GPUMetricsAbsent"]
