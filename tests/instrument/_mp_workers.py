"""A root process and its ``multiprocessing`` workers, run as a program by test_multiprocess.

``python -m tests.instrument._mp_workers MODE [START_METHOD]`` prints the root's
``/metrics`` (answered by ``metrics_app``, as the middleware does) after:

- ``pool``: one model call in the root, four in a ``ProcessPoolExecutor`` and one
  in a ``Process``, all of the given start method;
- ``alive``: one call in a worker that is still running at the first scrape and
  has exited by the second (both printed, split by a ``---`` line);
- ``served``: a forked worker of a root that made metrics creates ``metrics_app``
  (a forked API server); it prints the refusal;
- ``unshared``: a spawned worker whose shared directory cannot be made (its
  traceback goes to stderr); prints its exit code;
- ``unrelated``: a plain subprocess, not a multiprocessing worker, makes a model
  call with the root's variable inherited.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import subprocess
import sys
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from aivitals.errors import ConfigError
from aivitals.instrument import inference, metrics_app
from aivitals.instrument._multiprocess import children_directory


def call(_: object = None) -> int:
    with inference(model="m", version="v1"):
        pass
    return os.getpid()


def scrape() -> str:
    out: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        out.append(message)

    asyncio.run(metrics_app()({"type": "http", "method": "GET", "headers": []}, None, send))
    return str(out[1]["body"].decode())


def wait_then_call(ready: Any, done: Any) -> None:
    call()
    ready.set()
    done.wait(30)


def serve(queue: Any) -> None:
    try:
        metrics_app()
    except ConfigError as exc:
        queue.put(str(exc))
    else:
        queue.put("served")


def main() -> None:
    mode = sys.argv[1]
    ctx = multiprocessing.get_context(sys.argv[2] if len(sys.argv) > 2 else "fork")
    if mode == "pool":
        call()
        with ProcessPoolExecutor(2, mp_context=ctx) as pool:
            pids = set(pool.map(call, range(4)))
        worker = ctx.Process(target=call)
        worker.start()
        worker.join()
        print("# pids", *sorted([*pids, worker.pid or 0]))
        print("# directory", children_directory())
        print(scrape())
    elif mode == "alive":
        ready, done = ctx.Event(), ctx.Event()
        worker = ctx.Process(target=wait_then_call, args=(ready, done))
        worker.start()
        ready.wait(30)
        print("# pid", worker.pid)
        print(scrape())
        done.set()
        worker.join()
        print("---")
        print(scrape())
    elif mode == "served":
        call()
        queue = ctx.Queue()
        worker = ctx.Process(target=serve, args=(queue,))
        worker.start()
        print(queue.get(timeout=30))
        worker.join()
    elif mode == "unshared":
        worker = ctx.Process(target=call)
        worker.start()
        worker.join(60)
        print("# exitcode", worker.exitcode)
    elif mode == "unrelated":
        call()
        code = "from tests.instrument._mp_workers import call; call()"
        subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
        print(scrape())


if __name__ == "__main__":
    main()
