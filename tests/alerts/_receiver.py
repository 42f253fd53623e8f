"""A webhook receiver for tests: records JSON bodies, answers with scripted codes and delays."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Receiver:
    url: str
    bodies: list[Any] = field(default_factory=list)
    codes: list[int] = field(default_factory=list)  # answered in order, then 200
    delay: float = 0.0
    hits: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def wait_for(self, predicate: Any, timeout: float = 30.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if predicate(list(self.bodies)):
                    return True
            time.sleep(0.05)
        return False


@contextmanager
def receiver() -> Iterator[Receiver]:
    rec = Receiver(url="")

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            body = self.rfile.read(length)
            with rec.lock:
                rec.hits += 1
                code = rec.codes.pop(0) if rec.codes else 200
                delay = rec.delay
            if delay:
                time.sleep(delay)
            if code == 200:
                with rec.lock:
                    rec.bodies.append(json.loads(body))
            self.send_response(code)
            self.send_header("Content-Length", "0")
            self.end_headers()

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    rec.url = f"http://127.0.0.1:{server.server_address[1]}/hook"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield rec
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
