"""Multiprocess exposition without a server: worker processes write, another scrapes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tests._servers import promtool

REPO = Path(__file__).resolve().parents[2]

WORKER = """
from aivitals.instrument._metrics import family
family("http_requests_in_flight").labels("GET", "/x").inc(5)
family("http_request_duration_seconds").labels("GET", "/x", "2xx", "200").observe(0.1)
family("model_load_time_seconds").labels("m", "v1").set(2.5)
family("model_info").labels("m", "v1", "cpu").set(1)
"""

SCRAPE = """
import asyncio
from aivitals.instrument import metrics_app
app = metrics_app()
out = []
async def send(message):
    out.append(message)
asyncio.run(app({"type": "http", "method": "GET", "headers": []}, None, send))
print(out[1]["body"].decode())
"""


def _python(code: str, mp_dir: Path) -> str:
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(mp_dir), "PYTHONPATH": str(REPO / "src")}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _values(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    return [
        (s.labels, s.value)
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name == name
    ]


def test_dead_workers_keep_counts_but_drop_live_gauges(tmp_path: Path) -> None:
    mp_dir = tmp_path / "mp"
    mp_dir.mkdir()
    _python(WORKER, mp_dir)  # a worker that exited
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(mp_dir), "PYTHONPATH": str(REPO / "src")}
    alive = subprocess.Popen(
        [sys.executable, "-c", WORKER + "import sys\nprint('ready', flush=True)\nsys.stdin.read()"],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert alive.stdout is not None and alive.stdout.readline().strip() == "ready"
        text = _python(SCRAPE, mp_dir)
    finally:
        assert alive.stdin is not None
        alive.stdin.close()
        alive.wait(30)
    counts = _values(text, "http_request_duration_seconds_count")
    assert [v for _, v in counts] == [2.0]  # histograms sum over all workers, dead or alive
    assert [v for _, v in _values(text, "http_requests_in_flight")] == [5.0]  # the live one's
    assert [v for _, v in _values(text, "model_info")] == [1.0]  # Info as a gauge of 1
    assert [v for _, v in _values(text, "model_load_time_seconds")] == [2.5]
    rss = _values(text, "service_process_resident_memory_bytes")
    assert [labels["pid"] for labels, _ in rss] == [str(alive.pid)]
    assert len(list(mp_dir.glob("gauge_livesum_*.db"))) == 1  # the dead worker's went
    result = promtool("check", "metrics", input_text=text)
    assert result.returncode == 0, result.stdout + result.stderr


def test_mark_worker_dead_is_harmless_without_multiprocess() -> None:
    from aivitals.instrument import mark_worker_dead

    assert mark_worker_dead(12345678, None) is None  # no directory configured: nothing to do
