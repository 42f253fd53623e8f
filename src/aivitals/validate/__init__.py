"""aivitals.validate: prove that every fault is caught.

For each scenario (each fault this machine can host; GPU faults through the
simulated device) it runs a baseline, injects the fault with
``aivitals.chaos``, and checks that the expected alerts fired within a
deadline, that the diagnosis's top finding is the fault's signature and layer,
that error logs carry the structured fields, and that the alerts resolve after
the revert. One line per check, a JSON report, a non-zero exit on any failure.

**Usage**::

    from aivitals.validate import ValidateConfig, run_validate
    report = run_validate(ValidateConfig(quick=True, scenarios=("gpu_memory_leak",)))
    report.passed

Against a service that already runs (``aivitals validate --target URL``)::

    from aivitals.load import RequestTemplate
    target = ExternalOptions(url="http://127.0.0.1:8300",
                             request=RequestTemplate.load("request.json"))
    report = run_validate(ValidateConfig(quick=True, target=target))
"""

from __future__ import annotations

from ._cases import PAIRS, Case
from ._config import ValidateConfig
from ._external import ExternalOptions, ExternalTarget, why_not
from ._lock import RunLock, default_lock_path
from ._record import Recording, load_recordings, save_recording
from ._replay import Replay, ReplayedPoll, count_flips, replay, replayable
from ._report import Check, Report, ScenarioResult
from ._runner import LOG_FIELDS, run_validate
from ._scenarios import SCENARIOS, Scenario, hostable
from ._severity import SEVERITIES, reached, severity_params, severity_table, summarize_sweep
from ._soak import SoakReport, parse_soak_duration, run_soak
from ._target import (
    TargetAgent,
    TargetConfig,
    TargetEngine,
    TargetLedger,
    TargetPack,
    TargetRedis,
    TargetService,
    ValidateTarget,
)

__all__ = [
    "LOG_FIELDS",
    "PAIRS",
    "SCENARIOS",
    "SEVERITIES",
    "Case",
    "Check",
    "ExternalOptions",
    "ExternalTarget",
    "Recording",
    "Replay",
    "ReplayedPoll",
    "Report",
    "RunLock",
    "Scenario",
    "ScenarioResult",
    "SoakReport",
    "TargetAgent",
    "TargetConfig",
    "TargetEngine",
    "TargetLedger",
    "TargetPack",
    "TargetRedis",
    "TargetService",
    "ValidateConfig",
    "ValidateTarget",
    "count_flips",
    "default_lock_path",
    "hostable",
    "load_recordings",
    "parse_soak_duration",
    "reached",
    "replay",
    "replayable",
    "run_soak",
    "run_validate",
    "save_recording",
    "severity_params",
    "severity_table",
    "summarize_sweep",
    "why_not",
]
