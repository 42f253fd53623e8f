from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from aivitals.collect import BaseCollector, Event
from aivitals.signals import Sample


def wait_for(cond: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError("condition not met in time")


class Counting(BaseCollector):
    """Yields host_load1 = number of runs so far."""

    def __init__(self, name: str = "counting") -> None:
        super().__init__()
        self.name = name
        self.runs = 0

    def _collect(self) -> Iterable[Sample]:
        self.runs += 1
        return [Sample("host_load1", {}, float(self.runs))]


class Hanging(BaseCollector):
    name = "hanging"

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()

    def _collect(self) -> Iterable[Sample]:
        self.release.wait(10)  # bounded: the test releases it on teardown
        return [Sample("host_load5", {}, 1.0)]


class Raising:
    """Not a BaseCollector: breaks the protocol by raising."""

    name = "raising"

    def collect(self) -> Iterable[Sample]:
        raise RuntimeError("boom")


class WithEvents(BaseCollector):
    name = "events"

    def __init__(self) -> None:
        super().__init__()
        self._pending = [Event(1000.0, "kernel", "NVRM: Xid (PCI:0000:3b:00): 79", {"xid": "79"})]

    def _collect(self) -> Iterable[Sample]:
        return []

    def drain_events(self) -> list[Event]:
        out, self._pending = self._pending, []
        return out


VLLM_TEXT = b"""# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="m"} 3
other_metric 1
"""


class _Target(BaseHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        if self.path == "/hang":
            time.sleep(3)
            return
        body = VLLM_TEXT if self.path == "/metrics" else b"not {{ an exposition\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@contextmanager
def target_server() -> Iterator[str]:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Target)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()
