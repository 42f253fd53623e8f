"""Where load and faults may go: loopback only, unless the user allows a host."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from urllib.parse import urlsplit

from ..errors import ConfigError, FaultRefused

__all__ = ["check_target", "is_loopback_host", "split_url"]

_LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})


def is_loopback_host(host: str) -> bool:
    """True for ``localhost`` and addresses in 127.0.0.0/8 or ``::1``.

    Names other than localhost are never resolved: a DNS answer can change
    between the check and the connect, so only literal addresses count.
    """
    host = host.strip("[]").lower()
    if host in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def split_url(url: str) -> tuple[str, int, str]:
    """``(host, port, path_with_query)`` of an ``http://`` URL; ``ConfigError`` otherwise."""
    parts = urlsplit(url)
    if parts.scheme != "http":
        raise ConfigError(f"url: {url!r} must start with http:// (https is not supported)")
    if not parts.hostname:
        raise ConfigError(f"url: {url!r} has no host")
    try:
        port = parts.port or 80
    except ValueError as exc:
        raise ConfigError(f"url: {url!r} has an invalid port") from exc
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    return parts.hostname, port, path


def check_target(url: str, allow_hosts: Iterable[str] = ()) -> tuple[str, int, str]:
    """Refuse a target that is not on this machine unless its host is allowed.

    **Usage**::

        check_target("http://127.0.0.1:8000/v1/embeddings")   # ("127.0.0.1", 8000, "/v1/...")
        check_target("http://10.0.0.5:80/", allow_hosts=["10.0.0.5"])
    """
    host, port, path = split_url(url)
    allowed = {h.strip("[]").lower() for h in allow_hosts}
    if not is_loopback_host(host) and host.lower() not in allowed:
        raise FaultRefused(
            f"target {host!r} is not on loopback; aivitals only sends load and faults to "
            f"this machine unless the host is allowed explicitly (--allow-host {host})"
        )
    return host, port, path
