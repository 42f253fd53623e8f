"""Parse Prometheus text and OpenMetrics exposition into ``(labels, value, t_ms)`` rows.

The plain text format has a fast line parser: a scrape repeats the same
series every time, so the text before the value (``name{labels}``) is cached
per parser and maps straight to its parsed label set. Any line the fast path
does not fully understand sends the whole text to prometheus_client's
parser, which is the reference (a property test checks both agree).
OpenMetrics text (ending in ``# EOF``) always goes to prometheus_client's
OpenMetrics parser.

Parsing is all-or-nothing: rows are returned only when the whole text
parsed, so a malformed scrape stores nothing.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from ..errors import ExpositionError
from ._series import Labels, label_key

__all__ = ["ExpositionParser", "Row", "parse_reference"]

#: One parsed sample: canonical labels (with ``__name__``), value, timestamp in ms or None.
Row = tuple[Labels, float, int | None]

_NAME_RE = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")
_LABEL_RE = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(,|\Z)')
_ESCAPE_RE = re.compile(r"\\(.)")
_ESCAPES = {"\\": "\\", "n": "\n", '"': '"'}
_VALUE_WORDS = {"nan": math.nan, "+inf": math.inf, "inf": math.inf, "-inf": -math.inf}
_CACHE_LIMIT = 200_000


class _Unusual(Exception):
    """The fast path met something it leaves to the reference parser."""

    def __init__(self, line: str = "") -> None:
        self.line = line
        super().__init__(line)


def _unescape(match: re.Match[str]) -> str:
    ch = match.group(1)
    if ch not in _ESCAPES:
        raise _Unusual
    return _ESCAPES[ch]


def _parse_labels(name: str, body: str) -> Labels:
    labels = {"__name__": name}
    pos = 0
    while pos < len(body):
        m = _LABEL_RE.match(body, pos)
        if m is None:
            if body[pos:].strip() == "":
                break
            raise _Unusual
        value = m.group(2)
        if "\\" in value:
            value = _ESCAPE_RE.sub(_unescape, value)
        if m.group(1) in labels:
            raise _Unusual
        labels[m.group(1)] = value
        pos = m.end()
        if m.group(3) == "":
            break
    return label_key(labels)


def _parse_key(key: str) -> Labels:
    brace = key.find("{")
    if brace < 0:
        name, body = key.rstrip(), ""
    else:
        if not key.endswith("}"):
            raise _Unusual
        name, body = key[:brace].rstrip(), key[brace + 1 : -1]
    if _NAME_RE.match(name) is None:
        raise _Unusual
    return _parse_labels(name, body)


def _parse_value(text: str) -> float:
    if "_" in text:
        raise _Unusual  # Python's float() accepts 1_000; Prometheus does not
    try:
        return float(text)
    except ValueError:
        word = _VALUE_WORDS.get(text.lower())
        if word is None:
            raise _Unusual from None
        return word


@dataclass
class ExpositionParser:
    """A reusable parser; keep one per scrape target so its key cache stays warm.

    ::

        rows = ExpositionParser().parse('up{job="a"} 1\\n')
    """

    _cache: dict[str, Labels] = field(default_factory=dict)

    def parse(self, text: str) -> list[Row]:
        """All samples of ``text``; raises ``ExpositionError`` naming the bad line."""
        if _is_openmetrics(text):
            return parse_reference(text, openmetrics=True)
        try:
            return self._fast(text)
        except _Unusual as unusual:
            try:
                return parse_reference(text, openmetrics=False)
            except ExpositionError as exc:
                raise ExpositionError(f"{exc}; first unusual line: {unusual.line!r}") from exc

    def _fast(self, text: str) -> list[Row]:
        cache = self._cache
        if len(cache) > _CACHE_LIMIT:
            cache.clear()
        rows: list[Row] = []
        append = rows.append
        for line in text.split("\n"):
            try:
                self._line(line, cache, append)
            except _Unusual as exc:
                raise _Unusual(line) from exc
        return rows

    def _line(self, line: str, cache: dict[str, Labels], append: Callable[[Row], None]) -> None:
        if not line or line[0] == "#" or line.isspace():
            if line.startswith("#") and not _is_plain_comment(line):
                raise _Unusual
            return
        close = line.rfind("}")
        if close >= 0:
            key, rest = line[: close + 1], line[close + 1 :].split()
        else:
            key, *rest = line.split()
        labels = cache.get(key)
        if labels is None:
            labels = _parse_key(key)
            cache[key] = labels
        if len(rest) == 1:
            append((labels, _parse_value(rest[0]), None))
        elif len(rest) == 2 and rest[1].lstrip("-").isdigit():
            append((labels, _parse_value(rest[0]), int(rest[1])))
        else:
            raise _Unusual


def _is_plain_comment(line: str) -> bool:
    # HELP/TYPE lines and free comments carry no samples in the text format.
    return not line.startswith("# EOF")


def _is_openmetrics(text: str) -> bool:
    return text.rstrip().endswith("# EOF")


def parse_reference(text: str, *, openmetrics: bool) -> list[Row]:
    """Parse with prometheus_client's parser (the reference); all or nothing."""
    from prometheus_client.openmetrics.parser import (
        text_string_to_metric_families as openmetrics_families,
    )
    from prometheus_client.parser import text_string_to_metric_families as text_families

    parse: Callable[[str], Iterable[Any]] = openmetrics_families if openmetrics else text_families
    rows: list[Row] = []
    try:
        for family in parse(text):
            for s in family.samples:
                t_ms = None if s.timestamp is None else _timestamp_ms(s.timestamp)
                rows.append((label_key({**s.labels, "__name__": s.name}), float(s.value), t_ms))
    except ExpositionError:
        raise
    except Exception as exc:  # the parser raises ValueError, TypeError, IndexError, ...
        raise ExpositionError(f"malformed exposition: {exc}") from exc
    return rows


def _timestamp_ms(ts: object) -> int:
    # prometheus_client gives float seconds, or a Timestamp (sec, nsec) for OpenMetrics.
    sec = getattr(ts, "sec", None)
    if sec is not None:
        return int(sec) * 1000 + int(getattr(ts, "nsec", 0)) // 1_000_000
    return round(float(ts) * 1000)  # type: ignore[arg-type]
