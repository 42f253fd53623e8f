"""The agent's configuration: one frozen object, validated on creation."""

from __future__ import annotations

import ipaddress
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from ..collect import Collector, check_netns, pod_source
from ..collect.gpu import default_sim_dir
from ..errors import ConfigError
from ._webconfig import WebConfig

__all__ = ["GPU_CHOICES", "AgentConfig", "ScrapeTarget", "parse_duration", "parse_listen"]

GPU_CHOICES = ("auto", "nvml", "smi", "sim", "none")
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h|d)?$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


def parse_duration(key: str, text: str | float) -> float:
    """Seconds from ``1.5``, ``500ms``, ``15s``, ``5m``, ``1h``; ConfigError names ``key``."""
    if isinstance(text, int | float):
        seconds = float(text)
    else:
        m = _DURATION.match(text.strip())
        if m is None:
            raise ConfigError(f"{key}: {text!r} is not a duration (like 1s, 500ms, 5m, 1h)")
        seconds = float(m.group(1)) * _UNITS[m.group(2)]
    if not seconds > 0:
        raise ConfigError(f"{key}: must be > 0, got {text!r}")
    return seconds


def parse_listen(text: str, *, allow_remote: bool) -> tuple[str, int]:
    """``host:port`` checked against the loopback-only default."""
    host, sep, port_text = text.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port_text.isdigit() or int(port_text) > 65535:
        raise ConfigError(f"listen: {text!r} is not host:port (like 127.0.0.1:9478)")
    if not allow_remote and not _is_loopback(host):
        raise ConfigError(
            f"listen: {text!r} is not a loopback address; pass --allow-remote to listen there"
        )
    return host, int(port_text)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True, slots=True)
class ScrapeTarget:
    """One /metrics URL to scrape, with the ``job`` label its series get."""

    url: str
    job: str = "scrape"

    @classmethod
    def parse(cls, text: str) -> ScrapeTarget:
        """``http://host:port/metrics`` or ``job=http://host:port/metrics``."""
        job, sep, url = text.partition("=")
        if not sep or "://" in job:
            job, url = "scrape", text
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ConfigError(f"scrape: {text!r} is not an http(s) URL")
        return cls(url=url, job=job)

    @property
    def instance(self) -> str:
        return urlsplit(self.url).netloc


@dataclass(frozen=True, kw_only=True)
class AgentConfig:
    """What the agent collects, how often, and where it listens.

    **Usage**::

        AgentConfig(listen="127.0.0.1:0", gpu="sim", sim_gpu_dir="/tmp/sim", interval=1.0)

    ``interval`` is the collectors' period; ``scrape_interval`` the scrape
    targets' (15 s, Prometheus's default). ``collector_timeout`` marks a run
    that has not returned by then as failed (``reason="timeout"``).
    ``exporter`` only collects and serves ``/metrics``: no store, no query API.
    ``probes`` (name -> URL) are blackbox HTTP probes, run at ``interval``:
    the service as its callers see it (``probe_success``, ``probe_duration_seconds``).
    ``netns`` are other network namespaces whose TCP counters and interfaces the host
    collector reads too (``ip netns`` names, globs over them, or ``/proc/<pid>/ns/net``
    files; needs root): where a container or a proxy in front of the service sends its
    segments. ``kubelet_pods`` names the Kubernetes pods of GPU processes: the kubelet's
    ``/pods`` answer in a file, its log directory (``/var/log/pods``) or its read-only
    port's URL; without it a process in a pod carries its ``pod_uid`` only.
    ``web_config`` (``load_web_config(path)``, Prometheus' web-config format) serves
    every path over TLS and/or behind basic auth.
    ``sla`` (seconds) is the request-time SLA of the scraped services: the agent exports
    it as ``aivitals_service_sla_seconds`` per target, which the rule pack's burn-rate
    alerts need (none without it).
    """

    listen: str = "127.0.0.1:9478"
    allow_remote: bool = False
    exporter: bool = False
    interval: float = 1.0
    scrape: Sequence[ScrapeTarget] = ()
    scrape_interval: float = 15.0
    scrape_timeout: float = 10.0
    scrape_max_bytes: int = 64 * 2**20
    gpu: str = "auto"
    sim_gpu_dir: str | None = None
    pid: int | None = None
    port: int | None = None
    tcp_ports: Sequence[int] = ()
    netns: Sequence[str] = ()
    kernel_log: bool = True
    retention: float = 3600.0
    max_series: int = 1_000_000
    collector_timeout: float | None = None
    proc: str = "/proc"
    sys: str = "/sys"
    extra_collectors: Sequence[Collector] = field(default_factory=tuple)
    probes: Mapping[str, str] = field(default_factory=dict)
    probe_timeout: float | None = None
    kubelet_pods: str | None = None
    web_config: WebConfig | None = None
    sla: float | None = None

    def __post_init__(self) -> None:
        parse_listen(self.listen, allow_remote=self.allow_remote)
        if self.kubelet_pods is not None:
            pod_source(self.kubelet_pods)  # ConfigError for a URL that is not http(s)
        for key in ("interval", "scrape_interval", "scrape_timeout", "retention"):
            value = getattr(self, key)
            if not (isinstance(value, int | float) and value > 0):
                raise ConfigError(f"{key}: must be a number of seconds > 0, got {value!r}")
        if self.probe_timeout is not None and not (
            isinstance(self.probe_timeout, int | float) and 0 < self.probe_timeout < self.timeout
        ):
            # a probe that outlasts the collector's run timeout would mark the
            # collector down, when only its target is slow
            raise ConfigError(
                f"probe_timeout: must be > 0 and below the collector timeout "
                f"({self.timeout:g} s), got {self.probe_timeout!r}"
            )
        if self.collector_timeout is not None and not self.collector_timeout > 0:
            raise ConfigError(f"collector_timeout: must be > 0, got {self.collector_timeout!r}")
        if self.gpu not in GPU_CHOICES:
            raise ConfigError(f"gpu: {self.gpu!r} is not one of {', '.join(GPU_CHOICES)}")
        if self.pid is not None and self.port is not None:
            raise ConfigError("pid and port: give one way to find the served process, not both")
        if self.pid is not None and self.pid <= 0:
            raise ConfigError(f"pid: must be > 0, got {self.pid!r}")
        for key in ("port", "tcp_ports"):
            value = getattr(self, key)
            for p in value if isinstance(value, Sequence) else ([] if value is None else [value]):
                if not (isinstance(p, int) and 0 < p < 65536):
                    raise ConfigError(f"{key}: {p!r} is not a TCP port")
        check_netns(self.netns)
        if self.scrape_max_bytes < 1024:
            raise ConfigError(f"scrape_max_bytes: must be >= 1024, got {self.scrape_max_bytes!r}")
        if self.max_series < 1:
            raise ConfigError(f"max_series: must be >= 1, got {self.max_series!r}")
        if self.sla is not None:
            if isinstance(self.sla, bool) or not isinstance(self.sla, int | float):
                raise ConfigError(f"sla: must be a number of seconds, got {self.sla!r}")
            if not (math.isfinite(self.sla) and self.sla > 0):
                raise ConfigError(f"sla: must be a finite number of seconds > 0, got {self.sla!r}")
            if not self.scrape:
                # the SLA is a property of a scraped service's histogram; with no target
                # the series would join nothing and the SLO alerts would stay silent
                raise ConfigError(
                    "sla: applies to the services the agent scrapes, and none is given; "
                    "add --scrape [JOB=]URL of the service's /metrics"
                )
        if self.exporter and self.scrape:
            raise ConfigError(
                "scrape: --exporter mode only serves the agent's own collectors; "
                "let Prometheus scrape the other targets"
            )

    @property
    def timeout(self) -> float:
        """The per-run collector timeout (default: the interval, at least 2 s)."""
        return self.collector_timeout or max(2.0, self.interval)

    @property
    def probe_deadline(self) -> float:
        """A probe's timeout: as given, else three quarters of the collector timeout."""
        return self.probe_timeout or 0.75 * self.timeout

    @property
    def sim_dir(self) -> str:
        return self.sim_gpu_dir or default_sim_dir()
