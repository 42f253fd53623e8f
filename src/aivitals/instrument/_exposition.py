"""``/metrics`` as a tiny ASGI or WSGI app, single-process or multiprocess.

With ``PROMETHEUS_MULTIPROC_DIR`` set (``uvicorn --workers N``, gunicorn),
every worker writes its values to files there and any worker answers a scrape
with the sum over all of them; per-worker process metrics (RSS, CPU, fds,
threads) are read from ``/proc`` for each live worker and keep a ``pid``
label, since summing two workers' RSS hides which one leaks.

Without that variable, a process whose ``multiprocessing`` workers write to
its children's directory (see ``_multiprocess``) serves its own in-memory
values with the workers' files added: a series both hold is summed (a
counter, a histogram, an in-progress gauge) or takes the larger value (the
gauges whose multiprocess mode is a max).
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

import psutil
from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector

from .. import signals
from . import _multiprocess
from ._metrics import GAUGE_MODES, multiprocess_dir

__all__ = ["WorkerProcessCollector", "mark_worker_dead", "metrics_app", "metrics_wsgi_app"]

Scope = MutableMapping[str, Any]
ASGI = Callable[[Scope, Any, Any], Awaitable[None]]
WSGI = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]

_PID_IN_NAME = re.compile(r"_(\d+)\.db$")


def metrics_app(*, registry: CollectorRegistry | None = REGISTRY) -> ASGI:
    """An ASGI app that answers every GET with the Prometheus exposition.

    In multiprocess mode it aggregates all workers' files (``registry`` is then
    only used for metrics no worker file holds). OpenMetrics is served when
    the scraper asks for it in ``Accept``.

    **Usage**::

        app.mount("/metrics", aivitals.instrument.metrics_app())

    Raises ``ConfigError`` in a forked worker whose parent keeps metrics in
    memory: those would be missing from every scrape it answers.
    """
    _multiprocess.forked_after_metrics()

    async def app(scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        if scope.get("method") not in ("GET", "HEAD"):
            await _respond(send, 405, b"method not allowed\n", b"text/plain; charset=utf-8")
            return
        accept = ""
        for name, value in scope.get("headers", ()):
            if name == b"accept":
                accept = value.decode("latin-1")
        target = _scrape_registry(registry)
        encoder, content_type = choose_encoder(accept)
        body = encoder(target)
        await _respond(send, 200, body if scope["method"] == "GET" else b"", content_type.encode())

    return app


async def _respond(send: Any, status: int, body: bytes, content_type: bytes) -> None:
    headers = [(b"content-type", content_type), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _scrape_registry(registry: CollectorRegistry | None) -> CollectorRegistry | _WithWorkers:
    _multiprocess.forked_after_metrics()  # a fork of a fork-time app: refuse every scrape
    path = multiprocess_dir()
    if not path:
        own = registry if registry is not None else REGISTRY
        children = _multiprocess.children_directory()
        if children is None:
            return own
        _reap_dead_workers(children)
        return _WithWorkers(own, children)
    _reap_dead_workers(path)
    merged = CollectorRegistry()
    MultiProcessCollector(merged, path=path)  # type: ignore[no-untyped-call]
    merged.register(WorkerProcessCollector(path))
    return merged


class _WithWorkers:
    """This process's registry with its ``multiprocessing`` workers' files added."""

    def __init__(self, own: CollectorRegistry, path: str) -> None:
        self.own = own
        self.path = path

    def collect(self) -> Iterable[Metric]:
        families: dict[str, Metric] = {}
        for metric in self.own.collect():
            families[metric.name] = metric
        workers = MultiProcessCollector(None, path=self.path)  # type: ignore[no-untyped-call]
        files = list(workers.collect())  # type: ignore[no-untyped-call]
        for metric in [*files, *WorkerProcessCollector(self.path).collect()]:
            mine = families.get(metric.name)
            families[metric.name] = metric if mine is None else _merge(mine, metric)
        return list(families.values())


def _merge(mine: Metric, theirs: Metric) -> Metric:
    """One family from two processes' views of it: same series added (or maxed)."""
    mode = GAUGE_MODES.get(mine.name, "livesum") if mine.type == "gauge" else "sum"
    out = Metric(mine.name, mine.documentation, mine.type, mine.unit)
    index: dict[tuple[str, tuple[tuple[str, str], ...]], int] = {}
    for sample in [*mine.samples, *theirs.samples]:
        key = (sample.name, tuple(sorted(sample.labels.items())))
        at = index.get(key)
        if at is None:
            index[key] = len(out.samples)
            out.samples.append(sample)
            continue
        old = out.samples[at].value
        if sample.name.endswith("_created"):
            value = min(old, sample.value)  # the series began with the earlier process
        elif "max" in mode:
            value = max(old, sample.value)
        elif "mostrecent" in mode:
            value = sample.value  # the workers' files hold the newer value
        else:
            value = old + sample.value
        out.samples[at] = out.samples[at]._replace(value=value)
    return out


class WorkerProcessCollector:
    """``service_process_*{pid, process="worker"}`` for every live worker of the multiprocess dir.

    A worker is known by the pid in its value files' names; a pid that no
    longer runs yields nothing (its files are for ``mark_worker_dead``).
    """

    def __init__(self, path: str, *, process: str = "worker") -> None:
        self.path = path
        self.process = process

    def collect(self) -> Iterable[Metric]:
        families = _process_families()
        for pid in sorted(self._pids()):
            try:
                proc = psutil.Process(pid)
                with proc.oneshot():
                    values = _process_values(proc)
            except (psutil.Error, OSError):
                continue  # gone between listing and reading: nothing, never a fake 0
            for name, value in values.items():
                if value is not None:
                    families[name].add_metric([str(pid), self.process], value)
        yield from families.values()

    def _pids(self) -> set[int]:
        pids = set()
        for name in glob.glob(os.path.join(self.path, "*.db")):
            match = _PID_IN_NAME.search(name)
            if match:
                pids.add(int(match.group(1)))
        return pids


def _process_families() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in (
        "service_process_resident_memory_bytes",
        "service_process_open_fds",
        "service_process_max_fds",
        "service_process_threads",
        "service_process_cpu_seconds_total",
    ):
        spec = signals.get(name)
        if spec.type is signals.MetricType.COUNTER:
            out[name] = CounterMetricFamily(
                name[: -len("_total")], spec.help, labels=("pid", "process")
            )
        else:
            out[name] = GaugeMetricFamily(name, spec.help, labels=("pid", "process"))
    return out


def _process_values(proc: psutil.Process) -> dict[str, float | None]:
    cpu = proc.cpu_times()
    try:
        fds: float | None = float(proc.num_fds())
    except (psutil.Error, AttributeError):
        fds = None
    try:
        limit = float(proc.rlimit(psutil.RLIMIT_NOFILE)[0])
    except (psutil.Error, AttributeError, OSError):
        limit = None
    return {
        "service_process_resident_memory_bytes": float(proc.memory_info().rss),
        "service_process_open_fds": fds,
        "service_process_max_fds": limit,
        "service_process_threads": float(proc.num_threads()),
        "service_process_cpu_seconds_total": float(cpu.user + cpu.system),
    }


def _reap_dead_workers(path: str) -> None:
    """Drop live-mode gauge files of workers that exited (uvicorn has no exit hook)."""
    from prometheus_client import multiprocess

    dead = set()
    for name in glob.glob(os.path.join(path, "gauge_live*.db")):
        match = _PID_IN_NAME.search(name)
        if match and not psutil.pid_exists(int(match.group(1))):
            dead.add(int(match.group(1)))
    for pid in dead:
        multiprocess.mark_process_dead(pid, path)  # type: ignore[no-untyped-call]


def mark_worker_dead(pid: int, path: str | None = None) -> None:
    """Drop a dead worker's live gauges; call it from gunicorn's ``child_exit`` hook.

    **Usage** (gunicorn.conf.py)::

        def child_exit(server, worker):
            aivitals.instrument.mark_worker_dead(worker.pid)
    """
    from prometheus_client import multiprocess

    directory = path or multiprocess_dir()
    if directory:
        multiprocess.mark_process_dead(pid, directory)  # type: ignore[no-untyped-call]


def metrics_wsgi_app(*, registry: CollectorRegistry | None = REGISTRY) -> WSGI:
    """``metrics_app``'s WSGI twin: every GET or HEAD answered with the exposition.

    **Usage**::

        from werkzeug.middleware.dispatcher import DispatcherMiddleware
        app.wsgi_app = DispatcherMiddleware(app.wsgi_app, {
            "/metrics": aivitals.instrument.metrics_wsgi_app()})
    """
    _multiprocess.forked_after_metrics()

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        method = environ.get("REQUEST_METHOD")
        if method not in ("GET", "HEAD"):
            body = b"method not allowed\n"
            headers = [("Content-Type", "text/plain; charset=utf-8"), ("Allow", "GET, HEAD")]
            start_response("405 Method Not Allowed", [*headers, ("Content-Length", str(len(body)))])
            return [body]
        encoder, content_type = choose_encoder(environ.get("HTTP_ACCEPT", ""))
        body = encoder(_scrape_registry(registry))
        headers = [("Content-Type", content_type), ("Content-Length", str(len(body)))]
        start_response("200 OK", headers)
        return [body if method == "GET" else b""]

    return app
