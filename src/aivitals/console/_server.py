"""``aivitals console``'s own small server: the console over a remote agent or Prometheus.

The same pages and API the agent serves at ``/``, on a stdlib threaded
server bound to 127.0.0.1 unless told otherwise. It only reads.
"""

from __future__ import annotations

import logging
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from ._app import Response, respond
from ._source import Source

__all__ = ["ConsoleServer", "write_response"]

log = logging.getLogger("aivitals.console.http")


def write_response(handler: BaseHTTPRequestHandler, r: Response) -> None:
    """Write ``r`` on ``handler`` (no body for HEAD or 304)."""
    try:
        handler.send_response(r.status)
        handler.send_header("Content-Type", r.content_type)
        for k, v in r.headers.items():
            handler.send_header(k, v)
        send_body = handler.command != "HEAD" and r.status != HTTPStatus.NOT_MODIFIED
        handler.send_header("Content-Length", str(len(r.body) if send_body else 0))
        handler.end_headers()
        if send_body:
            handler.wfile.write(r.body)
    except (BrokenPipeError, ConnectionResetError):
        # the page went away (navigated, closed) before its answer: nobody to tell
        handler.close_connection = True


class _Busy:
    """Requests in progress, so that a stop can wait for them (and only them)."""

    def __init__(self) -> None:
        self._n = 0
        self._cond = threading.Condition()

    def __enter__(self) -> None:
        with self._cond:
            self._n += 1

    def __exit__(self, *exc: object) -> None:
        with self._cond:
            self._n -= 1
            self._cond.notify_all()

    def wait_idle(self, timeout: float) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: self._n == 0, timeout)


class _Handler(BaseHTTPRequestHandler):
    source: Source
    busy: _Busy
    server_version = "aivitals-console"
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)

    def _handle(self) -> None:
        parts = urlsplit(self.path)
        headers = {k.lower(): v for k, v in self.headers.items()}
        with self.busy:
            r = respond(self.source, self.command, parts.path, parts.query, headers)
        if r is None:
            r = Response(HTTPStatus.NOT_FOUND, b"not found\n", "text/plain; charset=utf-8")
        write_response(self, r)

    do_GET = do_HEAD = do_POST = do_PUT = do_DELETE = do_PATCH = _handle


class ConsoleServer:
    """Serve the console of ``source`` on ``host:port`` from a daemon thread.

    **Usage**::

        with ConsoleServer(RemoteSource("http://127.0.0.1:9090", kind="prometheus")) as s:
            print(s.url)
    """

    def __init__(self, source: Source, host: str = "127.0.0.1", port: int = 0) -> None:
        self.source = source
        self._busy = _Busy()
        handler = type("ConsoleHandler", (_Handler,), {"source": source, "busy": self._busy})
        self._server = ThreadingHTTPServer((host, port), handler)
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/"

    def start(self) -> ConsoleServer:
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="aivitals-console", daemon=True
        )
        self._thread.start()
        return self

    def stop(self, timeout: float = 15.0) -> None:
        self._server.shutdown()
        self._server.server_close()
        # Requests still answering (each bounded by the backend's timeout) finish before
        # the source's connections are closed under them; idle keep-alive connections
        # are not waited for.
        self._busy.wait_idle(timeout)
        close = getattr(self.source, "close", None)
        if callable(close):
            close()

    def __enter__(self) -> ConsoleServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
