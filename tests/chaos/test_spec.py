"""One spec per fault: the registry finds each fault and its spec in the module that
implements it, the tables are views of the specs, and a bad spec is refused."""

from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from aivitals.chaos import (
    FAULT_SPECS,
    FAULT_TABLE,
    FAULTS,
    Fault,
    FaultContext,
    FaultEffect,
    FaultInfo,
    FaultSpec,
    Grading,
    Knob,
    Needs,
    Runs,
    SweepBasis,
    check_grading,
    check_spec,
)
from aivitals.chaos._registry import _MODULES, collect_faults, registry
from aivitals.errors import ConfigError

SRC = Path(__file__).resolve().parents[2] / "src" / "aivitals"


def _rule_pack_alerts() -> set[str]:
    from aivitals.alerts import default_pack

    return set(default_pack().alert_names)


def _signature_ids() -> set[str]:
    from aivitals.diagnose import load_signatures

    return {s.id for s in load_signatures()}


def _knob(**kw: Any) -> Knob:
    return Knob(param=None, unit="events", bound=1.0, source="any event", **kw)


def _spec(**kw: Any) -> FaultSpec:
    base: dict[str, Any] = {
        "name": "toy_fault",
        "layer": "service",
        "description": "a fault for the test",
        "alerts": ("QueueBacklog",),
        "signature": "traffic_surge",
        "needs": Needs("outside"),
        "grading": Grading(knob=lambda b: _knob(), measure=lambda w, b: 1.0),
    }
    return FaultSpec(**{**base, **kw})


class ToyFault(Fault):
    """A fault that does nothing, defined in this test module only."""

    name = "toy_fault"
    spec = _spec()

    def _start(self, ctx: FaultContext) -> FaultEffect:
        return FaultEffect()


def test_every_fault_has_one_spec_and_every_spec_a_fault() -> None:
    found = collect_faults(_MODULES)
    assert sorted(c.name for c in found) == sorted(FAULTS) == sorted(FAULT_SPECS)
    for name, cls in FAULTS.items():
        assert cls.spec is FAULT_SPECS[name] and cls.spec.name == name
        # the spec lives in the module that implements the fault
        assert cls.__module__ in {m.__name__ for m in _MODULES}, name
    assert len({id(s) for s in FAULT_SPECS.values()}) == len(FAULT_SPECS)


def test_the_fault_table_and_the_scenarios_are_views_of_the_specs() -> None:
    from aivitals.validate import SCENARIOS

    assert list(FAULT_TABLE) == list(FAULT_SPECS) == list(SCENARIOS)
    for name, spec in FAULT_SPECS.items():
        assert FAULT_TABLE[name] == FaultInfo.of(spec)
        s = SCENARIOS[name]
        assert s.params == dict(spec.runs.params)
        assert s.quick_params == dict(spec.runs.quick_params)
        assert s.needs is spec.needs.why_not and s.error_codes == spec.runs.error_codes


def test_every_spec_names_alerts_of_the_rule_pack_and_signatures_the_diagnosis_knows() -> None:
    alerts, signatures = _rule_pack_alerts(), _signature_ids()
    for spec in FAULT_SPECS.values():
        check_spec(spec, alerts=alerts, signatures=signatures)


def test_a_fault_defined_in_its_module_appears_in_the_derived_tables() -> None:
    # A throwaway module holding one fault: the registry finds it with no other edit,
    # and the table built from it has its row (no global registry is touched).
    module = ModuleType("toy_faults")
    module.ToyFault = ToyFault  # type: ignore[attr-defined]
    ToyFault.__module__ = "toy_faults"
    try:
        found = registry([*collect_faults(_MODULES), *collect_faults([module])])
    finally:
        ToyFault.__module__ = __name__
    assert list(found)[-1] == "toy_fault"  # after the ordered ones
    from aivitals.chaos._table import build_table

    table = build_table(c.spec for c in found.values())
    assert table["toy_fault"].alerts == ("QueueBacklog",)
    assert "toy_fault" not in FAULTS  # the shipped registry is untouched


def test_a_class_imported_into_a_module_is_not_registered_twice() -> None:
    module = ModuleType("imports_a_fault")
    module.ToyFault = ToyFault  # type: ignore[attr-defined]
    assert collect_faults([module]) == []  # defined in this test module, not there
    assert collect_faults([sys.modules[__name__]]) == [ToyFault]


def test_the_registry_refuses_a_name_twice_or_a_spec_of_another_name() -> None:
    with pytest.raises(ConfigError, match="'toy_fault': defined twice"):
        registry([ToyFault, ToyFault])

    class Misnamed(ToyFault):
        name = "other_fault"

    with pytest.raises(ConfigError, match="'other_fault': its spec is named 'toy_fault'"):
        registry([Misnamed])


@pytest.mark.parametrize("reason", ["", "   ", "two\nlines", None])
def test_a_consequence_without_a_reason_is_refused(reason: object) -> None:
    ok = _spec(consequences={"QueueWaitHigh": "the queue fills, so waits grow"})
    assert FaultInfo.of(ok).consequences == ("QueueWaitHigh",)
    assert FaultInfo.of(ok).reasons["QueueWaitHigh"].startswith("the queue fills")
    with pytest.raises(ConfigError, match=r"consequence 'QueueWaitHigh' of 'toy_fault'"):
        _spec(consequences={"QueueWaitHigh": reason})


def test_incoherent_specs_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"either the signature .* or the suspects"):
        _spec(suspects=("service_process_threads",))
    with pytest.raises(ConfigError, match=r"either the signature .* or the suspects"):
        _spec(signature=None)
    with pytest.raises(ConfigError, match="layer 'gpu' is not one of"):
        _spec(layer="gpu")
    with pytest.raises(ConfigError, match="needs 'cloud' is not one of"):
        _spec(needs=Needs("cloud"))  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="QueueBacklog both expected and an allowed"):
        _spec(consequences={"QueueBacklog": "it queues"})
    with pytest.raises(ConfigError, match="no measure of its magnitude and no reason why"):
        _spec(grading=Grading(knob=lambda b: _knob()))


def test_unknown_alerts_and_signatures_are_refused() -> None:
    alerts, signatures = _rule_pack_alerts(), _signature_ids()
    with pytest.raises(ConfigError, match="alert 'QueueOnFire' is not in the rule pack"):
        check_spec(_spec(alerts=("QueueOnFire",)), alerts=alerts, signatures=signatures)
    with pytest.raises(ConfigError, match="alert 'Nope' is not in the rule pack"):
        check_spec(_spec(consequences={"Nope": "a reason"}), alerts=alerts, signatures=signatures)
    with pytest.raises(ConfigError, match="the diagnosis has no signature 'toy_fault'"):
        check_spec(_spec(signature="toy_fault"), alerts=alerts, signatures=signatures)
    with pytest.raises(ConfigError, match="has a signature of that name"):
        check_spec(
            _spec(name="cpu_burn", signature=None, suspects=("host_cpu_seconds_total",)),
            alerts=alerts,
            signatures=signatures,
        )


def _basis() -> SweepBasis:
    from aivitals.validate._severity import _nominal

    return _nominal()


def _graded(threshold: float, moderate: float, severe: float | None = None) -> FaultSpec:
    return _spec(
        grading=Grading(
            knob=lambda b: Knob(
                param="rate",
                unit="requests/s",
                bound=1.0,
                source="a test bound",
                threshold={"rate": threshold},
                moderate={"rate": moderate},
                severe={} if severe is None else {"rate": severe},
            ),
            magnitude=lambda p, b: float(p["rate"]),
            measure=lambda w, b: 1.0,
        )
    )


def test_a_graded_faults_severities_must_grow() -> None:
    check_grading(_graded(1, 2), _basis(), {"rate": 3})
    check_grading(_graded(1, 2, 4), _basis(), {"rate": 1})  # the knob's severe counts
    with pytest.raises(ConfigError, match=r"threshold 3 <= moderate 2 <= severe 5"):
        check_grading(_graded(3, 2), _basis(), {"rate": 5})
    with pytest.raises(ConfigError, match=r"threshold 1 <= moderate 2 <= severe 1\.5"):
        check_grading(_graded(1, 2), _basis(), {"rate": 1.5})
    no_magnitude = _spec(
        grading=dataclasses.replace(_graded(1, 2).grading, magnitude=None),
    )
    with pytest.raises(ConfigError, match="graded by 'rate' but has no magnitude"):
        check_grading(no_magnitude, _basis(), {"rate": 3})


def test_a_knob_is_named_after_its_fault() -> None:
    assert _spec().knob(_basis()).fault == "toy_fault"


def test_no_per_fault_branches_outside_the_specs() -> None:
    # a fault's behaviour lives in its spec: validate and the chaos machinery never ask
    # which fault they hold
    branch = re.compile(r"""\bfault\s*(==|!=|\bin\b|\bnot in\b)\s*[("']""")
    for path in [*(SRC / "validate").glob("*.py"), *(SRC / "chaos").glob("*.py")]:
        for n, line in enumerate(path.read_text().splitlines(), 1):
            assert not branch.search(line), f"{path.name}:{n}: {line.strip()}"


def test_runs_defaults_are_empty() -> None:
    r = Runs()
    assert (r.params, r.quick_params, r.error_codes, r.impatient_client) == ({}, {}, (), False)
