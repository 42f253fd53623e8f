"""The severity sweep: every graded fault at threshold, moderate and severe, every other
fault once, and whether a run reached the magnitude it asked for.

*threshold* is the magnitude at which the knowledge's bound for the fault's defining
signal is just crossed, and *moderate* twice that magnitude; where twice does not fit
under what the system can take (a share of the device, of the fd limit), moderate is
halfway from the threshold to that limit. *severe* is today's scenario
(``Scenario.quick_params`` or ``Scenario.params``, merged onto the fault's defaults),
except where the knob sets it: at the limit where moderate is capped, and at twice
moderate where today's asks less than moderate; so severe >= moderate >= threshold for
every graded fault.
No value here is tuned to make a case pass: each is computed below from a bound of
the rule pack (``PackParams`` defaults, with validate's demo SLA), of a diagnosis
signature (``load_signatures()``), or of DOMAIN.md, and from what validate's run is
made of (``LoadPlan``'s request rates, the demo's sim GPU, the stack's fd limit).
Where the rule pack and the signature disagree, the lower bound is the threshold
(the first point where the knowledge calls it a fault): the issue's own examples are
a GPU leak of 2e6 bytes/s (the signature), P99 over twice the SLA, 5 % packet loss and
100 ms of added latency (the signature's 0.2 s probe round trip).

A fault whose parameter does not change its signal's size (an Xid happens or not)
has one magnitude, and so does a fault the knowledge base has no threshold for: the
sweep runs it once, at today's values, as ``fault@single`` (``SINGLE``), never three
times under three names.

``reached`` measures, after the fault phase, the magnitude the fault achieved from
the agent's store and compares it with the one asked. ``summarize_sweep`` turns a
sweep's JSON report into the benchmark's numbers, counting every case run: one that
did not reach its magnitude is *not reached* and one whose alerts were not tested is
*diagnosis only*, neither of them caught.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import cache
from typing import Any

from ..chaos import FAULT_SPECS, FaultSpec, Knob, SweepBasis, check_grading
from ..errors import ConfigError
from ._report import Check
from ._target import ValidateTarget

__all__ = [
    "NOMINAL_EMBEDDINGS_RPS",
    "OUTCOMES",
    "SEVERITIES",
    "SINGLE",
    "TOLERANCE",
    "Knob",
    "beyond_reach",
    "knob",
    "magnitude",
    "reached",
    "severities",
    "severity_params",
    "severity_table",
    "summarize_sweep",
]

#: the severities of a graded fault, weakest first
SEVERITIES = ("threshold", "moderate", "severe")
#: the one severity of a fault without a graded parameter: today's values, run once
SINGLE = "single"

#: A graded fault reached its severity when the measured magnitude is at least this
#: close to the one asked: validate's load is a few Poisson requests a second, so a
#: rate measured over a 10-60 s fault phase carries noise of about this size.
TOLERANCE = 0.1


# -- what the derivations stand on -------------------------------------------------------
def _request_rate() -> float:
    """Validate's own requests per second: every one calls the service's per-request
    fault hooks (the leaks) and counts in the job's HTTP rates."""
    from ._load import LoadPlan

    plan = LoadPlan()
    return plan.completions_rate + plan.embeddings_rate


@cache
def _pack() -> Any:
    """The rule pack's bounds as validate runs it (the demo's SLA, the pack's defaults)."""
    from ..alerts import PackParams
    from ._runner import _demo_rule_params

    return PackParams(**_demo_rule_params())


@cache
def _signature_param(signature: str, key: str) -> float:
    from ..diagnose import load_signatures

    for sig in load_signatures():
        if sig.id == signature:
            return float(sig.params[key])
    raise ConfigError(f"the diagnosis has no signature {signature!r}")


#: The demo model's inference time on validate's completions (12 tokens, CPU), nominal:
#: ~0.1 s, the figure the SLA ratio was set from (``SLA_PER_MEDIAN``). A run measures the
#: model and sets its SLA to that ratio times the median it measured, so the contention
#: factor that reaches 2 x SLA (x5, x10) is the same on any machine; the seconds this
#: module states for it are at the nominal speed (the run's report has the measured one).
DEMO_INFERENCE_S = 0.1


#: The demo's embeddings throughput with its two workers busy, nominal: a sweep measures
#: its own at the start (``calibrate_capacity``); quick sweeps on a shared 2-core machine
#: serve 41-47 fresh inputs a second saturated.
NOMINAL_EMBEDDINGS_RPS = 40.0


def _pool(capacity: Mapping[str, Any] | None) -> tuple[int, float, float]:
    """The worker pool: workers, and seconds of one worker per fresh embeddings input
    and per validate completion (``capacity`` as ``calibrate_capacity`` measured it;
    None: the nominal figures)."""
    from ..demo import StackConfig

    cap = capacity or {}
    workers = int(cap.get("workers") or StackConfig().workers)
    per_embedding = workers / float(cap.get("embeddings_rps") or NOMINAL_EMBEDDINGS_RPS)
    per_completion = float(cap.get("completion_s") or DEMO_INFERENCE_S)
    return workers, per_embedding, per_completion


def _base_rate() -> float:
    from ..chaos import FaultContext

    # validate gives its fault context no base_rate: the context's default
    return FaultContext().base_rate


def _cpus() -> int:
    return os.cpu_count() or 1


@cache
def _nominal() -> SweepBasis:
    """What the derivations stand on, before a run: the rule pack as validate runs it,
    validate's load, the demo's sim GPU and stack, this host, the nominal pool."""
    from ..demo import DemoConfig, StackConfig
    from ._load import LoadPlan

    plan, demo, stack = LoadPlan(), DemoConfig(), StackConfig()
    return SweepBasis(
        pack=_pack(),
        request_rate=_request_rate(),
        completions_rate=plan.completions_rate,
        embeddings_rate=plan.embeddings_rate,
        embeddings_pool=plan.embeddings_pool,
        sim_gpu_memory_total=demo.sim_gpu_memory_total,
        sim_weights_bytes=demo.sim_weights_bytes,
        workers=stack.workers,
        fd_limit=float(stack.service_max_fds or 0) or 2200.0,
        cpus=_cpus(),
        base_rate=_base_rate(),
        inference_s=DEMO_INFERENCE_S,
        nominal_embeddings_rps=NOMINAL_EMBEDDINGS_RPS,
        pool=_pool(None),
        signature_param=_signature_param,
    )


def _basis(capacity: Mapping[str, Any] | None = None) -> SweepBasis:
    """The basis with the worker pool ``capacity`` measured (None: the nominal one)."""
    nominal = _nominal()
    return nominal if capacity is None else replace(nominal, pool=_pool(capacity))


def _spec(fault: str) -> FaultSpec:
    knob(fault)  # the ConfigError for an unknown fault
    return FAULT_SPECS[fault]


@cache
def _knobs() -> dict[str, Knob]:
    """fault -> its knob, from each fault's spec; a spec whose severities do not grow
    (threshold <= moderate <= severe, in quick and in full runs) is refused."""
    out: dict[str, Knob] = {}
    for name, spec in FAULT_SPECS.items():
        for params in (spec.runs.quick_params, spec.runs.params):
            check_grading(spec, _nominal(), {**_defaults(name), **params})
        out[name] = spec.knob(_nominal())
    return out


def knob(fault: str) -> Knob:
    """How ``fault`` is swept; ``ConfigError`` for a fault the table does not know."""
    table = _knobs()
    if fault not in table:
        raise ConfigError(
            f"no severity table for fault {fault!r}; known: {', '.join(sorted(table))}"
        )
    return table[fault]


def severities(fault: str) -> tuple[str, ...]:
    """The severities the sweep runs ``fault`` at: ``SEVERITIES`` for a graded fault,
    ``(SINGLE,)`` for one with a single magnitude; ``ConfigError`` for an unknown fault."""
    return SEVERITIES if knob(fault).param is not None else (SINGLE,)


def _check_severity(fault: str, severity: str) -> None:
    if severity not in (*SEVERITIES, SINGLE):
        known = ", ".join((*SEVERITIES, SINGLE))
        raise ConfigError(f"unknown severity {severity!r}; expected one of {known}")
    allowed = severities(fault)
    if severity not in allowed:
        raise ConfigError(
            f"{fault} runs at {', '.join(allowed)}, not {severity!r}: "
            + (
                "it has one magnitude, run once"
                if allowed == (SINGLE,)
                else "it has a graded parameter"
            )
        )


def _defaults(fault: str) -> dict[str, Any]:
    """The fault's parameter defaults: its class's, or for an in-process fault the
    demo service's (the class passes them through and the service checks them)."""
    from ..chaos import get_fault

    cls = get_fault(fault)
    remote = getattr(cls, "remote", None)
    if remote is not None:
        from ..chaos import IN_PROCESS_FAULTS

        return {k: v[0] for k, v in IN_PROCESS_FAULTS[remote].params.items()}
    return {k: v[0] for k, v in cls.params.items()}


def severity_params(
    fault: str, severity: str, *, quick: bool, capacity: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The fault's parameters at ``severity`` (one of ``severities(fault)``) for a quick
    or a full run; ``ConfigError`` for an unknown fault or severity, or a severity the
    fault does not run at. ``capacity`` (what ``calibrate_capacity`` measured) sizes a
    surge against this machine's service; None, against the nominal one.

    **Usage**::

        severity_params("network_loss", "threshold", quick=True)   # {"percent": 5}
    """
    from ._scenarios import scenario

    k = knob(fault)
    _check_severity(fault, severity)
    s = scenario(fault)
    today = {**_defaults(fault), **(s.quick_params if quick else s.params)}
    if severity == SINGLE:
        return today
    at = _spec(fault).grading.at
    if at is not None:  # capacity None: the nominal pool, as the knob's own
        return at(severity, today, _basis(capacity))
    if severity == "severe":
        return {**today, **k.severe}
    return {**today, **(k.threshold if severity == "threshold" else k.moderate)}


def magnitude(
    fault: str, params: Mapping[str, Any], capacity: Mapping[str, Any] | None = None
) -> float | None:
    """The magnitude ``params`` ask of ``fault``, in its knob's unit (None for a fault
    with one magnitude: then the bound is what a run must cross); a surge's against
    ``capacity`` (None: the nominal one)."""
    k = knob(fault)
    if k.param is None:
        return None
    measure = _spec(fault).grading.magnitude
    if measure is None:
        raise ConfigError(f"fault {fault!r}: no magnitude for its knob {k.param!r}")
    return measure({**_defaults(fault), **params}, _basis(capacity))


def beyond_reach(
    fault: str, severity: str, params: Mapping[str, Any], *, pack: Any, fault_s: float
) -> dict[str, str]:
    """The fault table's expected alerts that ``params`` cannot make fire within a fault
    phase of ``fault_s`` seconds under the rule pack ``pack`` (a ``PackParams``): alert
    name -> why, said with the numbers (the spec's ``Grading.beyond_reach``). Empty at
    severe (today's values, which every alert is expected to catch).

    A GPU leak's alerts count the bytes it has grown, not its rate, so a leak at the
    signature's 2 MB/s, or twice it, reaches neither within a quick phase of 60 s: at
    threshold and moderate those alerts are reported as out of reach rather than
    missed; the diagnosis still has to name the leak.
    """
    _check_severity(fault, severity)
    out_of_reach = _spec(fault).grading.beyond_reach
    if severity == "severe" or out_of_reach is None:
        return {}
    return out_of_reach({**_defaults(fault), **params}, pack, fault_s, _nominal())


def severity_table(*, quick: bool) -> list[dict[str, Any]]:
    """One row per fault: the parameter swept, the severities it runs at and their
    values (a single-magnitude fault: ``single``, its scenario's), the bound and its
    source."""
    from ._scenarios import SCENARIOS

    rows = []
    for fault in SCENARIOS:
        k = knob(fault)
        sevs = severities(fault)
        values = {sev: severity_params(fault, sev, quick=quick) for sev in sevs}
        shown = list(_spec(fault).grading.shown) or ([k.param] if k.param else [])
        rows.append(
            {
                "fault": fault,
                "param": ", ".join(shown) or "-",
                "severities": list(sevs),
                **{sev: {p: values[sev].get(p) for p in shown} for sev in sevs},
                "unit": k.unit,
                "bound": k.bound,
                "source": k.source,
                "note": k.note,
            }
        )
    return rows


# -- reached -----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class _Window:
    """The fault phase in the agent's store: values of an expression at its end (with
    ``W`` the phase's length as the range), over it, or just before it."""

    store: Any
    tick: float
    t_fault: float
    t_end: float
    #: when a leak would reach its bound (the device full, the fault's max_mib)
    full_at: float = math.inf

    @property
    def w(self) -> str:
        return f"{max(int(self.t_end - self.t_fault), int(2 * self.tick) + 1)}s"

    @property
    def before_s(self) -> float:
        # the last 8 s before the fault (validate's quick baseline is 10 s, a full
        # run's 60 s): the calm under the same load the fault's reach is measured from
        return max(8.0, 4 * self.tick)

    def series(self, expr: str, start: float, end: float) -> list[tuple[Mapping[str, str], float]]:
        res = self.store.query_range(expr, start, end, self.tick)
        return [(s.labels, v) for s in res.matrix for _, v in s.points if v == v]

    def at(self, expr: str, t: float) -> list[tuple[Mapping[str, str], float]]:
        return self.series(expr.replace("[W]", f"[{self.w}]"), t, t)

    def end(self, expr: str) -> list[float]:
        return [v for _, v in self.at(expr, self.t_end)]

    def end_from_before(self, expr: str) -> list[float]:
        """``expr`` at the end, ``[W]`` reaching one tick before the injection: a counter
        of events such as ``changes()`` must see the last sample before the fault, or an
        event at the injection's first tick leaves no change inside the range (a range cut
        to the phase reads 0 model loads for every cold_start)."""
        w = f"{math.ceil(self.t_end - self.t_fault + self.tick)}s"
        return [v for _, v in self.series(expr.replace("[W]", f"[{w}]"), self.t_end, self.t_end)]

    def start(self, expr: str) -> list[tuple[Mapping[str, str], float]]:
        """``expr`` at the injection, ``[W]`` standing for the calm just before it."""
        return self.series(
            expr.replace("[W]", f"[{int(self.before_s)}s]"), self.t_fault, self.t_fault
        )

    def over(self, expr: str) -> list[float]:
        return [v for _, v in self.series(expr, self.t_fault, self.t_end)]

    def before(self, expr: str) -> list[float]:
        return [v for _, v in self.series(expr, self.t_fault - self.before_s, self.t_fault)]

    def delta(self, expr: str) -> float:
        """How much a sum of counters grew over the phase (a series that appears
        during it, such as a first Xid, counts from zero)."""
        end = self.at(expr, self.t_end)
        start = self.at(expr, self.t_fault - self.tick)
        return (end[0][1] if end else 0.0) - (start[0][1] if start else 0.0)


#: achieved magnitude, or why it cannot be measured (a string)
def _full_at(fault: str, params: Mapping[str, Any], t_fault: float) -> float:
    """When a fault asked at ``params`` reaches what bounds it and stops growing (a
    leak's device or cap; ``Grading.full_after``), else never."""
    full_after = _spec(fault).grading.full_after
    if full_after is None:
        return math.inf
    return t_fault + full_after({**_defaults(fault), **params}, _nominal())


def _asked(
    fault: str,
    severity: str,
    params: Mapping[str, Any],
    t: float,
    capacity: Mapping[str, Any] | None = None,
) -> float | None:
    """The magnitude the case asked, in the measured signal's terms: the spec's own
    (``Grading.asked``), else the magnitude, else (one magnitude) the bound."""
    del severity  # the magnitude asked is in params
    asked = _spec(fault).grading.asked
    if asked is not None:
        return asked({**_defaults(fault), **params}, t, _basis(capacity))
    m = magnitude(fault, params, capacity)
    return knob(fault).bound if m is None else m


def _fmt(value: float, unit: str) -> str:
    if "bytes/s" in unit:
        return f"{value / 1e6:.2f} MB/s"
    if unit.startswith(("share", "drop", "rise")):
        return f"{value:.1%}"
    if unit.startswith("s "):
        return f"{value:.3f} s"
    if unit.startswith("offered load"):
        return f"x{value:.2f}"
    return f"{value:.4g}"


def reached(
    stack: ValidateTarget,
    fault: str,
    severity: str,
    params: dict[str, Any],
    *,
    quick: bool,
    t_fault: float,
    t_end: float,
    capacity: Mapping[str, Any] | None = None,
) -> Check | None:
    """Did the fault reach the magnitude ``severity`` asked, on this machine?

    Measured from the agent's store over ``[t_fault, t_end]``. ``ok`` True: reached
    (a graded fault within ``TOLERANCE`` of the magnitude asked, a fault with one
    magnitude past its bound); False: "could not reach the <severity> magnitude on
    this machine: achieved X, asked Y"; ``ok`` None: the magnitude cannot be measured
    here (the text says why). ``None`` only for a fault whose magnitude is not a
    number the agent collects.
    """
    k = knob(fault)
    _check_severity(fault, severity)
    grading = _spec(fault).grading
    if grading.measure is None:  # the agent does not collect it (``unmeasured`` says why)
        return None
    del quick  # the magnitude asked is in params; the phase times set the windows
    full = _full_at(fault, params, t_fault)
    window = _Window(stack.agent.store, float(stack.config.tick), t_fault, t_end, full)
    try:
        achieved = grading.measure(window, _basis(capacity))
    except Exception as exc:  # a query error is reported, never raised into the run
        achieved = f"the measurement failed: {type(exc).__name__}: {exc}"
    asked = _asked(fault, severity, params, t_end - t_fault, capacity)
    if isinstance(achieved, str) or asked is None:
        why = achieved if isinstance(achieved, str) else "nothing asked"
        return Check(
            "severity",
            None,
            f"{severity} magnitude not measured: {why}",
            {"severity": severity, "unit": k.unit, "asked": asked},
        )
    data = {"severity": severity, "unit": k.unit, "achieved": achieved, "asked": asked,
            "bound": k.bound}  # fmt: skip
    if grading.indirect:
        text = (
            f"{severity} magnitude not judged: {_fmt(achieved, k.unit)} ({k.unit}) with "
            f"{_fmt(asked, k.unit)} asked; {grading.indirect}"
        )
        return Check("severity", None, text, data)
    counted = k.param is None and k.bound == 1.0
    if k.param is None and k.bound is not None and not counted:
        ok = achieved > k.bound  # one magnitude: the fault must cross its bound
    elif counted:
        ok = achieved >= 1.0
    else:
        ok = achieved >= (1.0 - TOLERANCE) * asked
    got, want = _fmt(achieved, k.unit), _fmt(asked, k.unit)
    if ok:
        text = f"{severity} magnitude reached: {got} ({k.unit}), asked {want}"
    else:
        text = (
            f"could not reach the {severity} magnitude on this machine: achieved {got}, "
            f"asked {want} ({k.unit})"
        )
    return Check("severity", ok, text, data)


# -- the benchmark's numbers -------------------------------------------------------------
def _quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    pos = q * (len(s) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


#: What became of a sweep case, each counted once, in the order they are judged: not run
#: (skipped, or cut short by Ctrl-C), crashed, short of the magnitude it asked, missed by
#: an expected alert or by the diagnosis, named by the diagnosis with no alert to test (the
#: fault has none, or its magnitude cannot make them fire in the phase), caught.
OUTCOMES = ("not tested", "error", "not reached", "missed", "diagnosis only", "caught")


def _outcome(case: Mapping[str, Any]) -> str:
    if case.get("skipped") or case.get("error") == "interrupted":
        return "not tested"
    if case.get("error"):
        return "error"
    if case.get("reached") is False:
        return "not reached"
    if not case.get("diag_ok") or case.get("alerts_ok") is False:
        return "missed"
    if not case.get("alerts_tested"):
        return "diagnosis only"
    return "caught"


def _severity_of(name: Any, fault: str, severity: Any) -> tuple[str, str | None]:
    """The case's severity as the sweep counts it, and the one the report named where
    they differ: a report from before single-magnitude faults ran once names their three
    runs threshold, moderate and severe; they count as three runs at ``SINGLE``."""
    if severity not in (*SEVERITIES, SINGLE):
        raise ConfigError(f"case {name!r}: unknown severity {severity!r}")
    if severity in SEVERITIES and fault in _knobs() and knob(fault).param is None:
        return SINGLE, severity
    return severity, None


def _case_of_report(s: Mapping[str, Any]) -> dict[str, Any] | None:
    """One sweep case of a validate report (None for a pair or a plain case beside it)."""
    if s.get("severity") is None:
        return None
    fault = "+".join(s.get("faults") or [str(s.get("fault", "")).split("@")[0]])
    sev, ran_as = _severity_of(s.get("fault"), fault, s.get("severity"))
    checks = {c["name"]: c for c in s.get("checks", [])}
    alerts = [c for n, c in checks.items() if n.startswith("alert:")]
    diag = checks.get("diagnosis")
    sev_check = checks.get("severity")
    diag_ok = bool(diag and diag.get("ok"))
    fired = [c["data"]["after_s"] for c in alerts if c.get("ok") and "after_s" in c["data"]]
    t0, t1 = s.get("t_fault"), s.get("t_revert") or s.get("ended_at")
    phase = (
        float(t1) - float(t0)
        if isinstance(t0, int | float) and isinstance(t1, int | float)
        else 0.0
    )
    return {
        "case": s.get("fault"),
        "fault": fault,
        "severity": sev,
        "ran_as": ran_as,
        "skipped": s.get("skipped"),
        "error": s.get("error"),
        # expected alerts this magnitude cannot make fire in its phase (``beyond_reach``)
        # are not among the alert checks: they were not tested
        "alerts_tested": len(alerts),
        "alerts_ok": all(c.get("ok") for c in alerts),
        "diag_ok": diag_ok,
        "first_alert_s": min(fired) if fired else None,
        "finding_s": diag["data"].get("after_s") if diag_ok and diag else None,
        "stable_share": (diag or {}).get("data", {}).get("stable_share"),
        "reached": None if sev_check is None else sev_check.get("ok"),
        "reached_text": None if sev_check is None else sev_check.get("text"),
        # during the fault and after its revert alike
        "false_p0p1": list(
            dict.fromkeys(
                a
                for n in ("other_alerts", "recovery_pages")
                for a in (checks.get(n) or {}).get("data", {}).get("false_paging", [])
            )
        ),
        "beyond_reach": sorted(n.split(":", 1)[1] for n in checks if n.startswith("beyond_reach:")),
        "fault_s": max(0.0, phase),
    }


def _case_of_summary(c: Mapping[str, Any]) -> dict[str, Any]:
    """One case of an earlier ``summarize_sweep`` answer (a detection_sweep results
    file), for its report to be counted again under these rules. An answer from before
    the outcomes were kept says only whether the case was caught: the alerts it tested
    are the fault table's less those out of reach, and a case the diagnosis named but
    did not catch missed an alert."""
    fault = str(c.get("fault", ""))
    sev, ran_as = _severity_of(c.get("case"), fault, c.get("ran_as") or c.get("severity"))
    out = dict(c)
    out.update(severity=sev, ran_as=ran_as)
    out.setdefault("false_p0p1", [])
    out.setdefault("beyond_reach", [])
    if "diag_ok" not in c:
        from ..chaos import FAULT_TABLE

        faults = fault.split("+")
        unknown = [f for f in faults if f not in FAULT_TABLE]
        if unknown:
            raise ConfigError(f"case {c.get('case')!r}: no fault table row for {unknown[0]!r}")
        expected = {a for f in faults for a in FAULT_TABLE[f].alerts}
        diag_ok = c.get("caught") is True or c.get("finding_s") is not None
        out["diag_ok"] = diag_ok
        out["alerts_tested"] = len(expected - set(out["beyond_reach"]))
        out["alerts_ok"] = True if c.get("caught") else (False if diag_ok else None)
    return out


def _cases(report: Mapping[str, Any]) -> tuple[list[dict[str, Any]], Mapping[str, Any] | None]:
    """The sweep cases of a validate report, or of an earlier summary (then also it)."""
    if not isinstance(report, Mapping):
        raise ConfigError("not a validate report: no 'scenarios' list")
    if isinstance(report.get("scenarios"), list):
        got = (_case_of_report(s) for s in report["scenarios"])
        return [c for c in got if c is not None], None
    earlier = report.get("summary")
    if isinstance(earlier, Mapping) and isinstance(earlier.get("cases"), list):
        return [_case_of_summary(c) for c in earlier["cases"]], earlier
    raise ConfigError(
        "not a validate report: no 'scenarios' list (nor a detection_sweep result's "
        "'summary' with its 'cases')"
    )


def summarize_sweep(report: Mapping[str, Any]) -> dict[str, Any]:
    """The sweep's numbers from a validate report (``Report.to_dict()`` / its JSON), or
    from a detection_sweep results file (its ``summary``, counted again).

    Per case (fault x severity, or a single-magnitude fault's one run): its outcome
    (``OUTCOMES``; caught means every expected alert fired and the diagnosis named the
    fault, and kept naming it, at the magnitude asked), the time from injection to the
    first expected alert and to the stable correct finding, and whether the severity was
    reached. Per severity (``SEVERITIES`` and ``SINGLE``): the cases caught, tested and
    not tested, and the outcomes of the others; ``caught`` is each one's caught share over
    every case tested (a crash, a case short of its magnitude and one with no alert to
    test all count, as not caught). Time-to-detection percentiles over the caught
    cases; false P0/P1 alerts per hour of fault phase; ``consequences``, the allowed
    consequence entries of the fault table. ``ConfigError`` for a report without sweep
    cases.
    """
    from ..chaos import FAULT_TABLE

    cases, earlier = _cases(report)
    if not cases:
        raise ConfigError("the report holds no sweep case (run 'aivitals validate --sweep')")
    for c in cases:
        c["outcome"] = _outcome(c)
        c["caught"] = None if c["outcome"] == "not tested" else c["outcome"] == "caught"
    tested = [c for c in cases if c["outcome"] != "not tested"]
    by_severity: dict[str, dict[str, int]] = {}
    shares: dict[str, float | None] = {}
    for sev in (*SEVERITIES, SINGLE):
        at = [c for c in cases if c["severity"] == sev]
        n = {o: sum(c["outcome"] == o for c in at) for o in OUTCOMES}
        by_severity[sev] = {
            "caught": n["caught"],
            "tested": len(at) - n["not tested"],
            "not_tested": n["not tested"],
            **{o.replace(" ", "_"): n[o] for o in OUTCOMES[1:-1]},
        }
        shares[sev] = (
            n["caught"] / by_severity[sev]["tested"] if by_severity[sev]["tested"] else None
        )
    ttd = [c["first_alert_s"] for c in tested if c["caught"] and c.get("first_alert_s") is not None]
    false_alerts = sum(len(c["false_p0p1"]) for c in tested)
    if earlier is not None and not all("fault_s" in c for c in tested):
        fault_s = float(earlier.get("fault_hours") or 0.0) * 3600.0
    else:
        fault_s = sum(float(c.get("fault_s") or 0.0) for c in tested)
    count = {o: sum(c["outcome"] == o for c in cases) for o in OUTCOMES}
    return {
        "cases": cases,
        "caught": shares,
        "by_severity": by_severity,
        "not_reached": count["not reached"],
        "diagnosis_only": count["diagnosis only"],
        "errors": count["error"],
        "missed": count["missed"],
        "not_tested": count["not tested"],
        "consequences": sum(len(i.consequences) for i in FAULT_TABLE.values()),
        "ttd_p50_s": _quantile(ttd, 0.5),
        "ttd_p90_s": _quantile(ttd, 0.9),
        "false_p0p1": false_alerts,
        "fault_hours": fault_s / 3600.0,
        "false_p0p1_per_h": false_alerts / (fault_s / 3600.0) if fault_s > 0 else None,
        "ran": len(tested),
        "interrupted": bool(report.get("interrupted") or (earlier or {}).get("interrupted")),
    }
