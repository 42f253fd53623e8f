"""Steady, light traffic to every node of the fleet, so its services have signals to show.

``python -m aivitals.fleet._traffic --rps 2 --max-seconds 3600 URL [URL ...]``

One thread per node sends ``POST /v1/embeddings`` at ``rps`` (a fixed period,
not Poisson: the fleet wants a flat baseline): two texts repeated from a small set
(cache hits once warm), then a fresh one (a miss), so the hit ratio is a steady 2/3
rather than a coin toss that a short rate window turns into drops. Not half and
half: a hit takes a few milliseconds and a miss tens, and with exactly half of each
the median latency sits on the edge between them, jumping a histogram bucket or two
whenever a rate window holds one miss more: the fleet's end-to-end test then calls
a healthy node "stands out from its peers" now and then (2 runs of 11), and a probe
can read one node's median at 0.038 s against its peers' 0.01 s. Bounded by
``--max-seconds``; stops on SIGTERM. Requests
that fail are counted, never retried: the fleet's faults are meant to show.
"""

from __future__ import annotations

import argparse
import random
import signal
import sys
import threading
import time
from collections.abc import Sequence
from types import FrameType

import httpx

from ..load import embeddings_request, make_prompt

__all__ = ["main"]


#: Of every this many requests, one is fresh (a cache miss); the others repeat.
MISS_EVERY = 3


def is_fresh(sent: int) -> bool:
    """Whether request number ``sent`` (from 0) is a fresh text: the last of each
    ``MISS_EVERY``, so the first ones of a short run already show hits."""
    return sent % MISS_EVERY == MISS_EVERY - 1


def _drive(base: str, rps: float, stop: threading.Event, seed: int) -> None:
    rng = random.Random(seed)
    repeated = [make_prompt(12, rng=random.Random(k)) for k in range(8)]
    sent = 0
    period = 1.0 / rps
    next_at = time.monotonic() + rng.random() * period  # nodes out of phase
    with httpx.Client(base_url=base, timeout=10.0) as client:
        while not stop.is_set():
            fresh = is_fresh(sent)
            text = make_prompt(12, rng=rng) if fresh else repeated[sent % len(repeated)]
            sent += 1
            spec = embeddings_request(text)
            try:
                client.post(spec.path, content=spec.body, headers=dict(spec.headers))
            except httpx.HTTPError:
                pass  # a node that is down or slow is what the fleet shows, not an error here
            next_at += period
            delay = next_at - time.monotonic()
            if delay < -5 * period:
                next_at = time.monotonic()  # fell far behind (a stalled node): do not burst
            stop.wait(max(0.0, delay))


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m aivitals.fleet._traffic")
    p.add_argument("urls", nargs="+", help="base URLs of the nodes' services")
    p.add_argument("--rps", type=float, default=2.0, help="requests per second per node")
    p.add_argument("--max-seconds", type=float, default=4 * 3600.0)
    args = p.parse_args(argv)
    if not 0 < args.rps <= 100:
        p.error(f"--rps {args.rps}: expected 0 < rps <= 100")
    stop = threading.Event()

    def _stop(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    threads = [
        threading.Thread(target=_drive, args=(u.rstrip("/"), args.rps, stop, i), daemon=True)
        for i, u in enumerate(args.urls)
    ]
    for t in threads:
        t.start()
    stop.wait(args.max_seconds)
    stop.set()
    for t in threads:
        t.join(15)
    return 0


if __name__ == "__main__":
    sys.exit(main())
