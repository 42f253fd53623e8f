"""Settings of the demo service, validated once and read from the environment in one place."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from ..errors import ConfigError

__all__ = ["LM_MODEL_ID", "LM_MODEL_NAME", "DemoConfig"]

#: The generation model's public name: it says the weights are random.
LM_MODEL_NAME = "random-tiny-gpt2 (random weights, demo only)"
#: Its ``model`` label value in metrics.
LM_MODEL_ID = "random-tiny-gpt2"
_ENV_PREFIX = "AIVITALS_DEMO_"
_DEVICES = ("auto", "cpu", "cuda")


@dataclass(frozen=True, kw_only=True)
class DemoConfig:
    """How the demo service runs. Every field has a default; all are checked.

    **Usage**::

        cfg = DemoConfig(workers=2, redis_url="redis://127.0.0.1:6380/0")
        app = create_app(cfg)
    """

    #: Worker threads that run model work off the event loop.
    workers: int = 2
    #: Worker threads of the embeddings' own lane (pool "embeddings"): a cheap embedding
    #: never waits behind a long generation in the "model" pool.
    embedding_workers: int = 1
    #: Requests that may wait for a worker (in each pool); beyond it the queue refuses.
    queue_size: int = 64
    #: torch intra-op threads per call (1 keeps workers from fighting on few cores).
    torch_threads: int = 1
    #: "auto" picks cuda when torch sees a GPU.
    device: str = "auto"
    #: Layers / width of the random-weight GPT-2 used for completions.
    lm_layers: int = 4
    lm_width: int = 128
    lm_heads: int = 4
    lm_context: int = 1024
    #: Seed of the random weights, so two processes serve the same "model".
    lm_seed: int = 0
    #: Limits a request may ask for.
    max_input_tokens: int = 512
    max_new_tokens: int = 256
    default_max_tokens: int = 32
    max_batch: int = 64
    #: Default deadline of a request when it sends no X-Request-Timeout, seconds.
    request_timeout: float = 30.0
    #: Request bodies over this many bytes are refused (413) by the input guard.
    max_body_bytes: int = 100_000
    #: Readiness probe (a one-text embedding through the pool): period and budget, seconds.
    probe_interval: float = 5.0
    probe_timeout: float = 2.0
    #: Redis for the response cache; None -> an in-process cache.
    redis_url: str | None = None
    cache_enabled: bool = True
    #: Cache entries live ttl * (1 +- jitter) seconds, so keys do not expire together.
    cache_ttl: float = 300.0
    cache_jitter: float = 0.1
    #: Simulated GPU state directory (aivitals.collect.gpu.SimGPU); None -> no sim GPU.
    sim_gpu_dir: Path | None = None
    sim_gpu_index: int = 0
    sim_gpu_memory_total: int = 24 * 2**30
    #: Bytes booked on the sim GPU at start for the weights (what a 7B fp16 model holds).
    sim_weights_bytes: int = 14 * 2**30
    #: KV-cache bytes accounted per token on the sim GPU (what a 7B fp16 model holds).
    sim_kv_bytes_per_token: int = 512 * 2**10
    #: The sim GPU is taken to run the kernels this many times faster than the CPU that
    #: really computes them: busy time booked = CPU compute time / speedup.
    sim_gpu_speedup: float = 1.0
    #: Enables POST /_aivitals/chaos when set (also from AIVITALS_CHAOS_TOKEN).
    chaos_token: str | None = None
    #: Version label of the served models.
    model_version: str = "v0.1.0"
    #: Where metrics go; None -> prometheus_client's default registry.
    registry: CollectorRegistry | None = None

    def __post_init__(self) -> None:
        for name in (
            "workers",
            "embedding_workers",
            "queue_size",
            "torch_threads",
            "lm_layers",
            "lm_heads",
        ):
            _positive_int(name, getattr(self, name))
        for name in ("lm_width", "lm_context", "max_input_tokens", "max_new_tokens", "max_batch"):
            _positive_int(name, getattr(self, name))
        _positive_int("default_max_tokens", self.default_max_tokens)
        _positive_int("sim_gpu_memory_total", self.sim_gpu_memory_total)
        _positive_int("sim_kv_bytes_per_token", self.sim_kv_bytes_per_token)
        if not 0 <= self.sim_weights_bytes < self.sim_gpu_memory_total:
            raise ConfigError(
                f"sim_weights_bytes={self.sim_weights_bytes!r}: expected 0 <= bytes < "
                f"sim_gpu_memory_total ({self.sim_gpu_memory_total})"
            )
        if self.lm_width % self.lm_heads:
            raise ConfigError(f"lm_width={self.lm_width} must be a multiple of lm_heads")
        if self.default_max_tokens > self.max_new_tokens:
            raise ConfigError(
                f"default_max_tokens={self.default_max_tokens} exceeds max_new_tokens"
            )
        if self.device not in _DEVICES:
            raise ConfigError(f"device={self.device!r}: expected one of {', '.join(_DEVICES)}")
        _positive_float("request_timeout", self.request_timeout)
        _positive_float("sim_gpu_speedup", self.sim_gpu_speedup)
        _positive_float("probe_interval", self.probe_interval)
        _positive_float("probe_timeout", self.probe_timeout)
        _positive_int("max_body_bytes", self.max_body_bytes)
        _positive_float("cache_ttl", self.cache_ttl)
        if not 0.0 <= self.cache_jitter < 1.0:
            raise ConfigError(f"cache_jitter={self.cache_jitter!r}: expected 0 <= jitter < 1")
        if self.sim_gpu_index < 0:
            raise ConfigError(f"sim_gpu_index={self.sim_gpu_index!r}: expected >= 0")
        if self.redis_url is not None and not self.redis_url.startswith(("redis://", "unix://")):
            raise ConfigError(f"redis_url={self.redis_url!r}: expected redis:// or unix://")
        if self.chaos_token is not None and len(self.chaos_token) < 8:
            raise ConfigError("chaos_token: expected at least 8 characters")

    def with_changes(self, **changes: Any) -> DemoConfig:
        return replace(self, **changes)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> DemoConfig:
        """Defaults, then ``AIVITALS_DEMO_<FIELD>`` variables, then ``overrides``.

        ``AIVITALS_CHAOS_TOKEN`` sets ``chaos_token``.
        """
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for f in fields(cls):
            key = _ENV_PREFIX + f.name.upper()
            if f.name != "registry" and key in env:
                values[f.name] = _cast(key, env[key], f.name)
        if env.get("AIVITALS_CHAOS_TOKEN"):
            values["chaos_token"] = env["AIVITALS_CHAOS_TOKEN"]
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)


_INTS = {
    "workers",
    "embedding_workers",
    "queue_size",
    "torch_threads",
    "lm_layers",
    "lm_width",
    "lm_heads",
    "lm_context",
    "lm_seed",
    "max_input_tokens",
    "max_new_tokens",
    "default_max_tokens",
    "max_batch",
    "sim_gpu_index",
    "sim_gpu_memory_total",
    "sim_kv_bytes_per_token",
    "sim_weights_bytes",
    "max_body_bytes",
}
_FLOATS = {
    "request_timeout",
    "cache_ttl",
    "cache_jitter",
    "probe_interval",
    "probe_timeout",
    "sim_gpu_speedup",
}


def _cast(key: str, raw: str, name: str) -> Any:
    try:
        if name in _INTS:
            return int(raw)
        if name in _FLOATS:
            return float(raw)
    except ValueError:
        raise ConfigError(f"{key}={raw!r}: expected a number") from None
    if name == "cache_enabled":
        if raw.lower() not in ("1", "0", "true", "false", "yes", "no"):
            raise ConfigError(f"{key}={raw!r}: expected true or false")
        return raw.lower() in ("1", "true", "yes")
    if name == "sim_gpu_dir":
        return Path(raw)
    return raw


def _positive_int(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ConfigError(f"{name}={value!r}: expected a positive integer")


def _positive_float(name: str, value: object) -> None:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if not ok or not math.isfinite(float(value)) or float(value) <= 0:  # type: ignore[arg-type]
        raise ConfigError(f"{name}={value!r}: expected a positive number")
