"""The subset of Go's text/template that Prometheus alert templates use.

Supported: ``{{ $value }}``, ``{{ $labels.name }}``, ``{{ .Value }}``, ``{{ .Labels.name }}``,
``{{ $externalLabels.name }}``, ``{{ $externalURL }}``, string and number literals,
pipelines (``{{ $value | humanize }}``, ``{{ $value | printf "%.2f" }}``), calls
(``{{ humanize $value }}``, ``{{ printf "%.2f" $value }}``), the functions
``humanize``, ``humanize1024``, ``humanizePercentage``, ``humanizeDuration``,
``printf``, ``toUpper``, ``toLower``, trim markers (``{{-``, ``-}}``) and comments.
Anything else (``if``, ``range``, ``with``, variables, ``query``) is rejected when the
rule is loaded, so a template never renders differently from Prometheus unnoticed.
Numbers print the way Go prints a float64, so ``{{ $value }}`` of 1e6 is ``1e+06``.

**Usage**::

    t = Template.parse("{{ $labels.gpu }} at {{ $value | humanizePercentage }}")
    t.render(value=0.93, labels={"gpu": "0"})     # '0 at 93%'
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal

__all__ = ["Template", "TemplateError", "go_float"]


class TemplateError(ValueError):
    """A template uses a construct outside the supported subset, or fails to render."""


Value = float | str


# --- Go number formatting ------------------------------------------------------------


def _special(v: float) -> str | None:
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return None


def go_float(v: float) -> str:
    """``fmt.Sprint(v)`` of a Go float64: shortest digits, exponent form from 1e6 or below 1e-4."""
    special = _special(v)
    if special is not None:
        return special
    if v == 0:
        return "-0" if math.copysign(1.0, v) < 0 else "0"
    sign, digits, exp = Decimal(repr(v)).normalize().as_tuple()
    assert isinstance(exp, int)
    text = "".join(map(str, digits))
    decimal_exp = len(text) + exp - 1
    prefix = "-" if sign else ""
    if decimal_exp < -4 or decimal_exp >= 6:
        mantissa = text[0] + ("." + text[1:] if len(text) > 1 else "")
        return f"{prefix}{mantissa}e{'-' if decimal_exp < 0 else '+'}{abs(decimal_exp):02d}"
    return prefix + format(Decimal(repr(abs(v))).normalize(), "f")


def _go_g(v: float, prec: int) -> str:
    special = _special(v)
    return special if special is not None else f"%.{prec}g" % v


def _go_verb(verb: str, flags: str, arg: Value) -> str:
    if isinstance(arg, str):
        if verb in "sv":
            return ("%" + flags + "s") % arg
        if verb == "q":
            return '"' + arg.replace("\\", "\\\\").replace('"', '\\"') + '"'
        return f"%!{verb}(string={arg})"
    special = _special(arg)
    if verb in "vg" and "." not in flags:
        return go_float(arg)
    if verb in "feEgG" and special is None:
        return ("%" + flags + verb) % arg
    if verb in "feEgGv":
        return special or ""
    if verb == "d":
        return f"%!d(float64={go_float(arg)})"
    return f"%!{verb}(float64={go_float(arg)})"


_VERB = re.compile(r"%([-+# 0]*\d*(?:\.\d+)?)([a-zA-Z%])")


def _printf(fmt: Value, *args: Value) -> str:
    if not isinstance(fmt, str):
        raise TemplateError("printf needs a format string first")
    it = iter(args)

    def one(m: re.Match[str]) -> str:
        flags, verb = m.group(1), m.group(2)
        if verb == "%":
            return "%"
        try:
            arg = next(it)
        except StopIteration:
            return f"%!{verb}(MISSING)"
        return _go_verb(verb, flags, arg)

    return _VERB.sub(one, fmt)


# --- Prometheus' template functions (template/template.go) --------------------------


def _to_float(v: Value) -> float:
    if isinstance(v, float):
        return v
    try:
        return float(v)
    except ValueError:
        raise TemplateError(f"cannot convert {v!r} to a number") from None


def _scale(v: float, base: float, big: tuple[str, ...], small: tuple[str, ...]) -> str:
    if v == 0 or _special(v) is not None:
        return _go_g(v, 4)
    prefix = ""
    if abs(v) >= 1:
        for p in big:
            if abs(v) < base:
                break
            prefix, v = p, v / base
        return _go_g(v, 4) + prefix
    for p in small:
        if abs(v) >= 1:
            break
        prefix, v = p, v * 1000
    return _go_g(v, 4) + prefix


def humanize(v: Value) -> str:
    return _scale(_to_float(v), 1000, tuple("kMGTPEZY"), tuple("munpfazy"))


def humanize1024(v: Value) -> str:
    f = _to_float(v)
    if abs(f) <= 1 or _special(f) is not None:
        return _go_g(f, 4)
    return _scale(f, 1024, ("ki", "Mi", "Gi", "Ti", "Pi", "Ei", "Zi", "Yi"), ())


def humanize_percentage(v: Value) -> str:
    return _go_g(_to_float(v) * 100, 4) + "%"


def _tdiv(a: int, b: int) -> int:
    """Go's integer division, which truncates toward zero."""
    q = abs(a) // b
    return q if a >= 0 else -q


def _tmod(a: int, unit: int, modulus: int) -> int:
    q = _tdiv(a, unit)
    return q - modulus * _tdiv(q, modulus)


def humanize_duration(v: Value) -> str:
    f = _to_float(v)
    if _special(f) is not None:
        return _go_g(f, 4)
    if f == 0:
        return _go_g(f, 4) + "s"
    if abs(f) >= 1:
        sign = "-" if f < 0 else ""
        f = abs(f)
        # Go converts with int64(v): past its range the value wraps to the minimum.
        whole = int(f) if f < 2**63 else -(2**63)
        seconds, minutes = _tmod(whole, 1, 60), _tmod(whole, 60, 60)
        hours, days = _tmod(whole, 3600, 24), _tdiv(whole, 86400)
        if days:
            return f"{sign}{days}d {hours}h {minutes}m {seconds}s"
        if hours:
            return f"{sign}{hours}h {minutes}m {seconds}s"
        if minutes:
            return f"{sign}{minutes}m {seconds}s"
        return f"{sign}{_go_g(f, 4)}s"
    prefix = ""
    for p in ("m", "u", "n", "p", "f", "a", "z", "y"):
        if abs(f) >= 1:
            break
        prefix, f = p, f * 1000
    return f"{_go_g(f, 4)}{prefix}s"


FUNCTIONS: dict[str, Callable[..., str]] = {
    "humanize": humanize,
    "humanize1024": humanize1024,
    "humanizePercentage": humanize_percentage,
    "humanizeDuration": humanize_duration,
    "printf": _printf,
    "toUpper": lambda s: str(s).upper(),
    "toLower": lambda s: str(s).lower(),
}
_ARITY = {"printf": None, "toUpper": 1, "toLower": 1}


# --- parsing -------------------------------------------------------------------------

_ACTION = re.compile(r"\{\{(-\s)?(.*?)(\s-)?\}\}", re.S)
_TOKEN = re.compile(
    r'\s*(?:(?P<str>"(?:[^"\\]|\\.)*"|`[^`]*`)|(?P<num>[-+]?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)'
    r"|(?P<pipe>\|)|(?P<word>[$.]?[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*|\$|\.))"
)
_ESCAPES = {"n": "\n", "t": "\t", '"': '"', "\\": "\\", "r": "\r"}


@dataclass(frozen=True, slots=True)
class _Data:
    value: float
    labels: Mapping[str, str]
    external_labels: Mapping[str, str]
    external_url: str


Operand = Callable[[_Data], Value]


def _string_literal(text: str) -> str:
    if text.startswith("`"):
        return text[1:-1]
    return re.sub(r"\\(.)", lambda m: _ESCAPES.get(m.group(1), m.group(1)), text[1:-1])


def _field(path: list[str], where: str) -> Operand:
    root, rest = path[0], path[1:]
    maps: dict[str, Callable[[_Data], Mapping[str, str]]] = {
        "$labels": lambda d: d.labels,
        ".Labels": lambda d: d.labels,
        "$externalLabels": lambda d: d.external_labels,
        ".ExternalLabels": lambda d: d.external_labels,
    }
    if root in ("$value", ".Value") and not rest:
        return lambda d: d.value
    if root in ("$externalURL", ".ExternalURL") and not rest:
        return lambda d: d.external_url
    if root in maps and len(rest) == 1:
        get, key = maps[root], rest[0]
        # Prometheus runs templates with missingkey=zero: an absent label renders "".
        return lambda d: get(d).get(key, "")
    raise TemplateError(f"unsupported template operand {'.'.join(path)!r} in {where!r}")


def _operand(kind: str, text: str, where: str) -> Operand:
    if kind == "str":
        s = _string_literal(text)
        return lambda d: s
    if kind == "num":
        n = float(text)
        return lambda d: n
    if text.startswith(".") and text != ".":
        return _field(["." + p for p in text[1:].split(".")[:1]] + text[1:].split(".")[1:], where)
    if text.startswith("$"):
        return _field(text.split("."), where)
    raise TemplateError(f"unsupported template construct {text!r} in {where!r}")


@dataclass(frozen=True, slots=True)
class _Command:
    func: str | None
    args: tuple[Operand, ...]

    def run(self, data: _Data, piped: Value | None) -> Value:
        values = [a(data) for a in self.args]
        if piped is not None:
            values.append(piped)
        if self.func is None:
            return values[0]
        return FUNCTIONS[self.func](*values)


def _tokens(text: str, where: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    pos = 0
    text = text.strip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            raise TemplateError(f"cannot parse {text[pos:]!r} in template {where!r}")
        kind = m.lastgroup or ""
        out.append((kind, m.group(kind)))
        pos = m.end()
    return out


def _command(tokens: list[tuple[str, str]], piped: bool, where: str) -> _Command:
    if not tokens:
        raise TemplateError(f"empty command in template {where!r}")
    kind, text = tokens[0]
    if kind == "word" and text in FUNCTIONS:
        args = tuple(_operand(k, t, where) for k, t in tokens[1:])
        total = len(args) + (1 if piped else 0)
        arity = _ARITY.get(text, 1)
        if (arity is None and total < 1) or (arity is not None and total != arity):
            raise TemplateError(f"wrong number of arguments for {text} in template {where!r}")
        return _Command(text, args)
    if kind == "word" and not text.startswith(("$", ".")):
        raise TemplateError(f"unsupported template function or keyword {text!r} in {where!r}")
    if len(tokens) != 1 or piped:
        raise TemplateError(f"unsupported template construct in {where!r}")
    return _Command(None, (_operand(kind, text, where),))


def _pipeline(text: str, where: str) -> tuple[_Command, ...]:
    commands: list[list[tuple[str, str]]] = [[]]
    for kind, tok in _tokens(text, where):
        if kind == "pipe":
            commands.append([])
        else:
            commands[-1].append((kind, tok))
    return tuple(_command(c, i > 0, where) for i, c in enumerate(commands))


@dataclass(frozen=True, slots=True)
class Template:
    """A parsed Prometheus alert template; ``render`` gives the expanded text."""

    source: str
    parts: tuple[str | tuple[_Command, ...], ...] = field(default=())

    @classmethod
    def parse(cls, source: str) -> Template:
        """Parse ``source``; ``TemplateError`` on anything outside the supported subset."""
        parts: list[str | tuple[_Command, ...]] = []
        pos = 0
        for m in _ACTION.finditer(source):
            literal = source[pos : m.start()]
            if m.group(1):
                literal = literal.rstrip()
            parts.append(literal)
            body = m.group(2)
            if not body.strip().startswith("/*"):
                parts.append(_pipeline(body, source))
            elif not body.strip().endswith("*/"):
                raise TemplateError(f"unclosed comment in template {source!r}")
            pos = m.end()
            if m.group(3):
                rest = source[pos:]
                pos += len(rest) - len(rest.lstrip())
        tail = source[pos:]
        if "{{" in tail or "}}" in tail:
            raise TemplateError(f"unbalanced braces in template {source!r}")
        parts.append(tail)
        return cls(source, tuple(p for p in parts if p != ""))

    @property
    def is_static(self) -> bool:
        return all(isinstance(p, str) for p in self.parts)

    def render(
        self,
        *,
        value: float,
        labels: Mapping[str, str],
        external_labels: Mapping[str, str] | None = None,
        external_url: str = "",
    ) -> str:
        """The expanded text; a failing function gives Prometheus' error text instead."""
        data = _Data(value, labels, external_labels or {}, external_url)
        out: list[str] = []
        try:
            for part in self.parts:
                out.append(part if isinstance(part, str) else self._run(part, data))
        except TemplateError as exc:
            return f"<error expanding template: {exc}>"
        return "".join(out)

    @staticmethod
    def _run(pipeline: tuple[_Command, ...], data: _Data) -> str:
        piped: Value | None = None
        for command in pipeline:
            piped = command.run(data, piped)
        assert piped is not None
        return piped if isinstance(piped, str) else go_float(piped)
