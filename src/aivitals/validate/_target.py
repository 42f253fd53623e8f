"""What validate needs of the system it checks: ``ValidateTarget``.

validate starts the target, measures its service, starts its agent with the rules'
parameters, injects faults through its fault context, loads and probes its service,
and reads its agent's store, alert engine and diagnosis. These protocols name exactly
the members it uses, and nothing else. Two implement them: the demo ``Stack``
(``aivitals.demo``), which validate starts, and ``ExternalTarget`` (``--target URL``), a
service that already runs; mypy checks that both satisfy them (below).

::

    ValidateTarget
    ├── config   TargetConfig    tick, workers, gpu_backend, scale (the time scale)
    ├── service  TargetService   url, log_path, alive(), exit_code(), wait_ready()
    ├── agent    TargetAgent     url, store (the embedded Store), events()
    ├── engine   TargetEngine    groups, history(), active(), firing()
    ├── pack     TargetPack      params (the rules' PackParams)
    ├── redis    TargetRedis | None     url
    ├── ledger   TargetLedger | None    run_id
    ├── sim_gpu_dir, chaos_token
    └── start(), stop(), start_agent(), start_service(), probe_via(), fault_context(),
        diagnose(), query()

``agent``, ``engine`` and ``pack`` exist once ``start_agent`` has run, ``service`` once
``start`` has; validate asks for none of them before.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ..alerts import AlertEvent, PackParams, RuleGroup
    from ..chaos import FaultContext
    from ..diagnose import Diagnosis, EventLike
    from ..timescale import TimeScale
    from ..tsdb import InstantSample, Store

__all__ = [
    "TargetAgent",
    "TargetConfig",
    "TargetEngine",
    "TargetLedger",
    "TargetPack",
    "TargetRedis",
    "TargetService",
    "ValidateTarget",
]


class TargetConfig(Protocol):
    """How the target runs (``demo.StackConfig``)."""

    @property
    def tick(self) -> float:
        """Scrape and rule-evaluation period, seconds."""
        ...

    @property
    def workers(self) -> int:
        """The service's workers: the calibration's concurrency."""
        ...

    @property
    def gpu_backend(self) -> str:
        """Where the GPU signals come from ("sim", "nvml"), for the report."""
        ...

    @property
    def scale(self) -> TimeScale:
        """The time scale the target's agent and rules run at."""
        ...


class TargetService(Protocol):
    """The service under test (``demo.ServiceProcess``)."""

    @property
    def url(self) -> str:
        """Where its clients reach it, ``http://host:port``."""
        ...

    @property
    def log_path(self) -> Path | None:
        """Its JSON log, whose error lines validate checks (None: none given, and the
        log check is not tested)."""
        ...

    def alive(self) -> bool: ...

    def exit_code(self) -> int | None: ...

    def wait_ready(self, timeout: float) -> None: ...


class TargetAgent(Protocol):
    """The agent watching the service (``agent.Agent``)."""

    @property
    def url(self) -> str: ...

    @property
    def store(self) -> Store: ...

    def events(
        self, start: float | None = None, end: float | None = None
    ) -> Sequence[EventLike]: ...


class TargetEngine(Protocol):
    """The alert rules evaluated on the agent's store (``alerts.RuleEngine``)."""

    @property
    def groups(self) -> Sequence[RuleGroup]: ...

    def history(
        self, start: float | None = None, end: float | None = None
    ) -> Sequence[AlertEvent]: ...

    def active(self) -> Sequence[AlertEvent]: ...

    def firing(self) -> Sequence[AlertEvent]: ...


class TargetPack(Protocol):
    """The rule pack the engine runs (``alerts.RulePack``): its parameters."""

    @property
    def params(self) -> PackParams: ...


class TargetRedis(Protocol):
    """The service's cache (``demo.RedisServer``), for the report."""

    @property
    def url(self) -> str: ...


class TargetLedger(Protocol):
    """The record of what the target started (``chaos.RunDir``), for the report."""

    @property
    def run_id(self) -> str: ...


class ValidateTarget(Protocol):
    """Everything validate uses of the system it checks; see the module docstring."""

    @property
    def config(self) -> TargetConfig: ...

    @property
    def service(self) -> TargetService: ...

    @property
    def agent(self) -> TargetAgent: ...

    @property
    def engine(self) -> TargetEngine: ...

    @property
    def pack(self) -> TargetPack: ...

    @property
    def redis(self) -> TargetRedis | None: ...

    @property
    def ledger(self) -> TargetLedger | None: ...

    @property
    def sim_gpu_dir(self) -> Path | None:
        """The simulated GPU's state directory, for the report (None: no simulated GPU)."""
        ...

    @property
    def chaos_token(self) -> str:
        """The token the service's in-process chaos and reload endpoints ask for."""
        ...

    def start(self) -> object:
        """Start the service (and its dependencies), not necessarily the agent."""
        ...

    def stop(self) -> None: ...

    def start_agent(self, rule_params: Mapping[str, Any] | None = None) -> None:
        """Start the agent and its rules, with ``rule_params`` on the pack's."""
        ...

    def start_service(self) -> None:
        """Start the service again after it died."""
        ...

    def probe_via(self, base_url: str | None) -> None:
        """Probe the service through ``base_url`` (a fault's client path); None: directly."""
        ...

    def fault_context(self, **extra: Any) -> FaultContext:
        """Where a fault acts: the service, its pids, its cache, its ledger."""
        ...

    def diagnose(
        self, *, window: float | None = None, end: float | None = None, rate: float | None = None
    ) -> Diagnosis: ...

    def query(self, expr: str) -> Sequence[InstantSample]:
        """Instant query on the agent's store, now."""
        ...


if TYPE_CHECKING:
    # mypy checks that the demo's parts satisfy the protocols validate types them with
    from ..agent import Agent
    from ..alerts import RuleEngine, RulePack
    from ..chaos import RunDir
    from ..demo import RedisServer, Stack, StackConfig
    from ._external import ExternalConfig, ExternalService, ExternalTarget

    _STACK: type[ValidateTarget] = Stack
    _EXTERNAL: type[ValidateTarget] = ExternalTarget
    _EXTERNAL_CONFIG: type[TargetConfig] = ExternalConfig
    _EXTERNAL_SERVICE: type[TargetService] = ExternalService
    _CONFIG: type[TargetConfig] = StackConfig
    _AGENT: type[TargetAgent] = Agent
    _ENGINE: type[TargetEngine] = RuleEngine
    _PACK: type[TargetPack] = RulePack
    _REDIS: type[TargetRedis] = RedisServer
    _LEDGER: type[TargetLedger] = RunDir
