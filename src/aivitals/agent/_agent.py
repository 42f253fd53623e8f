"""The long-running agent: collectors and scrapes on a schedule, the store, the HTTP API."""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..collect import BaseCollector, Collector, Event, Scraper, health_samples, reason_of
from ..errors import ConfigError, ExpositionError, StoreError
from ..signals import Sample
from ..tsdb import AppendStats, Store
from ._build import build_collectors
from ._config import AgentConfig, parse_listen
from ._exposition import render
from ._schedule import Job

__all__ = ["Agent"]

log = logging.getLogger("aivitals.agent")


class Agent:
    """Runs collectors and scrapes, keeps their samples, serves them over HTTP.

    **Usage**::

        agent = Agent(AgentConfig(listen="127.0.0.1:0", gpu="sim"))
        agent.start()
        agent.add_periodic("rules", 5.0, lambda now: engine.evaluate(now))
        agent.store.query("host_load1")
        print(agent.url)            # http://127.0.0.1:<port>
        agent.stop()
    """

    def __init__(
        self, config: AgentConfig | None = None, *, collectors: Sequence[Collector] | None = None
    ) -> None:
        self.config = config or AgentConfig()
        cfg = self.config
        self.collectors: list[Collector] = (
            list(collectors) if collectors is not None else build_collectors(cfg)
        )
        names = [c.name for c in self.collectors]
        if len(set(names)) != len(names):
            raise ValueError(f"collector names must be unique, got {names}")
        self._store: Store | None = (
            None if cfg.exporter else Store(retention=cfg.retention, max_series=cfg.max_series)
        )
        #: the GPU backend this agent runs, exported as aivitals_gpu_backend_info so that
        #: GPUMetricsAbsent (here or on a Prometheus) stays quiet on a machine without one
        self.gpu_backend = _gpu_backend(
            self.collectors, asked=cfg.gpu if collectors is None else "none"
        )
        self.scrapers = [
            Scraper(t.url, job=t.job, timeout=cfg.scrape_timeout, max_bytes=cfg.scrape_max_bytes)
            for t in cfg.scrape
        ]
        self._latest: dict[str, list[Sample]] = {}
        self._agent_errors: dict[str, Counter[str]] = {n: Counter() for n in names}
        self._scrape_errors: dict[str, Counter[str]] = {s.url: Counter() for s in self.scrapers}
        self._timed_out: dict[str, float] = {}
        self._appended = 0
        self._rejected: Counter[str] = Counter()
        self._events: deque[Event] = deque(maxlen=10_000)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._jobs: dict[str, Job] = {}
        self._collector_jobs: list[tuple[Collector, Job]] = []
        self._periodic: list[Job] = []
        self.alerts_provider: Callable[[], Any] | None = None
        self.rules_provider: Callable[[], Any] | None = None
        #: what /api/v1/alerts and /api/v1/rules say while no rule engine serves them
        self.rules_off_reason = "no rule engine runs in this agent: it evaluates no rules"
        self.diagnosis_provider: Callable[[], Any] | None = None
        self._server: Any = None
        self.started = False
        self.ready = False

    # --- public API ------------------------------------------------------------------
    @property
    def store(self) -> Store:
        """The embedded store (absent in exporter mode)."""
        if self._store is None:
            raise StoreError("the agent runs in exporter mode: it keeps no store")
        return self._store

    @property
    def has_store(self) -> bool:
        return self._store is not None

    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("the agent's HTTP server is not running")
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def add_periodic(self, name: str, interval: float, fn: Callable[[float], None]) -> None:
        """Run ``fn(wall_time)`` every ``interval`` s on the agent's clock (rules, diagnosis)."""
        if name in self._jobs:
            raise ValueError(f"a job named {name!r} is already scheduled")
        job = Job(name, interval, fn)
        self._jobs[name] = job
        self._periodic.append(job)
        if self.started:
            job.start(self._stop)

    def set_alerts_provider(self, fn: Callable[[], Any]) -> None:
        """``fn()`` answers ``/api/v1/alerts``: a list of alert events (or a JSON-able dict)."""
        self.alerts_provider = fn

    def set_rules_provider(self, fn: Callable[[], Any]) -> None:
        """``fn()`` answers ``/api/v1/rules``: ``{"groups": [...]}`` in Prometheus's shape."""
        self.rules_provider = fn

    def set_diagnosis_provider(self, fn: Callable[[], Any]) -> None:
        """``fn()`` answers ``/api/v1/diagnosis``: an object with ``to_json()`` or a dict."""
        self.diagnosis_provider = fn

    def serve_diagnosis(self, window: float = 900.0, hold: float | None = None) -> Any:
        """Answer ``/api/v1/diagnosis`` with the diagnosis of this agent's own store over the
        last ``window`` seconds (its events included), through one ``FindingMemory``: each
        request is another look at the same service, so a finding that led keeps leading
        until its evidence has been gone for ``hold`` (default: two minutes). Returns the
        memory."""
        from ..diagnose import FindingMemory, diagnose

        store = self.store  # StoreError in exporter mode: nothing to diagnose
        if not (math.isfinite(window) and window > 0):
            raise ConfigError(f"serve_diagnosis: window must be > 0 seconds, got {window!r}")
        memory = FindingMemory(hold)

        def latest() -> Any:
            end = time.time()
            d = diagnose(store, end=end, window=window, events=self.events(end - window, end))
            return memory.update(d)

        self.diagnosis_provider = latest
        return memory

    def events(self, start: float | None = None, end: float | None = None) -> list[Event]:
        """Kernel-log and GPU events seen so far (for the diagnosis), oldest first."""
        with self._lock:
            events = list(self._events)
        return [
            e
            for e in events
            if (start is None or e.time >= start) and (end is None or e.time <= end)
        ]

    def samples(self) -> list[Sample]:
        """The latest samples of every collector and scrape (what /metrics shows)."""
        with self._lock:
            return [s for group in self._latest.values() for s in group]

    def metrics_text(self) -> str:
        return render(self.samples())

    def collect_once(self, at: float | None = None) -> None:
        """Run every collector once on this thread, its samples stamped ``at`` (default:
        now) (tests, ``aivitals collectors``)."""
        now = time.time() if at is None else at
        for c in self.collectors:
            self._run_collector(c, now)
        for s in self.scrapers:
            self._run_scrape(s, now)
        self._run_self(now)

    def start(self) -> None:
        """Start the schedule and the HTTP server; returns at once."""
        if self.started:
            return
        if self._stop.is_set():
            raise RuntimeError("a stopped agent cannot be restarted; make a new Agent")
        from ._http import serve

        host, port = parse_listen(self.config.listen, allow_remote=self.config.allow_remote)
        self._server = serve(self, host, port)
        interval = self.config.interval
        # the agent's own series (its GPU backend among them) exist before anything runs
        self._run_self(time.time())
        for c in self.collectors:
            job = Job(f"collect-{c.name}", interval, self._collector_fn(c))
            self._collector_jobs.append((c, job))
            self._jobs[job.name] = job
        for i, s in enumerate(self.scrapers):
            # Spread scrapes over the interval so they do not all land at once.
            job = Job(f"scrape-{s.url}", self.config.scrape_interval, self._scrape_fn(s))
            self._jobs[job.name] = job
            job.start(self._stop, first_delay=i * self.config.scrape_interval / len(self.scrapers))
        self._jobs["self"] = Job("self", interval, self._run_self)
        for _, job in self._collector_jobs:
            job.start(self._stop)
        self._jobs["self"].start(self._stop, first_delay=interval / 2)
        for job in self._periodic:
            # one collector period later: the first rule evaluation sees the collectors'
            # first samples, instead of paging absent() rules on a store still empty
            job.start(self._stop, first_delay=interval)
        self.started = True
        threading.Thread(target=self._mark_ready, daemon=True, name="aivitals-ready").start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the schedule and the server; idempotent."""
        self._stop.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        deadline = time.monotonic() + timeout
        for job in self._jobs.values():
            job.join(max(0.0, deadline - time.monotonic()))
        for c in self.collectors:
            close = getattr(c, "close", None)
            if callable(close):
                try:
                    close()
                except Exception:  # closing must not stop the others closing
                    log.exception("closing collector %s failed", c.name)
        self.started = False

    def __enter__(self) -> Agent:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- the runs --------------------------------------------------------------------
    def _mark_ready(self) -> None:
        # Ready once every collector has reported once (or after 3 intervals).
        deadline = time.monotonic() + 3 * self.config.interval + self.config.timeout
        while time.monotonic() < deadline and not self._stop.is_set():
            with self._lock:
                if all(c.name in self._latest for c in self.collectors):
                    break
            time.sleep(0.05)
        self.ready = True

    def _collector_fn(self, c: Collector) -> Callable[[float], None]:
        return lambda now: self._run_collector(c, now)

    def _scrape_fn(self, s: Scraper) -> Callable[[float], None]:
        return lambda now: self._run_scrape(s, now)

    def _run_collector(self, c: Collector, now: float) -> None:
        start = time.perf_counter()
        if isinstance(c, BaseCollector):
            result = c.run()
            samples, ok = result.samples, result.ok
        else:
            try:
                samples, ok = list(c.collect()), True
            except Exception as exc:  # a third-party collector that broke its contract
                samples, ok = [], False
                with self._lock:
                    self._agent_errors[c.name][reason_of(exc)] += 1
        duration = time.perf_counter() - start
        health = health_samples(c.name, ok=ok, duration=duration, errors=self._errors_of(c))
        self._publish(c.name, [*samples, *health], now)
        drain = getattr(c, "drain_events", None)
        if callable(drain):
            events = drain()
            if events:
                with self._lock:
                    self._events.extend(events)

    def _errors_of(self, c: Collector) -> dict[str, int]:
        counts: Counter[str] = Counter()
        if isinstance(c, BaseCollector):
            counts.update(c.error_counts())
        with self._lock:
            counts.update(self._agent_errors[c.name])
        return dict(counts)

    def _run_scrape(self, s: Scraper, now: float) -> None:
        result = s.fetch()
        errors = self._scrape_errors[s.url]
        labels = {"job": s.job, "instance": s.instance}
        if result.ok and self._store is not None:
            assert result.text is not None
            try:
                stats = self._store.ingest_exposition(
                    result.text, timestamp=now, extra_labels=labels, target=s.url
                )
                self._count_append(stats)
            except ExpositionError:
                result = type(result)(None, "parse", result.duration, result.nbytes)
        if not result.ok:
            errors[result.reason] += 1
            self._mark_target_stale(s, now, labels)
        self._publish(f"scrape {s.url}", s.health_samples(result, dict(errors)), now)

    def _mark_target_stale(self, s: Scraper, now: float, labels: dict[str, str]) -> None:
        # As Prometheus does: a failed scrape makes the target's series stale.
        if self._store is None:
            return
        try:
            self._store.ingest_exposition("", timestamp=now, extra_labels=labels, target=s.url)
        except (ExpositionError, StoreError):
            pass

    def _run_self(self, now: float) -> None:
        self._check_hung(now)
        out = [Sample("aivitals_gpu_backend_info", {"backend": self.gpu_backend}, 1.0)]
        if self._store is not None:
            out.append(Sample("aivitals_tsdb_series", {}, float(self._store.series_count)))
            out.append(Sample("aivitals_tsdb_samples_appended_total", {}, float(self._appended)))
            out += [
                Sample("aivitals_tsdb_samples_rejected_total", {"reason": r}, float(n))
                for r, n in sorted(self._rejected.items())
            ]
        self._publish("agent", out, now)

    def _check_hung(self, now: float) -> None:
        timeout = self.config.timeout
        mono = time.monotonic()
        for c, job in self._collector_jobs:
            since = job.running_since
            if since is None or mono - since <= timeout or self._timed_out.get(c.name) == since:
                continue
            # The run is still going: report the collector down now, keep its thread.
            self._timed_out[c.name] = since
            with self._lock:
                self._agent_errors[c.name]["timeout"] += 1
            health = health_samples(
                c.name, ok=False, duration=mono - since, errors=self._errors_of(c)
            )
            self._publish(c.name, health, now)

    def _publish(self, key: str, samples: list[Sample], now: float) -> None:
        with self._lock:
            self._latest[key] = samples
        if self._store is not None and samples:
            try:
                # per collector, as a scrape per target: what it stopped reporting
                # (an exited GPU process, a removed namespace) goes stale now
                stats = self._store.append_samples(
                    samples, default_timestamp=now, target=f"collector:{key}"
                )
                self._count_append(stats)
            except StoreError:
                log.exception("store refused samples of %s", key)

    def _count_append(self, stats: AppendStats) -> None:
        with self._lock:
            self._appended += stats.appended
            self._rejected.update(stats.rejected)


#: Signs of NVIDIA hardware on a node, present even when no backend can read it.
NVIDIA_SIGNS = (Path("/proc/driver/nvidia"), Path("/dev/nvidiactl"), Path("/dev/nvidia0"))


def _gpu_backend(
    collectors: Sequence[Collector], *, asked: str = "none", signs: Sequence[Path] = NVIDIA_SIGNS
) -> str:
    """The backend of the GPU collector (nvml, smi, sim); "unreadable" when ``--gpu auto``
    found none on a node that shows NVIDIA hardware; else "none".

    A node whose driver or devices are visible but which no backend could read (a broken
    driver, NVML missing) is the blindness GPUMetricsAbsent exists to page: declaring it
    "none" would silence that alert exactly there.
    """
    for c in collectors:
        if c.name == "gpu":
            return str(getattr(getattr(c, "backend", None), "name", None) or "other")
    if asked == "auto" and any(p.exists() for p in signs):
        return "unreadable"
    return "none"
