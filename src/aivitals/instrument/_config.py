"""The middleware's settings: keyword-only, validated, every default usable as is."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError

__all__ = ["InstrumentConfig"]

_HEADER = re.compile(r"^[a-z0-9!#$%&'*+.^_`|~\-]+$")

#: Scope -> route template, or None for "no route matched".
RouteResolverFn = Callable[[Mapping[str, Any]], "str | None"]


@dataclass(frozen=True, kw_only=True, slots=True)
class InstrumentConfig:
    """Settings of ``instrument(app, ...)`` / ``AivitalsMiddleware``.

    **Usage**::

        config = InstrumentConfig(metrics_path="/metrics", max_route_values=200)
        app = aivitals.instrument(app, config=config)

    ``metrics_path``: where the middleware serves the exposition (None: not served).
    ``request_id_header``: the header honoured and echoed (lower case).
    ``max_request_id_length``: longer incoming ids are replaced by a generated one.
    ``lifecycle_logs``: emit the received/responded JSON lines (when logging is on).
    ``max_route_values``: distinct route templates before folding into ``<other>``.
    ``routes``: route templates (``/v1/items/{id}``) for raw ASGI apps without a router.
    ``route_resolver``: a callable ``scope -> template | None`` that overrides matching.
    ``exclude_paths``: exact paths left uninstrumented (health probes, for instance).
    ``abort_on_disconnect``: abort the request's model calls when the client leaves.
    """

    metrics_path: str | None = "/metrics"
    request_id_header: str = "x-request-id"
    max_request_id_length: int = 128
    lifecycle_logs: bool = True
    max_route_values: int = 200
    routes: Sequence[str] = ()
    route_resolver: RouteResolverFn | None = None
    exclude_paths: frozenset[str] = field(default_factory=frozenset)
    abort_on_disconnect: bool = True

    def __post_init__(self) -> None:
        if self.metrics_path is not None and not str(self.metrics_path).startswith("/"):
            raise ConfigError(f"metrics_path must start with '/', got {self.metrics_path!r}")
        if not isinstance(self.request_id_header, str) or not _HEADER.match(self.request_id_header):
            raise ConfigError(
                f"request_id_header must be a lower-case header name, "
                f"got {self.request_id_header!r}"
            )
        _positive("max_request_id_length", self.max_request_id_length, upper=1024)
        _positive("max_route_values", self.max_route_values, upper=100_000)
        for template in self.routes:
            if not isinstance(template, str) or not template.startswith("/"):
                raise ConfigError(f"routes: each template must start with '/', got {template!r}")
        if self.route_resolver is not None and not callable(self.route_resolver):
            raise ConfigError(f"route_resolver must be callable, got {self.route_resolver!r}")
        object.__setattr__(self, "exclude_paths", frozenset(self.exclude_paths))


def _positive(key: str, value: object, *, upper: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= upper:
        raise ConfigError(f"{key} must be an int in 1..{upper}, got {value!r}")
