"""Ports for servers the toolkit starts later than it picks their port."""

from __future__ import annotations

import random
import socket
import threading
from pathlib import Path

__all__ = ["free_port"]

#: Lowest port picked: under it sit well-known services' defaults (Redis, Prometheus ...).
_LOW = 10_000
_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_lock = threading.Lock()
_handed: set[int] = set()


def _ephemeral_start() -> int:
    try:
        return int(_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768  # Linux's default range starts here


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on ``host`` now, below the kernel's ephemeral range where it can be.

    ``bind(0)`` hands out ports from the ephemeral range, which the kernel also gives
    every outgoing connection as its local port: a port picked that way and bound seconds
    later (after a model loads) can meanwhile be some connection's, and the server's bind
    fails. Ports below the range are never handed out implicitly. A port is not handed
    out twice by one process.
    """
    top = _ephemeral_start()
    rng = random.SystemRandom()
    with _lock:
        if top - _LOW >= 1_000:
            for _ in range(200):
                port = rng.randrange(_LOW, top)
                if port not in _handed and _bindable(host, port):
                    _handed.add(port)
                    return port
        # no room below the range (or all tried were taken): the kernel's choice
        with socket.socket() as s:
            s.bind((host, 0))
            port = int(s.getsockname()[1])
        _handed.add(port)
        return port


def _bindable(host: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True
