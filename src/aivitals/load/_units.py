"""Durations as people type them: ``30s``, ``2m``, ``500ms``, ``1h`` or plain seconds."""

from __future__ import annotations

import math
import re

from ..errors import ConfigError

__all__ = ["parse_duration"]

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "": 1.0}
_RE = re.compile(r"^\s*(-?\d+(?:\.\d+)?)\s*(ms|s|m|h|)\s*$")


def parse_duration(text: str | float, *, key: str = "duration") -> float:
    """Seconds from ``"30s"``, ``"2m"``, ``"500ms"``, ``"1h"`` or a number.

    Negative values parse (the caller decides whether they are allowed);
    anything else raises ``ConfigError`` naming ``key``.

    **Usage**::

        parse_duration("90s")    # 90.0
        parse_duration("1.5m")   # 90.0
    """
    if isinstance(text, int | float):
        value = float(text)
    else:
        m = _RE.match(text)
        if m is None:
            raise ConfigError(f"{key}: {text!r} is not a duration (examples: 30s, 2m, 500ms)")
        value = float(m.group(1)) * _UNITS[m.group(2)]
    if not math.isfinite(value):
        raise ConfigError(f"{key}: {text!r} is not finite")
    return value
