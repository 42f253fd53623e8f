"""Run ``promtool test rules`` files on the embedded engine, and promtool itself.

The shipped unit tests are promtool files. Running the same files on the
embedded engine (series loaded into a ``Store``, rules evaluated at every
``evaluation_interval`` from 0, firing alerts compared at each ``eval_time``)
is how the engine proves it agrees with Prometheus.

Series notation follows promtool: ``1+2x3`` is ``1 3 5 7``, ``_`` a missing
sample, ``_x3`` three missing samples, ``stale`` a staleness marker.
"""

from __future__ import annotations

import math
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from ..errors import ConfigError
from ._engine import STALE_NAN
from ._params import parse_duration
from ._rules import RuleGroup, load_rules

__all__ = [
    "FiringAlert",
    "PromtoolResult",
    "SeriesLoader",
    "expand_values",
    "parse_series",
    "run_engine_on_test",
    "run_promtool_tests",
    "shipped_test_files",
]


_ITEM = re.compile(
    r"^(?:(?P<blank>_)(?:x(?P<btimes>\d+))?|(?P<stale>stale)"
    r"|(?P<start>[-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|Inf|NaN))"
    r"(?:(?P<op>[-+])(?P<step>\d+\.?\d*(?:[eE][-+]?\d+)?)?x(?P<times>\d+)|x(?P<rep>\d+))?)$"
)
_SELECTOR = re.compile(r"^\s*([a-zA-Z_:][a-zA-Z0-9_:]*)?\s*(?:\{(.*)\})?\s*$", re.S)
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')


def expand_values(text: str) -> list[float | None]:
    """promtool's series values; None is a missing sample."""
    out: list[float | None] = []
    for item in str(text).split():
        m = _ITEM.match(item)
        if m is None:
            raise ConfigError(f"series value {item!r} is not promtool notation")
        if m.group("blank"):
            out.extend([None] * int(m.group("btimes") or 1))
        elif m.group("stale"):
            out.append(STALE_NAN)
        else:
            start = float(m.group("start"))
            times = m.group("times") or m.group("rep")
            if times is None:
                out.append(start)
                continue
            step = float(m.group("step") or 0) * (-1 if m.group("op") == "-" else 1)
            out.extend(start + i * step for i in range(int(times) + 1))
    return out


def parse_series(selector: str) -> tuple[str, dict[str, str]]:
    """``name{a="b"}`` as (name, labels)."""
    m = _SELECTOR.match(selector)
    if m is None:
        raise ConfigError(f"series {selector!r} is not a metric selector")
    labels: dict[str, str] = {}
    body = m.group(2) or ""
    pos = 0
    while pos < len(body.strip()):
        lm = _LABEL.match(body, pos)
        if lm is None:
            raise ConfigError(f"series {selector!r}: cannot parse labels at {body[pos:]!r}")
        labels[lm.group(1)] = re.sub(r"\\(.)", r"\1", lm.group(2))
        pos = lm.end()
    name = m.group(1) or labels.pop("__name__", "")
    if not name:
        raise ConfigError(f"series {selector!r} has no metric name")
    return name, labels


class SeriesLoader:
    """Appends promtool ``input_series`` to anything with ``append(name, labels, v, t)``."""

    def __init__(self, sink: Any) -> None:
        self.sink = sink

    def load(self, input_series: Iterable[Mapping[str, Any]], interval: float) -> int:
        n = 0
        for entry in input_series:
            name, labels = parse_series(str(entry["series"]))
            for i, value in enumerate(expand_values(str(entry.get("values", "")))):
                if value is not None:
                    self.sink.append(name, labels, value, i * interval)
                    n += 1
        return n


@dataclass(frozen=True, slots=True)
class FiringAlert:
    labels: dict[str, str]
    annotations: dict[str, str]

    def key(self) -> tuple[tuple[tuple[str, str], ...], tuple[tuple[str, str], ...]]:
        return tuple(sorted(self.labels.items())), tuple(sorted(self.annotations.items()))


def run_engine_on_test(
    test: Mapping[str, Any],
    groups: Sequence[RuleGroup],
    *,
    evaluation_interval: float,
    backend_factory: Callable[[], Any],
    alertnames: Sequence[str] | None = None,
    until: float | None = None,
) -> dict[tuple[float, str], list[FiringAlert]]:
    """Firing alerts of the embedded engine for one promtool test case.

    Loads ``input_series`` into a fresh backend, evaluates every group at 0,
    interval, ... and returns, per (eval_time, alertname) asked for by the
    test (or every step for ``alertnames``), the firing alerts.
    """
    from ._engine import RuleEngine

    backend = backend_factory()
    interval = parse_duration(str(test.get("interval", "1m")), key="interval")
    SeriesLoader(backend).load(test.get("input_series") or [], interval)
    asked: dict[float, set[str]] = {}
    for case in test.get("alert_rule_test") or []:
        t = parse_duration(str(case["eval_time"]), key="eval_time")
        asked.setdefault(t, set()).add(str(case["alertname"]))
    end = until if until is not None else max(asked, default=0.0)
    engine = RuleEngine(backend, groups, registry=None)
    out: dict[tuple[float, str], list[FiringAlert]] = {}
    steps = math.floor(end / evaluation_interval + 1e-9)
    for i in range(steps + 1):
        ts = i * evaluation_interval
        engine.evaluate(ts)
        names = set(alertnames) if alertnames is not None else asked.get(ts, set())
        for name in names:
            out[(ts, name)] = [
                FiringAlert(
                    {k: v for k, v in e.labels.items() if k != "alertname"}, dict(e.annotations)
                )
                for e in engine.firing()
                if e.alertname == name
            ]
    return out


@dataclass(frozen=True, slots=True)
class PromtoolResult:
    ok: bool
    output: str
    command: list[str]


def shipped_test_files() -> list[Path]:
    """The promtool unit-test files shipped with the pack (they test the default pack)."""
    root = resources.files("aivitals.alerts") / "rules" / "tests"
    return sorted(Path(str(p)) for p in root.iterdir() if str(p).endswith(".test.yml"))


def run_promtool_tests(
    pack_text: str, test_files: Sequence[Path] | None = None, *, promtool: str | None = None
) -> PromtoolResult:
    """``promtool test rules`` on the unit tests against ``pack_text`` (the rendered pack).

    The files refer to ``aivitals-rules.yml`` beside them; both are copied into a
    temporary directory. ``ConfigError`` when promtool is not installed.
    """
    binary = shutil.which(promtool or "promtool")
    if binary is None:
        raise ConfigError(
            f"promtool not found ({promtool or 'on PATH'}): install the Debian/Ubuntu "
            "package 'prometheus'"
        )
    files = list(test_files) if test_files is not None else shipped_test_files()
    with tempfile.TemporaryDirectory(prefix="aivitals-rules-test-") as tmp:
        work = Path(tmp)
        (work / "aivitals-rules.yml").write_text(pack_text, encoding="utf-8")
        names = []
        for f in files:
            shutil.copy(f, work / f.name)
            names.append(f.name)
        cmd = [binary, "test", "rules", *names]
        proc = subprocess.run(cmd, cwd=work, capture_output=True, text=True, timeout=300)
    return PromtoolResult(proc.returncode == 0, proc.stdout + proc.stderr, cmd)


def load_test_doc(path: Path) -> dict[str, Any]:
    doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    if not isinstance(doc, dict):
        raise ConfigError(f"{path}: not a promtool test file")
    return doc


def groups_for(pack_text: str) -> list[RuleGroup]:
    return load_rules(pack_text)
