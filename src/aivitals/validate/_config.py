"""Settings of a validate run: phase lengths (full or ``--quick``), scenarios, output."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from ..timescale import TimeScale

if TYPE_CHECKING:
    from ._external import ExternalOptions

__all__ = ["ValidateConfig"]


@dataclass(frozen=True, kw_only=True)
class ValidateConfig:
    """One ``aivitals validate`` run.

    **Usage**::

        ValidateConfig(quick=True, scenarios=("gpu_memory_leak", "cpu_burn"))

    Phases per scenario: ``baseline`` seconds of normal load, then the fault
    for at most ``fault_max`` seconds (earlier when every expected alert fired
    and the diagnosis named the fault, but not before ``fault_min``), then the
    revert and at most ``recover_max`` seconds for the alerts to resolve.
    Unset phase lengths take those of the run's time scale (``scale``). ``params`` overrides
    a scenario's fault parameters: ``{"redis_down": {"method": 1}}``.

    ``scenarios`` names faults or pairs (``"redis_down+traffic_surge"``); unset,
    every fault and the listed pairs run. ``sweep`` runs every graded fault at its
    three severities (threshold, moderate, severe) and each fault with a single
    magnitude once (``fault@single``) instead. ``record`` saves each
    case's window as a snapshot with its label in that directory.

    ``target`` runs the drill against a service that already runs (``--target URL``)
    instead of the demo stack: no sweep or recording then (both are the demo's).
    """

    quick: bool = False
    scenarios: tuple[str, ...] | None = None
    report_path: Path = Path("validate-report.json")
    baseline: float | None = None
    fault_min: float | None = None
    fault_max: float | None = None
    recover_max: float | None = None
    lock_path: Path | None = None
    workdir: Path | None = None
    rule_params: dict[str, Any] = field(default_factory=dict)
    params: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: "sim" (the simulated GPU), "nvml" (a real CUDA GPU, models on it), or "auto"
    gpu: str = "auto"
    sweep: bool = False
    record: Path | None = None
    target: ExternalOptions | None = None

    def __post_init__(self) -> None:
        if self.target is not None and (self.sweep or self.record is not None):
            raise ConfigError(
                "--target runs the drill on your service: --sweep and --record are for the "
                "demo stack (its simulated magnitudes and labelled recordings)"
            )
        if self.target is not None and self.target.prometheus is not None and self.quick:
            raise ConfigError(
                "--prometheus with --quick: your Prometheus evaluates its rules at their own "
                "windows and for: durations, and a quick run compresses them only in the "
                "embedded agent, so every alert held for minutes would be a miss; run "
                "without --quick"
            )
        if self.gpu not in ("auto", "sim", "nvml"):
            raise ConfigError(f"gpu={self.gpu!r}: expected auto, sim or nvml")
        for key in ("baseline", "fault_min", "fault_max", "recover_max"):
            value = getattr(self, key)
            if value is not None and not (
                isinstance(value, int | float) and math.isfinite(value) and 0 < value <= 3600
            ):
                raise ConfigError(f"{key}={value!r}: expected 0 < seconds <= 3600")
        if self.phase("fault_min") > self.phase("fault_max"):
            raise ConfigError(
                f"fault_min={self.phase('fault_min'):g} exceeds fault_max="
                f"{self.phase('fault_max'):g}"
            )
        if self.scenarios is not None and not self.scenarios:
            raise ConfigError("scenarios: empty; name at least one or leave it unset for all")
        if self.scenarios is not None:
            from ._cases import case

            for name in self.scenarios:
                case(name)
        named = {f for n in self.scenarios or () for f in n.split("+")}
        for fault, values in self.params.items():
            from ..chaos import get_fault

            cls = get_fault(fault)
            if self.scenarios is not None and fault not in named:
                raise ConfigError(f"params: {fault!r} is not among the scenarios being run")
            unknown = sorted(set(values) - set(cls.params)) if not cls.free_params else []
            if unknown:
                raise ConfigError(
                    f"params: fault {fault!r} has no {', '.join(unknown)} "
                    f"(it takes: {', '.join(sorted(cls.params)) or 'none'})"
                )

    @property
    def scale(self) -> TimeScale:
        """The run's time scale: ``QUICK`` with ``quick``, else ``SHIPPED``."""
        return TimeScale.of(self.quick)

    def phase(self, key: str) -> float:
        """A phase's length, seconds: the one set here, else the time scale's."""
        value = getattr(self, key)
        if value is not None:
            return float(value)
        return float(getattr(self.scale.phases, key))
