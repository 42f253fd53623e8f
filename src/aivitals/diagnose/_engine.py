"""The engine: a window from any Backend, every signature evaluated, hypotheses ranked.

Order of work (DOMAIN.md section 3): observe the vital signals and decide the
symptom shape; evaluate each signature's evidence (PromQL conditions, baseline
deviations judged by the detector, events); rank by evidence, specificity and
temporal precedence (a cause deviates before its effects); when nothing
matches, rank the most anomalous signals by layer. What could not be seen
(missing series, failed queries) is listed and lowers confidence; it never
raises, but for a backend that refuses the credentials or the TLS handshake
(``BackendAuthError``): every query would meet the same, so none is sent after it.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, ParamSpec

import numpy as np
import promql_parser

from .. import signals
from ..alerts import native_names, with_native
from ..errors import BackendAuthError, BackendError, BackendTimeout, ConfigError
from ..tsdb import Backend, QueryResult
from ._detector import DetectorConfig, detect
from ._model import (
    Diagnosis,
    Event,
    EventLike,
    EvidenceResult,
    Finding,
    Shape,
    SignalDeviation,
    Unseen,
)
from ._signatures import ROLES, EventEvidence, Evidence, Signature, load_signatures
from ._where import (
    DIALECTS,
    in_pod,
    localize,
    node_of,
    peer_outlier,
    peer_outliers,
    per_node,
    to_dialect,
    where_of,
)

__all__ = ["HIGH_CONFIDENCE", "VITALS", "diagnose"]

_Args = ParamSpec("_Args")

#: A finding at or above this confidence is "high confidence" (named in reports and benchmarks).
HIGH_CONFIDENCE = 0.6
#: Findings under this confidence are not reported.
REPORT_FLOOR = 0.25
#: The most a signature with one required observation and none of its supporting
#: evidence can reach: above the 0.5 that calls in the generic fallback, under
#: HIGH_CONFIDENCE.
LEAD_CONFIDENCE = 0.55

DETECTOR = DetectorConfig(rel_floor=0.01, warmup=20)
#: After this many backend failures in a row (down, timing out) the rest is not asked.
MAX_FAILURES = 3
#: A fault on at least this share of a fleet's nodes (and two of them) is one fleet-wide finding.
FLEET_WIDE_SHARE = 0.8
#: A node whose vital is this many times its peers' median (and far outside their spread)
#: is an outlier.
PEER_RATIO = 3.0
PEER_SCORE = 5.0
#: A node finding's peer evidence holds when the node is far outside its peers' spread AND
#: this many times past their median: a slow replica at 2.9x its five peers' median latency
#: holds; a healthy node of three a quarter off its two agreeing peers does not.
PEER_EVIDENCE_RATIO = 2.0
#: Over a fleet of more nodes than this, each question is asked per node (the worst GPU,
#: process or cache of the node), not per series, so an answer is at most one series a
#: node; the few findings reported then zoom in to name their GPU, pid or cache.
COARSE_ABOVE = 64
#: How many node findings zoom in (one query per required evidence item each).
ZOOM = 3
#: Vitals compared across nodes when a fleet is diagnosed.
PEER_VITALS = (
    "p99_latency",
    "inference_p99",
    "error_5xx_rate",
    "queue_length",
    "gpu_memory_used",
    "gpu_process_memory",
)


def _detector(points: int) -> DetectorConfig:
    """DETECTOR, with a shorter warm-up on a short grid (a sixth of it, at least 5 points).

    A 30-40 point window (a compressed validate run) has its fault ~10 points in: a
    20-point warm-up would absorb the fault into the baseline.
    """
    warmup = min(DETECTOR.warmup, max(5, points // 6))
    if warmup == DETECTOR.warmup:
        return DETECTOR
    return DetectorConfig(rel_floor=DETECTOR.rel_floor, warmup=warmup)


_P = "http_request_duration_seconds"
#: The vital signs watched in every diagnosis: name, layer, PromQL.
VITALS: tuple[tuple[str, str, str], ...] = (
    ("request_rate", "service", f"sum(rate({_P}_count[${{rate}}]))"),
    (
        "p99_latency",
        "service",
        f"histogram_quantile(0.99, sum by (le) (rate({_P}_bucket[${{rate}}])))",
    ),
    (
        "p50_latency",
        "service",
        f"histogram_quantile(0.5, sum by (le) (rate({_P}_bucket[${{rate}}])))",
    ),
    ("error_5xx_rate", "service", f'sum(rate({_P}_count{{status_class="5xx"}}[${{rate}}]))'),
    ("queue_length", "service", "sum(queue_length)"),
    (
        "queue_wait_p99",
        "service",
        "histogram_quantile(0.99, sum by (le) (rate(queue_wait_seconds_bucket[${rate}])))",
    ),
    ("pool_busy", "service", "max(worker_pool_active_workers / worker_pool_max_workers)"),
    ("process_rss", "service", "sum(max by (node, pid) (service_process_resident_memory_bytes))"),
    (
        "process_cpu",
        "service",
        "sum(max by (node, pid) (rate(service_process_cpu_seconds_total[${rate}])))",
    ),
    ("connections", "service", 'sum(host_tcp_connections{state="established"})'),
    (
        "cache_hit_ratio",
        "service",
        'sum(rate(cache_requests_total{result="hit"}[${rate}])) '
        "/ sum(rate(cache_requests_total[${rate}]))",
    ),
    (
        "inference_p99",
        "model",
        "histogram_quantile(0.99, sum by (le) "
        "(rate(model_inference_time_seconds_bucket[${rate}])))",
    ),
    ("gpu_utilization", "model", "avg(gpu_utilization_ratio)"),
    ("gpu_memory_used", "model", "max(gpu_memory_used_bytes / gpu_memory_total_bytes)"),
    ("gpu_process_memory", "model", "max(gpu_process_memory_used_bytes)"),
    (
        "output_tokens_p50",
        "model",
        "histogram_quantile(0.5, sum by (le) (rate(model_output_tokens_bucket[${rate}])))",
    ),
    (
        "input_tokens_p50",
        "business",
        "histogram_quantile(0.5, sum by (le) (rate(model_input_tokens_bucket[${rate}])))",
    ),
    ("input_rejections", "business", "sum(rate(input_rejections_total[${rate}]))"),
    (
        "host_cpu_busy",
        "infrastructure",
        '1 - sum(rate(host_cpu_seconds_total{mode="idle"}[${rate}])) '
        "/ sum(rate(host_cpu_seconds_total[${rate}]))",
    ),
    ("disk_busy", "infrastructure", "max(rate(host_disk_io_time_seconds_total[${rate}]))"),
    (
        "tcp_retransmits",
        "infrastructure",
        "sum(rate(host_tcp_retransmitted_segments_total[${rate}]))",
    ),
    (
        "memory_available",
        "infrastructure",
        "min(host_memory_available_bytes / host_memory_total_bytes)",
    ),
    (
        "swap_rate",
        "infrastructure",
        "sum(rate(host_swap_in_pages_total[${rate}]) + rate(host_swap_out_pages_total[${rate}]))",
    ),
)

#: DOMAIN.md section 9's toolbox, for an anomaly no signature explains.
TOOLBOX = {
    "model": ["nvidia-smi", "nvidia-smi dmon -c 10", "dmesg -T | grep -i xid"],
    "service": ["py-spy dump --pid <server pid>", "top -Hp <server pid>", "lsof -p <server pid>"],
    "infrastructure": [
        "uptime; top; mpstat -P ALL 1 5",
        "iostat -x 1 5",
        "free -m; vmstat 1 5; dmesg | grep -i oom",
        "ip -s link; ip route",
    ],
    "business": ["grep error_code <service log> | jq -r .error_code | sort | uniq -c"],
}

_PLACEHOLDER = re.compile(
    r"\{(pid|gpu|port|device|route|interface|process|cache|queue|pool"
    r"|instance|job|xid|model|check|reason|client|in_pod|mountpoint)\}"
)
_NAME = re.compile(r"\b([a-z_][a-z0-9_]*)\b")


@dataclass(slots=True)
class _Series:
    labels: dict[str, str]
    values: np.ndarray


_Dev = tuple[dict[str, str], float, str, float, float, float]


@dataclass(slots=True)
class _Ctx:
    backend: Backend
    start: float
    end: float
    step: float
    times: np.ndarray
    rate: str
    unseen: list[Unseen] = field(default_factory=list)
    cache: dict[str, list[_Series] | None] = field(default_factory=dict)
    present: dict[str, bool] = field(default_factory=dict)
    detected: dict[str, list[_Dev]] = field(default_factory=dict)
    #: fleet mode: the label naming where, the nodes seen, and which nodes have each metric
    location: str | None = None
    nodes: list[str] = field(default_factory=list)
    present_on: dict[str, set[str]] = field(default_factory=dict)
    index: dict[str, dict[str, list[_Series]]] = field(default_factory=dict)
    queries: int = 0
    deadline: float | None = None
    workers: int = 8
    dialect: str = "promql"
    coarse: bool = False
    failures: int = 0
    dead: str | None = None
    skipped: int = 0
    #: our sample names found only under an exporter's own names (a Prometheus that
    #: scrapes vLLM or DCGM without the recording rules): every query reads them so
    native: set[str] = field(default_factory=set)

    def may_query(self) -> bool:
        """False once the backend is given up on or the time budget is spent."""
        if self.dead is None and self.deadline is not None and time.monotonic() > self.deadline:
            self.dead = "the diagnosis's time budget ran out"
        if self.dead is not None:
            self.skipped += 1
            return False
        self.queries += 1
        return True

    def outcome(self, expr: str, exc: BaseException | None, what: str = "query") -> None:
        """Count a query's success or failure; a run of failures gives the backend up."""
        if exc is None:
            self.failures = 0
            return
        self.unseen.append(Unseen(expr, f"{what} failed: {type(exc).__name__}: {exc}"))
        # only an unreachable or unanswering backend trips the breaker: a refused expression
        # (QueryError) or an error answer to some queries says nothing about the others
        if _unreachable(exc):
            self.failures += 1
            if self.failures >= MAX_FAILURES and self.dead is None:
                self.dead = f"the backend failed {self.failures} queries in a row ({exc})"

    def fetch(self, expr: str) -> list[_Series] | None:
        """The expression's series on the window grid (NaN where absent); None if it failed."""
        if expr in self.cache:
            return self.cache[expr]
        split = _threshold_split(expr)
        if split is not None:
            # "X > 3" is X filtered: reuse X's series instead of a second query
            inner = self.fetch(split[0])
            out = None if inner is None else [_filtered(s, split[1], split[2]) for s in inner]
            self.cache[expr] = [s for s in out if np.isfinite(s.values).any()] if out else out
            return self.cache[expr]
        if not self.may_query():
            self.cache[expr] = None
            return None
        try:
            answer = _range(self, expr)
        except BackendAuthError as exc:
            self.dead = str(exc)
            raise  # refused credentials or TLS: every other query would be refused too
        except Exception as exc:  # a backend bug must not stop the diagnosis either
            self.outcome(expr, exc)
            self.cache[expr] = None
            return None
        self.outcome(expr, None)
        self.cache[expr] = _grid(self, expr, answer)
        return self.cache[expr]

    def part(self, expr: str, node: str | None) -> list[_Series] | None:
        """The expression's series of one node (and those without the label); all of them
        when ``node`` is None."""
        series = self.fetch(expr)
        if series is None or node is None or self.location is None:
            return series
        idx = self.index.get(expr)
        if idx is None:
            idx = {}
            for sr in series:
                idx.setdefault(node_of(sr.labels, self.location), []).append(sr)
            self.index[expr] = idx
        return idx.get(node, []) + (idx.get("", []) if node else [])


def _unreachable(exc: BaseException) -> bool:
    """A timeout, or a transport failure under a BackendError (connection refused, reset)."""
    import httpx

    if isinstance(exc, BackendTimeout):
        return True
    return isinstance(exc, BackendError) and isinstance(exc.__cause__, httpx.TransportError)


_THRESHOLD = re.compile(
    r"^(?P<lhs>.*\S)\s*(?P<op>>=|<=|>|<)\s*(?P<num>-?[0-9.]+(?:e[-+]?[0-9]+)?)$"
)
_OPS = {">": np.greater, "<": np.less, ">=": np.greater_equal, "<=": np.less_equal}


@functools.lru_cache(maxsize=4096)
def _threshold_split(expr: str) -> tuple[str, str, float] | None:
    """``(X, op, n)`` when ``expr`` is exactly the filter ``X op n`` at its top level."""
    m = _THRESHOLD.match(expr.strip())
    if m is None:
        return None
    try:
        ast = promql_parser.parse(expr)
        lhs = promql_parser.parse(m.group("lhs"))
    except ValueError:
        return None
    if not isinstance(ast, promql_parser.BinaryExpr) or ast.modifier is not None:
        return None
    if not isinstance(ast.rhs, promql_parser.NumberLiteral) or str(ast.lhs) != str(lhs):
        return None
    return m.group("lhs"), m.group("op"), float(m.group("num"))


def _filtered(s: _Series, op: str, n: float) -> _Series:
    with np.errstate(invalid="ignore"):
        keep = _OPS[op](s.values, n)
    return _Series(s.labels, np.where(keep, s.values, np.nan))


def _range(ctx: _Ctx, expr: str) -> Any:
    """One range query in the backend's dialect: a QueryResult, or (arrays, warnings) from a
    backend that offers them (PrometheusBackend: no Python tuple per point)."""
    sent = _sent(ctx, expr)
    fast = getattr(ctx.backend, "query_range_arrays", None)
    if fast is not None:
        return fast(sent, ctx.start, ctx.end, ctx.step)
    return ctx.backend.query_range(sent, ctx.start, ctx.end, ctx.step)


def _sent(ctx: _Ctx, expr: str) -> str:
    """What goes to the backend: the expression with the samples found only under native
    names read through them (``alerts.with_native``), in the backend's dialect."""
    if ctx.native:
        expr = with_native(expr, ctx.native, step=f"{round(ctx.step * 1000)}ms")
    return to_dialect(expr, ctx.dialect)


def _grid(ctx: _Ctx, expr: str, answer: Any) -> list[_Series]:
    """An answer of ``_range`` on the window grid; its warnings listed as unseen."""
    if isinstance(answer, QueryResult):
        warnings: Sequence[str] = answer.warnings
        out = _on_grid(answer, ctx.times, ctx.step)
    else:
        arrays, warnings = answer
        out = []
        for labels, ts, vs in arrays:
            vals = np.full(len(ctx.times), np.nan)
            idx = np.rint((ts - ctx.times[0]) / ctx.step).astype(np.int64)
            ok = (idx >= 0) & (idx < len(ctx.times))
            vals[idx[ok]] = vs[ok]
            out.append(_Series({k: v for k, v in labels.items() if k != "__name__"}, vals))
    if warnings:
        ctx.unseen.append(Unseen(expr, "partial answer: " + "; ".join(warnings)[:300]))
    return out


def _on_grid(res: QueryResult, times: np.ndarray, step: float) -> list[_Series]:
    out = []
    for rs in res.matrix:
        vals = np.full(len(times), np.nan)
        if rs.points:
            pts = np.asarray(rs.points, dtype=np.float64)
            idx = np.rint((pts[:, 0] - times[0]) / step).astype(np.int64)
            ok = (idx >= 0) & (idx < len(times))
            vals[idx[ok]] = pts[ok, 1]
        labels = {k: v for k, v in rs.labels.items() if k != "__name__"}
        out.append(_Series(labels, vals))
    return out


def _reusing_results(fn: Callable[_Args, Diagnosis]) -> Callable[_Args, Diagnosis]:
    """Run ``fn`` with the embedded store computing each repeated aggregation once: one
    diagnosis asks the same histogram sums for medians, P99s and ratios."""

    @functools.wraps(fn)
    def run(*args: _Args.args, **kwargs: _Args.kwargs) -> Diagnosis:
        from ..tsdb import Store

        backend = args[0] if args else kwargs.get("backend")
        if not isinstance(backend, Store):
            return fn(*args, **kwargs)
        with backend.reusing_results():
            return fn(*args, **kwargs)

    return run


@_reusing_results
def diagnose(
    backend: Backend,
    *,
    end: float | None = None,
    window: float = 1800.0,
    step: float | None = None,
    alerts: Sequence[Any] = (),
    events: Sequence[EventLike] = (),
    signatures: Sequence[Signature] | None = None,
    params: Mapping[str, Mapping[str, float]] | None = None,
    location: str | None = "node",
    budget: float | None = None,
    workers: int = 8,
    dialect: str = "promql",
    coarse_above: int = COARSE_ABOVE,
    rate: float | None = None,
) -> Diagnosis:
    """Diagnose the window ``[end - window, end]`` of ``backend``.

    ``alerts`` are ``AlertEvent``-like objects (``alertname``, ``labels``,
    ``active_at``); ``events`` kernel lines and error-coded logs; ``params``
    overrides signature thresholds by id (``{"gpu_oom": {"memory_ratio": 0.8}}``).

    Over a fleet (series carrying the ``location`` label, ``node`` by default) every
    question keeps that label, each finding names its node (``where``, ``scope``), a
    fault on (nearly) every node is one fleet-wide finding, a node far from its peers
    ranks first, and ``Diagnosis.nodes`` gives each node's verdict. ``location=None``
    never splits. The number of queries does not grow with the fleet; ``budget``
    (seconds) bounds the time spent asking, after which the rest is listed as unseen,
    and ``workers`` queries run at once on a remote backend. ``dialect="metricsql"``
    (VictoriaMetrics) sends ``changes``/``increase``/``delta`` as their ``*_prometheus``
    forms, so both engines answer alike. Over more than ``coarse_above`` nodes each
    question is asked per node (its worst series) and the top findings zoom in.
    ``rate`` (seconds) sets the signatures' ``${rate}`` window; by default a minute, or a
    quarter of a short window (a compressed run passes its rule pack's rate window, so a
    short window that starts at its own baseline still reads rates over enough requests).

    **Usage**::

        from aivitals.diagnose import diagnose
        d = diagnose(store)                  # the last 30 minutes
        print(d.to_markdown())
    """
    t0 = time.perf_counter()
    end = time.time() if end is None else float(end)
    if not (math.isfinite(window) and window > 0):
        raise ConfigError(f"diagnose window must be > 0 seconds, got {window!r}")
    step = float(step) if step else max(1.0, round(window / 600.0))
    _check_args(end, window, step)
    start = end - window
    times = np.arange(start, end + step / 2, step)
    if rate is None:
        rate_text = _rate_window(window, step)
    elif not (isinstance(rate, int | float) and math.isfinite(rate) and 2 * step <= rate):
        least = f"{2 * step:g} s"
        raise ConfigError(f"diagnose rate must be at least two steps ({least}), got {rate!r}")
    else:
        rate_text = f"{int(rate)}s"
    if budget is not None and not (math.isfinite(budget) and budget > 0):
        raise ConfigError(f"diagnose budget must be > 0 seconds, got {budget!r}")
    ctx = _Ctx(backend, start, end, step, times, rate_text)
    ctx.deadline = None if budget is None else time.monotonic() + budget
    ctx.workers = max(1, int(workers))
    if dialect not in DIALECTS:
        raise ConfigError(f"diagnose dialect must be one of {DIALECTS}, got {dialect!r}")
    ctx.dialect = dialect
    sigs = list(signatures) if signatures is not None else _builtin()
    unknown = set(params or {}) - {s.id for s in sigs}
    if unknown:
        raise ConfigError(f"diagnose params name unknown signatures: {sorted(unknown)}")
    own = [Event(float(e.time), str(e.kind), str(e.text), dict(e.fields)) for e in events]
    all_events = sorted([*own, *_alert_events(alerts)], key=lambda e: e.time)
    all_events = [e for e in all_events if start <= e.time <= end]
    _check_presence(ctx, sigs, location)
    rendered = [s.render((params or {}).get(s.id), rate_text) for s in sigs]
    if ctx.location is not None:
        rendered = [_localized(s, ctx.location) for s in rendered]
    fine = {s.id: s for s in rendered}
    if ctx.location is not None and len(ctx.nodes) > coarse_above:
        ctx.coarse = True
        rendered = [_coarsened(s, ctx.location) for s in rendered]
    if ctx.location is None:
        _prefetch(ctx, rendered)
        _detect_all(ctx, rendered)
    else:
        # a fleet: the required evidence first; the rest only for the signatures it leaves
        # (a signature whose required evidence holds on no node has no finding to support)
        _prefetch(ctx, rendered, ("required",))
        _detect_all(ctx, rendered, ("required",))
        live = [s for s in rendered if _candidates(ctx, s) != set()]
        _prefetch(ctx, live)
        _detect_all(ctx, live)
    deviations = _vitals(ctx)
    if ctx.location is None:
        findings = [f for s in rendered if (f := _evaluate(ctx, s, all_events)) is not None]
    else:
        findings = [f for s in rendered for f in _evaluate_fleet(ctx, s, all_events)]
        findings += _peer_findings(ctx, findings)
    findings = _rank(findings)
    if ctx.coarse:
        findings = _zoom(ctx, findings, fine)
    if not any(f.confidence >= 0.5 for f in findings):
        findings += _fallback(deviations, ctx.location)
    shape = _shape(ctx, deviations, findings)
    layers = _layer_scores(deviations, findings)
    if ctx.skipped:
        ctx.unseen.append(Unseen(f"{ctx.skipped} queries", f"not sent: {ctx.dead}"))
    return Diagnosis(
        shape,
        start,
        end,
        step,
        findings,
        deviations,
        _dedupe(ctx.unseen),
        all_events,
        layers,
        time.perf_counter() - t0,
        queries=ctx.queries,
        location=ctx.location,
        nodes=_node_status(ctx, findings) if ctx.location is not None else {},
    )


def _rate_window(window: float, step: float) -> str:
    """The ``${rate}`` window: a minute, but never over a quarter of a short diagnosis window.

    A window of a few tens of seconds (a compressed validate run, 1 s scrapes) with a
    minute-long rate would average a fault away with the calm before it.
    """
    return f"{int(max(4 * step, min(60.0, window / 4)))}s"


def _check_args(end: float, window: float, step: float) -> None:
    if not math.isfinite(end):
        raise ConfigError(f"diagnose end must be a finite time, got {end!r}")
    if not (math.isfinite(window) and window > 0):
        raise ConfigError(f"diagnose window must be > 0 seconds, got {window!r}")
    if not (math.isfinite(step) and 0 < step <= window / 10):
        raise ConfigError(f"diagnose step must be > 0 and at most window/10, got {step!r}")


_BUILTIN: list[Signature] = []


def _builtin() -> list[Signature]:
    if not _BUILTIN:
        _BUILTIN.extend(load_signatures())
    return _BUILTIN


def _alert_events(alerts: Sequence[Any]) -> list[Event]:
    out = []
    for a in alerts:
        name = str(getattr(a, "alertname", ""))
        at = getattr(a, "fired_at", None) or getattr(a, "active_at", None)
        if at is None:
            continue
        labels = {str(k): str(v) for k, v in dict(getattr(a, "labels", {}) or {}).items()}
        out.append(Event(float(at), "alert", f"{name} {getattr(a, 'state', '')}", labels))
    return out


def _metric_names(expr: str) -> set[str]:
    return {
        tok
        for tok in _NAME.findall(expr)
        if tok == "up" or (signals.family_of(tok) is not None and not tok.endswith("_total_"))
    }


def _check_presence(ctx: _Ctx, sigs: Sequence[Signature], location: str | None = None) -> None:
    names: set[str] = set()
    for s in sigs:
        for e in s.evidence:
            names |= _metric_names(e.expr)
    for _, _, expr in VITALS:
        names |= _metric_names(expr)
    stored = _stored_names(ctx.backend)
    window = f"{int(ctx.end - ctx.start)}s"
    # a name the embedded store never saw needs no query
    asked = [n for n in sorted(names) if stored is None or n in stored]
    answers = _presence(ctx, asked, window, location)
    # absent under our name: asked again through the exporters' own names, which then
    # stand in for ours in every query (the store's names rule out most without asking)
    again = [
        n
        for n in sorted(names)
        if n not in answers
        and (natives := native_names(n))
        and (stored is None or not stored.isdisjoint(natives))
    ]
    if again:
        ctx.native = set(again)
        found = _presence(ctx, again, window, location)
        ctx.native = set(found)
        answers.update(found)
    missing: dict[str, list[str]] = {}
    for name in sorted(names):
        where = answers.get(name)
        ctx.present[name] = bool(where)
        if where:
            ctx.present_on[name] = where
        else:
            spec = signals.family_of(name)
            missing.setdefault(spec.source if spec else "scrape", []).append(name)
    for source, metrics in sorted(missing.items()):
        ctx.unseen.append(
            Unseen(
                f"{source}: {', '.join(metrics)}",
                "no series in the window (exporter or collector missing?)",
            )
        )
    nodes = sorted({n for where in ctx.present_on.values() for n in where} - {""})
    if location is not None and nodes:
        ctx.location, ctx.nodes = location, nodes
        _missing_on_nodes(ctx)


def _missing_on_nodes(ctx: _Ctx) -> None:
    """Metrics some nodes export and others do not (an older agent, a collector missing)."""
    gaps: dict[str, list[str]] = {}
    for name, where in sorted(ctx.present_on.items()):
        if "" in where:
            continue  # a shared series stands for every node
        for node in ctx.nodes:
            if node not in where:
                gaps.setdefault(node, []).append(name)
    for node, metrics in sorted(gaps.items()):
        ctx.unseen.append(
            Unseen(
                f"{ctx.location}={node}: {', '.join(metrics)}",
                "its peers export these and it does not (an older agent or a missing collector)",
            )
        )


def _stored_names(backend: Backend) -> set[str] | None:
    """The embedded store's metric names (one call), or None for a remote backend."""
    from ..tsdb import Store

    return set(backend.metric_names()) if isinstance(backend, Store) else None


def _presence(
    ctx: _Ctx, names: Sequence[str], window: str, location: str | None
) -> dict[str, set[str]]:
    """For each metric name, the location label values it has series on ("" without one)."""
    by = f" by ({location})" if location else ""
    exprs = [f"count{by} (last_over_time({n}[{window}]))" for n in names]

    def ask(expr: str) -> QueryResult:
        return ctx.backend.query(_sent(ctx, expr), ctx.end)

    out: dict[str, set[str]] = {}
    for name, res in zip(names, _run_many(ctx, exprs, ask, "presence query"), strict=True):
        if res is not None:
            where = {node_of(s.labels, location) if location else "" for s in res.vector}
            if where:
                out[name] = where
    return out


def _run_many(ctx: _Ctx, exprs: Sequence[str], ask: Any, what: str) -> list[Any]:
    """``ask(expr)`` for each expression: ``ctx.workers`` at once on a remote backend, in
    turn on the embedded store. A failure is listed as unseen and answers None; after
    MAX_FAILURES in a row, or past the budget, the rest are not sent (counted as skipped)."""
    from concurrent.futures import as_completed

    from ..tsdb import Store

    skip = object()

    def one(expr: str) -> Any:
        if ctx.dead is not None or (ctx.deadline is not None and time.monotonic() > ctx.deadline):
            return skip
        try:
            return ask(expr)
        except BackendAuthError as exc:
            ctx.dead = str(exc)  # at once: the workers send nothing more
            return exc
        except Exception as exc:  # listed as unseen by account(), never raised
            return exc

    def account(expr: str, res: Any) -> Any:
        if res is skip:
            ctx.skipped += 1
            if ctx.dead is None:
                ctx.dead = "the diagnosis's time budget ran out"
            return None
        ctx.queries += 1
        if isinstance(res, BackendAuthError):
            ctx.dead = str(res)
            raise res  # refused credentials or TLS: every other query would be refused too
        if isinstance(res, BaseException):
            ctx.outcome(expr, res, what)
            return None
        ctx.outcome(expr, None)
        if isinstance(res, QueryResult) and res.warnings and what != "query":
            # presence answers (instant); a range answer's warnings are listed by _grid
            ctx.unseen.append(Unseen(expr, "partial answer: " + "; ".join(res.warnings)[:300]))
        return res

    if isinstance(ctx.backend, Store) or ctx.workers <= 1 or len(exprs) <= 1:
        return [account(e, one(e)) for e in exprs]
    out: dict[int, Any] = {}
    with ThreadPoolExecutor(max_workers=ctx.workers) as pool:
        futures = {pool.submit(one, e): i for i, e in enumerate(exprs)}
        # accounted as they finish, so a dead backend stops the queries not yet started
        for fut in as_completed(futures):
            i = futures[fut]
            out[i] = account(exprs[i], fut.result())
    return [out[i] for i in range(len(exprs))]


def _localized(sig: Signature, location: str) -> Signature:
    evidence = tuple(dataclasses.replace(e, expr=localize(e.expr, location)) for e in sig.evidence)
    return dataclasses.replace(sig, evidence=evidence)


def _coarsened(sig: Signature, location: str) -> Signature:
    """Every evidence item asked per node: its worst series (max, or min for a fall)."""

    def one(e: Evidence) -> Evidence:
        split = _threshold_split(e.expr)
        if per_node(split[0] if split is not None else e.expr, location):
            return e  # already one series a node at most: the same question, asked once
        if split is not None:
            agg = "min" if split[1] in ("<", "<=") else "max"
            expr = f"{_per_node(agg, split[0], location)} {split[1]} {split[2]!r}"
        else:
            agg = "min" if e.deviation == "down" else "max"
            expr = _per_node(agg, e.expr, location)
        return dataclasses.replace(e, expr=expr)

    return dataclasses.replace(sig, evidence=tuple(one(e) for e in sig.evidence))


_OUTER = re.compile(r"^(max|min) by \(([^()]*)\) \((.*)\)$", re.S)


def _per_node(agg: str, expr: str, location: str) -> str:
    """``agg by (node) (expr)``; ``max by (gpu, node) (E)`` under max becomes ``max by (node)
    (E)`` (the same answer, and the same query string as the vital that asks it)."""
    m = _OUTER.match(expr.strip())
    if m is not None and m.group(1) == agg and location in m.group(2):
        inner = m.group(3)
        try:
            promql_parser.parse(inner)
        except ValueError:
            inner = ""
        if inner:
            return f"{agg} by ({location}) ({inner})"
    return f"{agg} by ({location}) ({expr})"


def _zoom(ctx: _Ctx, findings: list[Finding], fine: Mapping[str, Signature]) -> list[Finding]:
    """The top node findings of a coarse diagnosis, asked again on their node only (one
    query per required item, filtered on the server) to name the GPU, pid or cache."""
    assert ctx.location is not None
    loc = ctx.location
    out: list[Finding] = []
    zoomed = 0
    for f in findings:
        sig = fine.get(f.signature)
        if f.scope != "node" or zoomed >= ZOOM or sig is None or not f.nodes:
            out.append(f)
            continue
        zoomed += 1
        node = f.nodes[0]
        quoted = node.replace("\\", "\\\\").replace('"', '\\"')
        only = f'label_replace(vector(1), "{loc}", "{quoted}", "", "")'
        labels: list[Mapping[str, str]] = []
        for ev in sorted(sig.of_role("required"), key=lambda e: e.deviation is not None):
            if not _seen(ctx, ev.expr, node):
                continue
            series = ctx.fetch(f"({ev.expr}) and on ({loc}) {only}") or []
            recent = ctx.times >= ctx.end - max(4 * ctx.step, 0.25 * (ctx.end - ctx.start))
            live = [sr for sr in series if np.isfinite(sr.values[recent]).any()]
            if ev.deviation is not None and live:
                # the series that moved most over the window
                live.sort(key=lambda sr: -_moved(sr.values))
            labels += [sr.labels for sr in live[:1]]
            if labels:
                break
        where = {loc: node, **{k: v for k, v in where_of(labels).items() if k != loc}}
        out.append(
            dataclasses.replace(
                f,
                title=f"{_fill(sig.title, where)} on {node}",
                commands=[_fill(c, where) for c in sig.commands],
                stop_loss=[_fill(c, where) for c in sig.stop_loss],
                where=where,
            )
        )
    return out


def _moved(values: np.ndarray) -> float:
    ok = values[np.isfinite(values)]
    if ok.size < 2:
        return 0.0
    return float(abs(ok[-1] - ok[0]) / max(abs(ok[0]), 1e-9))


def _vexpr(ctx: _Ctx, template: str) -> str:
    """A vital's expression for this diagnosis (per node over a fleet)."""
    expr = template.replace("${rate}", ctx.rate)
    return localize(expr, ctx.location) if ctx.location else expr


def _prefetch(ctx: _Ctx, sigs: Sequence[Signature], roles: Sequence[str] = ROLES) -> None:
    """Every expression the diagnosis will read, asked at once (one query each)."""
    from ..tsdb import Store

    if isinstance(ctx.backend, Store) or ctx.workers <= 1:
        return  # the embedded store answers in-process: nothing to overlap
    exprs = [_vexpr(ctx, t) for _, _, t in VITALS] + [_vexpr(ctx, "min(up)")]
    exprs += [e.expr for s in sigs for e in s.evidence if e.role in roles]
    wanted: list[str] = []
    for e in dict.fromkeys(exprs):
        split = _threshold_split(e)
        base = split[0] if split is not None else e
        if base not in ctx.cache and base not in wanted and _seen(ctx, base):
            wanted.append(base)

    def ask(expr: str) -> Any:
        return _range(ctx, expr)

    for expr, res in zip(wanted, _run_many(ctx, wanted, ask, "query"), strict=True):
        ctx.cache[expr] = None if res is None else _grid(ctx, expr, res)


def _seen(ctx: _Ctx, expr: str, node: str | None = None) -> bool:
    """An expression is seen when at least one metric it names has data (on ``node``)."""
    names = _metric_names(expr)
    if not names:
        return True
    if node is None or ctx.location is None:
        return any(ctx.present.get(n, False) for n in names)
    return any(bool(ctx.present_on.get(n, set()) & {node, ""}) for n in names)


def _detect_all(ctx: _Ctx, sigs: Sequence[Signature], roles: Sequence[str] = ROLES) -> None:
    """Fetch every expression the detector must judge and run it once over all their series
    (each series against its own baseline; one already judged is not judged again)."""
    exprs = [_vexpr(ctx, t) for _, _, t in VITALS]
    exprs += [
        e.expr for s in sigs for e in s.evidence if e.deviation is not None and e.role in roles
    ]
    owners: list[tuple[str, int]] = []
    rows: list[np.ndarray] = []
    for expr in dict.fromkeys(exprs):
        if expr in ctx.detected:
            continue
        ctx.detected[expr] = []
        if not _seen(ctx, expr):
            continue
        for i, series in enumerate(ctx.fetch(expr) or []):
            owners.append((expr, i))
            rows.append(series.values)
    if not rows:
        return
    res = detect(np.vstack(rows), ctx.times, config=_detector(len(ctx.times)))
    for k, (expr, i) in enumerate(owners):
        series = (ctx.cache[expr] or [])[i]
        dev = _judge(ctx, series, float(res.first_deviation[k]), float(res.scores[k].max()))
        if dev is not None:
            ctx.detected[expr].append(dev)


def _judge(ctx: _Ctx, s: _Series, first: float, score: float) -> _Dev | None:
    """A detected episode that still holds at the end: labels, since, direction, values."""
    if math.isnan(first):
        return None
    # "now" is the last minute, or the last quarter of a short window (a minute would be
    # all of a 30 s window, its calm start included)
    recent = ctx.times >= ctx.end - min(60.0, max(4 * ctx.step, 0.25 * (ctx.end - ctx.start)))
    before = s.values[ctx.times < first]
    before = before[np.isfinite(before)]
    now = s.values[recent]
    now = now[np.isfinite(now)]
    if before.size < 3 or now.size == 0:
        return None
    base, latest = float(np.median(before)), float(np.median(now))
    spread = float(np.median(np.abs(before - base))) * 1.4826
    if abs(latest - base) < max(spread * 3.0, abs(base) * 0.02, 1e-9):
        return None  # back to normal (or never far): an episode, not a current deviation
    return (s.labels, first, "up" if latest > base else "down", score, base, latest)


def _vitals(ctx: _Ctx) -> list[SignalDeviation]:
    out: list[SignalDeviation] = []
    for name, layer, template in VITALS:
        expr = _vexpr(ctx, template)
        for dev in ctx.detected.get(expr, []):
            labels, first, direction, score, base, latest = dev
            out.append(SignalDeviation(name, layer, labels, first, direction, score, base, latest))
    return sorted(out, key=lambda d: d.first_deviation)


def _deviations(
    ctx: _Ctx, expr: str, min_change: float = 0.0, node: str | None = None
) -> list[_Dev]:
    out = []
    for dev in ctx.detected.get(expr, []):
        here = node is None or ctx.location is None or node_of(dev[0], ctx.location) in (node, "")
        if not here:
            continue
        base, latest = dev[4], dev[5]
        if abs(latest - base) >= min_change * max(abs(base), 1e-9):
            out.append(dev)
    return out


def _evaluate(
    ctx: _Ctx, sig: Signature, events: Sequence[Event], node: str | None = None
) -> Finding | None:
    results = [_evidence(ctx, e, node) for e in sig.evidence]
    results += [_event_evidence(e, events) for e in sig.events]
    conf = _confidence(results) * sig.prior
    if conf < REPORT_FLOOR:
        return None
    labels = _labels_from(results)
    held = sorted(
        (r for r in results if r.held and r.role != "contradicting"),
        key=lambda r: r.since if r.since is not None else math.inf,
    )
    firsts = [r.since for r in held if r.since is not None and r.new and r.role == "required"]
    firsts = firsts or [r.since for r in held if r.since is not None]
    return Finding(
        signature=sig.id,
        layer=sig.layer,
        title=_fill(sig.title, labels),
        confidence=round(conf, 3),
        evidence=results,
        first_deviation=min(firsts) if firsts else None,
        commands=[_fill(c, labels) for c in sig.commands],
        stop_loss=[_fill(c, labels) for c in sig.stop_loss],
        timeline=[(r.since, r.says) for r in held if r.since is not None],
        summary=sig.summary,
        where=where_of(lab for r in held for lab, _ in r.values),
    )


def _evidence(ctx: _Ctx, ev: Evidence, node: str | None = None) -> EvidenceResult:
    if not _seen(ctx, ev.expr, node):
        return EvidenceResult(ev.role, ev.says, ev.expr, held=False, seen=False)
    series = ctx.part(ev.expr, node)
    if series is None:
        return EvidenceResult(ev.role, ev.says, ev.expr, held=False, seen=False)
    if ev.deviation is None:
        return _condition(ctx, ev, series)
    devs = [
        d
        for d in _deviations(ctx, ev.expr, ev.min_change, node)
        if ev.deviation == "any" or d[2] == ev.deviation
    ]
    if not devs:
        return EvidenceResult(ev.role, ev.says, ev.expr, held=False, seen=True)
    devs.sort(key=lambda d: d[1])
    values = [(d[0], d[5]) for d in devs[:5]]
    return EvidenceResult(
        ev.role,
        ev.says,
        ev.expr,
        held=True,
        seen=True,
        since=devs[0][1],
        values=values,
        new=True,
        score=max(d[3] for d in devs),
    )


def _condition(ctx: _Ctx, ev: Evidence, series: Sequence[_Series]) -> EvidenceResult:
    # on a short window (a compressed validate run) "recent" is its last quarter: the
    # previous incident's tail at the window's start must not count as holding now
    span = min(ev.recent, max(4 * ctx.step, 0.25 * (ctx.end - ctx.start)))
    recent = ctx.times >= ctx.end - span
    baseline = ctx.times < ctx.start + 0.25 * (ctx.end - ctx.start)
    held_series = [s for s in series if np.isfinite(s.values[recent]).any()]
    if not held_series:
        return EvidenceResult(ev.role, ev.says, ev.expr, held=False, seen=True)
    present = np.zeros(len(ctx.times), dtype=bool)
    for s in held_series:
        present |= np.isfinite(s.values)
    standing = baseline.any() and present[baseline].mean() >= 0.5
    since = (
        float(ctx.times[np.flatnonzero(present & ~baseline)[0]])
        if (present & ~baseline).any()
        else float(ctx.times[np.flatnonzero(present)[0]])
    )
    if standing:
        since = float(ctx.times[np.flatnonzero(present)[0]])
    values = [(s.labels, _last(s.values)) for s in held_series[:5]]
    return EvidenceResult(
        ev.role,
        ev.says,
        ev.expr,
        held=True,
        seen=True,
        since=since,
        values=values,
        new=not standing,
        score=1.0,
    )


def _last(values: np.ndarray) -> float:
    ok = values[np.isfinite(values)]
    return float(ok[-1]) if ok.size else math.nan


def _event_evidence(ev: EventEvidence, events: Sequence[Event]) -> EvidenceResult:
    pattern = ev.pattern
    hits = [e for e in events if (ev.kind in (e.kind, "any")) and pattern.search(e.text)]
    if not hits:
        return EvidenceResult(
            ev.role, ev.says, f"{ev.kind} ~ /{ev.match}/", held=False, seen=bool(events)
        )
    values = [({**dict(h.fields), "text": h.text[:160]}, 1.0) for h in hits[:5]]
    kinds = ",".join(sorted({h.kind for h in hits}))
    return EvidenceResult(
        ev.role,
        ev.says,
        f"{kinds} ~ /{ev.match}/",
        held=True,
        seen=True,
        since=hits[0].time,
        values=values,
        new=True,
        score=1.0,
    )


def _confidence(results: Sequence[EvidenceResult]) -> float:
    """Evidence, specificity and novelty into [0, 1]; unseen and contradicting lower it."""
    req = [r for r in results if r.role == "required"]
    seen_req = [r for r in req if r.seen]
    if not seen_req or any(not r.held for r in seen_req):
        return 0.0
    sup = [r for r in results if r.role == "supporting" and r.seen]
    support = sum(r.held for r in sup) / len(sup) if sup else 0.5
    specificity = min(1.0, (len(seen_req) - 1) / 2.0)
    conf = 0.55 + 0.25 * support + 0.1 * specificity + 0.1
    if len(seen_req) == 1 and sup and not any(r.held for r in sup):
        # one observation with none of the effects the signature expects beside it (a
        # burst of traffic the service absorbed, a reload nobody felt) is a lead, not a
        # diagnosis: it stays under HIGH_CONFIDENCE (the fault-free soak named these)
        conf = min(conf, LEAD_CONFIDENCE)
    if not any(r.new for r in results if r.held and r.role != "contradicting"):
        conf *= 0.5  # a standing condition: nothing changed in the window
    conf *= 0.8 ** (len(req) - len(seen_req))
    conf *= 0.95 ** sum(1 for r in results if r.role == "supporting" and not r.seen)
    conf *= 0.5 ** sum(1 for r in results if r.role == "contradicting" and r.held)
    return max(0.0, min(1.0, conf))


def _rank(findings: list[Finding]) -> list[Finding]:
    """Order by confidence plus a bonus for deviating first (a cause precedes its effects)."""
    if not findings:
        return findings
    starts = [f.first_deviation for f in findings if f.first_deviation is not None]
    earliest = min(starts) if starts else 0.0

    def key(f: Finding) -> float:
        lead = 0.0
        if f.first_deviation is not None:
            lead = math.exp(-max(0.0, f.first_deviation - earliest) / 120.0)
        # a node that stands out from its peers (a fleet diagnosis) is the likelier cause
        peer = max((e.score for e in f.evidence if e.role == "peer" and e.held), default=0.0)
        return f.confidence + 0.08 * lead + 0.1 * min(1.0, peer / (2 * PEER_SCORE))

    return sorted(findings, key=key, reverse=True)


def _labels_from(results: Sequence[EvidenceResult]) -> dict[str, str]:
    """Labels to fill runbooks with: from required evidence first, then supporting."""
    labels: dict[str, str] = {}
    for role in ("required", "supporting"):
        for r in results:
            if r.role == role and r.held:
                for lab, _ in r.values:
                    for k, v in lab.items():
                        labels.setdefault(k, v)
    return labels


def _fill(text: str, labels: Mapping[str, str]) -> str:
    labels = {**labels, "in_pod": in_pod(labels)}  # "" outside a pod: never "<in_pod>"
    return _PLACEHOLDER.sub(lambda m: labels.get(m.group(1), f"<{m.group(1)}>"), text)


def _fallback(deviations: Sequence[SignalDeviation], location: str | None = None) -> list[Finding]:
    """No signature matched: name the most anomalous layers and their signals."""
    by_layer: dict[str, list[SignalDeviation]] = {}
    for d in deviations:
        by_layer.setdefault(d.layer, []).append(d)
    out = []
    for layer, devs in by_layer.items():
        devs.sort(key=lambda d: d.first_deviation)
        lead = devs[0]
        ev = [
            EvidenceResult(
                "supporting",
                f"{d.name} went {d.direction}: {d.baseline:.4g} -> {d.latest:.4g}",
                d.name,
                True,
                True,
                d.first_deviation,
                ((d.labels, d.latest),),
                True,
                d.score,
            )
            for d in devs
        ]
        out.append(
            Finding(
                signature=f"anomaly_{layer}",
                layer=layer,
                title=(
                    f"Unexplained anomaly in the {layer} layer ({lead.name} {lead.direction} first)"
                ),
                confidence=round(min(0.45, 0.2 + 0.05 * len(devs)), 3),
                evidence=ev,
                first_deviation=lead.first_deviation,
                commands=TOOLBOX.get(layer, []),
                stop_loss=["Stop the loss first: shift traffic, scale, limit, restart or degrade."],
                timeline=[(d.first_deviation, ev[i].says) for i, d in enumerate(devs)],
                where=where_of(d.labels for d in devs),
                scope="local" if location is None else "node",
            )
        )
    return sorted(out, key=lambda f: f.first_deviation or math.inf)


# --- a fleet: per node, fleet-wide, peers ---------------------------------------------------
def _candidates(ctx: _Ctx, sig: Signature) -> set[str] | None:
    """Nodes on which every required PromQL evidence has something; None: no node splits it
    (only shared series or events), so the signature is judged once for all."""
    assert ctx.location is not None
    found: set[str] | None = None
    split = False
    for ev in sig.of_role("required"):
        series = ctx.fetch(ev.expr) if _seen(ctx, ev.expr) else None
        if series is None:
            continue  # not seen (or the query failed): it cannot narrow the nodes down
        if ev.deviation is None:
            on = {node_of(sr.labels, ctx.location) for sr in series}
        else:
            on = {node_of(d[0], ctx.location) for d in ctx.detected.get(ev.expr, [])}
        if "" in on:
            continue  # a shared series holds for every node
        split = True
        found = on if found is None else found & on
    return (found or set()) if split else None


def _evaluate_fleet(ctx: _Ctx, sig: Signature, events: Sequence[Event]) -> list[Finding]:
    """The signature judged per node, from the one answer per expression: one finding per
    node it holds on, or ONE fleet-wide finding when it holds on (nearly) all of them."""
    assert ctx.location is not None
    loc = ctx.location
    nodes = _candidates(ctx, sig)
    if nodes is None:
        f = _evaluate(ctx, sig, events)
        if f is None:
            return []
        if len(ctx.nodes) < 2:
            return [dataclasses.replace(f, scope="node", nodes=tuple(ctx.nodes))]
        return [_fleet_wide(ctx, f, dict.fromkeys(ctx.nodes, f))]
    found: dict[str, Finding] = {}
    for node in sorted(nodes):
        mine = [e for e in events if e.fields.get(loc) in (None, node)]
        f = _evaluate(ctx, sig, mine, node)
        if f is not None:
            found[node] = f
    if len(ctx.nodes) >= 2 and len(found) >= max(2.0, FLEET_WIDE_SHARE * len(ctx.nodes)):
        best = max(found.values(), key=lambda f: f.confidence)
        return [_fleet_wide(ctx, best, found)]
    return [_on_node(ctx, sig, node, f) for node, f in found.items()]


def _fleet_wide(ctx: _Ctx, best: Finding, found: Mapping[str, Finding]) -> Finding:
    n, k = len(ctx.nodes), len(found)
    conf = float(np.mean([f.confidence for f in found.values()]))
    title = re.sub(rf"\s*\bon {re.escape(ctx.location or '')}\S*", "", best.title)
    spared = sorted(set(ctx.nodes) - set(found))
    says = f"Holds on {k} of {n} nodes" + (f" (not on {', '.join(spared[:5])})" if spared else "")
    ev = EvidenceResult("fleet", says, f"{ctx.location} in {k}/{n}", True, True, score=k / n)
    where = {
        key: value
        for key, value in best.where.items()
        if key != ctx.location and all(f.where.get(key) == value for f in found.values())
    }
    return dataclasses.replace(
        best,
        title=f"Fleet-wide ({k} of {n} nodes): {title}",
        confidence=round(conf, 3),
        evidence=[*best.evidence, ev],
        where=where,
        scope="fleet",
        nodes=tuple(sorted(found)),
    )


def _on_node(ctx: _Ctx, sig: Signature, node: str, f: Finding) -> Finding:
    assert ctx.location is not None
    where = {ctx.location: node, **{k: v for k, v in f.where.items() if k != ctx.location}}
    evidence = list(f.evidence)
    peer = _peer_evidence(ctx, sig, node)
    if peer is not None:
        evidence.append(peer)
    return dataclasses.replace(
        f,
        title=f"{f.title} on {node}",
        evidence=evidence,
        where=where,
        scope="node",
        nodes=(node,),
    )


def _node_values(ctx: _Ctx, expr: str) -> dict[str, float]:
    """Each node's recent level of an expression (its largest series, median of the last
    quarter of the window): what the node's peers are compared on."""
    assert ctx.location is not None
    recent = ctx.times >= ctx.end - max(4 * ctx.step, 0.25 * (ctx.end - ctx.start))
    out: dict[str, float] = {}
    for sr in ctx.fetch(expr) or []:
        node = node_of(sr.labels, ctx.location)
        vals = sr.values[recent]
        vals = vals[np.isfinite(vals)]
        if node and vals.size:
            out[node] = max(out.get(node, -math.inf), float(np.median(vals)))
    return out


def _far_from_peers(value: float, med: float, direction: str | None) -> bool:
    """``value`` PEER_EVIDENCE_RATIO times past its peers' median, the way the evidence
    points (up, down, or either when it does not say). The spread alone is not enough:
    with two peers it comes from two values, and two that happen to agree make any node a
    quarter off them "far out" (the 5 % floor): a 3-node fleet called a healthy node the
    odd one on such a difference in 2 of 11 runs of its end-to-end test."""
    if not (math.isfinite(value) and math.isfinite(med)):
        return False
    up = value > 0 and value >= PEER_EVIDENCE_RATIO * max(med, 0.0)
    down = med > 0 and value <= med / PEER_EVIDENCE_RATIO
    if direction == "up":
        return up
    if direction == "down":
        return down
    return up or down


def _peer_evidence(ctx: _Ctx, sig: Signature, node: str) -> EvidenceResult | None:
    """The node's value of the signature's first required PromQL evidence against its peers'."""
    for ev in sig.of_role("required"):
        split = _threshold_split(ev.expr)
        base = split[0] if split is not None else ev.expr
        values = _node_values(ctx, base)
        got = peer_outlier(values, node)
        if got is None:
            continue
        score, value, med = got
        direction = ev.deviation
        if direction is None and split is not None:
            direction = "up" if split[1].startswith(">") else "down"
        return EvidenceResult(
            "peer",
            f"{node}: {value:.4g} where its {len(values) - 1} peers' median is {med:.4g}",
            base,
            held=score >= PEER_SCORE and _far_from_peers(value, med, direction),
            seen=True,
            values=(({ctx.location or "node": node}, value),),
            score=min(score, 1e6),
        )
    return None


def _peer_findings(ctx: _Ctx, findings: Sequence[Finding]) -> list[Finding]:
    """A node whose vital is PEER_RATIO times its peers' median, far outside their spread,
    when no signature named that node: the outlier, ranked by how far it stands."""
    assert ctx.location is not None
    named = {n for f in findings if f.scope == "node" for n in f.nodes}
    out: list[Finding] = []
    for name, layer, template in VITALS:
        if name not in PEER_VITALS:
            continue
        expr = _vexpr(ctx, template)
        values = _node_values(ctx, expr)
        scores = peer_outliers(values)
        for node in sorted(scores):
            got = scores[node]
            if node in named:
                continue
            score, value, med = got
            if score < PEER_SCORE or value < PEER_RATIO * max(med, 0.0) or value <= 0:
                continue
            says = f"{name} on {node} is {value:.4g}, its peers' median {med:.4g}"
            ev = EvidenceResult(
                "peer", says, expr, True, True, values=(({ctx.location: node}, value),),
                score=min(score, 1e6), new=True,
            )  # fmt: skip
            ratio = f"{value / med:.1f}x" if med > 0 else "far above"
            out.append(
                Finding(
                    signature=f"peer_outlier_{name}",
                    layer=layer,
                    title=f"{node}: {name} at {ratio} its peers' median",
                    confidence=0.45,
                    evidence=[ev],
                    first_deviation=None,
                    commands=TOOLBOX.get(layer, []),
                    stop_loss=[f"Take {node} out of rotation while the others serve."],
                    where={ctx.location: node},
                    scope="node",
                    nodes=(node,),
                )
            )
            named.add(node)
    return out


def _node_status(ctx: _Ctx, findings: Sequence[Finding]) -> dict[str, str]:
    """Each node's verdict: the findings naming it, a fleet-wide fault, down, or healthy."""
    status: dict[str, list[str]] = {n: [] for n in ctx.nodes}
    recent = ctx.times >= ctx.end - min(60.0, max(4 * ctx.step, 0.25 * (ctx.end - ctx.start)))
    assert ctx.location is not None
    ups = ctx.fetch(_vexpr(ctx, "min(up)"))
    reporting: set[str] = set()
    for sr in ups or []:
        vals = sr.values[recent]
        vals = vals[np.isfinite(vals)]
        node = node_of(sr.labels, ctx.location)
        if vals.size:
            reporting.add(node)
        if node in status and vals.size and vals[-1] < 1:
            status[node].append("scrape target down")
    if ups:
        for node in status:
            if node not in reporting:
                status[node].append("no recent data")
    for f in findings:
        # a node is called unhealthy on a finding worth acting on, not on a faint match;
        # a faint match on a node far from its peers still says the node is the odd one
        if f.confidence < 0.5:
            if any(e.role == "peer" and e.held for e in f.evidence):
                for node in f.nodes:
                    if node in status:
                        status[node].append("stands out from its peers")
            continue
        for node in f.nodes:
            if node in status:
                status[node].append(
                    f.signature if f.scope == "node" else f"fleet-wide {f.signature}"
                )
    return {n: ", ".join(dict.fromkeys(v)) if v else "healthy" for n, v in status.items()}


def _shape(ctx: _Ctx, devs: Sequence[SignalDeviation], findings: Sequence[Finding]) -> Shape:
    by: dict[str, SignalDeviation] = {}
    for d in devs:
        by.setdefault(d.name, d)
    rate = by.get("request_rate")
    collapsed = rate is not None and rate.latest < 0.2 * max(rate.baseline, 1e-9)
    if _target_down(ctx) or collapsed:
        return Shape.UNAVAILABLE
    err = by.get("error_5xx_rate")
    if err and rate and err.latest > 0.5 * max(rate.latest, 1e-9):
        return Shape.UNAVAILABLE
    p99 = by.get("p99_latency")
    if p99 and p99.direction == "up":
        return Shape.WIDESPREAD_TIMEOUTS
    out = by.get("output_tokens_p50")
    if out and out.direction == "down":
        return Shape.SEMANTIC_ANOMALIES
    if _episodes(ctx) >= 2:
        return Shape.INTERMITTENT_SPIKES
    if any(f.confidence >= HIGH_CONFIDENCE for f in findings):
        return Shape.WIDESPREAD_TIMEOUTS if devs else Shape.INTERMITTENT_SPIKES
    return Shape.HEALTHY


def _target_down(ctx: _Ctx) -> bool:
    """A scrape target whose ``up`` was 0 in the last minute."""
    if not ctx.present.get("up"):
        return False
    recent = ctx.times >= ctx.end - 60.0
    for s in ctx.fetch(_vexpr(ctx, "min(up)")) or []:
        vals = s.values[recent]
        vals = vals[np.isfinite(vals)]
        if vals.size and vals.min() < 1:
            return True
    return False


def _episodes(ctx: _Ctx) -> int:
    expr = VITALS[1][2].replace("${rate}", ctx.rate)
    series = ctx.cache.get(expr) or []
    if not series:
        return 0
    res = detect(series[0].values[None, :], ctx.times, config=_detector(len(ctx.times)))
    hot = res.scores[0] >= 0.5
    return int(np.sum(hot[1:] & ~hot[:-1]))


def _layer_scores(devs: Sequence[SignalDeviation], findings: Sequence[Finding]) -> dict[str, float]:
    scores: dict[str, float] = {}
    for d in devs:
        scores[d.layer] = max(scores.get(d.layer, 0.0), round(d.score, 3))
    for f in findings:
        scores[f.layer] = max(scores.get(f.layer, 0.0), f.confidence)
    return dict(sorted(scores.items(), key=lambda kv: -kv[1]))


def _dedupe(items: Sequence[Unseen]) -> list[Unseen]:
    seen: set[tuple[str, str]] = set()
    out = []
    for u in items:
        if (u.what, u.why) not in seen:
            seen.add((u.what, u.why))
            out.append(u)
    return out
