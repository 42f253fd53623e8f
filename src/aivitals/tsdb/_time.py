"""Durations and times as the CLI takes them (``15s``, ``now-5m``), and the agent's default URL.

Public (``aivitals.tsdb``) because every command that reads a backend parses
them the same way: ``aivitals query``, ``aivitals diagnose``, ``aivitals snapshot``.
"""

from __future__ import annotations

import math
import re
from datetime import datetime

from ..errors import ConfigError

__all__ = ["DEFAULT_AGENT", "parse_api_time", "parse_duration", "parse_time"]

#: Where ``aivitals agent`` listens by default: the backend when none is named.
DEFAULT_AGENT = "http://127.0.0.1:9478"
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(name: str, text: str) -> float:
    """``90``, ``15s``, ``5m``, ``1h30m`` -> seconds; ``ConfigError`` naming the option."""
    try:
        return float(text)
    except ValueError:
        pass
    pos, total = 0, 0.0
    for m in _DURATION.finditer(text):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
    if pos != len(text) or not text:
        raise ConfigError(f"{name}: not a duration: {text!r} (use e.g. 15s, 5m, 1h)")
    return total


def parse_time(name: str, text: str, now: float) -> float:
    """Epoch seconds, ``now`` or ``now-5m``."""
    if text == "now":
        return now
    if text.startswith("now-"):
        return now - parse_duration(name, text[4:])
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"{name}: not a time: {text!r} (epoch seconds, now, now-5m)") from None
    if not math.isfinite(value):
        raise ConfigError(f"{name}: not a time: {text!r}")
    return value


def parse_api_time(key: str, text: str) -> float:
    """A time as the Prometheus HTTP API takes it: unix seconds or RFC 3339.

    One parser for every HTTP API that answers in Prometheus's shapes (the agent's
    and the console's), so both accept and refuse the same texts."""
    try:
        value = float(text)
    except ValueError:
        try:
            value = datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
        except ValueError:
            raise ConfigError(f"{key}: {text!r} is not a unix time or RFC 3339 time") from None
    if not math.isfinite(value):
        raise ConfigError(f"{key}: {text!r} is not finite")
    return value
