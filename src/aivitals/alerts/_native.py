"""Our names read from the engines' own series: one conversion for the rules and the diagnosis.

The agent rewrites vLLM's, DCGM's or node_exporter's names onto ours as it scrapes
(``signals.translate``). A Prometheus that scrapes those exporters itself has only
their names, and the rule pack and the diagnosis read ours. This module turns the
alias tables (``signals.ALIASES``, ``DERIVED``, ``FOREIGN_LABELS``) into PromQL that
reads one of our samples from the native series: scaled into our unit, relabelled
into our label names, with the labels an alias adds. ``recording_rules`` records
every such sample under our name; ``with_native`` rewrites a query so that each
selector of ours falls back to the native series where ours is missing.

Neither may count a target twice: a native form is dropped for every target
(``job``, ``instance``) that already exports the sample under our name (an agent
in between, an instrumented service). The guard is per target: a node whose agent
exports host and GPU series while Prometheus also scrapes its node_exporter or
dcgm-exporter has both, which is why the Kubernetes deploy, whose DaemonSet runs the
agent, records only the engines' names (``native_rule_group(sources=...)``).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from functools import cache

import promql_parser

from ..signals import ALIASES, DERIVED, FOREIGN_LABELS, MetricType, family_of

__all__ = [
    "GUARD_LABELS",
    "SOURCE_LABEL",
    "NativeForm",
    "native_expr",
    "native_forms",
    "native_names",
    "native_samples",
    "with_native",
]

#: The label a recorded series carries, naming the exporter it was read from. It also
#: keeps the double-counting guard from seeing the rule's own output as "ours".
SOURCE_LABEL = "aivitals_source"
#: A target: the native form is dropped where the target exports our name itself.
GUARD_LABELS = ("job", "instance")
#: Target labels (set by the scrape config, on every family) that a source may spell
#: its own way (dcgm-exporter's Hostname for node): relabelled on every family.
_TARGET_LABELS = ("node",)
_TMP = "aivitals_relabel"
_SUFFIXES = ("_bucket", "_sum", "_count")
_CLASSIC = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
#: Range functions f with f(c*x) = c*f(x) for c > 0: the scale goes after the call.
_LINEAR = frozenset(
    {
        "rate",
        "irate",
        "increase",
        "delta",
        "idelta",
        "deriv",
        "predict_linear",
        "avg_over_time",
        "min_over_time",
        "max_over_time",
        "sum_over_time",
        "quantile_over_time",
        "stddev_over_time",
        "mad_over_time",
        "last_over_time",
        "holt_winters",
        "double_exponential_smoothing",
    }
)
#: Range functions that ignore the values' unit (they count samples or changes).
_INVARIANT = frozenset({"count_over_time", "changes", "resets", "present_over_time"})

Matcher = tuple[str, str, str]


@dataclass(frozen=True, slots=True)
class NativeForm:
    """One way to read our sample ``sample`` from an exporter's series.

    ``expr`` is a foreign sample name, or for a derived form a PromQL expression
    over bare foreign names; ``matchers`` pick this form's share of a shared family
    (OpenTelemetry's token type).
    """

    sample: str
    source: str
    expr: str
    scale: float = 1.0
    add_labels: tuple[tuple[str, str], ...] = ()
    matchers: tuple[Matcher, ...] = ()
    derived: bool = False


@cache
def _table() -> dict[str, tuple[NativeForm, ...]]:
    out: dict[str, list[NativeForm]] = {}
    for alias in ALIASES:
        if _CLASSIC.fullmatch(alias.foreign) is None:
            continue  # dotted OTel names; the underscore spelling is in the table too
        splits = [(k.partition("=")[0], k.partition("=")[2], v) for k, v in alias.extra.items()]
        targets: list[tuple[str, tuple[Matcher, ...]]] = [
            (alias.ours, tuple((lbl, "!=", val) for lbl, val, _ in splits))
        ]
        targets += [(ours, ((lbl, "=", val),)) for lbl, val, ours in splits]
        for ours, matchers in targets:
            spec = family_of(ours)
            if alias.histogram and spec is not None and spec.type is MetricType.HISTOGRAM:
                # histograms are aliased only where the unit already matches (scale 1),
                # so bucket boundaries carry across unchanged
                for suffix in _SUFFIXES:
                    form = NativeForm(
                        ours + suffix,
                        alias.source,
                        alias.foreign + suffix,
                        1.0,
                        alias.add_labels,
                        matchers,
                    )
                    out.setdefault(form.sample, []).append(form)
                continue
            form = NativeForm(
                ours, alias.source, alias.foreign, alias.scale, alias.add_labels, matchers
            )
            out.setdefault(ours, []).append(form)
    for d in DERIVED:
        out.setdefault(d.ours, []).append(
            NativeForm(d.ours, d.source, d.expr, d.scale, derived=True)
        )
    return {sample: tuple(forms) for sample, forms in out.items()}


def native_samples() -> tuple[str, ...]:
    """Every sample of ours that some exporter's series can stand in for, sorted."""
    return tuple(sorted(_table()))


def native_forms(sample: str) -> tuple[NativeForm, ...]:
    """The native forms of one of our samples, in the table's order (newest name first)."""
    return _table().get(sample, ())


def native_names(sample: str) -> tuple[str, ...]:
    """The foreign metric names the native forms of ``sample`` read."""
    out: list[str] = []
    for form in native_forms(sample):
        out += _names(form.expr) if form.derived else [form.expr]
    return tuple(dict.fromkeys(out))


@dataclass(frozen=True, slots=True)
class _Call:
    """A range function around the selector: its name, other arguments and the range."""

    func: str
    before: tuple[str, ...]
    after: tuple[str, ...]
    range: str
    step: str


def native_expr(
    sample: str,
    matchers: Sequence[Matcher] = (),
    *,
    source_label: bool = False,
    call: _Call | None = None,
    sources: Collection[str] | None = None,
) -> str | None:
    """PromQL reading ``sample`` from every native form of it (``or`` between them).

    ``matchers`` are on our label names: each is moved onto the exporter's label
    (``model`` -> vLLM's ``model_name``), dropped where the form adds that label
    itself (a form whose added label fails it is left out). ``source_label`` sets
    ``aivitals_source`` to the exporter on the result; ``sources`` keeps the forms of
    those exporters only (``"vllm"``, ``"dcgm"``, ``"node"``, ...). None when no form
    applies.

    **Usage**::

        native_expr("kv_cache_usage_ratio")
        # (label_replace(... vllm:kv_cache_usage_perc ...) or ...)
    """
    spec = family_of(sample)
    labels = set(spec.labels) if spec is not None else set()
    parts = []
    for form in native_forms(sample):
        if sources is not None and form.source not in sources:
            continue
        rendered = _render(form, matchers, labels, call)
        if rendered is None:
            continue
        if source_label:
            rendered = f'label_replace({rendered}, "{SOURCE_LABEL}", "{form.source}", "", "")'
        parts.append(rendered)
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else "(" + " or ".join(parts) + ")"


def _render(
    form: NativeForm, matchers: Sequence[Matcher], labels: set[str], call: _Call | None
) -> str | None:
    renames = {
        ours: theirs
        for ours, theirs in FOREIGN_LABELS.get(form.source, {}).items()
        if ours in labels or ours in _TARGET_LABELS
    }
    added = dict(form.add_labels)
    plain: list[Matcher] = list(form.matchers)
    variants: list[list[Matcher]] = [[]]
    for label, op, value in matchers:
        if label in added:
            if not _satisfies(added[label], op, value):
                return None  # the form sets that label to a value the query excludes
            continue
        if label not in renames:
            plain.append((label, op, value))
            continue
        # our label where the series has it, else the exporter's candidates in order
        chain: list[list[Matcher]] = [[(label, op, value)]]
        cands = renames[label]
        for i, cand in enumerate(cands):
            unset = [(label, "=", "")] + [(c, "=", "") for c in cands[:i]]
            chain.append([*unset, (cand, op, value)])
        variants = [v + c for v in variants for c in chain]
    if call is not None and form.derived and call.func not in _LINEAR | _INVARIANT:
        return None
    bodies = [_body(form, plain + v, call) for v in variants]
    if any(b is None for b in bodies):
        return None
    expr = bodies[0] if len(bodies) == 1 else "(" + " or ".join(str(b) for b in bodies) + ")"
    if form.scale != 1.0 and (call is None or call.func in _LINEAR):
        expr = f"{expr} * {_number(form.scale)}"
    for ours, theirs in renames.items():
        joined = ", ".join(f'"{x}"' for x in (ours, *theirs))
        expr = (
            f'label_replace(label_replace(label_join({expr}, "{_TMP}", ";", {joined}), '
            f'"{ours}", "$1", "{_TMP}", ";*([^;]+).*"), "{_TMP}", "", "", "")'
        )
    for label, value in form.add_labels:
        expr = f'label_replace({expr}, "{label}", "{value}", "", "")'
    return expr


def _body(form: NativeForm, matchers: Sequence[Matcher], call: _Call | None) -> str | None:
    if form.derived:
        inner = _with_matchers(form.expr, matchers)
        if call is None:
            return f"({inner})"
        arg = f"({inner})[{call.range}:{call.step}]"
    else:
        sel = _selector(form.expr, matchers)
        if call is None:
            return sel
        arg = f"{sel}[{call.range}]"
    if call.func not in _LINEAR | _INVARIANT:
        return None
    return f"{call.func}({', '.join([*call.before, arg, *call.after])})"


def _selector(name: str, matchers: Sequence[Matcher]) -> str:
    body = ",".join(f'{label}{op}"{_escape(value)}"' for label, op, value in matchers)
    return f"{name}{{{body}}}" if body else name


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


def _with_matchers(expr: str, matchers: Sequence[Matcher]) -> str:
    for name in _names(expr):
        pattern = rf"(?<![\w:]){re.escape(name)}(?![\w:])"
        selector = _selector(name, matchers)
        expr = re.sub(pattern, lambda _m: selector, expr)  # noqa: B023 (used at once)
    return expr


@cache
def _names(expr: str) -> tuple[str, ...]:
    found: list[str] = []

    def visit(node: object) -> None:
        if isinstance(node, promql_parser.VectorSelector) and node.name:
            found.append(node.name)

    promql_parser.walk(promql_parser.parse(expr), visit)
    return tuple(dict.fromkeys(found))


def _satisfies(actual: str, op: str, value: str) -> bool:
    if op == "=":
        return actual == value
    if op == "!=":
        return actual != value
    hit = re.fullmatch(value, actual) is not None
    return hit if op == "=~" else not hit


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(value)


_OPS = {"MatchOp.Equal": "=", "MatchOp.NotEqual": "!=", "MatchOp.Re": "=~", "MatchOp.NotRe": "!~"}


def _matchers_of(vs: promql_parser.VectorSelector) -> list[Matcher] | None:
    out: list[Matcher] = []
    for m in vs.matchers.matchers:
        op = _OPS.get(str(m.op))
        if op is None or m.name == "__name__":
            return None
        out.append((m.name, op, m.value))
    if getattr(vs.matchers, "or_matchers", None):
        return None  # `a{x="1" or y="2"}`: not worth a conversion
    return out


def _modifiers(vs: promql_parser.VectorSelector) -> str:
    out = ""
    if vs.offset is not None:
        out += f" offset {promql_parser.display_duration(vs.offset)}"
    if vs.at is not None:
        out += f" {vs.at}"
    return out


def with_native(expr: str, names: Collection[str], *, step: str = "1m") -> str:
    """``expr`` with each selector of a sample in ``names`` falling back to its native
    forms for the targets that do not export it under our name.

    ``names`` are our sample names to rewrite (the diagnosis passes those it found
    only under native names); a selector inside a range function is rewritten with
    the function (``rate(ours[1m])`` -> ``rate(ours[1m]) or rate(vllm:x[1m])``); a
    derived form inside one is read through a subquery at ``step``. An expression
    that names none of them, does not parse, or would not parse rewritten is
    returned unchanged.

    **Usage**::

        with_native("max(kv_cache_usage_ratio) > 0.9", {"kv_cache_usage_ratio"})
    """
    wanted = {n for n in names if native_forms(n)}
    if not wanted or not any(n in expr for n in wanted) or "\\" in expr:
        return expr  # the parser prints string escapes back unescaped: keep such text as is
    try:
        ast = promql_parser.parse(expr)
    except ValueError:
        return expr
    calls: dict[str, str] = {}
    vectors: dict[str, str] = {}
    depth = [0]  # inside a range selector: its vector selector is the call's business

    def enter(node: object) -> None:
        if isinstance(node, promql_parser.MatrixSelector):
            depth[0] += 1
        elif isinstance(node, promql_parser.Call):
            for i, arg in enumerate(node.args):
                if isinstance(arg, promql_parser.MatrixSelector):
                    got = _call_form(node, i, arg, wanted, step)
                    if got is not None:
                        calls[str(node)] = got
        elif (
            isinstance(node, promql_parser.VectorSelector)
            and depth[0] == 0
            and node.name in wanted
            and (m := _matchers_of(node)) is not None
            and (alt := native_expr(node.name, m)) is not None
        ):
            vectors[str(node)] = _guarded(str(node), alt)

    def leave(node: object) -> None:
        if isinstance(node, promql_parser.MatrixSelector):
            depth[0] -= 1

    promql_parser.walk(ast, enter, leave)
    if not calls and not vectors:
        return expr
    text = str(ast)
    slots: list[str] = []

    def park(original: str, replacement: str, tail: str) -> None:
        nonlocal text
        pattern = rf"(?<![\w:]){re.escape(original)}{tail}"
        if re.search(pattern, text) is None:
            return
        slots.append(replacement)
        text = re.sub(pattern, f"\x00{len(slots) - 1}\x00", text)

    # longest first: a call's text holds its selector's
    for original, replacement in sorted(calls.items(), key=lambda kv: -len(kv[0])):
        park(original, replacement, "")
    for original, replacement in sorted(vectors.items(), key=lambda kv: -len(kv[0])):
        park(original, replacement, r"(?!\s*\[)")
    out = re.sub("\x00([0-9]+)\x00", lambda m: slots[int(m.group(1))], text)
    try:
        promql_parser.parse(out)
    except ValueError:
        return expr
    return out


def _call_form(
    node: promql_parser.Call,
    index: int,
    arg: promql_parser.MatrixSelector,
    wanted: set[str],
    step: str,
) -> str | None:
    vs = arg.vector_selector
    func = node.func.name
    if vs.name not in wanted or func not in _LINEAR | _INVARIANT:
        return None
    matchers = _matchers_of(vs)
    if matchers is None:
        return None
    mods = _modifiers(vs)
    call = _Call(
        func,
        tuple(str(a) for a in node.args[:index]),
        tuple(str(a) for a in node.args[index + 1 :]),
        promql_parser.display_duration(arg.range),
        step,
    )
    alt = native_expr(vs.name, matchers, call=call)
    if alt is None:
        return None
    if mods:
        alt = _with_mods(alt, mods)
    return _guarded(str(node), alt)


def _with_mods(expr: str, mods: str) -> str:
    """Put the selector's offset or @ after every range in the native form."""
    return re.sub(r"(\[[0-9a-z]+(?::[0-9a-z]+)?\])", lambda m: m.group(1) + mods, expr)


def _guarded(ours: str, native: str) -> str:
    on = ", ".join(GUARD_LABELS)
    return f"({ours} or ({native} unless on ({on}) {ours}))"
