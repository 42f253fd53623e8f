from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from aivitals.instrument._metrics import family
from aivitals.signals import metric


def test_shared_family_takes_labels_by_name_or_position() -> None:
    registry = CollectorRegistry()
    fam = family("cache_requests_total", registry)
    fam.labels(cache="redis", result="hit").inc()
    fam.labels("redis", "hit").inc()
    text = generate_latest(registry).decode()
    assert 'cache_requests_total{cache="redis",result="hit"} 2.0' in text
    with pytest.raises(ValueError, match="expected labels"):
        fam.labels(cache="redis")
    with pytest.raises(ValueError, match="expected labels"):
        fam.labels("redis", result="hit")


def test_protect_and_instrument_share_queue_families_in_either_order() -> None:
    from aivitals.protect._metrics import metrics_for

    first = CollectorRegistry()
    family("queue_length", first).labels(queue="pool").set(3)
    metrics_for(first).queue_length.labels("admission").set(1)
    second = CollectorRegistry()
    metric("queue_length", registry=second).labels(queue="admission").set(1)
    family("queue_length", second).labels(queue="pool").set(3)
    for registry in (first, second):
        text = generate_latest(registry).decode()
        assert 'queue_length{queue="pool"} 3.0' in text
        assert 'queue_length{queue="admission"} 1.0' in text
