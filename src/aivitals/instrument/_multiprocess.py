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

import os
import shutil
import stat
import sys
import tempfile
import threading
from pathlib import Path
from types import FrameType

import psutil

from ..errors import ConfigError
from ._metrics import _BY_REGISTRY, _UNREGISTERED, multiprocess_dir

__all__ = ["ENV", "FIX", "ensure_multiprocess", "master_directory", "use_directory"]

#: The variable prometheus_client reads (the lower-case spelling is honoured too).
ENV = "PROMETHEUS_MULTIPROC_DIR"

FIX = (
    "start gunicorn with `-c python:aivitals.instrument.gunicorn_conf` (or import its "
    "child_exit and on_exit into your gunicorn.conf.py), or export PROMETHEUS_MULTIPROC_DIR "
    "set to an empty directory before gunicorn starts"
)

_lock = threading.Lock()
#: set once this process knows its answer (a directory in use, or one process)
_decided = False
_MAX_FRAMES = 200


def ensure_multiprocess() -> str | None:
    """The multiprocess directory in use, set up first when a multi-worker gunicorn needs one.

    Returns None when one process serves (no gunicorn, ``-w 1``, or not
    called from inside gunicorn's app loading). Idempotent and cheap after
    the first answer; called by every aivitals part before its first metric.
    Raises ``ConfigError`` with the fix when metrics were made before it.

    **Usage**::

        aivitals.instrument.ensure_multiprocess()   # at the top of the app module, if
                                                    # it makes prometheus metrics itself
    """
    global _decided
    path = multiprocess_dir()
    if path or _decided or "gunicorn.arbiter" not in sys.modules:
        return path
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


def _shared_directory(master: int) -> Path:
    """``<tmp>/aivitals-prometheus-<uid>/<master pid>-<master start>``, created empty."""
    base = Path(tempfile.gettempdir()) / f"aivitals-prometheus-{os.getuid()}"
    base.mkdir(mode=0o700, exist_ok=True)
    info = os.lstat(base)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        raise ConfigError(f"{base} is not a directory of this user; {FIX}")
    name = _master_key(master)
    if name is None:
        raise ConfigError(f"gunicorn's master (pid {master}) cannot be read; {FIX}")
    _remove_stale(base, keep=name)
    path = base / name
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
