"""deploy/keda: the ScaledObject's structure, its PromQL, and what the queries answer.

KEDA's CRD schema is not carried by kubernetes-validate, so the fields are checked here
against keda.sh/v1alpha1 (ScaledObject) and the Prometheus scaler's documented metadata.
The queries are parsed by the parser the dashboards use, checked by promtool, and run
on the embedded store over three replicas' series, so the number KEDA divides by the
threshold is the one meant.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import yaml

from aivitals.dashboards._query import families_in
from aivitals.tsdb import Store
from tests._servers import promtool

ROOT = Path(__file__).resolve().parents[2]
SCALED = ROOT / "deploy" / "keda" / "scaledobject.yaml"
BASE = ROOT / "deploy" / "kubernetes"
_SPEC = {
    "scaleTargetRef",
    "pollingInterval",
    "cooldownPeriod",
    "initialCooldownPeriod",
    "idleReplicaCount",
    "minReplicaCount",
    "maxReplicaCount",
    "fallback",
    "advanced",
    "triggers",
}
_TRIGGER = {"type", "name", "metadata", "metricType", "authenticationRef", "useCachedMetrics"}
_PROMETHEUS = {
    "serverAddress",
    "query",
    "queryParameters",
    "threshold",
    "activationThreshold",
    "namespace",
    "customHeaders",
    "ignoreNullValues",
    "unsafeSsl",
}


def _scaled() -> dict[str, Any]:
    doc = yaml.safe_load(SCALED.read_text())
    assert isinstance(doc, dict)
    return doc


def _queries() -> dict[str, tuple[str, float, str]]:
    return {
        t["name"]: (t["metadata"]["query"], float(t["metadata"]["threshold"]), t["metricType"])
        for t in _scaled()["spec"]["triggers"]
    }


def test_the_scaledobject_has_kedas_structure() -> None:
    doc = _scaled()
    assert doc["apiVersion"] == "keda.sh/v1alpha1" and doc["kind"] == "ScaledObject"
    spec = doc["spec"]
    assert set(spec) <= _SPEC
    assert 1 <= spec["minReplicaCount"] <= spec["maxReplicaCount"]
    behavior = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert set(behavior) <= {"scaleUp", "scaleDown"}
    for trigger in spec["triggers"]:
        assert set(trigger) <= _TRIGGER, trigger
        assert trigger["type"] == "prometheus"
        assert trigger["metricType"] in ("AverageValue", "Value", "Utilization")
        meta = trigger["metadata"]
        assert set(meta) <= _PROMETHEUS, meta
        # KEDA's metadata is map[string]string: a bare number or boolean is refused
        assert all(isinstance(v, str) for v in meta.values()), meta
        float(meta["threshold"])
    assert set(_queries()) == {"queue", "kv-cache"}


def test_it_scales_the_example_service_its_queries_select() -> None:
    """The target is the base's Deployment, and `job` is what the operator gives that
    Service's series (the Service's name, its ServiceMonitor having no jobLabel)."""
    ref = _scaled()["spec"]["scaleTargetRef"]
    docs = list(yaml.safe_load_all((BASE / "example-service.yaml").read_text()))
    deploy = next(d for d in docs if d and d["kind"] == "Deployment")
    assert (ref["kind"], ref["name"]) == ("Deployment", deploy["metadata"]["name"])
    monitor = next(d for d in docs if d and d["kind"] == "ServiceMonitor")
    assert "jobLabel" not in monitor["spec"]
    service = next(d for d in docs if d and d["kind"] == "Service")
    for query, _, _ in _queries().values():
        assert f'job="{service["metadata"]["name"]}"' in query


def test_the_queries_read_names_the_prometheusrule_records_from_the_engines() -> None:
    """aivitals' names, which the PrometheusRule writes from vLLM's, SGLang's and TGI's
    own: the same object scales a vLLM Deployment."""
    rule = yaml.safe_load((BASE / "prometheusrule.yaml").read_text())
    native = next(g for g in rule["spec"]["groups"] if g["name"] == "aivitals-native-names")
    recorded = {r["record"]: r["expr"] for r in native["rules"]}
    read = set()
    for query, _, _ in _queries().values():
        read |= families_in(query)
    assert read == {"queue_length", "kv_cache_usage_ratio"}
    assert "vllm:num_requests_waiting" in recorded["queue_length"]
    assert "vllm:" in recorded["kv_cache_usage_ratio"]


def test_the_queries_answer_what_keda_divides_by_the_threshold() -> None:
    store = Store()
    now = time.time()
    queue = {"a": 4.0, "b": 7.0, "c": 9.0}
    kv = {"a": 0.9, "b": 0.7, "c": 0.8}
    for pod in queue:
        labels = {"job": "example-service", "pod": pod}
        store.append("queue_length", {**labels, "queue": "engine"}, queue[pod], now)
        store.append("kv_cache_usage_ratio", {**labels, "model": "m"}, kv[pod], now)
    # another service's queue must not scale this one
    store.append("queue_length", {"job": "other", "queue": "engine"}, 100.0, now)
    queries = _queries()
    query, threshold, kind = queries["queue"]
    (total,) = store.query(query, now).values()
    assert total == 20.0 and kind == "AverageValue"
    assert math.ceil(total / threshold) == 4  # replicas the HPA asks for
    query, threshold, kind = queries["kv-cache"]
    (mean,) = store.query(query, now).values()
    assert math.isclose(mean, 0.8) and kind == "Value"
    assert math.ceil(3 * mean / threshold - 1e-9) == 3  # at the target: no change


def test_promtool_accepts_the_queries(tmp_path: Path) -> None:
    rules: dict[str, Any] = {
        "groups": [
            {
                "name": "keda",
                "rules": [
                    {"record": f"keda:{name.replace('-', '_')}", "expr": query}
                    for name, (query, _, _) in _queries().items()
                ],
            }
        ]
    }
    path = tmp_path / "keda.yml"
    path.write_text(yaml.safe_dump(rules))
    proc = promtool("check", "rules", str(path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rules["groups"][0]["rules"][0]["expr"] = "sum(queue_length{job=}"
    path.write_text(yaml.safe_dump(rules))
    assert promtool("check", "rules", str(path)).returncode != 0
