"""Reading another network namespace's /proc/net files (TCP counters, interfaces).

A service in a container, or behind a sidecar or proxy in its own namespace, sends and
resends its TCP segments there: the host's /proc/net/snmp never counts them. These
files are per namespace, so reading them means entering it: a short-lived thread
``setns(2)``s into the namespace, reads, and goes back. Only that thread moves (Linux
namespaces are per thread), and it ends right after, so the collector's own thread
never leaves the host's namespace. Entering needs CAP_SYS_ADMIN (root).
"""

from __future__ import annotations

import ctypes
import fnmatch
import functools
import os
import threading
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from ..errors import ConfigError

__all__ = ["RUN_NETNS", "check_netns", "read_in_netns", "resolve_netns"]

#: Where ``ip netns add`` (and podman, CNI) bind-mount the namespaces they name.
RUN_NETNS = "/run/netns"

_CLONE_NEWNET = 0x40000000


def check_netns(patterns: Iterable[str]) -> tuple[str, ...]:
    """``patterns`` as a tuple, or ``ConfigError`` naming the first that is neither a
    name or glob (no "/") nor an absolute path."""
    out = tuple(patterns)
    for p in out:
        if not isinstance(p, str) or not p or ("/" in p and not p.startswith("/")):
            raise ConfigError(f"netns: {p!r} is not a namespace name, glob or absolute path")
    return out


def resolve_netns(
    patterns: Iterable[str], run_dir: str = RUN_NETNS
) -> tuple[dict[str, str], list[str]]:
    """``(label -> namespace file, names asked for that do not exist)``.

    A pattern is a name under ``run_dir`` (``ip netns`` names), a glob over those names
    (``aivitals-*``: whichever exist now; none is no error), or an absolute path to a
    namespace file (``/proc/<pid>/ns/net`` of a container's process), labelled by itself.
    """
    found: dict[str, str] = {}
    missing: list[str] = []
    names: list[str] | None = None
    for pattern in patterns:
        if pattern.startswith("/"):
            if os.path.exists(pattern):
                found[pattern] = pattern
            else:
                missing.append(pattern)
        elif any(c in pattern for c in "*?["):
            if names is None:
                try:
                    names = sorted(os.listdir(run_dir))
                except FileNotFoundError:
                    names = []  # no namespace was ever named on this host
            for name in fnmatch.filter(names, pattern):
                found[name] = os.path.join(run_dir, name)
        elif os.path.exists(os.path.join(run_dir, pattern)):
            found[pattern] = os.path.join(run_dir, pattern)
        else:
            missing.append(pattern)
    return found, missing


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)  # loaded once, not at every collection


def _setns(fd: int) -> None:
    if _libc().setns(fd, _CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def read_in_netns(path: str, files: Sequence[str], *, timeout: float = 2.0) -> Mapping[str, str]:
    """The text of ``/proc/net/<file>`` for each of ``files``, as seen in the namespace
    whose file is ``path``. Raises ``OSError`` (``PermissionError`` without root)."""
    out: dict[str, str] = {}
    errors: list[BaseException] = []

    def work() -> None:
        try:
            own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
            try:
                target = os.open(path, os.O_RDONLY)
                try:
                    _setns(target)
                    try:
                        # thread-self: /proc/self/net is the namespace of the process's
                        # main thread, which never moved
                        for name in files:
                            out[name] = Path("/proc/thread-self/net", name).read_text()
                    finally:
                        _setns(own)
                finally:
                    os.close(target)
            finally:
                os.close(own)
        except BaseException as exc:  # handed to the caller's thread
            errors.append(exc)

    t = threading.Thread(target=work, name="aivitals-netns-read", daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        raise TimeoutError(f"reading the network namespace {path} took over {timeout:g} s")
    if errors:
        raise errors[0]
    return out
