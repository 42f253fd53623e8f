"""Multiprocess exposition without a server: worker processes write, another scrapes."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from aivitals.instrument._multiprocess import ENV, ROOT_ENV
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


def _run(*args: str, tmpdir: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``_mp_workers`` as a fresh root process (no variables from this test run)."""
    env = {k: v for k, v in os.environ.items() if k not in (ENV, ROOT_ENV)}
    env["PYTHONPATH"] = f"{REPO / 'src'}{os.pathsep}{REPO}"
    if tmpdir is not None:
        env["TMPDIR"] = str(tmpdir)
    return subprocess.run(
        [sys.executable, "-m", "tests.instrument._mp_workers", *args],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _root(*args: str) -> str:
    done = _run(*args)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _calls(text: str) -> float:
    got = _values(text, "model_inference_time_seconds_count")
    assert len(got) == 1, got  # one series: the root's and the workers' counts added
    return got[0][1]


@pytest.mark.slow
@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_multiprocessing_workers_reach_the_roots_metrics(method: str) -> None:
    """Without PROMETHEUS_MULTIPROC_DIR, every worker's model calls add to the root's
    exposition: one in the root, four in a process pool, one in a Process."""
    out = _root("pool", method)
    pids = out.splitlines()[0].split()[2:]
    assert str(os.getpid()) not in pids and len(set(pids)) >= 2  # real other processes
    assert _calls(out) == 6.0
    assert [v for _, v in _values(out, "model_info")] == [1.0]


def test_a_live_worker_shows_its_process_and_a_dead_one_its_counts_only() -> None:
    out = _root("alive", "fork")
    pid = out.splitlines()[0].split()[2]
    first, second = out.split("\n---\n")
    assert _calls(first) == 1.0
    assert [labels["pid"] for labels, _ in _values(first, "service_process_threads")] == [pid]
    assert _calls(second) == 1.0  # a count outlives its worker
    assert _values(second, "service_process_threads") == []  # its process does not


def test_a_fork_serving_metrics_of_a_root_with_metrics_is_refused_with_the_fix() -> None:
    """A forked API server cannot show what its parent keeps in memory: it refuses at
    ``metrics_app()`` (the middleware's start), naming both ways out."""
    out = _root("served", "fork")
    assert "this process (pid" in out and "serves /metrics" in out
    assert "made metrics in its own memory (" in out and "model_aborts_total" in out
    assert "serve /metrics from that process" in out
    assert "export PROMETHEUS_MULTIPROC_DIR set to an empty directory" in out


def test_a_worker_without_a_shared_directory_is_refused_at_start(tmp_path: Path) -> None:
    """Where the directory cannot be made, the worker fails as aivitals loads (its first
    metric is made at import), with the fix, instead of recording into a memory that
    nobody scrapes."""
    (tmp_path / f"aivitals-prometheus-{os.getuid()}").write_text("not a directory")
    done = _run("unshared", "spawn", tmpdir=tmp_path)
    assert done.returncode == 0 and "# exitcode 1" in done.stdout
    assert "ConfigError" in done.stderr and "cannot be made" in done.stderr
    assert "export PROMETHEUS_MULTIPROC_DIR set to an empty directory" in done.stderr


def test_an_unrelated_subprocess_does_not_join_the_root() -> None:
    """Only multiprocessing workers join: a program the root merely starts (a server
    of its own) inherits the variable but keeps its metrics to itself."""
    assert _calls(_root("unrelated")) == 1.0


def test_the_roots_directory_is_gone_after_it_exits() -> None:
    out = _root("pool", "fork")
    directory = out.splitlines()[1].split()[2]
    assert directory.startswith(tempfile.gettempdir())  # the workers made it
    assert not Path(directory).exists()


def test_merging_two_processes_views_adds_counts_and_maxes_max_gauges() -> None:
    from prometheus_client.metrics_core import Metric

    from aivitals.instrument._exposition import _merge

    def fam(name: str, kind: str, samples: list[tuple[str, float]]) -> Metric:
        out = Metric(name, "h", kind)
        for sample, value in samples:
            out.add_sample(sample, {"model": "m"}, value)
        return out

    hist = _merge(
        fam("h", "histogram", [("h_count", 2.0), ("h_created", 50.0)]),
        fam("h", "histogram", [("h_count", 3.0), ("h_created", 40.0)]),
    )
    assert {s.name: s.value for s in hist.samples} == {"h_count": 5.0, "h_created": 40.0}
    info = _merge(
        fam("model_info", "gauge", [("model_info", 1.0)]),
        fam("model_info", "gauge", [("model_info", 1.0)]),
    )
    assert [s.value for s in info.samples] == [1.0]  # livemax: one model, not two
