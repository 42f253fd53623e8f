"""Blackbox HTTP probes: the service as its callers see it, from outside the process.

The service's own metrics start the clock when a request reaches the app, so
what happens on the way (a slow or lossy network, a proxy, a load balancer
queue) never shows in them. A probe sends a small request through the same
path the callers use and times the whole exchange, like Prometheus's
blackbox_exporter, whose series names it uses (``probe_success``,
``probe_duration_seconds``, ``probe_http_status_code``), so rules written for
one work with the other.

**Usage**::

    probe = HTTPProbeCollector({"client": "http://10.0.0.7:8000/healthz"}, timeout=5.0)
    agent = Agent(AgentConfig(extra_collectors=[probe]))
    probe.retarget("client", "http://gateway.internal/healthz")   # the path changed
"""

from __future__ import annotations

import http.client
import threading
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

from ..errors import ConfigError
from ..signals import Sample
from ._health import BaseCollector

__all__ = ["HTTPProbeCollector"]

_USER_AGENT = "aivitals-probe/1"


def _check_url(name: str, url: str) -> tuple[str, str, int, str]:
    if not isinstance(name, str) or not name:
        raise ConfigError(f"probe name must be a non-empty string, got {name!r}")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"probe {name!r}: {url!r} is not an http(s) URL")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as exc:
        raise ConfigError(f"probe {name!r}: bad port in {url!r}") from exc
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return parts.scheme, parts.hostname, port, path


class HTTPProbeCollector(BaseCollector):
    """GET each target once a run; success, duration and status per target.

    A failed or timed-out probe is data, not a collector failure: it yields
    ``probe_success 0`` with the time it took (at most ``timeout``) and keeps
    the collector up. Each probe opens a new connection, as a first-time caller
    would, so connection set-up on a lossy path is part of what it measures.
    """

    name = "probe"

    def __init__(self, targets: Mapping[str, str], *, timeout: float = 5.0) -> None:
        super().__init__()
        if not isinstance(timeout, int | float) or not 0 < timeout <= 60:
            raise ConfigError(f"probe timeout must be in (0, 60] seconds, got {timeout!r}")
        self.timeout = float(timeout)
        self._lock = threading.Lock()
        self._targets: dict[str, tuple[str, tuple[str, str, int, str]]] = {}
        for name, url in targets.items():
            self.retarget(name, url)

    @property
    def targets(self) -> dict[str, str]:
        """name -> URL, as probed now."""
        with self._lock:
            return {name: url for name, (url, _) in self._targets.items()}

    def retarget(self, name: str, url: str) -> None:
        """Probe ``name`` at ``url`` from the next run on (the series keep their label)."""
        parsed = _check_url(name, url)
        with self._lock:
            self._targets[name] = (url, parsed)

    def _collect(self) -> Iterable[Sample]:
        with self._lock:
            targets = list(self._targets.items())
        if len(targets) > 1:  # side by side: the run lasts one timeout, not one per target
            with ThreadPoolExecutor(min(8, len(targets)), "aivitals-probe") as pool:
                results = list(pool.map(lambda t: self._probe(*t[1][1]), targets))
        else:
            results = [self._probe(*parsed) for _, (_, parsed) in targets]
        for (name, _), (ok, seconds, status) in zip(targets, results, strict=True):
            lab = {"target": name}
            yield Sample("probe_success", lab, 1.0 if ok else 0.0)
            yield Sample("probe_duration_seconds", lab, seconds)
            if status:
                yield Sample("probe_http_status_code", lab, float(status))

    def _probe(self, scheme: str, host: str, port: int, path: str) -> tuple[bool, float, int]:
        cls = http.client.HTTPSConnection if scheme == "https" else http.client.HTTPConnection
        start = time.perf_counter()
        conn = cls(host, port, timeout=self.timeout)
        try:
            conn.request("GET", path, headers={"User-Agent": _USER_AGENT, "Connection": "close"})
            response = conn.getresponse()
            response.read(65536)  # the body's first bytes: the exchange completes
            status = response.status
        except (OSError, http.client.HTTPException) as exc:
            self.count_error("timeout" if isinstance(exc, TimeoutError) else "probe_failed")
            return False, min(time.perf_counter() - start, self.timeout), 0
        finally:
            conn.close()
        return 200 <= status < 400, time.perf_counter() - start, status
