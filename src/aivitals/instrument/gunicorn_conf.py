"""A gunicorn config that turns on multiprocess exposition before any worker starts.

**Usage**::

    gunicorn -c python:aivitals.instrument.gunicorn_conf -w 4 app:service

or, with a gunicorn.conf.py of your own::

    from aivitals.instrument.gunicorn_conf import child_exit, on_exit  # noqa: F401

Importing it (gunicorn does, in the master, before forking) points
``PROMETHEUS_MULTIPROC_DIR`` at a fresh private directory, unless it is set
already, so every worker writes its metrics there and any worker's
``/metrics`` answers for all of them. ``child_exit`` drops a dead worker's
live gauges; ``on_exit`` removes the directory this module made.

Without it aivitals sets the same up by itself when it makes its first
metric inside a gunicorn worker; this config is for apps that make
prometheus metrics of their own before that (aivitals refuses to start
those with a message naming this module), and for the cleanup at exit.
"""

from __future__ import annotations

import shutil
from typing import Any

from ._exposition import mark_worker_dead
from ._multiprocess import master_directory

_DIRECTORY, _CREATED = master_directory()


def child_exit(server: Any, worker: Any) -> None:
    """gunicorn hook: a worker exited; its live gauges no longer count."""
    mark_worker_dead(worker.pid, _DIRECTORY)


def on_exit(server: Any) -> None:
    """gunicorn hook: the master is exiting; remove the directory made for this run."""
    if _CREATED:
        shutil.rmtree(_DIRECTORY, ignore_errors=True)
