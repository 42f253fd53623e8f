"""Staleness agrees with a real Prometheus that scrapes a target whose series vanish.

Backfilled blocks cannot hold staleness markers, so here Prometheus really
scrapes a small HTTP server every second; series ``b`` disappears for a few
scrapes and comes back. The store ingests the same texts at the timestamps
Prometheus recorded (read back from ``up``), and both answer the same queries.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from aivitals.tsdb import PrometheusBackend, Store
from tests._servers import prometheus

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PHASES = ["a 1\nb 2\nc 5\n"] * 4 + ["a 1\nc 5\n"] * 3 + ["a 1\nb 3\n"] * 3
QUERIES = [
    "a",
    "b",
    "c",
    "count_over_time(b[10s])",
    "last_over_time(b[1m])",
    "b offset 2s",
    "sum(b) or vector(0)",
    "absent(b)",
    "changes(b[1m])",
]


class _Target:
    def __init__(self) -> None:
        self.served: list[str] = []
        self.lock = threading.Lock()

    def next_text(self) -> str:
        with self.lock:
            text = PHASES[min(len(self.served), len(PHASES) - 1)]
            self.served.append(text)
            return text


def _serve(target: _Target) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = target.next_text().encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture(scope="module")
def scraped() -> Iterator[tuple[Store, PrometheusBackend, list[float]]]:
    target = _Target()
    server = _serve(target)
    port = server.server_address[1]
    config = (
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
        "scrape_configs:\n  - job_name: t\n    static_configs:\n"
        f"      - targets: ['127.0.0.1:{port}']\n"
    )
    try:
        with prometheus(config) as prom_server, PrometheusBackend(prom_server.url) as prom:
            deadline = time.monotonic() + 40
            while len(target.served) < len(PHASES) + 1 and time.monotonic() < deadline:
                time.sleep(0.2)
            assert len(target.served) > len(PHASES), "Prometheus did not scrape enough"
            (up,) = prom.query('up{job="t"}[1m]', time.time()).matrix
            points = up.points[: len(PHASES)]
            if any(v != 1.0 for _, v in points):
                # A failed scrape writes markers for everything; texts no longer line up.
                pytest.skip("a scrape failed (machine overloaded); timeline not comparable")
            times = [t for t, _ in points]
            store = Store()
            labels = {"job": "t", "instance": f"127.0.0.1:{port}"}
            for t, text in zip(times, target.served, strict=False):
                store.ingest_exposition(text, timestamp=t, extra_labels=labels, target="t")
            yield store, prom, times
    finally:
        server.shutdown()
        server.server_close()


def _answer(backend: object, expr: str, at: float) -> dict[tuple[tuple[str, str], ...], float]:
    result = backend.query(expr, at)  # type: ignore[attr-defined]
    if result.type == "scalar":
        return {(): result.scalar[1]}
    return {tuple(sorted(s.labels.items())): s.value for s in result.vector}


def test_staleness_matches_prometheus(
    scraped: tuple[Store, PrometheusBackend, list[float]],
) -> None:
    store, prom, times = scraped
    assert len(times) == len(PHASES)
    checked = 0
    problems = []
    for at in [t + 0.5 for t in times[:-1]]:
        for expr in QUERIES:
            ours, theirs = _answer(store, expr, at), _answer(prom, expr, at)
            checked += 1
            same = ours.keys() == theirs.keys() and all(
                (math.isnan(ours[k]) and math.isnan(theirs[k])) or ours[k] == theirs[k]
                for k in ours
            )
            if not same:
                problems.append(f"{expr} @ {at}: ours {ours} theirs {theirs}")
    assert not problems, "\n".join(problems)
    assert checked == len(QUERIES) * (len(PHASES) - 1)


def test_b_really_went_stale(scraped: tuple[Store, PrometheusBackend, list[float]]) -> None:
    store, _, times = scraped
    # b vanished at scrape 4: right after it, it is absent despite the 5-minute lookback.
    assert store.query("b", times[4] + 0.5).vector == []
    assert store.query("b", times[3] + 0.5).values() == [2.0]
    assert store.query("b", times[7] + 0.5).values() == [3.0]
