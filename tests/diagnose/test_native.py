"""The diagnosis on a store that holds only the exporters' own names (vLLM, DCGM,
node_exporter), as a Prometheus that scrapes them without the recording rules does."""

from __future__ import annotations

import functools
from typing import Any

import pytest

from aivitals.diagnose import diagnose
from aivitals.signals import ALIASES, FOREIGN_LABELS
from aivitals.tsdb import Store
from tests.diagnose import _corpus as corpus

DURATION = 600.0
_MIB = 1024.0 * 1024.0
#: The exporters a Prometheus would scrape beside an uninstrumented vLLM.
_SOURCES = ("vllm", "dcgm", "node")


def _reverse() -> dict[str, Any]:
    """Our sample name -> its first alias from those exporters (the newest name)."""
    out: dict[str, Any] = {}
    for alias in ALIASES:
        if alias.source in _SOURCES and not alias.histogram and alias.ours not in out:
            out[alias.ours] = alias
    return out


def _native_store(sc: Any) -> tuple[Store, set[str]]:
    """The scenario's series under the exporters' names and units; what has no native
    name stays ours. GPU memory total becomes DCGM's free (no reserved: the older
    default counters), per-host CPU becomes one core of node_exporter's."""
    reverse = _reverse()
    store = Store(retention=7200)
    series = list(corpus.samples(sc))
    used = {
        tuple(sorted(lb.items())): vals
        for name, lb, _, vals in series
        if name == "gpu_memory_used_bytes"
    }
    converted: set[str] = set()
    for name, labels, ts, vals in series:
        out_name, out_labels, out_vals = name, dict(labels), vals
        if name == "gpu_memory_total_bytes":
            out_name = "DCGM_FI_DEV_FB_FREE"
            out_vals = (vals - used[tuple(sorted(labels.items()))]) / _MIB
            out_labels["Hostname"] = "gpu-node-1"
        elif name == "host_cpu_seconds_total":
            out_name, out_labels = "node_cpu_seconds_total", {**labels, "cpu": "0"}
        elif name in reverse:
            # the corpus's one inference queue stands for vLLM's waiting queue, whose
            # alias names it queue="engine"
            alias = reverse[name]
            out_name, out_vals = alias.foreign, vals / alias.scale
            for k, _ in alias.add_labels:
                out_labels.pop(k, None)
            for ours, theirs in FOREIGN_LABELS.get(alias.source, {}).items():
                if ours in out_labels and ours != "node":
                    out_labels[theirs[0]] = out_labels.pop(ours)
            if alias.source == "dcgm":
                out_labels["Hostname"] = "gpu-node-1"
        if out_name != name:
            converted.add(name)
        for t, v in zip(ts.tolist(), out_vals.tolist(), strict=True):
            store.append(out_name, out_labels, v, t)
    return store, converted


@functools.cache
def _pair(fault: str) -> tuple[Any, Store, Store, frozenset[str]]:
    sc = corpus.scenario(fault, seed=1, duration=DURATION)
    ours = corpus.to_store(sc)
    assert isinstance(ours, Store)
    native, converted = _native_store(sc)
    return sc, ours, native, frozenset(converted)


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["kv_cache_pressure", "queue_saturation_idle_gpu", "cpu_burn"])
def test_native_names_alone_name_the_same_fault(fault: str) -> None:
    sc, ours, native, converted = _pair(fault)
    # the store really holds no aivitals name for what the exporters export
    for name in ("kv_cache_usage_ratio", "queue_length", "gpu_memory_used_bytes"):
        assert name in converted
        assert not native.metric_names() or name not in set(native.metric_names())
    want = diagnose(ours, end=sc.end, location=None)
    got = diagnose(native, end=sc.end, location=None)
    assert want.findings[0].signature == fault
    assert got.findings[0].signature == fault
    assert got.findings[0].confidence == pytest.approx(want.findings[0].confidence, abs=0.1)
    # what the exporters stand in for is not reported missing
    unseen = " ".join(u.what for u in got.unseen)
    assert "kv_cache_usage_ratio" not in unseen and "gpu_memory_total_bytes" not in unseen


def test_without_the_fallback_the_native_store_is_blind() -> None:
    """The fallback is what finds it: asked only by our names, the same store names no
    KV-cache pressure (the failure the issue reports)."""
    from aivitals.diagnose import _engine

    sc, _, native, _ = _pair("kv_cache_pressure")
    real = _engine.native_names
    try:
        _engine.native_names = lambda name: ()  # type: ignore[assignment]
        blind = diagnose(native, end=sc.end, location=None)
    finally:
        _engine.native_names = real  # type: ignore[assignment]
    assert not blind.findings or blind.findings[0].signature != "kv_cache_pressure"
    assert any("kv_cache_usage_ratio" in u.what for u in blind.unseen)
