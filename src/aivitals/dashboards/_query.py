"""PromQL for the dashboards, with the catalogue's aliases folded into every selector.

A panel names our metric (``model_time_to_first_token_seconds_bucket``); the
query it gets reads that name *or* every foreign name the catalogue maps onto
it (``vllm:time_to_first_token_seconds_bucket``, ``tgi_...``), scaled into our
unit and relabelled into our label names, so a vLLM, TGI, Triton or DCGM
target fills the same panel as an instrumented service, and an engine that
renames a metric between releases (both names are in the table) keeps it
filled. Grafana's own variables (``$node``, ``$__rate_interval``) stay in
the text; :func:`render_variables` substitutes them the way Grafana does, for
checks that send the queries to a real Prometheus.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import promql_parser

from ..errors import ConfigError
from ..signals import ALIASES, MetricSpec, MetricType, family_of

__all__ = [
    "FOREIGN_LABELS",
    "VARIABLE_LABELS",
    "Alternative",
    "absent_all",
    "alternatives",
    "families_in",
    "render_variables",
    "series",
]

#: Label names an engine spells differently from the catalogue: source -> ours -> theirs.
#: vLLM labels its series ``model_name``; the dashboards filter and group by ``model``.
FOREIGN_LABELS: dict[str, dict[str, str]] = {"vllm": {"model": "model_name"}}

#: The dashboards' template variables and the label each filters. ``node`` and
#: ``instance`` are target labels (set by the scrape config or the ServiceMonitor),
#: so every series has them; the others filter only the families whose catalogue
#: entry carries that label, so picking a GPU never empties an HTTP panel.
#: ``namespace`` and ``pod`` (the GPU dashboard's) are a GPU process's pod.
VARIABLE_LABELS: dict[str, str] = {
    "node": "node",
    "instance": "instance",
    "model": "model",
    "gpu": "gpu",
    "namespace": "namespace",
    "pod": "pod",
}
_TARGET_LABELS = ("node", "instance")
_SUFFIXES = ("_bucket", "_sum", "_count")
_RANGE_FUNCS = {
    "rate",
    "increase",
    "delta",
    "deriv",
    "changes",
    "avg_over_time",
    "max_over_time",
    "min_over_time",
    "quantile_over_time",
}


@dataclass(frozen=True, slots=True)
class Alternative:
    """One name a sample can be exposed under: ours, or an engine's alias for it."""

    name: str
    source: str
    scale: float = 1.0
    add_labels: tuple[tuple[str, str], ...] = ()
    #: extra matchers that pick this alias's share of a shared family (OTel token type)
    matchers: tuple[tuple[str, str, str], ...] = ()

    @property
    def labels(self) -> Mapping[str, str]:
        return FOREIGN_LABELS.get(self.source, {})


def _classic(name: str) -> bool:
    # Dotted OpenTelemetry names need Prometheus 3's quoted-name syntax; the underscore
    # spelling its exporter writes is in the table too and is the one used here.
    return re.fullmatch(r"[a-zA-Z_:][a-zA-Z0-9_:]*", name) is not None


def alternatives(sample: str) -> tuple[Alternative, ...]:
    """Our sample name first, then every alias of it in the catalogue (classic names only).

    ``alternatives("kv_cache_usage_ratio")`` gives ours, ``vllm:kv_cache_usage_perc``
    and the deprecated ``vllm:gpu_cache_usage_perc``. Raises ``ConfigError`` for a
    name the catalogue does not know, so a dashboard cannot reference a typo.
    """
    _spec(sample)
    out = [Alternative(sample, "aivitals")]
    for alias in ALIASES:
        if not _classic(alias.foreign):
            continue
        splits = [(k.partition("=")[0], k.partition("=")[2], v) for k, v in alias.extra.items()]
        # the alias proper (a shared family's other shares excluded) and its extra targets
        targets: list[tuple[str, tuple[tuple[str, str, str], ...]]] = [
            (alias.ours, tuple((lbl, "!=", val) for lbl, val, _ in splits))
        ]
        targets += [(ours, ((lbl, "=", val),)) for lbl, val, ours in splits]
        for ours, matchers in targets:
            if ours == sample:
                out.append(
                    Alternative(
                        alias.foreign, alias.source, alias.scale, alias.add_labels, matchers
                    )
                )
            elif alias.histogram and sample.startswith(ours) and sample[len(ours) :] in _SUFFIXES:
                # histograms are aliased only when their unit already matches (scale 1),
                # so bucket boundaries carry across unchanged
                suffix = sample[len(ours) :]
                out.append(
                    Alternative(
                        alias.foreign + suffix, alias.source, 1.0, alias.add_labels, matchers
                    )
                )
    return tuple(out)


def _spec(sample: str) -> MetricSpec:
    spec = family_of(sample)
    if spec is None:
        raise ConfigError(f"{sample!r} is not a sample of any metric in the signal catalogue")
    return spec


def _variable_matchers(spec: MetricSpec) -> list[tuple[str, str, str]]:
    out = [
        (label, "=~", f"${var}") for var, label in VARIABLE_LABELS.items() if var in _TARGET_LABELS
    ]
    out += [
        (label, "=~", f"${var}")
        for var, label in VARIABLE_LABELS.items()
        if var not in _TARGET_LABELS and label in spec.labels
    ]
    return out


def _selector(name: str, matchers: Iterable[tuple[str, str, str]]) -> str:
    body = ", ".join(f'{label}{op}"{value}"' for label, op, value in matchers)
    return f"{name}{{{body}}}" if body else name


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(value)


def series(
    sample: str,
    *,
    fn: str | None = None,
    window: str = "$__rate_interval",
    where: Mapping[str, str] | None = None,
    variables: bool = True,
) -> str:
    """A selector of ``sample`` or any alias of it, optionally inside a range function.

    ``where`` adds matchers (``{"status": "429"}``; a value starting with ``~`` is a
    regex, with ``!`` a negation). ``variables`` adds the dashboard variables'
    matchers that apply to the family. Each alias is scaled into our unit after
    ``fn`` (a rate of microseconds times 1e-6 is a rate of seconds) and relabelled
    with ``label_replace`` into our label names.
    """
    if fn is not None and fn not in _RANGE_FUNCS:
        raise ConfigError(f"fn={fn!r}: expected one of {sorted(_RANGE_FUNCS)}")
    spec = _spec(sample)
    extra = [_matcher(k, v) for k, v in (where or {}).items()]
    base = (_variable_matchers(spec) if variables else []) + extra
    parts = []
    for alt in alternatives(sample):
        added = dict(alt.add_labels)
        if any(
            label in added and not _satisfies(added[label], op, value) for label, op, value in extra
        ):
            continue  # the alias sets that label to a value this query excludes
        matchers = [
            (alt.labels.get(label, label), op, value)
            for label, op, value in base
            if label not in added
        ]
        expr = _selector(alt.name, [*matchers, *alt.matchers])
        if fn is not None:
            expr = f"{fn}({expr}[{window}])"
        if alt.scale != 1.0:
            expr = f"{expr} * {_number(alt.scale)}"
        for ours, theirs in alt.labels.items():
            if ours in spec.labels:
                expr = f'label_replace({expr}, "{ours}", "$1", "{theirs}", "(.+)")'
        for label, value in alt.add_labels:
            expr = f'label_replace({expr}, "{label}", "{value}", "", "")'
        parts.append(expr)
    return parts[0] if len(parts) == 1 else "(" + " or ".join(parts) + ")"


def _matcher(label: str, value: str) -> tuple[str, str, str]:
    if value.startswith("!~"):
        return label, "!~", value[2:]
    if value.startswith("~"):
        return label, "=~", value[1:]
    if value.startswith("!"):
        return label, "!=", value[1:]
    return label, "=", value


def _satisfies(actual: str, op: str, value: str) -> bool:
    if op == "=":
        return actual == value
    if op == "!=":
        return actual != value
    hit = re.fullmatch(value, actual) is not None
    return hit if op == "=~" else not hit


def absent_all(family: str) -> str:
    """1 labelled ``metric="<family>"`` when neither the family nor any alias of it is
    collected for the selected nodes and instances; nothing otherwise."""
    spec = _spec(family)
    sample = f"{family}_count" if spec.type is MetricType.HISTOGRAM else spec.series_names()[0]
    matchers = [
        (label, "=~", f"${var}") for var, label in VARIABLE_LABELS.items() if var in _TARGET_LABELS
    ]
    terms = " and ".join(f"absent({_selector(alt.name, matchers)})" for alt in alternatives(sample))
    return f'label_replace({terms}, "metric", "{family}", "", "")'


#: What Grafana puts in place of its built-in variables when a check renders a query.
_BUILTINS = ("__rate_interval", "__interval", "__range")


def render_variables(expr: str, values: Mapping[str, str]) -> str:
    """``expr`` with Grafana variables (``$node``, ``${gpu}``, ``$__rate_interval``) replaced.

    ``values`` must name every variable the expression uses; a missing one raises
    ``ConfigError`` (a dashboard that references an undefined variable is a bug).
    """

    def sub(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        if name.isdigit():
            return m.group(0)  # label_replace's $1: a capture group, not a variable
        if name not in values:
            raise ConfigError(f"the query uses ${name}, which has no value: {expr}")
        return values[name]

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", sub, expr)


def families_in(expr: str) -> set[str]:
    """Catalogue families read by a PromQL expression (aliases counted as their family)."""
    names: set[str] = set()

    def visit(node: object) -> None:
        if isinstance(node, promql_parser.VectorSelector) and node.name:
            names.add(node.name)

    promql_parser.walk(promql_parser.parse(expr), visit)
    out: set[str] = set()
    for name in names:
        spec = family_of(name)
        if spec is None:
            for alias in ALIASES:
                if name == alias.foreign or (alias.histogram and name.startswith(alias.foreign)):
                    spec = family_of(alias.ours)
                    break
        if spec is not None:
            out.add(spec.name)
    return out
