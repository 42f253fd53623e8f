"""deploy/kubernetes: every manifest validated offline, generated copies current.

Built-in kinds are validated with kubernetes-validate (the API's OpenAPI schemas,
strict: an unknown field fails) for the oldest and newest Kubernetes it carries
that we support. ServiceMonitor and PrometheusRule are CRDs of the Prometheus
operator, which those schemas do not carry: their structure is checked here
field by field against the operator's v1 API, and the rules with promtool.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from aivitals.alerts import default_pack, native_rule_group
from aivitals.dashboards import build_dashboards
from tests._paths import load_script
from tests._servers import promtool

kv = pytest.importorskip("kubernetes_validate")

ROOT = Path(__file__).resolve().parents[2]
BASE = ROOT / "deploy" / "kubernetes"
VERSIONS = ("1.29.0", "1.37.0")
CRDS = {"ServiceMonitor", "PrometheusRule"}


def _generate() -> ModuleType:
    return load_script("deploy/generate.py", "deploy_generate")


def _kustomization() -> dict[str, Any]:
    doc = yaml.safe_load((BASE / "kustomization.yaml").read_text())
    assert isinstance(doc, dict)
    return doc


def _documents() -> list[dict[str, Any]]:
    """Every resource the kustomization lists, as kustomize would emit them (namespace
    and common labels applied), without needing kustomize."""
    kust = _kustomization()
    out = []
    for name in kust["resources"]:
        path = BASE / name
        assert path.is_file(), f"kustomization lists {name}, which does not exist"
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is None:
                continue
            meta = doc.setdefault("metadata", {})
            if doc["kind"] != "Namespace":
                meta["namespace"] = kust["namespace"]
            for pairs in kust.get("labels", []):
                meta.setdefault("labels", {}).update(pairs["pairs"])
            out.append(doc)
    return out


def test_the_kustomization_lists_every_manifest_and_nothing_else() -> None:
    listed = set(_kustomization()["resources"])
    present = {p.name for p in BASE.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == present


def test_builtin_kinds_validate_strictly() -> None:
    docs = _documents()
    kinds = {d["kind"] for d in docs}
    assert {"DaemonSet", "Deployment", "Service", "ConfigMap", "Namespace"} <= kinds
    for doc in docs:
        if doc["kind"] in CRDS:
            continue
        for version in VERSIONS:
            kv.validate(doc, version, strict=True)


def test_a_broken_manifest_is_caught() -> None:
    """The validation can fail: a misspelt field and a wrong type are refused."""
    daemonset = next(d for d in _documents() if d["kind"] == "DaemonSet")
    daemonset["spec"]["template"]["spec"]["hostPid"] = True  # hostPID, misspelt
    with pytest.raises(kv.ValidationError):
        kv.validate(daemonset, VERSIONS[-1], strict=True)
    daemonset = next(d for d in _documents() if d["kind"] == "DaemonSet")
    daemonset["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "9464"
    with pytest.raises(kv.ValidationError):
        kv.validate(daemonset, VERSIONS[-1], strict=True)


def test_the_agent_daemonset_has_what_the_issue_asks() -> None:
    ds = next(d for d in _documents() if d["kind"] == "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    assert pod["hostPID"] is True
    assert pod["runtimeClassName"] == "nvidia"
    assert any(t["key"] == "nvidia.com/gpu" for t in pod["tolerations"])
    kmsg = next(v for v in pod["volumes"] if v["name"] == "kmsg")
    assert kmsg["hostPath"] == {"path": "/dev/kmsg", "type": "CharDevice"}
    (agent,) = pod["containers"]
    mount = next(m for m in agent["volumeMounts"] if m["name"] == "kmsg")
    assert mount["readOnly"] is True
    assert "--exporter" in agent["args"] and "--allow-remote" in agent["args"]
    assert agent["livenessProbe"]["httpGet"]["path"] == "/-/healthy"
    assert agent["readinessProbe"]["httpGet"]["path"] == "/-/ready"
    # the requests match benchmarks/collector_cost.py's measured figures (with headroom)
    import json

    cost = json.loads((ROOT / "benchmarks" / "results" / "collector_cost.json").read_text())
    requests = agent["resources"]["requests"]
    assert _millicores(requests["cpu"]) >= cost["cpu_pct"] * 10  # percent of a core -> m
    assert _mebibytes(requests["memory"]) >= cost["rss_mb"] * 1e6 / 2**20
    limits = agent["resources"]["limits"]
    assert _mebibytes(limits["memory"]) >= 2 * _mebibytes(requests["memory"])


def _millicores(text: str) -> float:
    return float(text[:-1]) if text.endswith("m") else float(text) * 1000


def _mebibytes(text: str) -> float:
    assert text.endswith("Mi"), text
    return float(text[:-2])


def test_the_agent_serves_the_probed_paths_with_the_daemonsets_args(tmp_path: Path) -> None:
    """The container's arguments are accepted by `aivitals agent` and the probe paths answer.
    Run here on 127.0.0.1 (the pod listens on 0.0.0.0:9464) without the kernel log."""
    import httpx

    from tests._servers import free_port

    ds = next(d for d in _documents() if d["kind"] == "DaemonSet")
    agent = ds["spec"]["template"]["spec"]["containers"][0]
    port = free_port()
    args = [a for a in agent["args"] if not a.startswith("--listen=")]
    args += [f"--listen=127.0.0.1:{port}", "--no-kernel-log"]
    argv = [sys.executable, "-c", "from aivitals.cli import main; main()", *args]
    log = tmp_path / "agent.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    try:
        import time

        deadline = time.monotonic() + 60
        ready = None
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                ready = httpx.get(f"http://127.0.0.1:{port}/-/ready", timeout=2)
                if ready.status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        assert ready is not None and ready.status_code == 200, log.read_text()[-2000:]
        assert httpx.get(f"http://127.0.0.1:{port}/-/healthy", timeout=5).status_code == 200
        metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
        assert "host_cpu_seconds_total" in metrics
    finally:
        proc.terminate()
        proc.wait(timeout=15)


def test_the_example_service_probes_use_aivitals_health_endpoints() -> None:
    deploy = next(d for d in _documents() if d["kind"] == "Deployment")
    (svc,) = deploy["spec"]["template"]["spec"]["containers"]
    assert svc["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert svc["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert svc["startupProbe"]["httpGet"]["path"] == "/readyz"
    from aivitals.protect import _health

    doc = _health.__doc__ or ""
    assert "``/healthz`` (liveness)" in doc and "``/readyz`` (readiness)" in doc


def _check_servicemonitor(doc: dict[str, Any], services: list[dict[str, Any]]) -> None:
    assert doc["apiVersion"] == "monitoring.coreos.com/v1"
    assert set(doc) == {"apiVersion", "kind", "metadata", "spec"}
    spec = doc["spec"]
    assert set(spec) <= {"selector", "endpoints", "namespaceSelector", "jobLabel", "targetLabels"}
    assert "release" in doc["metadata"]["labels"]  # kube-prometheus-stack's selector
    selected = [
        s
        for s in services
        if spec["selector"]["matchLabels"].items() <= s["metadata"]["labels"].items()
    ]
    assert len(selected) == 1, "the selector must match exactly one Service"
    port_names = {p["name"] for p in selected[0]["spec"]["ports"]}
    endpoint_keys = {"port", "path", "interval", "scrapeTimeout", "relabelings", "scheme"}
    endpoint_keys.add("honorLabels")
    for endpoint in spec["endpoints"]:
        assert set(endpoint) <= endpoint_keys, endpoint
        assert endpoint["port"] in port_names
        assert isinstance(endpoint.get("honorLabels", False), bool)
        for relabel in endpoint.get("relabelings", []):
            assert set(relabel) <= {"sourceLabels", "targetLabel", "regex", "replacement", "action"}
            if relabel.get("action") == "labeldrop":
                assert set(relabel) == {"action", "regex"}
            else:
                assert relabel["targetLabel"] == "node"  # the dashboards' node variable


def test_the_agents_pod_labels_never_land_on_gpu_processes() -> None:
    """The agent exports a GPU process's own namespace/pod/container: Prometheus keeps them
    (honorLabels) and the target's, naming the agent's pod, are dropped, so a process
    outside any pod is not attributed to the agent."""
    import re

    monitor = next(
        d
        for d in _documents()
        if d["kind"] == "ServiceMonitor" and d["metadata"]["name"] == "aivitals-agent"
    )
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["honorLabels"] is True
    drops = [r["regex"] for r in endpoint["relabelings"] if r.get("action") == "labeldrop"]
    for label in ("namespace", "pod", "container"):
        assert any(re.fullmatch(rx, label) for rx in drops), label
    for label in ("node", "instance", "job", "service", "endpoint"):
        assert not any(re.fullmatch(rx, label) for rx in drops), label


def test_crds_have_the_operator_structure() -> None:
    docs = _documents()
    services = [d for d in docs if d["kind"] == "Service"]
    monitors = [d for d in docs if d["kind"] == "ServiceMonitor"]
    assert len(monitors) == 2
    for doc in monitors:
        _check_servicemonitor(doc, services)
    (rule,) = [d for d in docs if d["kind"] == "PrometheusRule"]
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert "release" in rule["metadata"]["labels"]
    for group in rule["spec"]["groups"]:
        assert set(group) <= {"name", "interval", "rules", "limit"}
        for r in group["rules"]:
            assert set(r) <= {
                "alert",
                "record",
                "expr",
                "for",
                "keep_firing_for",
                "labels",
                "annotations",
            }
    maps = [d for d in docs if d["kind"] == "ConfigMap"]
    assert len(maps) == 6 and all(m["metadata"]["labels"]["grafana_dashboard"] == "1" for m in maps)


def test_generated_copies_are_current() -> None:
    """One source of truth: the committed PrometheusRule and dashboard ConfigMaps are what
    the package generates now (regenerate with `python deploy/generate.py`)."""
    gen = _generate()
    for path, text in gen.generated().items():
        assert path.read_text() == text, f"{path.name} is stale: run python deploy/generate.py"
    rule = yaml.safe_load((BASE / "prometheusrule.yaml").read_text())
    native, *pack_groups = rule["spec"]["groups"]
    interval = default_pack().params.evaluation_interval
    assert native == native_rule_group(interval, sources=gen.ENGINE_SOURCES)
    # the engines' names only: the DaemonSet's agent exports host and GPU series itself,
    # so node_exporter's and DCGM's forms would count every node twice
    recorded = json.dumps(native)
    assert "vllm:" in recorded and "node_" not in recorded and "DCGM_" not in recorded
    assert native != native_rule_group(interval)  # the full group reads them
    assert pack_groups == yaml.safe_load(default_pack().text)["groups"]
    maps = list(yaml.safe_load_all((BASE / "dashboards-configmaps.yaml").read_text()))
    docs = build_dashboards()
    for m in maps:
        ((name, text),) = m["data"].items()
        assert json.loads(text) == docs[name.removesuffix(".json")]


def test_generate_check_fails_on_a_stale_copy(tmp_path: Path) -> None:
    gen = _generate()
    gen.RULE_FILE = tmp_path / "prometheusrule.yaml"
    gen.DASHBOARD_FILE = tmp_path / "dashboards-configmaps.yaml"
    gen.RULE_FILE.write_text("stale")
    assert gen.main(["--check"]) == 1
    assert gen.RULE_FILE.read_text() == "stale"  # --check writes nothing
    assert gen.main([]) == 0
    assert gen.main(["--check"]) == 0


@pytest.mark.integration
def test_promtool_checks_the_prometheusrules_rules(tmp_path: Path) -> None:
    rule = yaml.safe_load((BASE / "prometheusrule.yaml").read_text())
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}, sort_keys=False))
    proc = promtool("check", "rules", str(path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout
    # and it does reject a broken rule
    rule["spec"]["groups"][0]["rules"][0]["expr"] = "sum(rate(x[5m]"
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}, sort_keys=False))
    assert promtool("check", "rules", str(path)).returncode != 0


def test_kustomize_builds_when_kubectl_is_here() -> None:
    """Where kubectl (with its built-in kustomize) is installed, `kubectl kustomize` renders
    the base and every rendered document validates; elsewhere the resource check above
    stands in for it."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl not installed: the kustomization was checked by listing its resources")
    proc = subprocess.run(
        [kubectl, "kustomize", str(BASE)], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr
    docs = [d for d in yaml.safe_load_all(proc.stdout) if d]
    assert len(docs) == len(_documents())
    for doc in docs:
        assert doc["metadata"].get("namespace", "aivitals") == "aivitals"
        if doc["kind"] not in CRDS:
            kv.validate(doc, VERSIONS[-1], strict=True)
    images = {
        c["image"]
        for d in docs
        if d["kind"] in ("DaemonSet", "Deployment")
        for c in d["spec"]["template"]["spec"]["containers"]
    }
    assert images == {"aivitals-agent:0.1.0", "aivitals-example-service:0.1.0"}


def test_the_documented_overlay_that_names_pods_validates() -> None:
    """docs/deploy.md's patch (the kubelet's log directories, read-only, and
    --kubelet-pods) applied to the DaemonSet: still valid, and its argument accepted."""
    import re

    from aivitals.agent import AgentConfig

    doc = (ROOT / "docs" / "deploy.md").read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", doc, flags=re.S)
    (patch_text,) = [b for b in blocks if "--kubelet-pods" in b]
    ops = yaml.safe_load(textwrap.dedent(patch_text))
    ds = next(d for d in _documents() if d["kind"] == "DaemonSet")
    for op in ops:
        assert op["op"] == "add" and op["path"].endswith("/-"), op
        node: Any = ds
        for part in op["path"].strip("/").split("/")[:-1]:
            node = node[int(part)] if isinstance(node, list) else node[part]
        node.append(op["value"])
    for version in VERSIONS:
        kv.validate(ds, version, strict=True)
    agent = ds["spec"]["template"]["spec"]["containers"][0]
    (arg,) = [a for a in agent["args"] if a.startswith("--kubelet-pods=")]
    path = arg.partition("=")[2]
    mounts = {m["mountPath"]: m for m in agent["volumeMounts"]}
    assert mounts[path]["readOnly"] is True
    assert mounts[str(Path(path).parent / "containers")]["readOnly"] is True
    AgentConfig(kubelet_pods=path)  # accepted (the directory need not exist here)
