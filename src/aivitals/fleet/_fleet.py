"""A fleet of SIMULATED nodes on one machine, watched by the real engines.

Each node is a demo service replica plus ``aivitals agent --exporter`` with its
own simulated GPU (its own state directory, so a fault injected on one node's
GPU stays there). One real Prometheus scrapes every node with the exported rule
pack and sends alerts to a real Alertmanager, which posts them to a webhook
receiver that records them; VictoriaMetrics single-node scrapes the same
targets (``-promscrape.config``) and ``vmalert`` evaluates the same pack into
the same Alertmanager. Every node's series carry ``node="sim-node-<i>"`` (a
scrape-config target label): the nodes are simulated and their name says so,
and every GPU series carries ``backend="sim"``.

Everything is a detached process recorded in a state file (pid and start
time), so ``aivitals fleet down`` (or :meth:`Fleet.down`) stops all of it even
from another process.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import secrets
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx
import yaml

from .._ports import free_port
from .._tempdir import temp_root
from ..errors import AlreadyRunning, ConfigError, ServiceError
from ..timescale import TimeScale
from ._procs import Proc, alive, spawn, stop_all
from ._receiver import read_alerts

__all__ = ["NODE_PREFIX", "Fleet", "FleetConfig", "FleetNode", "default_state_path"]

#: Node names: the ``node`` label of every series of node i is ``sim-node-<i>``.
NODE_PREFIX = "sim-node-"
_STATE_VERSION = 1


def _duration(seconds: float) -> str:
    """Seconds as a Prometheus duration: 1.0 -> "1s"."""
    return f"{seconds:g}s"


def default_state_path() -> Path:
    """Where ``fleet up`` records its processes unless told otherwise (per user)."""
    return Path(temp_root()) / f"aivitals-fleet-{os.getuid()}" / "fleet.json"


def _free_port() -> int:
    # picked now, bound after the nodes' models load: outside the ephemeral range
    return free_port()


@dataclass(frozen=True, kw_only=True)
class FleetConfig:
    """How many nodes, how fast time runs, which engines.

    ``quick`` compresses time as ``aivitals validate --quick`` does (``scale``, the
    quick time scale): 1 s scrapes and rule evaluation, the pack's short windows and
    every ``for:`` divided by 60. ``rps`` is the steady traffic per node
    (0: none). ``redis`` gives the nodes one shared Redis cache (the fleet-wide
    dependency). ``workdir`` holds configs, logs, data and the sim GPUs (a new
    temp dir when None); ``state`` is the state file (``default_state_path()``).
    """

    nodes: int = 3
    quick: bool = True
    rps: float = 2.0
    redis: bool = True
    victoriametrics: bool = True
    alertmanager: bool = True
    workdir: Path | None = None
    state: Path | None = None
    ready_timeout: float = 240.0
    #: Light replicas: a one-layer random-weight LM (the CPU here is shared by every node);
    #: the embedding model is the packaged MiniLM as in the demo. Two workers, as the demo:
    #: with one, an instant occupancy gauge reads "all busy" whenever a scrape lands on a
    #: request, and a loaded machine makes that most scrapes (worker_pool_saturated).
    service_env: dict[str, str] = field(
        default_factory=lambda: {
            "AIVITALS_DEMO_WORKERS": "2",
            "AIVITALS_DEMO_LM_LAYERS": "1",
            "AIVITALS_DEMO_LM_WIDTH": "64",
            "AIVITALS_DEMO_LM_HEADS": "2",
            "AIVITALS_DEMO_PROBE_INTERVAL": "1",
        }
    )
    rule_params: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.nodes, int) or not 1 <= self.nodes <= 64:
            raise ConfigError(f"nodes={self.nodes!r}: expected 1..64 on one machine")
        if not 0 <= self.rps <= 100:
            raise ConfigError(f"rps={self.rps!r}: expected 0..100 requests/s per node")
        if not self.ready_timeout > 0:
            raise ConfigError(f"ready_timeout={self.ready_timeout!r}: expected > 0 s")

    @property
    def scale(self) -> TimeScale:
        """The fleet's time scale: ``QUICK`` with ``quick``, else ``SHIPPED``."""
        return TimeScale.of(self.quick)

    @property
    def tick(self) -> str:
        """Scrape and evaluation interval of the fleet's Prometheus and vmalert."""
        return _duration(self.scale.server_tick)


@dataclass(frozen=True, slots=True)
class FleetNode:
    """One simulated node: its service replica, its exporter agent and its sim GPU."""

    index: int
    name: str
    service_port: int
    agent_port: int
    sim_gpu_dir: str
    workdir: str

    @property
    def service_url(self) -> str:
        return f"http://127.0.0.1:{self.service_port}"

    @property
    def agent_url(self) -> str:
        return f"http://127.0.0.1:{self.agent_port}"

    @property
    def service_target(self) -> str:
        return f"127.0.0.1:{self.service_port}"

    @property
    def agent_target(self) -> str:
        return f"127.0.0.1:{self.agent_port}"


class Fleet:
    """N simulated nodes, Prometheus, Alertmanager (+ webhook receiver), VictoriaMetrics
    with vmalert, a shared Redis and steady traffic; started and stopped as one.

    **Usage**::

        with Fleet(FleetConfig(nodes=3)) as fleet:
            fleet.prometheus_url, fleet.victoriametrics_url, fleet.alertmanager_url
            fleet.nodes[1].name            # "sim-node-2"
            fleet.fault_context(2)         # chaos on node 2 only
            fleet.alerts()                 # what Alertmanager delivered to the webhook

        Fleet.from_state().down()          # another process: stop what `fleet up` started
    """

    def __init__(self, config: FleetConfig | None = None) -> None:
        self.config = config or FleetConfig()
        self.state_path = Path(self.config.state or default_state_path())
        self._own_workdir = self.config.workdir is None
        self.workdir = Path(self.config.workdir or tempfile.mkdtemp(prefix="aivitals-fleet-"))
        self.chaos_token = secrets.token_urlsafe(24)
        self.nodes: list[FleetNode] = []
        self.procs: list[Proc] = []
        self.ports: dict[str, int] = {}
        self.pids: dict[str, int] = {}
        self.started_at = 0.0

    # --- URLs -------------------------------------------------------------------------
    def _url(self, name: str) -> str | None:
        port = self.ports.get(name)
        return None if port is None else f"http://127.0.0.1:{port}"

    @property
    def prometheus_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['prometheus']}"

    @property
    def alertmanager_url(self) -> str | None:
        return self._url("alertmanager")

    @property
    def victoriametrics_url(self) -> str | None:
        return self._url("victoriametrics")

    @property
    def vmalert_url(self) -> str | None:
        return self._url("vmalert")

    @property
    def receiver_url(self) -> str | None:
        url = self._url("receiver")
        return None if url is None else url + "/alerts"

    @property
    def redis_port(self) -> int | None:
        return self.ports.get("redis")

    @property
    def alerts_file(self) -> Path:
        return self.workdir / "alerts.jsonl"

    def node(self, which: int | str) -> FleetNode:
        """A node by its 1-based index or its name."""
        for n in self.nodes:
            if which in (n.index, n.name):
                return n
        raise ConfigError(f"no node {which!r} in this fleet ({len(self.nodes)} nodes)")

    # --- life -------------------------------------------------------------------------
    def up(self) -> Fleet:
        """Start everything and wait until every part answers; on failure stop what started."""
        try:
            self._refuse_second()
        except BaseException:
            if self._own_workdir:  # made for this fleet, which will not start: not left behind
                shutil.rmtree(self.workdir, ignore_errors=True)
            raise
        atexit.register(self._atexit)
        self.started_at = time.time()
        try:
            self._start()
        except BaseException:
            self.down()
            raise
        return self

    def _refuse_second(self) -> None:
        if not self.state_path.exists():
            return
        try:
            other = Fleet.from_state(self.state_path)
        except ConfigError:
            return  # an unreadable leftover: overwritten
        if any(alive(p) for p in other.procs):
            raise AlreadyRunning(
                f"a fleet is already running (state {self.state_path}); "
                "run `aivitals fleet down` first"
            )

    def _start(self) -> None:
        cfg = self.config
        self.workdir.mkdir(parents=True, exist_ok=True)
        if cfg.redis and shutil.which("redis-server"):
            self._start_redis()
        for i in range(1, cfg.nodes + 1):
            d = self.workdir / f"node-{i}"
            self.nodes.append(
                FleetNode(
                    index=i,
                    name=f"{NODE_PREFIX}{i}",
                    service_port=_free_port(),
                    agent_port=_free_port(),
                    sim_gpu_dir=str(d / "sim-gpu"),
                    workdir=str(d),
                )
            )
        for n in self.nodes:  # the slow part (model loading): all at once
            self._start_service(n)
        self._save()
        rules = self._write_configs()
        if cfg.alertmanager:
            self._start_receiver()
            self._start_alertmanager()
        for n in self.nodes:
            self._start_agent(n)
        self._start_prometheus(rules)
        if cfg.victoriametrics:
            self._start_victoriametrics()
            self._start_vmalert(rules)
        self._save()
        deadline = time.monotonic() + cfg.ready_timeout
        for n in self.nodes:
            self._wait(f"{n.name}/service", n.service_url + "/readyz", deadline)
            self._wait(f"{n.name}/agent", n.agent_url + "/metrics", deadline)
        if cfg.rps > 0:
            self._start_traffic()
        self._save()

    def _spawn(self, name: str, argv: Sequence[str], *, env: dict[str, str] | None = None) -> Proc:
        log = self.workdir / "logs" / f"{name.replace('/', '-')}.log"
        p = spawn(name, argv, log, env=env, cwd=self.workdir)
        self.procs.append(p)
        self.pids[name] = p.pid
        return p

    def _wait(
        self,
        name: str,
        url: str,
        deadline: float,
        ok: Callable[[httpx.Response], bool] | None = None,
    ) -> None:
        proc = next((p for p in self.procs if p.name == name), None)
        last = "no answer"
        while time.monotonic() < deadline:
            if proc is not None and not alive(proc):
                raise ServiceError(f"{name} exited during start: {_tail(proc.log)}")
            try:
                r = httpx.get(url, timeout=2.0)
                if r.status_code == 200 and (ok is None or ok(r)):
                    return
                last = f"HTTP {r.status_code}"
            except httpx.HTTPError as exc:
                last = type(exc).__name__
            time.sleep(0.25)
        tail = _tail(proc.log) if proc is not None else ""
        raise ServiceError(f"{name} not ready at {url} in time ({last}); log tail: {tail}")

    def _start_redis(self) -> None:
        port = _free_port()
        self.ports["redis"] = port
        d = self.workdir / "redis"
        d.mkdir(parents=True, exist_ok=True)
        self._spawn(
            "redis",
            [str(shutil.which("redis-server")), "--bind", "127.0.0.1", "--port", str(port),
             "--save", "", "--appendonly", "no", "--dir", str(d)],
        )  # fmt: skip
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
                return
            time.sleep(0.05)
        raise ServiceError(f"redis-server did not listen on {port}: {_tail(self.procs[-1].log)}")

    def _start_service(self, n: FleetNode) -> None:
        Path(n.workdir).mkdir(parents=True, exist_ok=True)
        env = {
            **os.environ,
            "HF_HUB_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "OMP_NUM_THREADS": "1",
            "AIVITALS_CHAOS_TOKEN": self.chaos_token,
            "AIVITALS_SIM_GPU_DIR": n.sim_gpu_dir,
            # the replicas compute on the CPU and book their work on their own sim GPU
            "AIVITALS_DEMO_DEVICE": "cpu",
            **self.config.service_env,
        }
        argv = [
            sys.executable, "-m", "aivitals.demo.serve",
            "--port", str(n.service_port),
            "--sim-gpu-dir", n.sim_gpu_dir,
            "--log-file", str(Path(n.workdir) / "service.jsonl"),
            *(["--redis-port", str(self.redis_port)] if self.redis_port else []),
        ]  # fmt: skip
        self._spawn(f"{n.name}/service", argv, env=env)

    def _start_agent(self, n: FleetNode) -> None:
        argv = [
            sys.executable, "-m", "aivitals.cli", "agent", "--exporter",
            "--listen", n.agent_target,
            "--gpu", "sim", "--sim-gpu-dir", n.sim_gpu_dir,
            "--port", str(n.service_port),
            "--interval", _duration(self.config.scale.tick),
            "--no-kernel-log",
        ]  # fmt: skip
        self._spawn(f"{n.name}/agent", argv)

    # --- the engines ------------------------------------------------------------------
    def rule_pack_text(self) -> str:
        """The exported rule pack as loaded by Prometheus and vmalert (time-compressed
        when ``quick``: the quick time scale's windows and every ``for:`` / 60)."""
        from ..alerts import default_pack
        from ..demo import for_floors, scale_for

        scale = self.config.scale
        if not scale.compressed:
            return default_pack(**self.config.rule_params).text
        pack = default_pack(**{**scale.rule_windows, **self.config.rule_params})
        return scale_for(pack.text, scale.for_factor, floors=for_floors(pack.params))

    def scrape_configs(self) -> list[dict[str, Any]]:
        """Both jobs of the exported prometheus.yml, one static config (and node label) per node."""
        jobs = (
            ("ai-service", [n.service_target for n in self.nodes]),
            ("aivitals-agent", [n.agent_target for n in self.nodes]),
        )
        return [
            {
                "job_name": job,
                "static_configs": [
                    {"targets": [t], "labels": {"node": n.name}}
                    for n, t in zip(self.nodes, targets, strict=True)
                ],
            }
            for job, targets in jobs
        ]

    def _write_configs(self) -> Path:
        from ..alerts import ExportTargets, default_pack, export_pack

        self.ports["receiver"] = _free_port()
        self.ports["alertmanager"] = _free_port()
        self.ports["prometheus"] = _free_port()
        if self.config.victoriametrics:
            self.ports["victoriametrics"] = _free_port()
            self.ports["vmalert"] = _free_port()
        rules = self.workdir / "aivitals-rules.yml"
        rules.write_text(self.rule_pack_text(), encoding="utf-8")
        (self.workdir / "aivitals-rules.vmalert.yml").write_text(
            vmalert_rules(self.rule_pack_text()), encoding="utf-8"
        )
        pack = default_pack(**({"scrape_interval": self.config.tick,
                                "evaluation_interval": self.config.tick}
                               if self.config.scale.compressed else {}))  # fmt: skip
        targets = ExportTargets(
            service_targets=tuple(n.service_target for n in self.nodes),
            agent_targets=tuple(n.agent_target for n in self.nodes),
            alertmanager=f"127.0.0.1:{self.ports['alertmanager']}",
            webhook_url=f"http://127.0.0.1:{self.ports['receiver']}/alerts",
        )
        # the exported configs (`aivitals rules export`), adapted: one target label per node
        export_dir = self.workdir / "export"
        export_pack(pack, export_dir, targets)
        prom = yaml.safe_load((export_dir / "prometheus.yml").read_text())
        prom["rule_files"] = [str(rules)]
        prom["global"]["external_labels"] = {"source": "prometheus"}
        prom["scrape_configs"] = self.scrape_configs()
        if not self.config.alertmanager:
            prom.pop("alerting", None)
        (self.workdir / "prometheus.yml").write_text(yaml.safe_dump(prom, sort_keys=False))
        scrape = {"global": {"scrape_interval": self.config.tick},
                  "scrape_configs": self.scrape_configs()}  # fmt: skip
        (self.workdir / "vm-scrape.yml").write_text(yaml.safe_dump(scrape, sort_keys=False))
        am = yaml.safe_load((export_dir / "alertmanager.yml").read_text())
        group = self.config.scale.alert_group
        if group is not None:
            # as tests/alerts/test_e2e.py: deliver within seconds, not the minutes of production
            for route in [am["route"], *am["route"].get("routes", [])]:
                route["group_wait"] = _duration(group)
                route["group_interval"] = _duration(group)
        (self.workdir / "alertmanager.yml").write_text(yaml.safe_dump(am, sort_keys=False))
        return rules

    def _start_receiver(self) -> None:
        port = self.ports["receiver"]
        self._spawn(
            "receiver",
            [sys.executable, "-m", "aivitals.fleet._receiver", "--port", str(port),
             "--out", str(self.alerts_file)],
        )  # fmt: skip
        self._wait("receiver", f"http://127.0.0.1:{port}/", time.monotonic() + 30)

    def _start_alertmanager(self) -> None:
        binary = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
        if binary is None:
            raise ServiceError("alertmanager not found: apt-get install prometheus-alertmanager")
        port = self.ports["alertmanager"]
        self._spawn(
            "alertmanager",
            [binary, f"--config.file={self.workdir / 'alertmanager.yml'}",
             f"--storage.path={self.workdir / 'alertmanager-data'}",
             f"--web.listen-address=127.0.0.1:{port}",
             f"--cluster.listen-address=127.0.0.1:{_free_port()}", "--log.level=warn"],
        )  # fmt: skip
        self._wait("alertmanager", f"http://127.0.0.1:{port}/-/ready", time.monotonic() + 30)

    def _start_prometheus(self, rules: Path) -> None:
        binary = shutil.which("prometheus")
        if binary is None:
            raise ServiceError("prometheus not found: apt-get install prometheus")
        port = self.ports["prometheus"]
        self._spawn(
            "prometheus",
            [binary, f"--config.file={self.workdir / 'prometheus.yml'}",
             f"--storage.tsdb.path={self.workdir / 'prometheus-data'}",
             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
        )  # fmt: skip
        self._wait("prometheus", f"http://127.0.0.1:{port}/-/ready", time.monotonic() + 60)

    def _start_victoriametrics(self) -> None:
        binary = shutil.which("victoria-metrics")
        if binary is None:
            raise ServiceError("victoria-metrics not found: apt-get install victoria-metrics")
        port = self.ports["victoriametrics"]
        self._spawn(
            "victoriametrics",
            [binary, f"-storageDataPath={self.workdir / 'vm-data'}",
             f"-httpListenAddr=127.0.0.1:{port}",
             f"-promscrape.config={self.workdir / 'vm-scrape.yml'}",
             # VictoriaMetrics hides the newest 30 s from queries by default; a compressed
             # fleet needs them (alerts and diagnoses within seconds)
             f"-search.latencyOffset={_duration(self.config.scale.server_lag)}",
             "-search.disableCache", "-loggerLevel=WARN"],
        )  # fmt: skip
        self._wait("victoriametrics", f"http://127.0.0.1:{port}/health", time.monotonic() + 60)

    def _start_vmalert(self, rules: Path) -> None:
        binary = shutil.which("vmalert")
        if binary is None:
            raise ServiceError("vmalert not found: apt-get install victoria-metrics")
        vm = self.victoriametrics_url
        argv = [
            binary, f"-rule={self.workdir / 'aivitals-rules.vmalert.yml'}",
            f"-datasource.url={vm}", f"-remoteWrite.url={vm}",
            f"-remoteRead.url={vm}", f"-httpListenAddr=127.0.0.1:{self.ports['vmalert']}",
            f"-evaluationInterval={self.config.tick}", "-external.label=source=vmalert",
            "-loggerLevel=WARN",
        ]  # fmt: skip
        if self.config.alertmanager:
            argv.append(f"-notifier.url={self.alertmanager_url}")
        else:
            # vmalert 1.79 (Debian 12) has no blackhole notifier: a port nobody listens on
            argv.append(f"-notifier.url=http://127.0.0.1:{_free_port()}")
        self._spawn("vmalert", argv)
        self._wait("vmalert", f"{self.vmalert_url}/health", time.monotonic() + 60)

    def _start_traffic(self) -> None:
        self._spawn(
            "traffic",
            [sys.executable, "-m", "aivitals.fleet._traffic", "--rps", str(self.config.rps),
             *(n.service_url for n in self.nodes)],
        )  # fmt: skip

    def down(self) -> list[str]:
        """Stop every process of the fleet (by pid and start time); returns the names of those
        that were running and had to be stopped. Idempotent. Removes the state file, and the
        workdir when the fleet made it."""
        with contextlib.suppress(Exception):
            atexit.unregister(self._atexit)
        stopped = stop_all(self.procs)
        if self.state_path.exists():
            with contextlib.suppress(OSError, ValueError):
                if json.loads(self.state_path.read_text()).get("workdir") == str(self.workdir):
                    self.state_path.unlink()
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
        return stopped

    def _atexit(self) -> None:
        self.down()

    def detach(self) -> None:
        """Leave the fleet running when this process exits (``fleet up``: ``fleet down`` stops
        it later from the state file)."""
        atexit.unregister(self._atexit)

    def stop_process(self, name: str) -> bool:
        """Stop one process of the fleet by its name (``sim-node-3/agent``): a node failing."""
        procs = [p for p in self.procs if p.name == name]
        if not procs:
            raise ConfigError(f"no process {name!r}; known: {[p.name for p in self.procs]}")
        return bool(stop_all(procs))

    def __enter__(self) -> Fleet:
        return self.up()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.down()

    # --- state ------------------------------------------------------------------------
    def _save(self) -> None:
        state = {
            "version": _STATE_VERSION,
            "workdir": str(self.workdir),
            "own_workdir": self._own_workdir,
            "started_at": self.started_at,
            "config": {
                "nodes": self.config.nodes,
                "quick": self.config.quick,
                "rps": self.config.rps,
            },
            "chaos_token": self.chaos_token,
            "ports": self.ports,
            "nodes": [asdict(n) for n in self.nodes],
            "procs": [p.to_dict() for p in self.procs],
        }
        self.state_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=2))
        os.chmod(tmp, 0o600)  # it holds the chaos token
        tmp.replace(self.state_path)

    @classmethod
    def from_state(cls, path: Path | str | None = None) -> Fleet:
        """The fleet a state file describes (to stop it, or to read its URLs)."""
        p = Path(path or default_state_path())
        try:
            raw = json.loads(p.read_text())
            fleet = cls(
                FleetConfig(
                    nodes=int(raw["config"]["nodes"]),
                    quick=bool(raw["config"]["quick"]),
                    rps=float(raw["config"]["rps"]),
                    workdir=Path(raw["workdir"]),
                    state=p,
                )
            )
            fleet._own_workdir = bool(raw.get("own_workdir", False))
            fleet.chaos_token = str(raw["chaos_token"])
            fleet.ports = {str(k): int(v) for k, v in raw["ports"].items()}
            fleet.nodes = [FleetNode(**n) for n in raw["nodes"]]
            fleet.procs = [Proc.from_dict(x) for x in raw["procs"]]
            fleet.pids = {x.name: x.pid for x in fleet.procs}
            fleet.started_at = float(raw.get("started_at", 0.0))
        except FileNotFoundError:
            raise ConfigError(f"no fleet state at {p} (is a fleet up?)") from None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"fleet state {p} is unreadable: {exc}") from exc
        return fleet

    def running(self) -> dict[str, bool]:
        """Each process of the fleet: still running?"""
        return {p.name: alive(p) for p in self.procs}

    # --- what runs on it --------------------------------------------------------------
    def alerts(self) -> list[dict[str, Any]]:
        """Alerts Alertmanager delivered to the webhook receiver, in order of arrival."""
        return read_alerts(self.alerts_file)

    def fault_context(self, node: int | str, **extra: Any) -> Any:
        """A chaos ``FaultContext`` aimed at one node: its service, pid and sim GPU only
        (and the fleet's shared Redis, for faults that hit every node)."""
        from ..chaos import FaultContext

        n = self.node(node)
        return FaultContext(
            target=n.service_url,
            service_pid=self.pids.get(f"{n.name}/service"),
            sim_gpu_dir=Path(n.sim_gpu_dir),
            redis_port=self.redis_port,
            redis_pid=self.pids.get("redis"),
            chaos_token=self.chaos_token,
            work_dir=Path(n.workdir),
            **extra,
        )


def vmalert_rules(text: str) -> str:
    """The pack for vmalert: the same rules, without ``keep_firing_for``, which the
    vmalert of Debian 12 (1.79) refuses as an unknown field. The one rule that uses it
    (AIServiceEarlyWarning) then resolves as soon as its condition clears."""
    doc = yaml.safe_load(text)
    for group in doc.get("groups") or []:
        for rule in group.get("rules") or []:
            rule.pop("keep_firing_for", None)
    return str(yaml.safe_dump(doc, sort_keys=False, allow_unicode=True))


def _tail(path: str, chars: int = 1500) -> str:
    try:
        return Path(path).read_text(errors="replace")[-chars:]
    except OSError:
        return ""
