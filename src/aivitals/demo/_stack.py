"""Everything ``aivitals demo`` and ``aivitals validate`` run, started and stopped as one.

Redis (a private ``redis-server`` on a free port), the demo service (a child
process in its own process group, so a stop takes its threads and children
with it), and the agent in this process: collectors (host, process, the sim
GPU), the scrape of the service, the alert engine on the rule pack, and the
diagnosis on demand. ``stop()`` is idempotent and also runs at exit.

The stack keeps a ledger (``Stack.ledger``, a chaos ``RunDir`` of kind
``"stack"``): its temp dirs and processes, and any process a fault started in
place of one of them (a restarted redis-server), are written there, and its
processes carry the ledger's run marker. ``stop()`` stops everything in it;
after a crash of this process ``aivitals chaos cleanup`` does.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx

from ..collect import HTTPProbeCollector
from ..errors import ConfigError, ServiceError
from ..timescale import QUICK, TimeScale
from ._redis import RedisServer, free_port

__all__ = [
    "FOR_SPANS_WINDOW",
    "PROBE_TARGET",
    "QUICK_RULES",
    "ServiceProcess",
    "Stack",
    "StackConfig",
    "for_floors",
    "scale_for",
]

#: The agent's blackbox probe of the demo service, as its clients reach it.
PROBE_TARGET = "client"

#: The quick time scale's rule windows (``aivitals.timescale.QUICK``) as pack parameters.
QUICK_RULES: dict[str, Any] = dict(QUICK.rule_windows)
#: Rules whose ``for:`` spans a whole window of their own at every time scale, each with
#: the pack parameter of that window. The shipped CacheHitRatioDrop holds for 1m over a
#: 1m hit ratio: five evaluations, two windows of lookups. Divided by 60, quick runs held
#: it for 1 s over a 4 s window of ~20 lookups: two evaluations of one window, and
#: overlapping 4 s windows of a healthy Zipf cache read 1 hit in 14 lookups for 1-2 s in
#: every quick soak recorded, enough to page P1. A real stampede holds it
#: 8-18 s (quick cache_stampede recordings, all three severities), so ``for: 4s`` still
#: fires within its 15 s fault phase.
FOR_SPANS_WINDOW: dict[str, str] = {"CacheHitRatioDrop": "short_window"}
_FOR = re.compile(r"^(\s*for:\s*)(\S+)\s*$")
_INTERVAL = re.compile(r"^(\s*interval:\s*)(\S+)\s*$", re.M)
_RULE = re.compile(r"^\s*-\s*(alert|record):\s*(\S+)\s*$")


def for_floors(params: Any) -> dict[str, float]:
    """Seconds each rule of ``FOR_SPANS_WINDOW`` must hold in a pack rendered with
    ``params`` (a ``PackParams``): its window's length."""
    import promql_parser

    return {
        alert: float(promql_parser.parse_duration(getattr(params, name)).total_seconds())
        for alert, name in FOR_SPANS_WINDOW.items()
    }


def scale_for(text: str, factor: float, *, floors: Mapping[str, float] | None = None) -> str:
    """Divide every ``for:`` of a rule file by ``factor`` (at least 1 s), for short runs.

    ``floors`` (alert name -> seconds, see ``for_floors``): those alerts' ``for:`` is
    divided no lower than that, and never raised above the file's own.
    """
    import promql_parser

    floors = dict(floors or {})
    current: str | None = None
    out: list[str] = []
    for line in text.splitlines(keepends=True):
        body = line.rstrip("\r\n")
        rule = _RULE.match(body)
        if rule:
            current = rule.group(2) if rule.group(1) == "alert" else None
        m = _FOR.match(body)
        if m:
            seconds = float(promql_parser.parse_duration(m.group(2)).total_seconds())
            scaled = max(1, round(seconds / factor))
            if current in floors:
                scaled = max(scaled, min(round(seconds), round(floors[current])))
            line = f"{m.group(1)}{scaled}s{line[len(body) :]}"
        out.append(line)
    return _INTERVAL.sub(lambda m: f"{m.group(1)}1s", "".join(out))


@dataclass(frozen=True, kw_only=True)
class StackConfig:
    """How the stack runs.

    ``quick`` runs it at the compressed time scale (``aivitals.timescale.QUICK``: 1 s
    scrapes and rule evaluation, short rule windows, every ``for:`` divided by 60), else
    the shipped one; ``scale`` is that scale with ``interval`` (the tick) and, in a quick
    stack, ``for_factor`` put in. ``workdir`` keeps logs and the sim GPU state (a temp
    dir when None).
    """

    quick: bool = False
    #: a quick stack's ``for:`` divisor (None: the quick scale's); ignored otherwise
    for_factor: float | None = None
    workers: int = 2
    queue_size: int = 32
    request_timeout: float = 30.0
    use_redis: bool = True
    agent: bool = True
    interval: float | None = None
    workdir: Path | None = None
    service_args: Sequence[str] = ()
    rule_params: dict[str, Any] = field(default_factory=dict)
    ready_timeout: float = 180.0
    #: "sim": GPU work booked on the simulated device; "nvml": a real CUDA GPU (the
    #: service runs its models there, the agent reads NVML); "auto": nvml when
    #: nvidia-smi is on the PATH, else sim.
    gpu: str = "auto"
    #: The service's open-file limit (soft). Small, as in many containers, so that the
    #: connection-flood fault exhausts it as in DOMAIN's incident; None keeps the inherited.
    service_max_fds: int | None = 2200

    def __post_init__(self) -> None:
        if self.for_factor is not None and self.for_factor < 1:
            raise ConfigError(f"for_factor={self.for_factor!r}: expected >= 1")
        if self.workers < 1:
            raise ConfigError(f"workers={self.workers!r}: expected >= 1")
        if self.gpu not in ("auto", "sim", "nvml"):
            raise ConfigError(f"gpu={self.gpu!r}: expected auto, sim or nvml")
        if self.interval is not None and self.interval <= 0:
            raise ConfigError(f"interval={self.interval!r}: expected > 0 seconds")

    @property
    def gpu_backend(self) -> str:
        """``gpu`` with "auto" resolved on this machine."""
        if self.gpu != "auto":
            return self.gpu
        return "nvml" if shutil.which("nvidia-smi") else "sim"

    @property
    def scale(self) -> TimeScale:
        """The time scale the stack runs at."""
        base = TimeScale.of(self.quick)
        factor = self.for_factor if self.quick and self.for_factor is not None else None
        return replace(base, tick=self.interval or base.tick, for_factor=factor or base.for_factor)

    @property
    def tick(self) -> float:
        """Scrape, collect and rule-evaluation period, seconds."""
        return self.scale.tick


class ServiceProcess:
    """``python -m aivitals.demo.serve`` as a child in its own process group."""

    def __init__(
        self,
        *,
        workdir: Path,
        sim_gpu_dir: Path,
        redis_port: int | None,
        chaos_token: str,
        workers: int,
        queue_size: int,
        request_timeout: float,
        port: int,
        max_fds: int | None = None,
        extra_args: Sequence[str] = (),
        device: str = "auto",
        ledger: Any = None,
    ) -> None:
        self.max_fds = max_fds
        self.ledger = ledger
        self.port = port
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = workdir / "service.jsonl"
        self.stdout_path = workdir / "service.out"
        self.chaos_token = chaos_token
        argv = [
            sys.executable, "-m", "aivitals.demo.serve",
            "--port", str(self.port),
            "--sim-gpu-dir", str(sim_gpu_dir),
            "--log-file", str(self.log_path),
            "--workers", str(workers),
            "--queue-size", str(queue_size),
            "--request-timeout", str(request_timeout),
            *(["--redis-port", str(redis_port)] if redis_port else []),
            *extra_args,
        ]  # fmt: skip
        self.argv = argv
        self.env = {
            **os.environ,
            "HF_HUB_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "AIVITALS_CHAOS_TOKEN": chaos_token,
            "AIVITALS_SIM_GPU_DIR": str(sim_gpu_dir),
            "AIVITALS_DEMO_PROBE_INTERVAL": "1",
            "AIVITALS_DEMO_DEVICE": device,
            # torch makes its inductor cache dir in the temp dir on import; inside the
            # workdir it goes with the stack (nothing is compiled, so nothing is lost)
            "TORCHINDUCTOR_CACHE_DIR": str(workdir / "torchinductor"),
        }
        if ledger is not None:
            from ..chaos import RUN_ENV

            # the ledger's marker: a cleanup after a crash finds it, recorded or not
            self.env[RUN_ENV] = ledger.run_id
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise ServiceError("the demo service is not running")
        return self.proc.pid

    def start(self, timeout: float) -> None:
        with self.stdout_path.open("ab") as out:
            self.proc = subprocess.Popen(
                self.argv,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # its own process group: one killpg stops it all
                preexec_fn=self._limit_fds if self.max_fds else None,
            )
        if self.ledger is not None:
            from ..chaos import start_time

            pid = self.proc.pid
            self.ledger.journal.record("process", pid=pid, start=start_time(pid), label="service")
        self.wait_ready(timeout)

    def _limit_fds(self) -> None:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        limit = self.max_fds or soft
        cap = limit if hard == resource.RLIM_INFINITY else min(limit, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (cap, hard))

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last = "no answer"
        while time.monotonic() < deadline:
            code = self.exit_code()
            if code is not None:
                raise ServiceError(f"the demo service exited with {code}: {self.tail()}")
            try:
                r = httpx.get(self.url + "/readyz", timeout=2.0)
                if r.status_code == 200:
                    return
                last = f"/readyz {r.status_code}: {r.text[:300]}"
            except httpx.HTTPError as exc:
                last = f"{type(exc).__name__}"
            time.sleep(0.25)
        raise ServiceError(f"the demo service was not ready within {timeout:g} s ({last})")

    def exit_code(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def tail(self, chars: int = 2000) -> str:
        try:
            return self.stdout_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self, timeout: float = 10.0) -> None:
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)


class Stack:
    """Redis + the demo service + the agent (+ rule engine and diagnosis).

    **Usage**::

        with Stack(StackConfig(quick=True)) as stack:
            print(stack.service.url, stack.agent.url)
            stack.engine.active()
            stack.diagnose(window=120)
    """

    def __init__(self, config: StackConfig | None = None) -> None:
        self.config = config or StackConfig()
        self._own_workdir = self.config.workdir is None
        self.workdir = self.config.workdir or Path(tempfile.mkdtemp(prefix="aivitals-stack-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.sim_gpu_dir = self.workdir / "sim-gpu"
        self.chaos_token = secrets.token_urlsafe(24)
        self.service_port = free_port()
        self.redis: RedisServer | None = None
        self._service: ServiceProcess | None = None
        self.agent: Any = None
        self.engine: Any = None
        self.pack: Any = None
        #: the live diagnosis's findings with memory (the agent's page, the demo's report)
        self.memory: Any = None
        self.started_at = time.time()
        self._stopped = threading.Event()
        #: the stack's ledger (chaos ``RunDir``, kind "stack"): what it started, for cleanup
        self.ledger: Any = None
        #: processes that faults started in place of the stack's own (handed back)
        self.replacements: list[Any] = []
        self._adopt_lock = threading.Lock()

    @property
    def service(self) -> ServiceProcess:
        """The demo service; ``ServiceError`` before ``start()``."""
        if self._service is None:
            raise ServiceError("the demo service is not running: start the stack first")
        return self._service

    # --- life ---------------------------------------------------------------------------
    def start(self) -> Stack:
        from ..chaos import RunDir, default_root

        atexit.register(self.stop)
        try:
            try:
                self.ledger = RunDir.create(default_root(), kind="stack")
            except OSError as exc:
                raise ServiceError(
                    f"cannot write the stack's ledger under {default_root()} ({exc}); set "
                    "AIVITALS_CHAOS_DIR to a directory you can write"
                ) from exc
            if self._own_workdir:
                self.ledger.journal.record("path", path=str(self.workdir))
            self._start_redis()
            self.start_service()
            if self.config.agent:
                self._start_agent()
        except BaseException:
            self.stop()
            raise
        return self

    def _start_redis(self) -> None:
        if self.config.use_redis and shutil.which("redis-server"):
            self.redis = RedisServer(ledger=self.ledger).start()

    def start_service(self) -> None:
        """Start (or restart, after it died) the demo service."""
        if self._service is not None:
            self._service.stop()
        self._service = ServiceProcess(
            workdir=self.workdir,
            sim_gpu_dir=self.sim_gpu_dir,
            redis_port=None if self.redis is None else self.redis.port,
            chaos_token=self.chaos_token,
            workers=self.config.workers,
            queue_size=self.config.queue_size,
            request_timeout=self.config.request_timeout,
            port=self.service_port,
            max_fds=self.config.service_max_fds,
            extra_args=self.config.service_args,
            # the models run where the GPU signals come from: the real device, or
            # the CPU with their work booked on the simulated one
            device="cuda" if self.config.gpu_backend == "nvml" else "cpu",
            ledger=self.ledger,
        )
        self._service.start(self.config.ready_timeout)

    def _agent_config(self) -> Any:
        from ..agent import AgentConfig, ScrapeTarget
        from ..chaos import FAULT_NETNS_GLOB

        tick = self.config.tick
        return AgentConfig(
            listen="127.0.0.1:0",
            interval=tick,
            scrape=(ScrapeTarget(self.service.url + "/metrics", job="demo"),),
            scrape_interval=tick,
            scrape_timeout=max(1.0, tick),
            gpu=self.config.gpu_backend,
            sim_gpu_dir=str(self.sim_gpu_dir),
            # by port, not pid: a restarted service keeps its port, so the agent follows it
            port=self.service.port,
            retention=3 * 3600.0,
            # the callers' view: /healthz probed the way clients come in (retargeted
            # through a network fault's path while one runs; see probe_via)
            probes={PROBE_TARGET: self.service.url + "/healthz"},
            # a network fault's proxy answers the clients from its own namespace, as a
            # container's or a sidecar's stack would: its resent segments are counted
            # there, never in the host's /proc/net/snmp (none exists without a fault)
            netns=(FAULT_NETNS_GLOB,),
        )

    def probe_via(self, base_url: str | None) -> None:
        """Probe the service through ``base_url`` (a fault's client path); None: directly."""
        if self.agent is None or self._service is None:
            return
        url = (base_url or self.service.url).rstrip("/") + "/healthz"
        for collector in self.agent.collectors:
            if isinstance(collector, HTTPProbeCollector):
                collector.retarget(PROBE_TARGET, url)

    def start_agent(self, rule_params: Mapping[str, Any] | None = None) -> None:
        """Start the agent and its rules on a stack started with ``agent=False``.

        For a caller that must measure the running service before it knows the rules'
        parameters: validate sets the model SLA from the demo model's measured speed on
        this machine. ``rule_params`` are added to the config's (they win).
        """
        if self._service is None:
            raise ServiceError("start the stack before its agent")
        if self.agent is not None:
            raise ServiceError("the stack's agent is already running")
        self.config = replace(
            self.config, agent=True, rule_params={**self.config.rule_params, **(rule_params or {})}
        )
        self._start_agent()

    def _start_agent(self) -> None:
        from ..agent import Agent
        from ..alerts import RuleEngine

        self.pack = self.rule_pack()
        self.agent = Agent(self._agent_config())
        self.engine = RuleEngine(self.agent.store, self.pack_groups())
        self.engine.attach(self.agent, default_interval=self.config.tick)
        self.memory = self.finding_memory()
        self.agent.set_diagnosis_provider(self.live_diagnosis)
        self.agent.start()

    def rule_pack(self) -> Any:
        from ..alerts import default_pack

        params = {**self.config.scale.rule_windows, **self.config.rule_params}
        return default_pack(**params)

    def pack_groups(self) -> Any:
        from ..alerts import load_rules

        scale = self.config.scale
        if not scale.compressed:
            return self.pack.groups
        return load_rules(
            scale_for(self.pack.text, scale.for_factor, floors=for_floors(self.pack.params))
        )

    def stop(self) -> None:
        if self._stopped.is_set():
            return
        self._stopped.set()
        atexit.unregister(self.stop)
        errors: list[str] = []
        steps: list[tuple[str, Any]] = [("agent", self.agent), ("service", self._service)]
        steps.append(("redis", self.redis))
        for name, part in steps:
            try:
                if part is not None:
                    part.stop()
            except Exception as exc:  # one part failing to stop must not keep the rest up
                errors.append(f"{name}: {exc}")
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
        errors += self._close_ledger()
        if errors:
            raise ServiceError("stopping the stack: " + "; ".join(errors))

    def _close_ledger(self) -> list[str]:
        """Stop whatever the ledger still holds (a replacement handed over by a
        fault, a process of a failed start), then remove it."""
        from ..chaos import replay

        if self.ledger is None:
            return []
        errors = replay(self.ledger)
        if not errors:
            self.ledger.remove()
        return [f"ledger {self.ledger.path}: {e}" for e in errors]

    def adopt(self, replacement: Any) -> None:
        """Take a process a fault started in place of one of ours as our own
        (``FaultContext.on_replace``); it is already in the ledger."""
        with self._adopt_lock:
            self.replacements.append(replacement)
            redis = self.redis
            if replacement.role == "redis-server" and redis and replacement.port == redis.port:
                redis.adopt(replacement.pid, replacement.start)

    def __enter__(self) -> Stack:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # --- what runs on it ------------------------------------------------------------------
    def fault_context(self, **extra: Any) -> Any:
        from ..chaos import FaultContext

        return FaultContext(
            target=self.service.url,
            service_pid=self.service.pid,
            sim_gpu_dir=self.sim_gpu_dir,
            redis_port=None if self.redis is None else self.redis.port,
            redis_pid=None if self.redis is None else self.redis.pid,
            chaos_token=self.chaos_token,
            work_dir=self.workdir,
            owner=None if self.ledger is None else self.ledger.path,
            on_replace=self.adopt,
            **extra,
        )

    def diagnose(
        self, *, window: float | None = None, end: float | None = None, rate: float | None = None
    ) -> Any:
        return diagnose_agent(
            self.agent, self.engine, step=self.config.tick, started_at=self.started_at,
            window=window, end=end, rate=rate,
        )  # fmt: skip

    def finding_memory(self) -> Any:
        """A ``FindingMemory`` whose hold follows the rule pack this stack runs: two of its
        rate windows (16 s at quick runs' 8 s, two minutes at the demo's compressed 60 s
        and the shipped minute), since a rate forgets a burst within one window."""
        import promql_parser

        from ..diagnose import FindingMemory, hold_for

        window = self.config.rule_params.get("rate_window")
        if window is None:
            return FindingMemory(self.config.scale.hold)
        return FindingMemory(hold_for(promql_parser.parse_duration(window).total_seconds()))

    def live_diagnosis(self) -> Any:
        """The diagnosis now, through the stack's memory: successive looks keep a finding
        that led until its evidence has been gone for the hold period."""
        d = self.diagnose()
        return d if self.memory is None else self.memory.update(d)

    def query(self, expr: str) -> list[Any]:
        """Instant query on the agent's store; [] when there is no agent or no data."""
        if self.agent is None:
            return []
        return list(self.agent.store.query(expr, time.time()).vector)

    def firing(self) -> list[Any]:
        return [] if self.engine is None else list(self.engine.firing())


def diagnose_agent(
    agent: Any,
    engine: Any,
    *,
    step: float,
    started_at: float,
    window: float | None = None,
    end: float | None = None,
    rate: float | None = None,
) -> Any:
    """The diagnosis over an agent's store with its alert history and events, for the
    last ``window`` seconds (default: since ``started_at``, at least a minute); the
    demo stack and validate's outside target both read their agent this way."""
    from ..diagnose import diagnose

    end = time.time() if end is None else end
    span = window if window is not None else max(60.0, end - started_at)
    start = end - span
    return diagnose(
        agent.store,
        end=end,
        window=span,
        step=step,
        alerts=engine.history(start=start) if engine is not None else (),
        events=agent.events(start=start) if agent is not None else (),
        rate=rate,
    )
