"""One spec per fault: everything the rest of aivitals knows about a fault, in one place.

A fault's ``FaultSpec`` is written beside its ``Fault`` class (``CpuBurn.spec``) and
holds what used to be spread over the fault table, validate's scenarios and its
severity sweep: the layer and the description, the alerts that must fire, the
alerts the fault may cause with the mechanism of each, the diagnosis signature that
must name it (or, for a fault no signature knows, the series the generic ranking must
rank), what the fault needs from a target, the parameters validate runs it at, and
how the severity sweep grades it (``Grading``). The fault table, validate's
``SCENARIOS`` and the sweep's knobs are views of the specs, so adding a fault touches
its module and its test.

The grading's callables are written against ``SweepBasis`` (the figures of the
system a sweep runs on, which validate measures or derives) and ``PhaseWindow`` (the
agent's store over a fault phase), both defined here, so that chaos needs nothing of
validate: validate builds them and calls the spec.

A spec refuses itself when it is incoherent (``ConfigError`` on construction: an
allowed consequence without its one-line reason, a signature and suspects together,
a grading that measures nothing and says no why); ``check_spec`` checks what needs the
knowledge (alert names in the rule pack, signature ids in the diagnosis) and
``check_grading`` that a graded fault's severities are ordered.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal, Protocol, get_args

from ..errors import ConfigError

if TYPE_CHECKING:
    from ..alerts import PackParams

__all__ = [
    "FaultSpec",
    "Grading",
    "Knob",
    "Layer",
    "Measured",
    "NeedKind",
    "Needs",
    "PhaseWindow",
    "Runs",
    "SweepBasis",
    "capped",
    "change",
    "check_grading",
    "check_spec",
    "down",
    "no_data",
    "peak",
    "rise",
    "slope",
    "up",
]

Layer = Literal["model", "service", "infrastructure", "business"]

#: What a fault needs from its target: ``in-process`` the service's chaos endpoint (its
#: token), ``outside`` only the service's URL (it acts as a client), ``host`` the machine
#: the service runs on (processes and files beside it), ``root`` root on that machine
#: (network namespaces, nftables), ``redis`` the service's Redis (its port, its pid),
#: ``gpu`` the service's device (the simulated GPU's state, or a real one).
NeedKind = Literal["in-process", "outside", "host", "root", "redis", "gpu"]

MIB = float(1 << 20)


def _anywhere() -> str | None:
    return None


@dataclass(frozen=True, slots=True)
class Needs:
    """What the fault needs from a target (``kind``) and a check of this machine:
    ``why_not()`` says why it cannot host the fault, or None. Against a service
    aivitals did not start (``validate --target``): ``external`` says why the fault can
    never act on it (None: it can, given its kind), and ``external_params`` the
    parameters it must take there (under the user's ``-p``). ``device``: the fault
    shows only on a GPU the agent reads, so a target without one cannot show it."""

    kind: NeedKind
    why_not: Callable[[], str | None] = _anywhere
    external: str | None = None
    external_params: Mapping[str, Any] = field(default_factory=dict)
    device: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class Runs:
    """How validate runs the fault: its parameters in a full run and in ``--quick``
    (merged onto the fault's defaults), the error codes the service's error log lines
    carry while it runs, an impatient client beside the load (one that gives up after
    0.3 s on 256-token generations), and a longer fault phase or baseline in quick runs
    for faults that build up or alerts that compare with a baseline."""

    params: Mapping[str, Any] = field(default_factory=dict)
    quick_params: Mapping[str, Any] = field(default_factory=dict)
    error_codes: tuple[str, ...] = ()
    impatient_client: bool = False
    quick_fault_max: float | None = None
    quick_baseline: float | None = None


# -- the severity sweep's terms ----------------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class Knob:
    """How one fault is swept.

    ``param`` is the parameter the severities change (None: the fault has one
    magnitude and runs once, as ``single``); ``threshold`` and ``moderate`` the values
    they set (the other parameters stay today's); ``severe`` the values severe sets
    instead of today's (the limit of a capped knob, or twice moderate where today's
    ask less; empty: today's); ``unit`` and ``bound`` the magnitude in the measured
    signal's terms and the knowledge's bound on it; ``source`` where that bound comes
    from; ``note`` a cap or a caveat. ``fault`` is filled in from the spec.
    """

    fault: str = ""
    param: str | None
    unit: str
    bound: float | None
    source: str
    threshold: Mapping[str, float] = field(default_factory=dict)
    moderate: Mapping[str, float] = field(default_factory=dict)
    note: str = ""
    severe: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class SweepBasis:
    """The figures a severity is derived from and a magnitude measured against: the rule
    pack as validate runs it, validate's load, the demo's sim GPU and stack, this host,
    and the worker pool (the one a run measured, or the nominal one)."""

    pack: PackParams
    #: validate's requests a second, all routes (every one calls the per-request hooks)
    request_rate: float
    completions_rate: float
    embeddings_rate: float
    #: distinct embeddings inputs validate cycles through
    embeddings_pool: int
    sim_gpu_memory_total: float
    sim_weights_bytes: float
    #: the stack's worker pool and the service's fd limit
    workers: int
    fd_limit: float
    cpus: int
    #: the fault context's normal request rate (what a surge multiplies)
    base_rate: float
    #: the demo model's nominal inference time, and the pool's nominal embeddings a second
    inference_s: float
    nominal_embeddings_rps: float
    #: workers, and seconds of one worker per fresh embeddings input and per completion
    pool: tuple[int, float, float]
    #: a diagnosis signature's parameter: (signature id, key) -> value
    signature_param: Callable[[str, str], float]


#: achieved magnitude, or why it cannot be measured (a string)
Measured = float | str


class PhaseWindow(Protocol):
    """The fault phase in the agent's store. ``[W]`` in an expression stands for the
    phase's length (``at``, ``end``), for it plus one tick (``end_from_before``), or for
    the calm before the fault (``start``)."""

    @property
    def tick(self) -> float: ...
    @property
    def t_fault(self) -> float: ...
    @property
    def t_end(self) -> float: ...
    @property
    def full_at(self) -> float: ...
    def series(
        self, expr: str, start: float, end: float
    ) -> list[tuple[Mapping[str, str], float]]: ...
    def at(self, expr: str, t: float) -> list[tuple[Mapping[str, str], float]]: ...
    def end(self, expr: str) -> list[float]: ...
    def end_from_before(self, expr: str) -> list[float]: ...
    def start(self, expr: str) -> list[tuple[Mapping[str, str], float]]: ...
    def over(self, expr: str) -> list[float]: ...
    def before(self, expr: str) -> list[float]: ...
    def delta(self, expr: str) -> float: ...


Params = Mapping[str, Any]


@dataclass(frozen=True, slots=True, kw_only=True)
class Grading:
    """How the severity sweep grades the fault and measures what a run reached.

    ``knob`` derives the severities from the basis. ``magnitude`` is what parameters
    (merged onto the fault's defaults) ask, in the knob's unit; a graded fault needs
    it. ``measure`` reads the achieved magnitude from the phase (None: the agent does
    not collect it, and ``unmeasured`` says why); ``indirect`` says why a measured value
    is reported, not judged. The rest change one step of the generic machinery:
    ``asked`` the magnitude a case asked (default: ``magnitude``, or the bound of a
    fault with one magnitude), ``at`` a severity's parameters sized against the
    basis's worker pool, which a run measures first (default: the knob's values over
    today's, fixed before the run), ``full_after`` the seconds until a fault at these parameters
    reaches what bounds it (a leak's device or cap), ``beyond_reach`` the expected
    alerts a phase of ``fault_s`` cannot make fire, ``shown`` the parameters the
    severity table shows (default: the knob's).
    """

    knob: Callable[[SweepBasis], Knob]
    magnitude: Callable[[Params, SweepBasis], float] | None = None
    measure: Callable[[PhaseWindow, SweepBasis], Measured] | None = None
    unmeasured: str = ""
    indirect: str = ""
    asked: Callable[[Params, float, SweepBasis], float | None] | None = None
    at: Callable[[str, Params, SweepBasis], dict[str, Any]] | None = None
    full_after: Callable[[Params, SweepBasis], float] | None = None
    beyond_reach: Callable[[Params, PackParams, float, SweepBasis], dict[str, str]] | None = None
    shown: tuple[str, ...] = ()


# -- the spec ----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class FaultSpec:
    """Everything aivitals knows about one fault.

    ``alerts`` are names from the shipped rule pack that should fire while the fault
    runs (empty: nothing the service side collects moves, and the description says
    why). ``signature`` is the diagnosis signature that must be the top finding; a
    fault no signature knows has ``suspects`` instead, metric families one of which
    the generic ranking must rank in its top three. ``hurts_clients``: the clients
    must feel it (P99 or errors). ``consequences``: the other alerts the fault
    legitimately causes, alert -> the mechanism in one line (any other P0/P1 alert
    during it is a false alert). ``event``: a one-time event whose effect passes by
    itself (a diagnosis that names nothing once it has passed is right).

    **Usage**::

        spec = FaultSpec(name="cpu_burn", layer="infrastructure",
                         description="host CPU saturated", alerts=("HostCPUSaturated",),
                         signature="cpu_burn", needs=Needs("host"),
                         grading=Grading(knob=lambda b: Knob(param=None, unit="busy share",
                                                               bound=0.9, source="..."),
                                         unmeasured="the example measures nothing"))
    """

    name: str
    layer: Layer
    description: str
    alerts: tuple[str, ...] = ()
    signature: str | None = None
    suspects: tuple[str, ...] = ()
    hurts_clients: bool = False
    consequences: Mapping[str, str] = field(default_factory=dict)
    event: bool = False
    needs: Needs
    runs: Runs = field(default_factory=Runs)
    grading: Grading

    def __post_init__(self) -> None:
        if not self.name.isidentifier():
            raise ConfigError(f"fault spec: name {self.name!r} is not an identifier")
        if self.layer not in get_args(Layer):
            raise ConfigError(
                f"fault spec {self.name!r}: layer {self.layer!r} is not one of "
                + ", ".join(get_args(Layer))
            )
        if self.needs.kind not in get_args(NeedKind):
            raise ConfigError(
                f"fault spec {self.name!r}: needs {self.needs.kind!r} is not one of "
                + ", ".join(get_args(NeedKind))
            )
        if (self.signature is None) == (not self.suspects):
            raise ConfigError(
                f"fault spec {self.name!r}: give either the signature the diagnosis must "
                "name or the suspects its generic ranking must rank, not both or neither"
            )
        for alert, reason in self.consequences.items():
            if not isinstance(reason, str) or not reason.strip() or "\n" in reason:
                raise ConfigError(
                    f"fault table: consequence {alert!r} of {self.name!r} has no reason: "
                    "each allowed consequence states, in one line, the mechanism by which "
                    "the fault causes it"
                )
        if overlap := set(self.alerts) & set(self.consequences):
            raise ConfigError(
                f"fault spec {self.name!r}: {', '.join(sorted(overlap))} both expected "
                "and an allowed consequence"
            )
        if self.grading.measure is None and not self.grading.unmeasured:
            raise ConfigError(
                f"fault spec {self.name!r}: no measure of its magnitude and no reason why"
            )

    def knob(self, basis: SweepBasis) -> Knob:
        """The fault's knob on ``basis``, named after the fault."""
        return replace(self.grading.knob(basis), fault=self.name)


def check_spec(spec: FaultSpec, *, alerts: Collection[str], signatures: Collection[str]) -> None:
    """``ConfigError`` unless every alert the spec names (expected or allowed) is in
    ``alerts`` (the rule pack's names) and its signature in ``signatures`` (the
    diagnosis's ids); a fault with suspects must not have a signature there."""
    unknown = sorted((set(spec.alerts) | set(spec.consequences)) - set(alerts))
    if unknown:
        raise ConfigError(f"fault spec {spec.name!r}: alert {unknown[0]!r} is not in the rule pack")
    if spec.signature is not None and spec.signature not in signatures:
        raise ConfigError(
            f"fault spec {spec.name!r}: the diagnosis has no signature {spec.signature!r}"
        )
    if spec.signature is None and spec.name in signatures:
        raise ConfigError(
            f"fault spec {spec.name!r}: the diagnosis has a signature of that name; "
            "name it instead of suspects"
        )


def check_grading(spec: FaultSpec, basis: SweepBasis, today: Mapping[str, Any]) -> None:
    """``ConfigError`` unless a graded fault's magnitudes grow with the severity:
    threshold <= moderate <= severe, each merged onto ``today`` (the fault's defaults
    and the scenario's parameters), in the knob's unit (a longer stampede interval is a
    smaller drop, so the raw values need not grow)."""
    k = spec.knob(basis)
    if k.param is None:
        return
    g = spec.grading
    if g.magnitude is None:
        raise ConfigError(f"fault {spec.name!r}: graded by {k.param!r} but has no magnitude")
    values = {"threshold": k.threshold, "moderate": k.moderate, "severe": k.severe}

    def params(severity: str) -> Mapping[str, Any]:
        if g.at is not None:
            return g.at(severity, today, basis)
        return {**today, **values[severity]}

    low, mid, high = (g.magnitude(params(s), basis) for s in values)
    if not low <= mid <= high:
        raise ConfigError(
            f"fault {spec.name!r}: its magnitude must grow with the severity, threshold "
            f"{low:g} <= moderate {mid:g} <= severe {high:g} ({k.unit})"
        )


# -- helpers the specs derive their knobs with ------------------------------------------
def up(x: float, step: float) -> float:
    """``x`` rounded up to the parameter's step (the fault asks at least the bound)."""
    return round(math.ceil(x / step - 1e-9) * step, 6)


def down(x: float, step: float) -> float:
    return round(math.floor(x / step + 1e-9) * step, 6)


def capped(threshold: float, twice: float, limit: float, step: float) -> float:
    """Moderate's value: ``twice`` the threshold's magnitude, or where that passes the
    ``limit``, halfway from the threshold to it (the limit itself is severe's)."""
    if twice <= limit:
        return up(twice, step)
    return up((threshold + limit) / 2, step)


# -- helpers the specs measure with -----------------------------------------------------
def no_data(metric: str) -> str:
    return f"no {metric} series in the agent's store during the fault"


def peak(values: list[float], metric: str) -> Measured:
    return max(values) if values else no_data(metric)


def rise(w: PhaseWindow, expr: str, metric: str) -> Measured:
    """The peak of ``expr`` over the phase above its median in the calm before."""
    during, before = w.over(expr), w.before(expr)
    if not during or not before:
        return no_data(metric)
    return max(during) - statistics.median(before)


def slope(w: PhaseWindow, metric: str) -> Measured:
    """The least-squares slope of ``metric`` from the injection to the phase's end, or
    to when the fault reached its bound (``full_at``: a full device, a leak's cap) and
    stopped growing: it averages out what comes and goes on top (KV reservations)."""
    end = min(w.t_end, max(w.t_fault + 4 * w.tick, w.full_at))
    span = max(int(end - w.t_fault), int(2 * w.tick) + 1)
    values = [v for _, v in w.series(f"max(deriv({metric}[{span}s]))", end, end)]
    return peak(values, metric)


def change(w: PhaseWindow, expr: str, metric: str, *, relative: bool) -> Measured:
    """``expr`` over the phase against the calm before: the difference, or the rise
    as a share of the before."""
    during, before = w.end(expr), [v for _, v in w.start(expr)]
    if not during or not before:
        return no_data(metric)
    if relative:
        return during[0] / before[0] - 1.0 if before[0] > 0 else no_data(metric)
    return during[0] - before[0]
