"""Label hygiene: the cardinality guard and model-version normalisation.

A label value that comes from outside (a path, a method, a build string) can
create a new series per request; Prometheus then pays for each one forever.
"""

from __future__ import annotations

import re
import threading
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry

from ..errors import ConfigError

__all__ = ["OTHER", "CardinalityGuard", "normalize_version"]

#: The value every label value past the cap is folded into.
OTHER = "<other>"

# git describe (-234-ga1b2c3d), -dirty, +build metadata, .dev/.post local parts
_BUILD_SUFFIX = re.compile(r"(?:-\d+-g[0-9a-f]{4,40})?(?:-dirty)?(?:\+[0-9A-Za-z.\-_]*)?$")
_BARE_HASH = re.compile(r"^g?[0-9a-f]{7,40}$")
_UNSAFE = re.compile(r"[^0-9A-Za-z._\-]")


def normalize_version(version: object, *, max_length: int = 32) -> str:
    """A version string fit for a label: build suffixes and raw hashes removed.

    ``v3.2.1-234-ga1b2c3d`` -> ``v3.2.1``; ``1.4.0-dirty`` -> ``1.4.0``;
    ``2.0.0+cu121`` -> ``2.0.0``; a bare commit hash -> ``unversioned``;
    None or empty -> ``unknown``.

    **Usage**::

        normalize_version("v3.2.1-234-ga1b2c3d-dirty")   # "v3.2.1"
    """
    if version is None:
        return "unknown"
    text = str(version).strip()
    if not text:
        return "unknown"
    if _BARE_HASH.match(text):
        return "unversioned"
    text = _BUILD_SUFFIX.sub("", text, count=1) or "unknown"
    return _UNSAFE.sub("_", text)[:max_length]


class CardinalityGuard:
    """Caps the distinct values of each label of each metric.

    The first ``max_values`` values of a (metric, label) pair pass; later new
    values become ``"<other>"``, and ``aivitals_cardinality_folded_total{metric}``
    counts each distinct value refused (once, not per observation).

    **Usage**::

        guard = CardinalityGuard(max_values=100)
        route = guard.fold("http_request_duration_seconds", "route", template)
    """

    def __init__(
        self,
        *,
        max_values: int = 100,
        overrides: dict[tuple[str, str], int] | None = None,
        registry: CollectorRegistry | None = REGISTRY,
    ) -> None:
        if not isinstance(max_values, int) or max_values < 1:
            raise ConfigError(f"max_values must be a positive int, got {max_values!r}")
        self.max_values = max_values
        self._overrides = dict(overrides or {})
        self._seen: dict[tuple[str, str], set[str]] = {}
        self._refused: dict[tuple[str, str], set[str]] = {}
        self._lock = threading.Lock()
        self._folded: Any = _folded_counter(registry)

    def fold(self, metric: str, label: str, value: str) -> str:
        """``value`` itself while under the cap or already seen, else ``"<other>"``."""
        key = (metric, label)
        seen = self._seen.get(key)
        if seen is not None and value in seen:
            return value
        with self._lock:
            seen = self._seen.setdefault(key, set())
            if value in seen:
                return value
            if len(seen) < self._overrides.get(key, self.max_values):
                seen.add(value)
                return value
            refused = self._refused.setdefault(key, set())
            # count each refused value once, and keep the memory of refusals bounded
            if value not in refused and len(refused) < 100_000:
                refused.add(value)
                self._folded.labels(metric).inc()
            return OTHER

    def values(self, metric: str, label: str) -> frozenset[str]:
        """The values admitted so far for one (metric, label)."""
        with self._lock:
            return frozenset(self._seen.get((metric, label), ()))


def _folded_counter(registry: CollectorRegistry | None) -> Any:
    from ._metrics import family

    return family("aivitals_cardinality_folded_total", registry)
