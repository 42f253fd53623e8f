from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from aivitals.collect import HTTPProbeCollector
from aivitals.errors import ConfigError


class _Handler(BaseHTTPRequestHandler):
    delay = 0.0

    def do_GET(self) -> None:
        time.sleep(self.server.delay)  # type: ignore[attr-defined]
        status = 503 if self.path.startswith("/down") else 200
        self.send_response(status)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[ThreadingHTTPServer]:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    srv.delay = 0.0  # type: ignore[attr-defined]
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def _values(probe: HTTPProbeCollector) -> dict[tuple[str, str], float]:
    return {(s.name, s.labels.get("target", "")): s.value for s in probe.collect()}


def _url(srv: ThreadingHTTPServer, path: str = "/healthz") -> str:
    return f"http://127.0.0.1:{srv.server_address[1]}{path}"


def test_a_probe_times_the_whole_exchange(server: ThreadingHTTPServer) -> None:
    server.delay = 0.2  # type: ignore[attr-defined]
    probe = HTTPProbeCollector({"client": _url(server)}, timeout=5)
    got = _values(probe)
    assert got[("probe_success", "client")] == 1.0
    assert got[("probe_http_status_code", "client")] == 200.0
    assert 0.2 <= got[("probe_duration_seconds", "client")] < 2.0
    assert got[("aivitals_collector_up", "")] == 1.0


def test_an_error_status_a_closed_port_and_a_timeout_are_failures_not_collector_errors(
    server: ThreadingHTTPServer,
) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]  # nobody listens once the socket closes
    probe = HTTPProbeCollector(
        {"down": _url(server, "/down"), "closed": f"http://127.0.0.1:{closed}/"}, timeout=0.5
    )
    got = _values(probe)
    assert got[("probe_success", "down")] == 0.0
    assert got[("probe_http_status_code", "down")] == 503.0
    assert got[("probe_success", "closed")] == 0.0
    assert ("probe_http_status_code", "closed") not in got
    server.delay = 1.5  # type: ignore[attr-defined]
    probe.retarget("down", _url(server))
    got = _values(probe)
    assert got[("probe_success", "down")] == 0.0
    assert got[("probe_duration_seconds", "down")] <= 0.5 + 1e-9
    assert got[("aivitals_collector_up", "")] == 1.0  # the collector itself worked
    assert probe.error_counts()["timeout"] >= 1


def test_retarget_keeps_the_series_name_and_changes_the_path(server: ThreadingHTTPServer) -> None:
    probe = HTTPProbeCollector({"client": "http://127.0.0.1:1/"}, timeout=0.5)
    probe.retarget("client", _url(server))
    assert probe.targets == {"client": _url(server)}
    assert _values(probe)[("probe_success", "client")] == 1.0


@pytest.mark.parametrize(
    ("targets", "timeout", "message"),
    [
        ({"x": "ftp://127.0.0.1/"}, 1.0, "not an http"),
        ({"x": "http:///nohost"}, 1.0, "not an http"),
        ({"x": "http://127.0.0.1:99999/"}, 1.0, "bad port"),
        ({"": "http://127.0.0.1/"}, 1.0, "non-empty"),
        ({"x": "http://127.0.0.1/"}, 0, "timeout"),
        ({"x": "http://127.0.0.1/"}, 120, "timeout"),
    ],
)
def test_bad_probe_settings_are_refused(
    targets: dict[str, str], timeout: float, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        HTTPProbeCollector(targets, timeout=timeout)
