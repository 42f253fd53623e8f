"""aivitals.load: an open/closed-loop HTTP load generator with trace replay.

Open loop sends on a Poisson schedule computed up front and measures latency
from each intended send time (no coordinated omission); closed loop keeps N
requests in flight. Streaming (SSE) answers give time to first token and time
per output token. Targets must be on loopback unless allowed explicitly.

**Usage**::

    from aivitals.load import LoadConfig, run_load
    report = run_load(LoadConfig(url="http://127.0.0.1:8000/v1/completions",
                                 rate=20, duration=30, slo_ttft=0.5))
    print(report.format())
"""

from __future__ import annotations

from ._capacity import CapacityLevel, CapacityReport, find_knee, sweep_capacity
from ._config import LoadConfig
from ._payload import (
    RequestSpec,
    completions_request,
    embeddings_request,
    get_request,
    make_prompt,
)
from ._report import SLO, LatencyStats, LoadReport, RequestResult, summarize
from ._run import LoadCounters, run_load, run_load_async
from ._schedule import poisson_schedule, uniform_schedule
from ._target import check_target, is_loopback_host, split_url
from ._template import (
    DEMO_COMPLETIONS,
    DEMO_EMBEDDINGS,
    OPENAI_KINDS,
    PLACEHOLDER,
    RequestTemplate,
    template_from_options,
)
from ._trace import TRACES, TraceRequest, dataset_dir, load_trace
from ._units import parse_duration

__all__ = [
    "DEMO_COMPLETIONS",
    "DEMO_EMBEDDINGS",
    "OPENAI_KINDS",
    "PLACEHOLDER",
    "SLO",
    "TRACES",
    "CapacityLevel",
    "CapacityReport",
    "LatencyStats",
    "LoadConfig",
    "LoadCounters",
    "LoadReport",
    "RequestResult",
    "RequestSpec",
    "RequestTemplate",
    "TraceRequest",
    "check_target",
    "completions_request",
    "dataset_dir",
    "embeddings_request",
    "find_knee",
    "get_request",
    "is_loopback_host",
    "load_trace",
    "make_prompt",
    "parse_duration",
    "poisson_schedule",
    "run_load",
    "run_load_async",
    "split_url",
    "summarize",
    "sweep_capacity",
    "template_from_options",
    "uniform_schedule",
]
