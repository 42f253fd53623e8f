"""Multiprocess exposition switched on for a pre-fork server, without the user's help.

gunicorn with several workers serves one app from several processes: a scrape
reaches one of them, so unless every worker writes its values to files in one
shared directory (prometheus_client's multiprocess mode), ``/metrics`` shows
one worker's share and jumps between workers. The mode has to be on before
the process makes its first metric, and the directory has to be the same for
all the workers of one server and empty when the server starts.

``ensure_multiprocess`` does that when aivitals makes its first metric inside
a gunicorn worker (or a preloading master) of more than one worker: it finds
gunicorn's worker or arbiter on the call stack (the app is imported from
there), takes a directory named after the master's pid and start time (so
every worker of one master agrees on it, and a later master never reuses
it), and turns the mode on. Metrics made before that moment would be lost
from the exposition, so then it refuses with the fix instead.
"""

from __future__ import annotations

import atexit
import os
import shutil
import stat
import sys
import tempfile
import threading
from pathlib import Path
from types import FrameType

import psutil

from .._tempdir import temp_root
from ..errors import ConfigError
from ._metrics import _BY_REGISTRY, _UNREGISTERED, multiprocess_dir

__all__ = [
    "ENV",
    "FIX",
    "ROOT_ENV",
    "children_directory",
    "ensure_multiprocess",
    "forked_after_metrics",
    "master_directory",
    "use_directory",
]

#: The variable prometheus_client reads (the lower-case spelling is honoured too).
ENV = "PROMETHEUS_MULTIPROC_DIR"

FIX = (
    "start gunicorn with `-c python:aivitals.instrument.gunicorn_conf` (or import its "
    "child_exit and on_exit into your gunicorn.conf.py), or export PROMETHEUS_MULTIPROC_DIR "
    "set to an empty directory before gunicorn starts"
)

#: the root process of multiprocessing workers: ``<pid>-<start time>``
ROOT_ENV = "AIVITALS_METRICS_ROOT"

ROOT_FIX = (
    "serve /metrics from that process, or export PROMETHEUS_MULTIPROC_DIR set to an "
    "empty directory before the service starts, so every process writes its metrics there"
)

_lock = threading.Lock()
#: set once this process knows its answer (a directory in use, or one process)
_decided = False
_MAX_FRAMES = 200


def ensure_multiprocess() -> str | None:
    """The multiprocess directory in use, set up first when a multi-worker gunicorn needs one.

    Returns None when one process serves (no gunicorn, ``-w 1``, or not
    called from inside gunicorn's app loading). In a ``multiprocessing``
    worker of the root process it is the root's directory (see the module's
    docstring). Idempotent and cheap after the first answer; called by every
    aivitals part before its first metric. Raises ``ConfigError`` with the
    fix when metrics were made before it, or when no shared directory can be
    made.

    **Usage**::

        aivitals.instrument.ensure_multiprocess()   # at the top of the app module, if
                                                    # it makes prometheus metrics itself
    """
    global _decided
    path = multiprocess_dir()
    if path or _decided:
        return path
    if _child_of is not None:
        with _lock:
            if not multiprocess_dir():
                use_directory(str(_root_directory(_child_of)))
            _decided = True
            return multiprocess_dir()
    if "gunicorn.arbiter" not in sys.modules:
        return None
    with _lock:
        path = multiprocess_dir()
        if path or _decided:
            return path
        server = _gunicorn_server()
        if server is None:
            return None  # not inside gunicorn's app loading: ask again later
        workers, master = server
        if workers <= 1:
            _decided = True
            return None
        made = _metrics_made()
        if made:
            raise ConfigError(
                f"gunicorn runs {workers} workers, so metrics must go through a shared "
                f"directory (prometheus multiprocess mode), but this worker made metrics "
                f"before aivitals could switch it on ({', '.join(made[:5])}); {FIX}"
            )
        path = str(_shared_directory(master))
        use_directory(path)
        _decided = True
        return path


def use_directory(path: str) -> None:
    """Turn multiprocess mode on for this process (and the workers it forks later)."""
    os.environ[ENV] = path
    from prometheus_client import values

    # prometheus_client picks its value class when it is imported, which has
    # happened by now: pick again, so metrics made from here on use the files
    values.ValueClass = values.get_value_class()  # type: ignore[no-untyped-call]


def _gunicorn_server() -> tuple[int, int] | None:
    """(configured workers, master pid) when gunicorn is loading the app on this stack."""
    worker_cls = getattr(sys.modules.get("gunicorn.workers.base"), "Worker", None)
    arbiter_cls = getattr(sys.modules.get("gunicorn.arbiter"), "Arbiter", None)
    frame: FrameType | None = sys._getframe(1)
    for _ in range(_MAX_FRAMES):
        if frame is None:
            return None
        owner = frame.f_locals.get("self")
        # the worker comes first: a forked worker's stack still holds the arbiter's frames
        if worker_cls is not None and isinstance(owner, worker_cls):
            return int(owner.cfg.workers), int(owner.ppid)
        if arbiter_cls is not None and isinstance(owner, arbiter_cls):
            return int(owner.cfg.workers), os.getpid()  # preload: the master imports the app
        frame = frame.f_back
    return None


def _metrics_made() -> list[str]:
    """Metrics this process already made in single-process mode (lost once the mode changes)."""
    from prometheus_client import REGISTRY
    from prometheus_client.metrics import MetricWrapperBase

    from ._fast import FastFamily

    names: set[str] = set()
    for collector, found in list(REGISTRY._collector_to_names.items()):
        if isinstance(collector, MetricWrapperBase | FastFamily) and found:
            # a counter registers name, name_total and name_created: show the one written
            names.add(next((n for n in sorted(found) if n.endswith("_total")), min(found)))
    for cache in [_UNREGISTERED, *list(_BY_REGISTRY.values())]:
        names.update(cache)
    return sorted(names)


def _base(fix: str) -> Path:
    base = Path(temp_root()) / f"aivitals-prometheus-{os.getuid()}"
    try:
        base.mkdir(mode=0o700, exist_ok=True)
        info = os.lstat(base)
    except OSError as exc:
        raise ConfigError(f"{base} cannot be made ({exc.strerror}); {fix}") from exc
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        raise ConfigError(f"{base} is not a directory of this user; {fix}")
    return base


def _shared_directory(master: int) -> Path:
    """``<tmp>/aivitals-prometheus-<uid>/<master pid>-<master start>``, created empty."""
    base = _base(FIX)
    name = _master_key(master)
    if name is None:
        raise ConfigError(f"gunicorn's master (pid {master}) cannot be read; {FIX}")
    _remove_stale(base, keep=name)
    path = base / name
    path.mkdir(mode=0o700, exist_ok=True)
    return path


def _root_directory(key: str) -> Path:
    """The root's directory, made by whichever of its children writes first."""
    base = _base(f"the root process {key.partition('-')[0]} shares metrics there; {ROOT_FIX}")
    _remove_stale(base, keep=key)
    path = base / key
    path.mkdir(mode=0o700, exist_ok=True)
    return path


def _master_key(pid: int) -> str | None:
    try:
        started = psutil.Process(pid).create_time()
    except (psutil.Error, OSError):
        return None
    return f"{pid}-{int(started * 100)}"


def _remove_stale(base: Path, *, keep: str) -> None:
    """Drop the directories of masters that no longer run (their files count for nobody)."""
    for entry in base.iterdir():
        pid, _, _ = entry.name.partition("-")
        if entry.name == keep or not pid.isdigit():
            continue
        if _master_key(int(pid)) != entry.name:
            shutil.rmtree(entry, ignore_errors=True)


def master_directory() -> tuple[str, bool]:
    """For a gunicorn config (the master, before any worker): (directory, created here).

    An already set ``PROMETHEUS_MULTIPROC_DIR`` is used as it is; otherwise a
    fresh private directory is made, to be removed at exit by its creator.
    """
    global _decided
    path = multiprocess_dir()
    created = False
    if not path:
        path = tempfile.mkdtemp(prefix="aivitals-prometheus-")
        created = True
    use_directory(path)
    _decided = True
    return path, created


# --- multiprocessing workers of a root process -------------------------------------

#: this process's own key when it is the root (children write to its directory)
_root_key: str | None = None
#: the root's key when this process is a multiprocessing child of it
_child_of: str | None = None
#: metrics the root had made, in memory, when it forked this child
_inherited: list[str] = []


def _claim() -> None:
    """At import: become the root, or recognise this process as a spawned child of it."""
    global _root_key, _child_of
    if multiprocess_dir():
        return  # multiprocess mode already: every descendant inherits it
    key = os.environ.get(ROOT_ENV)
    started = _multiprocessing_started()
    if key and started:
        root = int(key.partition("-")[0]) if key.partition("-")[0].isdigit() else -1
        if root in _parents(forkserver=started == "forkserver") and _master_key(root) == key:
            _child_of = key
            return
    own = _master_key(os.getpid())
    if own is None:
        return  # /proc unreadable: stay a plain single process
    _root_key = own
    os.environ[ROOT_ENV] = own
    atexit.register(_remove_root_directory)
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _multiprocessing_started() -> str | None:
    """How ``multiprocessing`` started this process: ``spawn``, ``forkserver`` or None.

    The original command line says so (``sys.argv`` is the parent's by now); an
    unrelated program that merely inherited the root's variable does not. A
    forkserver's children are forked from it and keep its command line.
    """
    argv = getattr(sys, "orig_argv", ())
    if "--multiprocessing-fork" in argv:
        return "spawn"
    if any("multiprocessing.forkserver" in a for a in argv):
        return "forkserver"
    return None


def _parents(*, forkserver: bool) -> tuple[int, ...]:
    """The parent; for a forkserver's child, the forkserver's parent too."""
    parent = os.getppid()
    if not forkserver:
        return (parent,)
    try:
        return parent, psutil.Process(parent).ppid()
    except (psutil.Error, OSError):
        return (parent,)


def _after_fork_in_child() -> None:
    """A ``multiprocessing`` fork of the root: its metrics go to the root's files from here."""
    global _root_key, _child_of, _decided, _inherited, _lock
    if _root_key is None or multiprocess_dir():
        return  # not the root's child, or files already
    _lock = threading.Lock()  # another thread of the parent may have held it at the fork
    try:
        forker = sys._getframe(1).f_globals.get("__name__")
    except ValueError:
        forker = None  # forked from C code, with no Python caller
    if forker != "multiprocessing.popen_fork":
        # a plain os.fork (a pre-fork server's worker) serves itself, as before, and is
        # the root of its own multiprocessing workers
        _root_key = _master_key(os.getpid())
        if _root_key is not None:
            os.environ[ROOT_ENV] = _root_key
        return
    key, _root_key = _root_key, None
    _child_of = key
    _inherited = _metrics_made()
    _forget_metrics()
    try:
        use_directory(str(_root_directory(key)))
    except (ConfigError, OSError):
        return  # no shared directory: its first metric tries again and refuses with the fix
    _decided = True


def _forget_metrics() -> None:
    """Drop the in-memory families this child inherited, so it makes file-backed ones."""
    from . import _inference, _metrics

    for registry, cache in list(_metrics._BY_REGISTRY.items()):
        for metric in cache.values():
            try:
                registry.unregister(metric)
            except KeyError:
                pass  # shared with another package and already gone
        cache.clear()
    _metrics._UNREGISTERED.clear()
    _metrics._LOCK = threading.Lock()  # another thread of the parent may have held it
    _inference._forget()


def children_directory() -> str | None:
    """In the root: its children's metric directory, when one of them made it."""
    if _root_key is None or multiprocess_dir() or not _root_key.startswith(f"{os.getpid()}-"):
        return None
    path = Path(temp_root()) / f"aivitals-prometheus-{os.getuid()}" / _root_key
    return str(path) if path.is_dir() else None


def forked_after_metrics() -> None:
    """Refuse to serve ``/metrics`` from a fork whose root keeps metrics in memory."""
    if _inherited and _child_of is not None:
        root = _child_of.partition("-")[0]
        raise ConfigError(
            f"this process (pid {os.getpid()}) serves /metrics, but it was forked by "
            f"process {root} after that process made metrics in its own memory "
            f"({_some(_inherited)}), which never reach this exposition; {ROOT_FIX}"
        )


def _some(names: list[str]) -> str:
    more = f" and {len(names) - 5} more" if len(names) > 5 else ""
    return ", ".join(names[:5]) + more


def _remove_root_directory() -> None:
    path = children_directory()
    if path is not None:
        shutil.rmtree(path, ignore_errors=True)


_claim()
