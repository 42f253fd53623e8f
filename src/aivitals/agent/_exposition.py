"""Render samples as Prometheus text exposition (format 0.0.4), HELP and TYPE
taken from the signal catalogue, so Prometheus can scrape the agent."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from ..signals import MetricType, Sample, family_of

__all__ = ["CONTENT_TYPE", "format_value", "render"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def format_value(value: float) -> str:
    """A float the way Prometheus writes it (``1``, ``0.25``, ``NaN``, ``+Inf``)."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(value)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(labels: Mapping[str, str]) -> str:
    if not labels:
        return ""
    inner = ",".join(f'{k}="{_escape(str(v))}"' for k, v in labels.items())
    return "{" + inner + "}"


def _type_of(name: str) -> tuple[str, str, str]:
    """(family name for HELP/TYPE, type word, help) of a sample name."""
    spec = family_of(name)
    if spec is None:
        return name, "untyped", ""
    kind = "gauge" if spec.type is MetricType.INFO else spec.type.value
    return spec.name, kind, spec.help


def render(samples: Iterable[Sample]) -> str:
    """Text exposition of ``samples``, grouped by family in first-seen order.

    **Usage**::

        render([Sample("host_load1", {}, 0.5)])
        # '# HELP host_load1 1-minute load average.\\n# TYPE host_load1 gauge\\nhost_load1 0.5\\n'
    """
    families: dict[str, list[str]] = {}
    heads: dict[str, str] = {}
    for s in samples:
        family, kind, help_ = _type_of(s.name)
        lines = families.get(family)
        if lines is None:
            lines = families[family] = []
            heads[family] = f"# HELP {family} {_escape_help(help_)}\n# TYPE {family} {kind}\n"
        lines.append(f"{s.name}{_labels(s.labels)} {format_value(float(s.value))}\n")
    return "".join(heads[f] + "".join(lines) for f, lines in families.items())


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")
