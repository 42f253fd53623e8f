"""The response cache: Redis when configured, an in-process dict otherwise.

Entries live ``ttl * (1 +- jitter)`` seconds so that keys written together do
not all expire together (the cache-stampede fault in DOMAIN.md section 7).
A cache that fails is a miss, counted with ``result="error"``: the service
keeps answering from the model while Redis is down.

Lookups are counted per kind of answer (``cache="completions"``,
``cache="embeddings"``) with the store in ``backend`` (``redis`` or
``memory``): completions and embeddings hit at very different rates (new
prompts against a fixed set of inputs), and one ratio over both moves with the
traffic's mix instead of with the cache's health; the alert that compares a
ratio with its recent best must compare like with like.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import threading
import time
from collections import OrderedDict
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter

from .. import signals

__all__ = ["KINDS", "MemoryCache", "RedisCache", "ResponseCache", "cache_key", "make_cache"]

log = logging.getLogger("aivitals.demo.cache")

#: The kinds of answer the service caches, each counted under its own ``cache`` label.
KINDS = ("completions", "embeddings")

#: The counter's labels: the catalogue's ``cache`` and ``result`` plus the store behind it.
_LABELS = ("cache", "backend", "result")


class _Backend(Protocol):
    name: str

    def get(self, key: str) -> bytes | None: ...

    def set(self, key: str, value: bytes, ttl: float) -> None: ...

    def ping(self) -> bool: ...

    def close(self) -> None: ...


def cache_key(kind: str, payload: dict[str, Any]) -> str:
    body = json.dumps(payload, sort_keys=True, separators=(",", ":"))
    return "aivitals-demo:" + kind + ":" + hashlib.sha256(body.encode()).hexdigest()


class MemoryCache:
    """A bounded in-process LRU with per-entry expiry."""

    name = "memory"

    def __init__(self, max_entries: int = 10_000) -> None:
        self._data: OrderedDict[str, tuple[float, bytes]] = OrderedDict()
        self._max = max_entries
        self._lock = threading.Lock()

    def get(self, key: str) -> bytes | None:
        with self._lock:
            item = self._data.get(key)
            if item is None:
                return None
            if item[0] <= time.monotonic():
                del self._data[key]
                return None
            self._data.move_to_end(key)
            return item[1]

    def set(self, key: str, value: bytes, ttl: float) -> None:
        with self._lock:
            self._data[key] = (time.monotonic() + ttl, value)
            self._data.move_to_end(key)
            while len(self._data) > self._max:
                self._data.popitem(last=False)

    def ping(self) -> bool:
        return True

    def close(self) -> None:
        with self._lock:
            self._data.clear()


class RedisCache:
    """Redis with short timeouts, so a dead Redis costs milliseconds, not seconds."""

    name = "redis"

    def __init__(self, url: str, *, timeout: float = 0.25) -> None:
        import redis

        self._client = redis.Redis.from_url(
            url, socket_timeout=timeout, socket_connect_timeout=timeout
        )
        self.url = url

    def get(self, key: str) -> bytes | None:
        value = self._client.get(key)
        return value if isinstance(value, bytes) else None

    def set(self, key: str, value: bytes, ttl: float) -> None:
        self._client.set(key, value, px=max(1, int(ttl * 1000)))

    def ping(self) -> bool:
        try:
            return bool(self._client.ping())
        except Exception:
            return False

    def close(self) -> None:
        self._client.close()


class ResponseCache:
    """A cache backend plus TTL jitter and the ``cache_requests_total`` counter.

    Every lookup names its kind (one of ``KINDS``); the counter's series for
    every kind exist at zero from the start, so a rate over them is 0, not absent.

    **Usage**::

        cache = ResponseCache(MemoryCache(), ttl=300, jitter=0.1, registry=registry)
        if (hit := cache.get("embeddings", key)) is None:
            cache.set("embeddings", key, b"...")
    """

    def __init__(
        self,
        backend: _Backend,
        *,
        ttl: float,
        jitter: float,
        registry: CollectorRegistry | None,
        rng: random.Random | None = None,
    ) -> None:
        self.backend = backend
        self.ttl = ttl
        self.jitter = jitter
        self._rng = rng or random.Random()
        counter = signals.metric("cache_requests_total", registry=registry, labels=_LABELS)
        assert isinstance(counter, Counter)
        self._counts: dict[tuple[str, str], Counter] = {
            (kind, result): counter.labels(cache=kind, backend=backend.name, result=result)
            for kind in KINDS
            for result in ("hit", "miss", "error")
        }
        self.last_error: str | None = None

    def get(self, kind: str, key: str) -> bytes | None:
        _check_kind(kind)
        try:
            value = self.backend.get(key)
        except Exception as exc:  # any client failure is a miss: degrade, do not fail
            self._record_error(kind, exc)
            return None
        self._counts[kind, "miss" if value is None else "hit"].inc()
        return value

    def set(self, kind: str, key: str, value: bytes) -> None:
        _check_kind(kind)
        try:
            self.backend.set(key, value, self.entry_ttl())
        except Exception as exc:
            self._record_error(kind, exc)

    def entry_ttl(self) -> float:
        return self.ttl * (1.0 + self._rng.uniform(-self.jitter, self.jitter))

    def ping(self) -> bool:
        return self.backend.ping()

    def close(self) -> None:
        self.backend.close()

    def _record_error(self, kind: str, exc: Exception) -> None:
        self._counts[kind, "error"].inc()
        self.last_error = f"{type(exc).__name__}: {exc}"
        # the request goes on without the cache; the log line says which dependency failed
        log.warning(
            "cache %s unavailable: %s",
            self.backend.name,
            type(exc).__name__,
            extra={"error_code": "DEPENDENCY_DOWN", "dependency": self.backend.name},
        )


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise ValueError(f"cache kind {kind!r}: expected one of {', '.join(KINDS)}")


def make_cache(
    redis_url: str | None, *, ttl: float, jitter: float, registry: CollectorRegistry | None
) -> ResponseCache:
    backend: _Backend = RedisCache(redis_url) if redis_url else MemoryCache()
    return ResponseCache(backend, ttl=ttl, jitter=jitter, registry=registry)
