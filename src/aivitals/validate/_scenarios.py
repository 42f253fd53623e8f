"""What each scenario injects and expects, and whether this machine can host it.

Each scenario is a view of its fault's spec (``aivitals.chaos.FaultSpec``, beside the
fault's implementation): the parameters that make the fault visible within a run's
phases (``FaultSpec.runs``) and what the machine needs to host it
(``FaultSpec.needs``). The fault's layer, expected signature and alerts are in the
same spec, read through the chaos package's fault table.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..chaos import FAULT_SPECS, FaultSpec

__all__ = ["SCENARIOS", "Scenario", "hostable", "scenario"]


@dataclass(frozen=True, slots=True)
class Scenario:
    fault: str
    #: fault parameters for a full run and for ``--quick``
    params: dict[str, Any] = field(default_factory=dict)
    quick_params: dict[str, Any] = field(default_factory=dict)
    #: error codes the service's error log lines should carry while it runs
    error_codes: tuple[str, ...] = ()
    #: what the host needs; returns why not, or None
    needs: Callable[[], str | None] = lambda: None
    #: while the fault runs, a client that gives up after 0.3 s on 256-token generations
    #: (LoadPlan.impatient_*)
    impatient_client: bool = False
    #: a longer fault phase in --quick runs, for faults that need time to build up
    quick_fault_max: float | None = None
    #: a longer baseline in --quick runs, for alerts and evidence that compare with a
    #: baseline (the cache's hit ratio before the stampede must exist to drop from it)
    quick_baseline: float | None = None


def _scenario(spec: FaultSpec) -> Scenario:
    r = spec.runs
    return Scenario(
        spec.name,
        params=dict(r.params),
        quick_params=dict(r.quick_params),
        error_codes=r.error_codes,
        needs=spec.needs.why_not,
        impatient_client=r.impatient_client,
        quick_fault_max=r.quick_fault_max,
        quick_baseline=r.quick_baseline,
    )


#: fault name -> scenario, in the fault table's order
SCENARIOS: dict[str, Scenario] = {name: _scenario(spec) for name, spec in FAULT_SPECS.items()}


def scenario(name: str) -> Scenario:
    from ..errors import ConfigError

    if name not in SCENARIOS:
        raise ConfigError(f"unknown scenario {name!r}; known: {', '.join(SCENARIOS)}")
    return SCENARIOS[name]


def hostable(s: Scenario) -> str | None:
    """None when this machine can host the scenario, else why not."""
    from ..chaos import FAULTS

    if s.fault not in FAULTS:
        return "the chaos package has no such fault yet"
    return s.needs()
