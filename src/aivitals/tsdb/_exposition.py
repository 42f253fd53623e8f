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
from typing import Any

from ..errors import ExpositionError
from ._series import Labels, label_key

__all__ = ["Entry", "EntryRow", "ExpositionParser", "Row", "parse_reference"]

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
    if "_" in text:  # Python's float() accepts 1_000; Prometheus does not
        raise ExpositionError(f"invalid value {text!r}")
    try:
        return float(text)
    except ValueError:
        word = _VALUE_WORDS.get(text.lower())
        if word is None:
            raise _Unusual from None
        return word


class Entry:
    """A parsed series key: its labels and, once the store has seen it, its series."""

    __slots__ = ("labels", "series")

    def __init__(self, labels: Labels) -> None:
        self.labels = labels
        self.series: Any = None


#: One parsed sample as the store consumes it.
EntryRow = tuple[Entry, float, int | None]


class ExpositionParser:
    """A reusable parser; keep one per scrape target so its key cache stays warm.

    ``extra`` labels are merged into every series (an exposed label of the
    same name is kept as ``exported_<name>``, as Prometheus does).

    ::

        rows = ExpositionParser().parse('up{job="a"} 1\n')
    """

    def __init__(self, extra: Labels = ()) -> None:
        self.extra = extra
        self._cache: dict[str, Entry] = {}

    def parse(self, text: str) -> list[Row]:
        """All samples of ``text``; raises ``ExpositionError`` naming the bad line."""
        return [(e.labels, v, t) for e, v, t in self.parse_entries(text)]

    def parse_entries(self, text: str) -> list[EntryRow]:
        if _is_openmetrics(text):
            rows = parse_reference(text, openmetrics=True)
        else:
            try:
                return self._fast(text)
            except _Unusual as unusual:
                try:
                    rows = parse_reference(text, openmetrics=False)
                except ExpositionError as exc:
                    msg = f"{exc}; first unusual line: {unusual.line!r}"
                    raise ExpositionError(msg) from exc
        return [(Entry(self._merge(labels)), v, t) for labels, v, t in rows]

    def _merge(self, labels: Labels) -> Labels:
        if not self.extra:
            return labels
        merged = dict(labels)
        for k, v in self.extra:
            if k in merged and k != "__name__":
                merged[f"exported_{k}"] = merged[k]
            merged[k] = v
        return label_key(merged)

    def _fast(self, text: str) -> list[EntryRow]:
        cache = self._cache
        if len(cache) > _CACHE_LIMIT:
            cache.clear()
        rows: list[EntryRow] = []
        append = rows.append
        line = ""
        try:
            for line in text.split("\n"):
                if not line or line[0] == "#" or line.isspace():
                    if line.startswith("# EOF"):
                        raise _Unusual
                    continue
                # Steady state: the text before the last space is a key seen before.
                head, _, last = line.rpartition(" ")
                entry = cache.get(head)
                if entry is not None and "_" not in last:
                    try:
                        append((entry, float(last), None))
                        continue
                    except ValueError:
                        pass  # NaN/Inf spellings and errors: the careful path below
                close = line.rfind("}")
                if close >= 0:
                    key, rest = line[: close + 1], line[close + 1 :].split()
                else:
                    key, *rest = line.split()
                entry = cache.get(key)
                if entry is None:
                    entry = Entry(self._merge(_parse_key(key)))
                    cache[key] = entry
                if len(rest) == 1:
                    append((entry, _parse_value(rest[0]), None))
                    if last == rest[0]:
                        cache[head] = entry
                elif len(rest) == 2 and rest[1].lstrip("-").isdigit():
                    append((entry, _parse_value(rest[0]), int(rest[1])))
                elif len(rest) == 2:
                    raise ExpositionError(f"invalid timestamp {rest[1]!r}")
                else:
                    raise ExpositionError("expected 'name{labels} value [timestamp]'")
        except _Unusual:
            raise _Unusual(line) from None
        except ExpositionError as exc:
            raise ExpositionError(f"malformed exposition line {line!r}: {exc}") from None
        return rows


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
