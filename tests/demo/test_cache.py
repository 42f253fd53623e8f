"""The response cache counts each kind of answer under its own `cache` label."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from aivitals.demo._cache import KINDS, MemoryCache, ResponseCache, cache_key


class _Broken(MemoryCache):
    name = "redis"

    def get(self, key: str) -> bytes | None:
        raise ConnectionError("refused")

    def set(self, key: str, value: bytes, ttl: float) -> None:
        raise ConnectionError("refused")


def _count(registry: CollectorRegistry, kind: str, backend: str, result: str) -> float | None:
    labels = {"cache": kind, "backend": backend, "result": result}
    return registry.get_sample_value("cache_requests_total", labels)


def test_each_kind_is_counted_apart_and_exists_at_zero() -> None:
    registry = CollectorRegistry()
    cache = ResponseCache(MemoryCache(), ttl=60, jitter=0.1, registry=registry)
    for kind in KINDS:
        for result in ("hit", "miss", "error"):
            assert _count(registry, kind, "memory", result) == 0.0
    key = cache_key("embeddings", {"input": ["x"]})
    assert cache.get("embeddings", key) is None
    cache.set("embeddings", key, b"v")
    assert cache.get("embeddings", key) == b"v"
    assert cache.get("completions", cache_key("completions", {"p": "new"})) is None
    assert _count(registry, "embeddings", "memory", "hit") == 1.0
    assert _count(registry, "embeddings", "memory", "miss") == 1.0
    assert _count(registry, "completions", "memory", "hit") == 0.0
    assert _count(registry, "completions", "memory", "miss") == 1.0


def test_a_failing_backend_is_an_error_of_the_kind_asked_for() -> None:
    registry = CollectorRegistry()
    cache = ResponseCache(_Broken(), ttl=60, jitter=0.0, registry=registry)
    assert cache.get("completions", "k") is None
    cache.set("completions", "k", b"v")
    assert _count(registry, "completions", "redis", "error") == 2.0
    assert _count(registry, "embeddings", "redis", "error") == 0.0
    assert cache.last_error == "ConnectionError: refused"


def test_an_unknown_kind_is_refused_before_the_backend_is_asked() -> None:
    registry = CollectorRegistry()
    cache = ResponseCache(_Broken(), ttl=60, jitter=0.0, registry=registry)
    with pytest.raises(ValueError, match="cache kind 'images': expected one of completions"):
        cache.get("images", "k")
    with pytest.raises(ValueError, match="cache kind 'images'"):
        cache.set("images", "k", b"v")
    assert cache.last_error is None  # refused, not a backend failure


@pytest.mark.parametrize("fault", ["redis_down", "cache_stampede"])
def test_the_diagnosis_reads_the_per_kind_labels(fault: str) -> None:
    """The knowledge base names these faults from the demo's labels: the Redis cache by
    ``backend="redis"`` (its ``cache`` label is now the kind), the stampede per kind."""
    from aivitals.diagnose import diagnose
    from aivitals.tsdb import Store
    from tests.diagnose import _corpus as corpus

    sc = corpus.scenario(fault, seed=1, duration=600.0)
    store = Store(retention=7200.0)
    for name, labels, ts, vals in corpus.samples(sc):
        kinds: list[dict[str, str]] = [labels]
        if name == "cache_requests_total":  # the corpus's one Redis cache, as the demo counts it
            assert labels["cache"] == "redis"
            kinds = [{**labels, "cache": kind, "backend": "redis"} for kind in KINDS]
        for full in kinds:
            for t, v in zip(ts.tolist(), vals.tolist(), strict=True):
                store.append(name, full, v / len(kinds), t)
    top = diagnose(store, end=sc.end, events=sc.events).findings[0]
    assert top.signature == fault
    assert any(kind in top.title for kind in KINDS), top.title  # it says which cache
