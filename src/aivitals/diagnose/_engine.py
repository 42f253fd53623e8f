"""The engine: a window from any Backend, every signature evaluated, hypotheses ranked.

Order of work (DOMAIN.md section 3): observe the vital signals and decide the
symptom shape; evaluate each signature's evidence (PromQL conditions, baseline
deviations judged by the detector, events); rank by evidence, specificity and
temporal precedence (a cause deviates before its effects); when nothing
matches, rank the most anomalous signals by layer. What could not be seen
(missing series, failed queries) is listed and lowers confidence; it never
raises.
"""

from __future__ import annotations

import functools
import math
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import promql_parser

from .. import signals
from ..errors import AivitalsError, ConfigError
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
from ._signatures import EventEvidence, Evidence, Signature, load_signatures

__all__ = ["HIGH_CONFIDENCE", "VITALS", "diagnose"]

#: A finding at or above this confidence is "high confidence" (named in reports and benchmarks).
HIGH_CONFIDENCE = 0.6
#: Findings under this confidence are not reported.
REPORT_FLOOR = 0.25

DETECTOR = DetectorConfig(rel_floor=0.01, warmup=20)


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
    ("process_rss", "service", "sum(service_process_resident_memory_bytes)"),
    ("process_cpu", "service", "sum(rate(service_process_cpu_seconds_total[${rate}]))"),
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
    r"|instance|job|xid|model|check|reason|client)\}"
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
        try:
            res = self.backend.query_range(expr, self.start, self.end, self.step)
            out = _on_grid(res, self.times, self.step)
        except AivitalsError as exc:
            self.unseen.append(Unseen(expr, f"query failed: {type(exc).__name__}: {exc}"))
            out = None
        except Exception as exc:  # a backend bug must not stop the diagnosis
            self.unseen.append(Unseen(expr, f"query failed: {type(exc).__name__}: {exc}"))
            out = None
        self.cache[expr] = out
        return out


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
) -> Diagnosis:
    """Diagnose the window ``[end - window, end]`` of ``backend``.

    ``alerts`` are ``AlertEvent``-like objects (``alertname``, ``labels``,
    ``active_at``); ``events`` kernel lines and error-coded logs; ``params``
    overrides signature thresholds by id (``{"gpu_oom": {"memory_ratio": 0.8}}``).

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
    rate = _rate_window(window, step)
    ctx = _Ctx(backend, start, end, step, times, rate)
    sigs = list(signatures) if signatures is not None else _builtin()
    unknown = set(params or {}) - {s.id for s in sigs}
    if unknown:
        raise ConfigError(f"diagnose params name unknown signatures: {sorted(unknown)}")
    own = [Event(float(e.time), str(e.kind), str(e.text), dict(e.fields)) for e in events]
    all_events = sorted([*own, *_alert_events(alerts)], key=lambda e: e.time)
    all_events = [e for e in all_events if start <= e.time <= end]
    _check_presence(ctx, sigs)
    rendered = [s.render((params or {}).get(s.id), rate) for s in sigs]
    _detect_all(ctx, rendered)
    deviations = _vitals(ctx)
    findings = [f for s in rendered if (f := _evaluate(ctx, s, all_events)) is not None]
    findings = _rank(findings)
    if not any(f.confidence >= 0.5 for f in findings):
        findings += _fallback(deviations)
    shape = _shape(ctx, deviations, findings)
    layers = _layer_scores(deviations, findings)
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


def _check_presence(ctx: _Ctx, sigs: Sequence[Signature]) -> None:
    names: set[str] = set()
    for s in sigs:
        for e in s.evidence:
            names |= _metric_names(e.expr)
    for _, _, expr in VITALS:
        names |= _metric_names(expr)
    stored = _stored_names(ctx.backend)
    window = f"{int(ctx.end - ctx.start)}s"
    missing: dict[str, list[str]] = {}
    for name in sorted(names):
        # a name the embedded store never saw needs no query
        never = stored is not None and name not in stored
        ok = False if never else _present(ctx, name, window)
        ctx.present[name] = ok
        if not ok:
            spec = signals.family_of(name)
            missing.setdefault(spec.source if spec else "scrape", []).append(name)
    for source, metrics in sorted(missing.items()):
        ctx.unseen.append(
            Unseen(
                f"{source}: {', '.join(metrics)}",
                "no series in the window (exporter or collector missing?)",
            )
        )


def _stored_names(backend: Backend) -> set[str] | None:
    """The embedded store's metric names (one call), or None for a remote backend."""
    from ..tsdb import Store

    return set(backend.metric_names()) if isinstance(backend, Store) else None


def _present(ctx: _Ctx, name: str, window: str) -> bool:
    try:
        res = ctx.backend.query(f"count(last_over_time({name}[{window}]))", ctx.end)
    except Exception as exc:  # a failing backend is reported, never raised
        ctx.unseen.append(Unseen(name, f"presence query failed: {type(exc).__name__}: {exc}"))
        return False
    return bool(res.values())


def _seen(ctx: _Ctx, expr: str) -> bool:
    """An expression is seen when at least one metric it names has data."""
    names = _metric_names(expr)
    return not names or any(ctx.present.get(n, False) for n in names)


def _detect_all(ctx: _Ctx, sigs: Sequence[Signature]) -> None:
    """Fetch every expression the detector must judge and run it once over all their series."""
    exprs = [t.replace("${rate}", ctx.rate) for _, _, t in VITALS]
    exprs += [e.expr for s in sigs for e in s.evidence if e.deviation is not None]
    owners: list[tuple[str, int]] = []
    rows: list[np.ndarray] = []
    for expr in dict.fromkeys(exprs):
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
        expr = template.replace("${rate}", ctx.rate)
        for dev in ctx.detected.get(expr, []):
            labels, first, direction, score, base, latest = dev
            out.append(SignalDeviation(name, layer, labels, first, direction, score, base, latest))
    return sorted(out, key=lambda d: d.first_deviation)


def _deviations(ctx: _Ctx, expr: str, min_change: float = 0.0) -> list[_Dev]:
    out = []
    for dev in ctx.detected.get(expr, []):
        base, latest = dev[4], dev[5]
        if abs(latest - base) >= min_change * max(abs(base), 1e-9):
            out.append(dev)
    return out


def _evaluate(ctx: _Ctx, sig: Signature, events: Sequence[Event]) -> Finding | None:
    results = [_evidence(ctx, e) for e in sig.evidence]
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
    )


def _evidence(ctx: _Ctx, ev: Evidence) -> EvidenceResult:
    if not _seen(ctx, ev.expr):
        return EvidenceResult(ev.role, ev.says, ev.expr, held=False, seen=False)
    series = ctx.fetch(ev.expr)
    if series is None:
        return EvidenceResult(ev.role, ev.says, ev.expr, held=False, seen=False)
    if ev.deviation is None:
        return _condition(ctx, ev, series)
    devs = [
        d
        for d in _deviations(ctx, ev.expr, ev.min_change)
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
        return f.confidence + 0.08 * lead

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
    return _PLACEHOLDER.sub(lambda m: labels.get(m.group(1), f"<{m.group(1)}>"), text)


def _fallback(deviations: Sequence[SignalDeviation]) -> list[Finding]:
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
            )
        )
    return sorted(out, key=lambda f: f.first_deviation or math.inf)


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
    for s in ctx.fetch("min(up)") or []:
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
