"""aivitals.demo: a real AI service to watch, break and diagnose.

Embeddings from the packaged all-MiniLM-L6-v2 (real weights), streaming
completions from a GPT-2-shaped model with RANDOM weights (real compute and KV
cache, meaningless text), a Redis response cache, a bounded worker pool, GPU
accounting on the simulated device when there is no GPU, and the chaos hook any
service can mount (``aivitals.chaos.mount``), with the demo's hooks for the faults
that need its pool and models.

**Usage**::

    from aivitals.demo import DemoConfig, create_app
    app = create_app(DemoConfig(redis_url="redis://127.0.0.1:6379/0"))
"""

from __future__ import annotations

# the chaos hook's path and fault table, re-exported: the demo serves them unchanged
from ..chaos import CHAOS_PATH, IN_PROCESS_FAULTS
from ._app import RELOAD_PATH, create_app
from ._config import LM_MODEL_NAME, DemoConfig
from ._models import EMBED_MODEL_NAME, DemoModels
from ._redis import RedisServer
from ._service import DemoService, QueueFullError
from ._session import SoakLoad
from ._stack import (
    FOR_SPANS_WINDOW,
    QUICK_RULES,
    Stack,
    StackConfig,
    diagnose_agent,
    for_floors,
    scale_for,
)
from ._workload import MAX_OUTPUT_TOKENS

__all__ = [
    "CHAOS_PATH",
    "EMBED_MODEL_NAME",
    "FOR_SPANS_WINDOW",
    "IN_PROCESS_FAULTS",
    "LM_MODEL_NAME",
    "MAX_OUTPUT_TOKENS",
    "QUICK_RULES",
    "RELOAD_PATH",
    "DemoConfig",
    "DemoModels",
    "DemoService",
    "QueueFullError",
    "RedisServer",
    "SoakLoad",
    "Stack",
    "StackConfig",
    "create_app",
    "diagnose_agent",
    "for_floors",
    "scale_for",
]
