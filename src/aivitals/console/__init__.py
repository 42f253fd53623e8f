"""The web console: live charts, alerts, the diagnosis with its evidence, fleet, daily report.

Plain HTML, CSS and ES modules in ``static/`` (no build step, no CDN; uPlot
vendored with its licence), served by the agent at ``/`` and by
``aivitals console`` over a remote agent or Prometheus. Read-only.

**Usage**::

    from aivitals.console import ConsoleServer, RemoteSource
    with ConsoleServer(RemoteSource("http://127.0.0.1:9090", kind="prometheus")) as server:
        print(server.url)
"""

from __future__ import annotations

from ._api import MAX_POINTS, choose_step, range_payload
from ._app import Response, respond
from ._server import ConsoleServer, write_response
from ._source import AgentSource, RemoteSource, Source, expr_threshold, normalize_alerts
from ._static import STATIC_DIR, resolve_static

__all__ = [
    "MAX_POINTS",
    "STATIC_DIR",
    "AgentSource",
    "ConsoleServer",
    "RemoteSource",
    "Response",
    "Source",
    "choose_step",
    "expr_threshold",
    "normalize_alerts",
    "range_payload",
    "resolve_static",
    "respond",
    "write_response",
]
