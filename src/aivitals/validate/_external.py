"""``validate --target URL``: the fault drill against a service aivitals did not start.

``ExternalTarget`` implements ``ValidateTarget`` for a service that already runs at a
URL on this machine. It never starts or stops that service: ``check()`` (run before any
fault) refuses a target that does not answer the user's request template, answers it
with an error, or whose port no local process owns; ``stop()`` stops only what the run
started (its embedded agent, its temp dir). The agent scrapes the target's metrics,
follows the processes holding its port (or ``--pid``), runs the shipped rule pack and
probes the target the way the drill's clients reach it.

Which faults apply is decided per fault from what it needs of a target (``why_not``);
a fault that cannot apply is reported as not tested, with the reason, never as a pass.

**Usage**::

    from aivitals.load import RequestTemplate
    options = ExternalOptions(url="http://127.0.0.1:8300",
                              request=RequestTemplate.load("request.json"))
    why_not("cpu_burn", options)          # None: it applies
    why_not("gpu_memory_leak", options)   # "in-process fault: needs ..."
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import psutil

from ..errors import AivitalsError, ConfigError, ServiceError
from ..load import RequestTemplate, check_target, is_loopback_host, split_url
from ..timescale import TimeScale
from ..tsdb import RemoteConnection
from ._remote import RemoteAlerts

if TYPE_CHECKING:
    from ..chaos import FaultContext

__all__ = [
    "ExternalConfig",
    "ExternalOptions",
    "ExternalService",
    "ExternalTarget",
    "check_answers",
    "external_params",
    "gpu_found",
    "owner_of_port",
    "parse_dependency",
    "why_not",
]

#: The job label of the target's scraped series in the embedded agent.
TARGET_JOB = "target"
#: The blackbox probe's name: the service as its clients see it (the demo's name too).
PROBE_NAME = "client"
#: The prompt of the request ``check`` sends: plain words any model takes.
CHECK_PROMPT = "aivitals validate checks that the service answers"


def parse_dependency(text: str) -> tuple[str, int]:
    """``--dependency HOST:PORT`` as ``(host, port)``.

    The host must be on loopback: the fault that takes the dependency down answers TCP
    to its port with a reset from the run's own nft table on the loopback interface, so
    a dependency on another host would not be touched and the case would prove nothing.
    """
    host, sep, port_text = text.rpartition(":")
    host = host.strip("[]")
    if not sep or not host:
        raise ConfigError(f"--dependency {text!r}: expected HOST:PORT (127.0.0.1:6379)")
    try:
        port = int(port_text)
    except ValueError:
        raise ConfigError(f"--dependency {text!r}: port {port_text!r} is not a number") from None
    if not 0 < port < 65536:
        raise ConfigError(f"--dependency {text!r}: port {port} is not a TCP port")
    if not is_loopback_host(host):
        raise ConfigError(
            f"--dependency {text!r}: only a dependency on loopback can be taken down (the "
            "run resets TCP to its port on the loopback interface); run the drill on the "
            "host where the dependency listens"
        )
    return host, port


@dataclass(frozen=True, kw_only=True)
class ExternalOptions:
    """What the user says about a running service (``validate --target``).

    ``url`` the service's base URL (on this machine); ``request`` what one request to it
    looks like; ``pid`` its process (default: whoever listens on the URL's port);
    ``metrics_path`` where it serves Prometheus metrics; ``sla`` the model SLA the rules
    run with, seconds (None: derived from the baseline the run measures);
    ``chaos_token`` opens its in-process chaos hook (None: in-process faults are not
    tested); ``dependency`` a ``(host, port)`` the drill may take down; ``log`` its JSON
    log, or the directory of its logs, one file per worker (None: the log check is not
    tested); ``prometheus`` and ``alertmanager`` where the user's monitoring evaluates
    and delivers the alerts (None: the embedded agent's engine, ``_remote``);
    ``concurrency`` requests in flight while the run measures the baseline.
    """

    url: str
    request: RequestTemplate
    pid: int | None = None
    metrics_path: str = "/metrics"
    sla: float | None = None
    chaos_token: str | None = None
    dependency: tuple[str, int] | None = None
    log: Path | None = None
    prometheus: str | None = None
    alertmanager: str | None = None
    #: credentials, TLS and headers for ``prometheus`` and ``alertmanager``
    connection: RemoteConnection = field(default_factory=RemoteConnection)
    concurrency: int = 2

    def __post_init__(self) -> None:
        try:
            check_target(self.url)
        except AivitalsError as exc:
            raise ConfigError(f"--target {self.url!r}: {exc}") from exc
        if split_url(self.url)[2] not in ("", "/"):
            raise ConfigError(
                f"--target {self.url!r}: give the service's base URL (http://host:port); "
                "the request's path comes from the template"
            )
        if not self.metrics_path.startswith("/"):
            raise ConfigError(f"--metrics-path {self.metrics_path!r}: must start with '/'")
        if self.pid is not None and self.pid <= 0:
            raise ConfigError(f"--pid {self.pid!r}: expected a process id above 0")
        if self.sla is not None and not (math.isfinite(self.sla) and self.sla > 0):
            raise ConfigError(f"--sla {self.sla!r}: expected seconds above 0")
        if self.chaos_token is not None and not self.chaos_token.strip():
            raise ConfigError("--chaos-token: empty; give the token the chaos hook checks")
        if self.concurrency < 1:
            raise ConfigError(f"concurrency {self.concurrency!r}: expected at least 1")
        for flag, url in (("--prometheus", self.prometheus), ("--alertmanager", self.alertmanager)):
            if url is not None and not url.startswith(("http://", "https://")):
                raise ConfigError(f"{flag} {url!r}: expected an http:// or https:// URL")
        if self.connection != RemoteConnection() and self.prometheus is None:
            raise ConfigError(
                "connection settings are for --prometheus and --alertmanager: give --prometheus"
            )
        if self.alertmanager is not None and self.prometheus is None:
            raise ConfigError(
                "--alertmanager: give --prometheus too (the Prometheus whose rules send to "
                "it: pending alerts and the rules are read there)"
            )
        if self.log is not None:
            from ._runner import LOG_SUFFIXES, log_files

            if not self.log.exists():
                raise ConfigError(
                    f"--log {str(self.log)!r}: no such file or directory; give the service's "
                    "JSON-lines log, or the directory its workers write theirs in"
                )
            if self.log.is_dir() and not log_files(self.log):
                raise ConfigError(
                    f"--log {str(self.log)!r}: a directory without a log file in it (looked "
                    f"for {', '.join('*' + x for x in LOG_SUFFIXES)})"
                )

    @property
    def base(self) -> str:
        return self.url.rstrip("/")

    @property
    def port(self) -> int:
        return split_url(self.url)[1]


def gpu_found() -> bool:
    """A CUDA GPU on this host (``nvidia-smi`` on the PATH): the agent reads it through
    NVML; without one it runs with ``--gpu none`` so GPUMetricsAbsent stays quiet."""
    return shutil.which("nvidia-smi") is not None


def _nft_why_not() -> str | None:
    if os.geteuid() != 0:
        return "needs root for the run's nft table that resets TCP to the dependency"
    if shutil.which("nft") is None:
        return "needs nft (apt-get install nftables)"
    return None


def why_not(fault: str, options: ExternalOptions, *, gpu: bool | None = None) -> str | None:
    """Why ``fault`` cannot be tested against the external target, or None when it can.

    Decided from what the fault needs of a target (its spec's ``Needs`` kind): an
    ``outside`` fault acts as a client; a ``host`` fault on this machine, where the
    service's process was found; a ``root`` fault needs root here; an ``in-process`` one
    the service's chaos hook and its token; a ``redis`` one a dependency the user names
    (and only the outage, never a flush of someone's keys); a ``gpu`` one a device.
    ``gpu`` None: look for one (``gpu_found``).
    """
    from ..chaos import FAULT_SPECS, FAULTS

    if fault not in FAULT_SPECS:
        raise ConfigError(f"unknown fault {fault!r}; known: {', '.join(FAULT_SPECS)}")
    if fault not in FAULTS:
        return "the chaos package has no such fault yet"
    spec = FAULT_SPECS[fault]
    kind = spec.needs.kind
    if kind in ("outside", "host"):
        return None
    if kind == "root":
        return spec.needs.why_not()
    if kind == "in-process":
        if not options.chaos_token:
            return (
                "in-process fault: needs the service's chaos hook (aivitals.chaos.mount(app)) "
                "and its token (--chaos-token or AIVITALS_CHAOS_TOKEN)"
            )
        if spec.needs.device and not (gpu_found() if gpu is None else gpu):
            return (
                "shows only on a GPU the agent reads: none found on this host (no "
                "nvidia-smi), so the hook's leak would have no device to show on"
            )
        return None
    if kind == "gpu" and not (gpu_found() if gpu is None else gpu):
        return "needs a GPU: none found on this host (no nvidia-smi)"
    if spec.needs.external is not None:
        return spec.needs.external
    if kind == "redis":
        if options.dependency is None:
            return (
                "needs a dependency to take down: --dependency HOST:PORT (the service's "
                "Redis or database)"
            )
        return _nft_why_not()
    if kind == "gpu":
        return None
    return f"needs {kind} of a target, which validate --target does not provide"


def external_params(fault: str) -> dict[str, Any]:
    """Parameters a fault must take against a service aivitals did not start, under
    the user's ``-p``: the dependency is blocked, never killed (the run could not hand a
    restarted process back), and a GPU co-tenant runs on the real device."""
    from ..chaos import FAULT_SPECS

    return dict(FAULT_SPECS[fault].needs.external_params)


def _listens(conns: Sequence[Any], port: int) -> bool:
    return any(
        c.status == psutil.CONN_LISTEN and getattr(c.laddr, "port", None) == port for c in conns
    )


def owner_of_port(port: int) -> int:
    """The process that owns the listening TCP ``port``: of the processes holding the
    socket (a pre-forking server's master and its workers), the eldest, whose parent
    does not hold it. ``ConfigError`` when no local process listens there.

    The host's socket table names one holder per socket, whichever it met last (a
    gunicorn worker as often as its master), so the owner is found by climbing from it
    through the parents that hold the same port.
    """
    try:
        conns = psutil.net_connections(kind="tcp")
    except psutil.AccessDenied as exc:
        raise ConfigError(
            f"cannot list the sockets of this host to find who listens on port {port} "
            f"({exc}); give --pid"
        ) from exc
    listening = [c for c in conns if _listens([c], port)]
    pids = sorted({c.pid for c in listening if c.pid})
    if not pids:
        if listening:
            raise ConfigError(
                f"port {port} is listening but its process is not visible to this user; "
                "give --pid, or run as the service's user"
            )
        raise ConfigError(
            f"no process on this host listens on port {port}: validate --target needs the "
            "service running here (its process is where host faults and the agent act)"
        )
    owner = pids[0]
    while True:
        try:
            parent = psutil.Process(owner).parent()
            if parent is None or parent.pid <= 1:
                return owner
            if not _listens(parent.net_connections("tcp"), port):
                return owner
        except psutil.Error:
            return owner
        owner = parent.pid


def _first_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return (lines[0] if lines else "(empty body)")[:200]


def check_answers(options: ExternalOptions, timeout: float = 10.0) -> float:
    """Send the template's request once and fetch the metrics path; the request's
    seconds. ``ConfigError`` naming what went wrong when the target does not answer, or
    answers either with an error (its status and the body's first line)."""
    spec = options.request.render(CHECK_PROMPT)
    url = options.base + spec.path
    what = f"--target {options.url}: {options.request.describe()}"
    t0 = time.monotonic()
    try:
        r = httpx.request(
            spec.method, url, content=spec.body, headers=list(spec.headers), timeout=timeout
        )
    except httpx.HTTPError as exc:
        raise ConfigError(
            f"{what} got no answer ({type(exc).__name__}: {exc or 'no detail'}); is the "
            "service running there?"
        ) from exc
    took = time.monotonic() - t0
    if r.status_code >= 400:
        raise ConfigError(
            f"{what} answered HTTP {r.status_code}: {_first_line(r.text)!r}; fix the request "
            "(--request FILE, or --openai and --model) so the healthy service answers it"
        )
    metrics = options.base + options.metrics_path
    try:
        m = httpx.get(metrics, timeout=timeout)
    except httpx.HTTPError as exc:
        raise ConfigError(f"--metrics-path: GET {metrics} got no answer ({exc})") from exc
    if m.status_code >= 400:
        raise ConfigError(
            f"--metrics-path: GET {metrics} answered HTTP {m.status_code}: "
            f"{_first_line(m.text)!r}; the agent reads the service's own metrics there"
        )
    return took


@dataclass(frozen=True, kw_only=True)
class ExternalConfig:
    """How the external target runs (``TargetConfig``): the time scale of the run, the
    baseline's concurrency and where the GPU signals come from."""

    quick: bool
    workers: int
    gpu_backend: str

    @property
    def scale(self) -> TimeScale:
        return TimeScale.of(self.quick)

    @property
    def tick(self) -> float:
        return self.scale.tick


class ExternalService:
    """The running service (``TargetService``): its URL, pid and optional log."""

    def __init__(self, options: ExternalOptions, pid: int) -> None:
        self.options = options
        self.pid = pid
        self._started = _start_time(pid)

    @property
    def url(self) -> str:
        return self.options.base

    @property
    def log_path(self) -> Path | None:
        return self.options.log

    @property
    def port(self) -> int:
        return self.options.port

    def alive(self) -> bool:
        """Its process (the same one, not a recycled pid) is still there."""
        try:
            p = psutil.Process(self.pid)
            same = abs(p.create_time() - self._started) < 0.5
            return same and p.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

    def exit_code(self) -> int | None:
        return None  # not our child: its exit status is its parent's to read

    def wait_ready(self, timeout: float) -> None:
        """Until the service answers the template's request again; ``ServiceError``
        after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                check_answers(self.options, timeout=min(10.0, timeout))
                return
            except ConfigError as exc:
                if time.monotonic() >= deadline or not self.alive():
                    raise ServiceError(f"the service is not ready: {exc}") from exc
            time.sleep(0.5)


def _start_time(pid: int) -> float:
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error as exc:
        raise ConfigError(f"--pid {pid}: no such process on this host ({exc})") from exc


class ExternalTarget:
    """A running service at a URL, as validate's target (``ValidateTarget``).

    **Usage**::

        target = ExternalTarget(options, quick=True)
        target.check()          # refuses a target that does not answer, before any fault
        target.start()
        target.start_agent({"sla_seconds": 0.5})
        ...
        target.stop()           # the agent and the temp dir; never the service
    """

    def __init__(
        self, options: ExternalOptions, *, quick: bool = False, workdir: Path | None = None
    ) -> None:
        self.options = options
        self.config = ExternalConfig(
            quick=quick,
            workers=options.concurrency,
            gpu_backend="nvml" if gpu_found() else "none",
        )
        self._own_workdir = workdir is None
        self._workdir = workdir
        self._service: ExternalService | None = None
        self._pid: int | None = None
        self.agent: Any = None
        self.engine: Any = None
        self.pack: Any = None
        self.memory: Any = None
        #: the user's Prometheus (and Alertmanager) alerts, with --prometheus
        self.remote: RemoteAlerts | None = None
        if options.prometheus is not None:
            from ..tsdb import PrometheusBackend

            self.remote = RemoteAlerts(
                PrometheusBackend(options.prometheus, timeout=10.0, connection=options.connection),
                options.alertmanager,
                interval=self.config.tick,
                connection=options.connection,
            )
        self.started_at = time.time()
        #: the service's request time in the check: what the run's first look saw
        self.check_seconds: float | None = None

    # -- what validate reads -------------------------------------------------------------
    @property
    def service(self) -> ExternalService:
        if self._service is None:
            raise ServiceError("the target is not checked yet: start() first")
        return self._service

    @property
    def redis(self) -> None:
        return None  # the service's dependencies are the user's; none is the run's

    @property
    def ledger(self) -> None:
        return None  # the run starts no process a fault could hand back

    @property
    def sim_gpu_dir(self) -> None:
        return None  # no simulated GPU: the service's device is real, or there is none

    @property
    def chaos_token(self) -> str:
        return self.options.chaos_token or ""

    @property
    def workdir(self) -> Path:
        if self._workdir is None:
            self._workdir = Path(tempfile.mkdtemp(prefix="aivitals-target-"))
        return self._workdir

    # -- life ------------------------------------------------------------------------------
    def check(self) -> int:
        """Find the service's process and check that it answers; its pid. Every refusal
        is a ``ConfigError`` raised before the run injects anything."""
        if self._pid is None:
            pid = self.options.pid
            if pid is None:
                pid = owner_of_port(self.options.port)
            else:
                _start_time(pid)
            self.check_seconds = check_answers(self.options)
            if self.remote is not None:
                self.remote.check(target_port=self.options.port)
            self._pid = pid
        return self._pid

    def start(self) -> ExternalTarget:
        """Check the service (it is running already: nothing is started)."""
        self._service = ExternalService(self.options, self.check())
        return self

    def start_service(self) -> None:
        raise ServiceError(
            f"the service (pid {self.service.pid}) is gone, and validate --target does not "
            "restart a service it did not start"
        )

    def stop(self) -> None:
        """Stop what the run started: the agent, and the temp dir of the disk faults."""
        agent, self.agent = self.agent, None
        try:
            if self.remote is not None:
                self.remote.stop()
            if agent is not None:
                agent.stop()
        finally:
            if self._own_workdir and self._workdir is not None:
                shutil.rmtree(self._workdir, ignore_errors=True)

    def _agent_config(self) -> Any:
        from ..agent import AgentConfig, ScrapeTarget
        from ..chaos import FAULT_NETNS_GLOB

        tick = self.config.tick
        o = self.options
        return AgentConfig(
            listen="127.0.0.1:0",
            interval=tick,
            scrape=(ScrapeTarget(o.base + o.metrics_path, job=TARGET_JOB),),
            scrape_interval=tick,
            scrape_timeout=max(1.0, tick),
            gpu=self.config.gpu_backend,
            # the process the user named, else every process holding the port (a
            # pre-forking server's workers too)
            pid=o.pid,
            port=None if o.pid is not None else o.port,
            retention=3 * 3600.0,
            # the callers' view: a GET every service answers (its metrics), sent the way
            # the drill's clients come in (through a network fault's proxy while one runs)
            probes={PROBE_NAME: o.base + o.metrics_path},
            netns=(FAULT_NETNS_GLOB,) if os.geteuid() == 0 else (),
        )

    def start_agent(self, rule_params: Mapping[str, Any] | None = None) -> None:
        """The embedded agent with the shipped rule pack at the run's time scale,
        ``rule_params`` on its parameters."""
        from ..agent import Agent
        from ..alerts import RuleEngine, default_pack, load_rules
        from ..demo import for_floors, scale_for
        from ..diagnose import FindingMemory

        if self._service is None:
            raise ServiceError("check the target before starting its agent")
        if self.agent is not None:
            raise ServiceError("the target's agent is already running")
        scale = self.config.scale
        self.pack = default_pack(**{**scale.rule_windows, **(rule_params or {})})
        if self.remote is not None:
            # the rules are the user's Prometheus'; the agent only measures the drill
            self.agent = Agent(self._agent_config())
            self.engine = self.remote
            self.memory = FindingMemory(scale.hold)
            self.agent.set_diagnosis_provider(self._live_diagnosis)
            self.agent.start()
            self.remote.start()
            return
        groups = self.pack.groups
        if scale.compressed:
            groups = load_rules(
                scale_for(self.pack.text, scale.for_factor, floors=for_floors(self.pack.params))
            )
        self.agent = Agent(self._agent_config())
        self.engine = RuleEngine(self.agent.store, groups)
        self.engine.attach(self.agent, default_interval=self.config.tick)
        self.memory = FindingMemory(scale.hold)
        self.agent.set_diagnosis_provider(self._live_diagnosis)
        self.agent.start()

    def _live_diagnosis(self) -> Any:
        d = self.diagnose()
        return d if self.memory is None else self.memory.update(d)

    # -- what runs on it -------------------------------------------------------------------
    def probe_via(self, base_url: str | None) -> None:
        from ..collect import HTTPProbeCollector

        if self.agent is None:
            return
        url = (base_url or self.options.base).rstrip("/") + self.options.metrics_path
        for collector in self.agent.collectors:
            if isinstance(collector, HTTPProbeCollector):
                collector.retarget(PROBE_NAME, url)

    def fault_context(self, **extra: Any) -> FaultContext:
        """The target URL and pid, the user's dependency as the port a dependency fault
        blocks, the chaos token only when given; no simulated GPU, no owner (the run
        restarts nothing of the user's)."""
        from ..chaos import FaultContext

        dep = self.options.dependency
        return FaultContext(
            target=self.options.base,
            service_pid=self.service.pid,
            sim_gpu_dir=None,
            redis_port=None if dep is None else dep[1],
            chaos_token=self.options.chaos_token,
            work_dir=self.workdir,
            request=self.options.request,
            **extra,
        )

    def diagnose(
        self, *, window: float | None = None, end: float | None = None, rate: float | None = None
    ) -> Any:
        from ..demo import diagnose_agent

        if self.remote is not None:
            from ..diagnose import diagnose

            end = time.time() if end is None else end
            span = window if window is not None else max(60.0, end - self.started_at)
            return diagnose(
                self.remote.prometheus,
                end=end,
                window=span,
                alerts=self.remote.history(start=end - span),
                events=self.agent.events(start=end - span) if self.agent is not None else (),
                rate=rate,
            )
        return diagnose_agent(
            self.agent, self.engine, step=self.config.tick, started_at=self.started_at,
            window=window, end=end, rate=rate,
        )  # fmt: skip

    def query(self, expr: str) -> Sequence[Any]:
        if self.agent is None:
            return []
        return list(self.agent.store.query(expr, time.time()).vector)

    def describe(self) -> dict[str, Any]:
        """The target as the report states it."""
        o = self.options
        return {
            "url": o.base,
            "request": o.request.describe(),
            "pid": self._pid,
            "pid_from": "--pid" if o.pid is not None else f"the owner of port {o.port}",
            "metrics": o.base + o.metrics_path,
            "dependency": None if o.dependency is None else f"{o.dependency[0]}:{o.dependency[1]}",
            "log": None if o.log is None else str(o.log),
            "chaos_hook": bool(o.chaos_token),
            "gpu": self.config.gpu_backend,
            "alerts_from": "the embedded agent's engine"
            if self.remote is None
            else self.remote.describe(),
        }
