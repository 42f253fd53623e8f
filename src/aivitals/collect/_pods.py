"""Which Kubernetes pod a process runs in: ``/proc/<pid>/cgroup``, then the kubelet's pods.

NVML attributes device memory to a pid. The kubelet's pod-resources API
attributes whole devices to pods, so on a time-sliced or MPS GPU, shared by
several pods, it cannot say whose memory is whose. The pid's cgroup can: on
every runtime and cgroup driver its path names the pod's UID and, below it,
the container's id (cgroup v1 and v2)::

    /kubepods/burstable/pod<uid>/<container id>                         cgroupfs
    /kubepods.slice/kubepods-burstable.slice/
        kubepods-burstable-pod<uid, _ for ->.slice/cri-containerd-<id>.scope   systemd
    (docker-<id>.scope, crio-<id>.scope for Docker and CRI-O)

``PodResolver`` turns a pid into labels: ``pod_uid`` for every process in a
pod, and ``namespace``, ``pod`` and ``container`` when a ``PodSource`` knows
the UID. The sources, each read only when configured:

- ``KubeletPodsFile(path)``: the kubelet's ``/pods`` answer (a ``v1.PodList``)
  in a file, re-read when it changes;
- ``KubeletPodsURL(url)``: the kubelet's read-only port,
  ``http://127.0.0.1:10255/pods`` (no authentication is sent);
- ``PodLogDirs(path)``: the kubelet's log directories,
  ``/var/log/pods/<namespace>_<pod>_<uid>/`` and
  ``/var/log/containers/<pod>_<namespace>_<container>-<id>.log``.

pod-resources is not a source: its answer names pods and devices, never a
pod's UID or a container's id, so it cannot be joined with a cgroup.

A resolution is cached per process (pid and start time, since pids are
reused); a UID the source does not know yet is asked again at most every
``min_refresh`` seconds. Nothing here raises into a scrape: an unreadable or
malformed file leaves that process without pod labels, counted once (and
logged once per reason).
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable
from urllib.parse import urlsplit

from ..errors import ConfigError
from ..signals import Sample

__all__ = [
    "POD_LABELS",
    "CgroupPod",
    "KubeletPodsFile",
    "KubeletPodsURL",
    "PodLogDirs",
    "PodNames",
    "PodResolver",
    "PodSource",
    "parse_pod_cgroup",
    "parse_pod_list",
    "pod_source",
]

log = logging.getLogger("aivitals.collect")

#: The labels a process in a pod can get, in the order they are added.
POD_LABELS = ("namespace", "pod", "container", "pod_uid")

_UID = (
    r"[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}"
    # a static pod's UID is the kubelet's hash of its manifest: 32 hex digits
    r"|[0-9a-f]{32}"
)
# one path component: "pod<uid>" (cgroupfs) or "<parent>-pod<uid>.slice" (systemd)
_POD_PART = re.compile(rf"(?:.*-)?pod(?P<uid>{_UID})(?:\.slice)?")
# the component below it: the container's own cgroup (not crio-conmon-<id>, the monitor)
_CONTAINER_PART = re.compile(
    r"(?:(?:cri-containerd|containerd|docker|crio)-)?(?P<id>[0-9a-f]{64})(?:\.scope)?"
)
_MAX_BODY = 64 * 2**20
_CONTAINER_TRIES = 3

CountError = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class CgroupPod:
    """The pod a cgroup path names: its UID (dashed) and the container's id ("" if none)."""

    uid: str
    container_id: str = ""


def _pod_of_path(path: str) -> CgroupPod | None:
    parts = path.split("/")
    # the innermost pod: a kubelet nested in a pod (kind) puts its pods below its own
    for i in range(len(parts) - 1, -1, -1):
        m = _POD_PART.fullmatch(parts[i])
        if m is None:
            continue
        below = _CONTAINER_PART.fullmatch(parts[i + 1]) if i + 1 < len(parts) else None
        return CgroupPod(m.group("uid").replace("_", "-"), below.group("id") if below else "")
    return None


def parse_pod_cgroup(text: str) -> CgroupPod | None:
    """The pod of a ``/proc/<pid>/cgroup`` file, or None outside Kubernetes.

    Every ``hierarchy-ID:controllers:path`` line is read (v1 controllers and the
    v2 ``0::`` line); the first naming a container wins, else the first naming a
    pod. A path relative to the reader's cgroup namespace (``/../../kubepods-...``)
    still names its pod. Raises ``ValueError`` when no line has that form.

    >>> parse_pod_cgroup("0::/kubepods/besteffort/pod0f9c1c2e-5b1a-4d6e-9a51-1f7c2d3e4b5a/" + "a" * 64)
    CgroupPod(uid='0f9c1c2e-5b1a-4d6e-9a51-1f7c2d3e4b5a', container_id='aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa')
    """  # noqa: E501
    found: CgroupPod | None = None
    valid = False
    for line in text.splitlines():
        hid, sep, rest = line.partition(":")
        _controllers, sep2, path = rest.partition(":")
        if not (sep and sep2 and hid.isdigit() and path.startswith("/")):
            continue
        valid = True
        pod = _pod_of_path(path)
        if pod is not None and (found is None or (pod.container_id and not found.container_id)):
            found = pod
    if not valid:
        raise ValueError("no hierarchy-ID:controllers:path line")
    return found


@dataclass(frozen=True, slots=True)
class PodNames:
    """What a pod source knows: pod UID -> (namespace, name), container id -> name."""

    pods: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    containers: Mapping[str, str] = field(default_factory=dict)


def parse_pod_list(doc: Any) -> PodNames:
    """Names from a ``v1.PodList`` (the kubelet's ``/pods``, or ``kubectl get pods -o json``).

    Container ids come from the container, init and ephemeral container
    statuses (``containerd://<id>``). A mirror pod (a static pod as the API
    server shows it) is also found under the UID its cgroup carries, the hash in
    its ``kubernetes.io/config.mirror`` annotation. Raises ``ValueError`` when
    ``doc`` is not a pod list.
    """
    items = doc.get("items") if isinstance(doc, dict) else None
    if not isinstance(items, list):
        raise ValueError("not a PodList (no items list)")
    pods: dict[str, tuple[str, str]] = {}
    containers: dict[str, str] = {}
    for item in items:
        meta = _dict(_dict(item).get("metadata"))
        uid, ns, name = meta.get("uid"), meta.get("namespace"), meta.get("name")
        if not (isinstance(uid, str) and isinstance(ns, str) and isinstance(name, str)):
            continue
        pods[uid] = (ns, name)
        notes = _dict(meta.get("annotations"))
        for key in ("kubernetes.io/config.mirror", "kubernetes.io/config.hash"):
            alias = notes.get(key)
            if isinstance(alias, str) and alias:
                pods.setdefault(alias, (ns, name))
        status = _dict(_dict(item).get("status"))
        for key in ("containerStatuses", "initContainerStatuses", "ephemeralContainerStatuses"):
            for cs in status.get(key) or ():
                cid, cname = _dict(cs).get("containerID"), _dict(cs).get("name")
                if isinstance(cid, str) and "://" in cid and isinstance(cname, str):
                    containers[cid.partition("://")[2]] = cname
    return PodNames(pods, containers)


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


@runtime_checkable
class PodSource(Protocol):
    """Where pod names come from; ``read`` raises ``OSError`` or ``ValueError`` on failure."""

    def read(self) -> PodNames: ...


class KubeletPodsFile:
    """The kubelet's ``/pods`` answer saved in a file (re-parsed only when it changes).

    **Usage**::

        KubeletPodsFile("/run/aivitals/pods.json")   # written by a sidecar, a cron job...
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._stamp: tuple[int, int] | None = None
        self._names = PodNames()

    def __repr__(self) -> str:
        return f"KubeletPodsFile({str(self.path)!r})"

    def read(self) -> PodNames:
        st = self.path.stat()
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp != self._stamp:
            self._names = parse_pod_list(json.loads(self.path.read_bytes()))
            self._stamp = stamp
        return self._names


class KubeletPodsURL:
    """The kubelet's ``/pods`` over plain HTTP: its read-only port, when the node opens it.

    **Usage**::

        KubeletPodsURL("http://127.0.0.1:10255/pods")
    """

    def __init__(self, url: str, *, timeout: float = 2.0) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(f"kubelet pods URL: {url!r} is not an http(s) URL")
        if not timeout > 0:
            raise ConfigError(f"timeout: must be > 0, got {timeout!r}")
        self.url = url
        self.timeout = float(timeout)
        self._parts = parts

    def __repr__(self) -> str:
        return f"KubeletPodsURL({self.url!r})"

    def read(self) -> PodNames:
        p = self._parts
        cls = http.client.HTTPSConnection if p.scheme == "https" else http.client.HTTPConnection
        conn = cls(p.hostname or "", p.port, timeout=self.timeout)
        try:
            conn.request("GET", (p.path or "/") + (f"?{p.query}" if p.query else ""))
            resp = conn.getresponse()
            if resp.status != 200:
                raise OSError(f"{self.url} answered HTTP {resp.status}")
            body = resp.read(_MAX_BODY + 1)
        except http.client.HTTPException as exc:  # not an OSError: mapped here
            raise OSError(f"{self.url}: {exc!r}") from exc
        finally:
            conn.close()
        if len(body) > _MAX_BODY:
            raise ValueError(f"{self.url} answered more than {_MAX_BODY} bytes")
        return parse_pod_list(json.loads(body))


class PodLogDirs:
    """Names from the kubelet's log directories, for a node that mounts them read-only.

    ``/var/log/pods/<namespace>_<pod>_<uid>/`` gives each pod; the symlinks
    ``/var/log/containers/<pod>_<namespace>_<container>-<id>.log`` give each
    container's id (``containers`` defaults to the sibling of ``pods``). Only
    the names are listed; no log is opened.

    **Usage**::

        PodLogDirs("/var/log/pods")
    """

    def __init__(
        self, pods: str | os.PathLike[str], containers: str | os.PathLike[str] | None = None
    ) -> None:
        self.pods = Path(pods)
        self.containers = Path(containers) if containers else self.pods.parent / "containers"

    def __repr__(self) -> str:
        return f"PodLogDirs({str(self.pods)!r}, {str(self.containers)!r})"

    def read(self) -> PodNames:
        pods: dict[str, tuple[str, str]] = {}
        for entry in os.scandir(self.pods):
            # namespaces and pod names are DNS names: no "_" inside them
            ns, _, rest = entry.name.partition("_")
            name, _, uid = rest.partition("_")
            if ns and name and uid:
                pods[uid] = (ns, name)
        containers: dict[str, str] = {}
        try:
            entries = list(os.scandir(self.containers))
        except FileNotFoundError:
            entries = []  # pods without container names
        for entry in entries:
            head, _, cid = entry.name.removesuffix(".log").rpartition("-")
            parts = head.split("_")
            if len(parts) == 3 and all(parts) and re.fullmatch(r"[0-9a-f]{64}", cid):
                containers[cid] = parts[2]
        return PodNames(pods, containers)


def pod_source(text: str) -> PodSource:
    """A source from a setting: an ``http(s)://`` URL, a directory (the kubelet's
    ``/var/log/pods``) or a file (the kubelet's ``/pods`` answer)."""
    if "://" in text:
        return KubeletPodsURL(text)
    if Path(text).is_dir():
        return PodLogDirs(text)
    return KubeletPodsFile(text)


@dataclass(slots=True)
class _Entry:
    pod: CgroupPod | None
    labels: dict[str, str]
    #: names resolved as far as they will be (or nothing more to ask)
    done: bool
    #: refreshes that knew the pod but not the container
    tries: int = 0


class PodResolver:
    """pid -> ``namespace``, ``pod``, ``container``, ``pod_uid`` labels, cached per process.

    ``proc_root`` is the ``/proc`` to read (a fixture tree in tests); ``source``
    names pods (None: ``pod_uid`` only). ``count`` receives a reason once per
    process that gets no pod labels: ``pod_pid_not_found`` (the pid is not in
    this ``/proc``: the agent is not in the host PID namespace, or the process
    just exited), ``pod_cgroup_unreadable``, ``pod_cgroup_malformed``; and
    ``pod_source_error`` per failed read of the source (the names of its last
    good answer are kept).

    **Usage**::

        resolver = PodResolver(source=KubeletPodsFile("/run/aivitals/pods.json"))
        resolver.labels(4242)
        # {'namespace': 'team-a', 'pod': 'llm-0', 'container': 'server', 'pod_uid': '6f1c...'}
    """

    def __init__(
        self,
        *,
        proc_root: str | os.PathLike[str] = "/proc",
        source: PodSource | None = None,
        min_refresh: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.proc_root = Path(proc_root)
        self.source = source
        self.min_refresh = float(min_refresh)
        self._clock = clock
        self._cache: dict[tuple[str, str], _Entry] = {}
        self._failed: set[str] = set()  # pids whose stat could not be read, counted once
        self._names = PodNames()
        self._fetched: float | None = None
        self._logged: set[str] = set()
        self._lock = threading.Lock()

    def annotate(self, samples: Iterable[Sample], count: CountError) -> list[Sample]:
        """``samples``, those with a ``pid`` label given their process's pod labels; the
        cache keeps only the processes seen here (call it once per collection)."""
        out: list[Sample] = []
        with self._lock:
            seen: set[tuple[str, str]] = set()
            pids: set[str] = set()
            for s in samples:
                pid = s.labels.get("pid")
                if not pid:
                    out.append(s)
                    continue
                pids.add(pid)
                extra = self._resolve(pid, count, seen)
                out.append(Sample(s.name, {**s.labels, **extra}, s.value, s.timestamp))
            self._cache = {k: v for k, v in self._cache.items() if k in seen}
            self._failed &= pids
        return out

    def labels(self, pid: int | str, count: CountError | None = None) -> dict[str, str]:
        """The pod labels of ``pid`` ({} outside a pod or when unknown)."""
        with self._lock:
            return dict(self._resolve(str(pid), count or (lambda _reason: None), set()))

    # --- one process ----------------------------------------------------------------
    def _resolve(self, pid: str, count: CountError, seen: set[tuple[str, str]]) -> dict[str, str]:
        start = self._start_time(pid, count)
        if start is None:
            return {}
        key = (pid, start)
        seen.add(key)
        entry = self._cache.get(key)
        if entry is None:
            entry = self._cache[key] = self._read(pid, count)
        if not entry.done:
            self._name(entry, count)
        return entry.labels

    def _start_time(self, pid: str, count: CountError) -> str | None:
        path = self.proc_root / pid / "stat"
        try:
            stat = path.read_text()
        except FileNotFoundError:
            self._fail_once(pid, count, "pod_pid_not_found", f"{path.parent} does not exist")
            return None
        except OSError as exc:
            self._fail_once(pid, count, "pod_cgroup_unreadable", f"{path}: {exc}")
            return None
        # starttime is the 22nd field, the 20th after the ")" that closes the command
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) < 20 or not fields[19].isdigit():
            self._fail_once(pid, count, "pod_cgroup_malformed", f"{path}: no start time")
            return None
        return fields[19]

    def _fail_once(self, pid: str, count: CountError, reason: str, detail: str) -> None:
        # no start time, so no cache entry: remember the pid instead, until it is gone
        if pid not in self._failed:
            self._failed.add(pid)
            self._fail(count, reason, detail)

    def _read(self, pid: str, count: CountError) -> _Entry:
        path = self.proc_root / pid / "cgroup"
        try:
            pod = parse_pod_cgroup(path.read_text(errors="replace"))
        except OSError as exc:
            self._fail(count, "pod_cgroup_unreadable", f"{path}: {exc}")
            return _Entry(None, {}, True)
        except ValueError as exc:
            self._fail(count, "pod_cgroup_malformed", f"{path}: {exc}")
            return _Entry(None, {}, True)
        if pod is None:
            return _Entry(None, {}, True)  # not in a pod: no labels, not even empty ones
        return _Entry(pod, {"pod_uid": pod.uid}, self.source is None)

    def _name(self, entry: _Entry, count: CountError) -> None:
        assert entry.pod is not None
        uid, cid = entry.pod.uid, entry.pod.container_id
        if not self._knows(uid, cid) and self._due():
            self._refresh(count)
            if uid in self._names.pods:
                entry.tries += 1
        names = self._names.pods.get(uid)
        if names is None:
            return  # pod_uid only, until the source knows the pod
        labels = {"namespace": names[0], "pod": names[1]}
        container = self._names.containers.get(cid) if cid else None
        if container:
            labels["container"] = container
        entry.labels = {**labels, "pod_uid": uid}
        # a container's status (its id) can trail its pod's by a few seconds; a source
        # that never lists it (no /var/log/containers) is not asked again for ever
        entry.done = container is not None or not cid or entry.tries >= _CONTAINER_TRIES

    def _knows(self, uid: str, cid: str) -> bool:
        return uid in self._names.pods and (not cid or cid in self._names.containers)

    def _due(self) -> bool:
        return self._fetched is None or self._clock() - self._fetched >= self.min_refresh

    def _refresh(self, count: CountError) -> None:
        assert self.source is not None
        self._fetched = self._clock()
        try:
            self._names = self.source.read()
        except Exception as exc:  # any source, even a broken one, must not fail the scrape
            self._fail(count, "pod_source_error", f"pod names from {self.source!r}: {exc}")

    def _fail(self, count: CountError, reason: str, detail: str) -> None:
        count(reason)
        if reason not in self._logged:
            self._logged.add(reason)
            log.warning("pod labels: %s (%s; counted, logged once per reason)", detail, reason)
