from __future__ import annotations

import os
from pathlib import Path

import aivitals.agent
import aivitals.collect
import aivitals.collect.gpu
from aivitals import signals
from aivitals.agent import Agent, AgentConfig


def test_every_series_the_agent_serves_is_in_the_catalogue(tmp_path: Path) -> None:
    config = AgentConfig(
        listen="127.0.0.1:0", gpu="sim", sim_gpu_dir=str(tmp_path), pid=os.getpid(), tcp_ports=[22]
    )
    agent = Agent(config)
    agent.collect_once()
    names = {s.name for s in agent.samples()}
    assert {"host_cpus", "service_process_threads", "gpu_utilization_ratio"} <= names
    assert {"kernel_log_lines_total", "aivitals_tsdb_series"} <= names
    for name in names:
        assert signals.family_of(name) is not None, name


def test_public_surface() -> None:
    for module in (aivitals.collect, aivitals.collect.gpu, aivitals.agent):
        exported = module.__all__
        for name in exported:
            assert getattr(module, name) is not None, f"{module.__name__}.{name}"
        public = {n for n in dir(module) if not n.startswith("_") and not n.islower()}
        assert public <= set(exported) | {"annotations"}, public - set(exported)
