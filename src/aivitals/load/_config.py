"""The load run's settings, validated once, with errors naming the bad key and value."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError
from ._payload import RequestSpec

__all__ = ["LoadConfig"]

_PAYLOADS = ("auto", "get", "embeddings", "completions")
_ARRIVALS = ("poisson", "uniform")


@dataclass(frozen=True, kw_only=True)
class LoadConfig:
    """One load run. Give exactly one of ``rate`` (open loop), ``concurrency``
    (closed loop) or ``trace`` (replay, open loop).

    **Usage**::

        LoadConfig(url="http://127.0.0.1:8000/v1/embeddings", rate=50, duration=30)
        LoadConfig(url="http://127.0.0.1:8000/v1/completions", concurrency=8, duration=60)
        LoadConfig(url="http://127.0.0.1:8000/v1/completions", trace="azure-conv",
                   time_scale=0.2, duration=120)

    ``payload="auto"`` picks the body from the URL path (``/v1/embeddings``,
    ``/v1/completions``, anything else is a ``GET``). ``input_pool`` distinct
    inputs are cycled (0: every request different), so a response cache sees
    a realistic mix of hits and misses. ``requests`` overrides the payload with
    explicit requests, cycled; with ``trace`` the trace gives the send times
    and ``requests`` the bodies. Open-loop send times are kept by a thread that
    sleeps until each one (``spin`` 0, the default); ``spin`` > 0 instead polls
    in the event loop for that long before each send, which is the most precise
    on an idle dedicated core and costs a whole core at high rates.
    """

    url: str
    rate: float | None = None
    concurrency: int | None = None
    trace: str | None = None
    duration: float = 10.0
    arrival: str = "poisson"
    time_scale: float = 1.0
    payload: str = "auto"
    stream: bool = True
    prompt_tokens: int = 32
    max_tokens: int = 16
    input_pool: int = 64
    max_prompt_tokens: int | None = 2048
    max_output_tokens: int | None = 256
    requests: tuple[RequestSpec, ...] = ()
    connections: int = 16
    max_connections: int = 1024
    timeout: float = 30.0
    slo_ttft: float | None = None
    slo_tpot: float | None = None
    slo_e2e: float | None = None
    allow_hosts: tuple[str, ...] = ()
    seed: int | None = None
    spin: float = 0.0
    progress: bool = False

    def __post_init__(self) -> None:
        given = [k for k in ("rate", "concurrency", "trace") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ConfigError(
                f"give exactly one of rate, concurrency or trace (got {given or 'none'})"
            )
        self._positive("duration", self.duration)
        self._positive("time_scale", self.time_scale)
        self._positive("timeout", self.timeout)
        if self.rate is not None:
            self._positive("rate", self.rate)
        if self.concurrency is not None and self.concurrency < 1:
            raise ConfigError(f"concurrency: {self.concurrency!r} must be >= 1")
        self._choice("payload", self.payload, _PAYLOADS)
        self._choice("arrival", self.arrival, _ARRIVALS)
        for key in ("prompt_tokens", "max_tokens", "connections", "max_connections"):
            if getattr(self, key) < 1:
                raise ConfigError(f"{key}: {getattr(self, key)!r} must be >= 1")
        if self.input_pool < 0:
            raise ConfigError(f"input_pool: {self.input_pool!r} must be >= 0")
        if self.spin < 0:
            raise ConfigError(f"spin: {self.spin!r} must be >= 0")
        for key in ("slo_ttft", "slo_tpot", "slo_e2e"):
            value = getattr(self, key)
            if value is not None:
                self._positive(key, value)

    @property
    def mode(self) -> str:
        if self.trace is not None:
            return "trace"
        return "open" if self.rate is not None else "closed"

    @staticmethod
    def _positive(key: str, value: float) -> None:
        if not value > 0:
            raise ConfigError(f"{key}: {value!r} must be > 0")

    @staticmethod
    def _choice(key: str, value: str, choices: tuple[str, ...]) -> None:
        if value not in choices:
            raise ConfigError(f"{key}: {value!r} is not one of {', '.join(choices)}")
