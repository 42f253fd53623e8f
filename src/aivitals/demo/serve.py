"""Run the demo AI service under uvicorn.

``python -m aivitals.demo.serve --port 8000 [--redis-port 6379] [--sim-gpu-dir DIR]``

The chaos hook (``aivitals.chaos.mount``) is on only when ``AIVITALS_CHAOS_TOKEN`` is set.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from ..errors import AivitalsError

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m aivitals.demo.serve", description=__doc__)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--redis-port", type=int, default=None, help="Redis on 127.0.0.1 for the cache")
    p.add_argument("--redis-url", default=None, help="Redis URL (instead of --redis-port)")
    p.add_argument("--sim-gpu-dir", type=Path, default=None, help="simulated GPU state directory")
    p.add_argument("--workers", type=int, default=None, help="model worker threads")
    p.add_argument("--queue-size", type=int, default=None)
    p.add_argument("--cache-ttl", type=float, default=None)
    p.add_argument("--request-timeout", type=float, default=None)
    p.add_argument("--log-file", type=Path, default=None, help="JSON lines log (aivitals loggers)")
    p.add_argument("--log-level", default="warning", help="uvicorn's own log level")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import uvicorn

    from ._app import create_app
    from ._config import DemoConfig

    redis_url = args.redis_url
    if redis_url is None and args.redis_port is not None:
        redis_url = f"redis://127.0.0.1:{args.redis_port}/0"
    try:
        config = DemoConfig.from_env(
            redis_url=redis_url,
            sim_gpu_dir=args.sim_gpu_dir,
            workers=args.workers,
            queue_size=args.queue_size,
            cache_ttl=args.cache_ttl,
            request_timeout=args.request_timeout,
        )
        if args.log_file is not None:
            from ..instrument import configure_logging

            configure_logging(args.log_file, static_fields={"service": "aivitals-demo"})
        app = create_app(config)
    except AivitalsError as exc:
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        access_log=False,
        timeout_graceful_shutdown=5,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
