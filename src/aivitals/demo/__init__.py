"""aivitals.demo: a real AI service to watch, break and diagnose.

Embeddings from the packaged all-MiniLM-L6-v2 (real weights), streaming
completions from a GPT-2-shaped model with RANDOM weights (real compute and KV
cache, meaningless text), a Redis response cache, a bounded worker pool, GPU
accounting on the simulated device when there is no GPU, and an in-process
chaos endpoint for faults that must happen inside the process.

**Usage**::

    from aivitals.demo import DemoConfig, create_app
    app = create_app(DemoConfig(redis_url="redis://127.0.0.1:6379/0"))
"""

from __future__ import annotations

from ._app import CHAOS_PATH, RELOAD_PATH, create_app
from ._config import LM_MODEL_NAME, DemoConfig
from ._faults import FAULTS as IN_PROCESS_FAULTS
from ._models import EMBED_MODEL_NAME, DemoModels
from ._redis import RedisServer
from ._service import DemoService, QueueFullError
from ._session import SoakLoad
from ._stack import FOR_SPANS_WINDOW, QUICK_RULES, Stack, StackConfig, for_floors, scale_for
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
    "for_floors",
    "scale_for",
]
