"""gunicorn settings for the embedding service: sync workers, each with its own model.

    gunicorn -c gunicorn.conf.py app:service              # from this directory
    gunicorn -c gunicorn.conf.py -b 127.0.0.1:9000 -w 3 app:service   # flags win

The aivitals hooks come from ``aivitals.instrument.gunicorn_conf`` as docs/instrument.md
says for a config of your own: importing it here, in the master, points
PROMETHEUS_MULTIPROC_DIR at a fresh directory before any worker starts, ``child_exit``
drops a dead worker's live gauges and ``on_exit`` removes the directory at the end.
"""

from aivitals.instrument.gunicorn_conf import child_exit, on_exit

__all__ = ["bind", "child_exit", "on_exit", "timeout", "worker_class", "workers"]

bind = "127.0.0.1:8300"
workers = 2
# One request at a time per process: the model call blocks the worker, by design.
worker_class = "sync"
# Each worker loads the model before it serves: leave it time on a busy machine.
timeout = 60
# No preload: each worker imports app.py itself, so it loads its own model copy and
# starts its own log writer thread (threads do not survive a fork).
preload_app = False
