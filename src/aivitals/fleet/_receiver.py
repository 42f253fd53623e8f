"""The fleet's webhook receiver: Alertmanager posts here, each body is appended to a file.

``python -m aivitals.fleet._receiver --port 5001 --out alerts.jsonl`` runs until
SIGTERM. One JSON object per line: ``{"received": <epoch s>, "body": <what
Alertmanager sent>}``; a body that is not JSON is kept as text, never dropped.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import FrameType
from typing import Any

__all__ = ["main", "read_alerts"]

_MAX_BODY = 8 * 2**20


def read_alerts(path: Path | str) -> list[dict[str, Any]]:
    """Every alert (Alertmanager's ``alerts[]`` items) the receiver recorded, in order."""
    out: list[dict[str, Any]] = []
    p = Path(path)
    if not p.exists():
        return out
    for line in p.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue  # a line cut short by a crash mid-write
        body = rec.get("body") if isinstance(rec, dict) else None
        if isinstance(body, dict):
            for alert in body.get("alerts") or []:
                if isinstance(alert, dict):
                    out.append({**alert, "received": rec.get("received")})
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m aivitals.fleet._receiver")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    lock = threading.Lock()
    args.out.parent.mkdir(parents=True, exist_ok=True)

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *a: Any) -> None:
            # http.server writes a line per request to stderr; the receiver's record
            # is alerts.jsonl, and its stderr is the fleet's log of real failures.
            return

        def do_POST(self) -> None:
            length = min(int(self.headers.get("Content-Length") or 0), _MAX_BODY)
            raw = self.rfile.read(length)
            try:
                body: Any = json.loads(raw)
            except ValueError:
                body = raw.decode("utf-8", errors="replace")
            line = json.dumps({"received": time.time(), "body": body}) + "\n"
            with lock, args.out.open("a", encoding="utf-8") as f:
                f.write(line)
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def do_GET(self) -> None:  # readiness
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    server.daemon_threads = True

    def _stop(signum: int, frame: FrameType | None) -> None:
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
