"""What one validate case runs: one fault or a pair of faults, at a given severity.

A case is named by its faults joined with ``+`` (``cpu_burn+gpu_memory_leak``);
the sweep adds ``@severity``. What each case expects (alerts, signatures, the
alerts it may cause, whether clients must feel it) is the union of its faults'
rows in the chaos fault table.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError
from ._scenarios import Scenario, scenario

__all__ = ["PAIRS", "Case", "case"]

#: The pairs a default run validates together: both must appear in the diagnosis's
#: top three. Each pair mixes layers whose evidence does not overlap, so two true
#: findings must coexist.
PAIRS: tuple[tuple[str, str], ...] = (
    ("cpu_burn", "gpu_memory_leak"),  # a noisy neighbour hides a slow leak
    ("redis_down", "traffic_surge"),  # a dependency fails while load spikes
)


@dataclass(frozen=True, slots=True)
class Case:
    scenarios: tuple[Scenario, ...]
    #: None: the scenario's own parameters; else a severity of the sweep
    severity: str | None = None

    @property
    def faults(self) -> tuple[str, ...]:
        return tuple(s.fault for s in self.scenarios)

    @property
    def name(self) -> str:
        base = "+".join(self.faults)
        return base if self.severity is None else f"{base}@{self.severity}"

    @property
    def is_pair(self) -> bool:
        return len(self.scenarios) > 1

    def params(
        self,
        quick: bool,
        overrides: dict[str, dict[str, Any]],
        capacity: Mapping[str, Any] | None = None,
    ) -> dict[str, dict[str, Any]]:
        """Each fault's parameters: the severity's (a surge's sized to ``capacity``, what
        the run measured), else the scenario's, then ``-p`` overrides."""
        out: dict[str, dict[str, Any]] = {}
        for s in self.scenarios:
            if self.severity is None:
                base = dict(s.quick_params if quick else s.params)
            else:
                from ._severity import severity_params

                base = severity_params(s.fault, self.severity, quick=quick, capacity=capacity)
            out[s.fault] = {**base, **overrides.get(s.fault, {})}
        return out


def case(name: str) -> Case:
    """A case by name: ``gpu_oom``, or two faults at once: ``redis_down+traffic_surge``."""
    parts = tuple(p.strip() for p in name.split("+"))
    if len(parts) > 2:
        raise ConfigError(f"{name!r}: at most two faults at once")
    if len(set(parts)) != len(parts):
        raise ConfigError(f"{name!r}: the same fault twice")
    return Case(tuple(scenario(p) for p in parts))
