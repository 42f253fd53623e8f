"""The long-running agent: collectors, scrapes, the embedded store and a read-only HTTP API.

**Usage**::

    from aivitals.agent import Agent, AgentConfig
    with Agent(AgentConfig(listen="127.0.0.1:9478", gpu="sim")) as agent:
        agent.store.query("host_load1")
"""

from __future__ import annotations

from ._agent import Agent
from ._build import build_collectors
from ._config import GPU_CHOICES, AgentConfig, ScrapeTarget, parse_duration, parse_listen
from ._exposition import render
from ._http import result_json

__all__ = [
    "GPU_CHOICES",
    "Agent",
    "AgentConfig",
    "ScrapeTarget",
    "build_collectors",
    "parse_duration",
    "parse_listen",
    "render",
    "result_json",
]
