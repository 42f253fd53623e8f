"""deploy/kubernetes: every manifest validated offline, in every variant of the settings;
the committed copies are what deploy/generate.py renders from deploy/values.yaml.

Built-in kinds are validated with kubernetes-validate (the API's OpenAPI schemas,
strict: an unknown field fails) for the oldest and newest Kubernetes it carries
that we support. ServiceMonitor and PrometheusRule are CRDs of the Prometheus
operator, which those schemas do not carry: their structure is checked here
field by field against the operator's v1 API, and the rules with promtool.
"""

from __future__ import annotations

import functools
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
from tests._pki import make_pki
from tests._servers import promtool

kv = pytest.importorskip("kubernetes_validate")

ROOT = Path(__file__).resolve().parents[2]
BASE = ROOT / "deploy" / "kubernetes"
VERSIONS = ("1.29.0", "1.37.0")
CRDS = {"ServiceMonitor", "PrometheusRule"}
#: bcrypt of "test" from prometheus.io's basic-auth guide
GUIDE_HASH = "$2b$12$hNf2lSsxfm0.i4a.1kVpSOVyBCfIB51VRjgBUyv6kdnyTlgWj81Ay"

#: The settings an owner changes, one variant each (over deploy/values.yaml).
VARIANTS: dict[str, dict[str, Any]] = {
    "default": {},
    "custom-labels": {
        "monitoring": {
            "serviceMonitorLabels": {"release": "prom-stack"},
            "ruleLabels": {"release": "prom-stack", "role": "alert-rules"},
            "scrapeInterval": "30s",
        }
    },
    "tls": {"agent": {"webConfig": {"tls": {"secretName": "aivitals-agent-tls"}}}},
    "basic-auth": {"agent": {"webConfig": {"basicAuth": {"users": {"prometheus": GUIDE_HASH}}}}},
    "tls-and-basic-auth": {
        "agent": {
            "webConfig": {
                "tls": {"secretName": "aivitals-agent-tls", "serverName": "agent.example"},
                "basicAuth": {"users": {"prometheus": GUIDE_HASH}, "scrapeSecretName": "auth"},
            }
        }
    },
    "cpu-nodes-elsewhere": {
        "namespace": "observability",
        "exampleService": False,
        "images": {"agent": {"repository": "registry.example/aivitals-agent", "tag": "1.2.3"}},
        "agent": {
            "runtimeClassName": None,
            "nodeSelector": {},
            "tolerations": [],
            "gpu": "none",
            "listenAddress": "::",
            "port": 10100,
            "interval": "10s",
            "resources": {"requests": {"cpu": "20m", "memory": "128Mi"}},
        },
    },
}


@functools.cache
def _generate() -> ModuleType:
    return load_script("deploy/generate.py", "deploy_generate")


def _render(tmp_path: Path, name: str) -> Path:
    """The variant rendered by the script's own entry point, as an owner would."""
    values = tmp_path / f"{name}.values.yaml"
    values.write_text(yaml.safe_dump(VARIANTS[name]))
    out = tmp_path / name
    assert _generate().main(["--values", str(values), "--out", str(out)]) == 0
    return out


def _kustomization(base: Path = BASE) -> dict[str, Any]:
    doc = yaml.safe_load((base / "kustomization.yaml").read_text())
    assert isinstance(doc, dict)
    return doc


def _documents(base: Path = BASE) -> list[dict[str, Any]]:
    """Every resource the kustomization lists, as kustomize would emit them (namespace
    and common labels applied), without needing kustomize."""
    kust = _kustomization(base)
    out = []
    for name in kust["resources"]:
        path = base / name
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


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_builtin_kinds_validate_strictly(tmp_path: Path, variant: str) -> None:
    docs = _documents(_render(tmp_path, variant))
    kinds = {d["kind"] for d in docs}
    assert {"DaemonSet", "Service", "ConfigMap", "Namespace"} <= kinds
    assert ("Deployment" in kinds) == VARIANTS[variant].get("exampleService", True)
    # a document the variant leaves as the default has it was validated in [default]
    same = [] if variant == "default" else _documents(_render(tmp_path, "default"))
    docs = [d for d in docs if d not in same]
    assert any(d["kind"] == "DaemonSet" for d in docs) or variant == "custom-labels"
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


def _start_agent(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-c", "from aivitals.cli import main; main()", *args]
    with log.open("wb") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)


def _wait_ready(url: str, proc: subprocess.Popen[bytes], log: Path, **kw: Any) -> None:
    import time

    import httpx

    deadline = time.monotonic() + 60
    ready = None
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            ready = httpx.get(f"{url}/-/ready", timeout=2, **kw)
            if ready.status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise AssertionError(log.read_text()[-2000:])


def test_the_agent_serves_the_probed_paths_with_the_daemonsets_args(tmp_path: Path) -> None:
    """The container's arguments are accepted by `aivitals agent` and the probe paths answer.
    Run here on 127.0.0.1 (the pod listens on 0.0.0.0) without the kernel log."""
    import httpx

    from tests._servers import free_port

    ds = next(d for d in _documents() if d["kind"] == "DaemonSet")
    agent = ds["spec"]["template"]["spec"]["containers"][0]
    port = free_port()
    args = [a for a in agent["args"] if not a.startswith("--listen=")]
    args += [f"--listen=127.0.0.1:{port}", "--no-kernel-log"]
    log = tmp_path / "agent.log"
    proc = _start_agent(args, log)
    try:
        _wait_ready(f"http://127.0.0.1:{port}", proc, log)
        assert httpx.get(f"http://127.0.0.1:{port}/-/healthy", timeout=5).status_code == 200
        metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
        assert "host_cpu_seconds_total" in metrics
    finally:
        proc.terminate()
        proc.wait(timeout=15)


def test_the_tls_variant_serves_what_its_servicemonitor_scrapes(tmp_path: Path) -> None:
    """The rendered TLS and basic-auth variant, run: the DaemonSet's arguments with the
    rendered web-config Secret (its TLS directory pointed at certificates made here), the
    kubelet's probes over HTTPS without credentials, Prometheus' scrape with them."""
    import ssl

    import httpx

    from tests._servers import free_port

    gen = _generate()
    docs = _documents(_render(tmp_path, "tls-and-basic-auth"))
    (secret,) = [d for d in docs if d["kind"] == "Secret"]
    ds = next(d for d in docs if d["kind"] == "DaemonSet")
    agent = ds["spec"]["template"]["spec"]["containers"][0]
    pki = make_pki(tmp_path / "pki")
    tls_dir = tmp_path / "tls"  # what the tls Secret's volume holds in the pod
    tls_dir.mkdir()
    shutil.copy(pki.server_cert, tls_dir / "tls.crt")
    shutil.copy(pki.server_key, tls_dir / "tls.key")
    web = tmp_path / "web-config.yml"
    web.write_text(secret["stringData"]["web-config.yml"].replace(gen.TLS_DIR, str(tls_dir)))
    port = free_port()
    args = [a for a in agent["args"] if not a.startswith(("--listen=", "--web-config="))]
    args += [f"--listen=127.0.0.1:{port}", "--no-kernel-log", f"--web-config={web}"]
    log = tmp_path / "agent.log"
    proc = _start_agent(args, log)
    url = f"https://127.0.0.1:{port}"
    try:
        _wait_ready(url, proc, log, verify=False)  # the kubelet does not check it either
        assert all(
            agent[p]["httpGet"]["scheme"] == "HTTPS" for p in ("livenessProbe", "readinessProbe")
        )
        assert httpx.get(f"{url}/-/healthy", verify=False, timeout=5).status_code == 200
        trust = ssl.create_default_context(cafile=str(pki.ca))
        assert httpx.get(f"{url}/metrics", verify=trust, timeout=5).status_code == 401
        # GUIDE_HASH is bcrypt("test"): what the scrape Secret's password would be
        ok = httpx.get(f"{url}/metrics", verify=trust, auth=("prometheus", "test"), timeout=5)
        assert ok.status_code == 200 and "host_cpu_seconds_total" in ok.text
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
    selected = [
        s
        for s in services
        if spec["selector"]["matchLabels"].items() <= s["metadata"]["labels"].items()
    ]
    assert len(selected) == 1, "the selector must match exactly one Service"
    port_names = {p["name"] for p in selected[0]["spec"]["ports"]}
    endpoint_keys = {"port", "path", "interval", "scrapeTimeout", "relabelings", "scheme"}
    endpoint_keys |= {"honorLabels", "tlsConfig", "basicAuth"}
    for endpoint in spec["endpoints"]:
        assert set(endpoint) <= endpoint_keys, endpoint
        assert endpoint["port"] in port_names
        assert isinstance(endpoint.get("honorLabels", False), bool)
        assert endpoint.get("scheme", "http") in ("http", "https")
        if "tlsConfig" in endpoint:  # the operator's SafeTLSConfig
            tls = endpoint["tlsConfig"]
            assert set(tls) <= {"ca", "cert", "keySecret", "serverName", "insecureSkipVerify"}
            assert set(tls["ca"]["secret"]) == {"name", "key"}
        if "basicAuth" in endpoint:  # two SecretKeySelectors
            auth = endpoint["basicAuth"]
            assert set(auth) == {"username", "password"}
            assert all(set(sel) == {"name", "key"} for sel in auth.values())
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


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_crds_have_the_operator_structure(tmp_path: Path, variant: str) -> None:
    docs = _documents(_render(tmp_path, variant))
    values = _generate().load_values(tmp_path / f"{variant}.values.yaml")
    services = [d for d in docs if d["kind"] == "Service"]
    monitors = [d for d in docs if d["kind"] == "ServiceMonitor"]
    assert len(monitors) == (2 if values["exampleService"] else 1)
    for doc in monitors:
        _check_servicemonitor(doc, services)
        # exactly the owner's labels for the operator's serviceMonitorSelector, nothing
        # more: no `release` unless asked for
        own = {"app.kubernetes.io/name", "app.kubernetes.io/part-of"}
        labels = doc["metadata"]["labels"]
        assert {k: v for k, v in labels.items() if k not in own} == (
            values["monitoring"]["serviceMonitorLabels"]
        )
        assert all(
            e["interval"] == values["monitoring"]["scrapeInterval"]
            for e in doc["spec"]["endpoints"]
        )
    (rule,) = [d for d in docs if d["kind"] == "PrometheusRule"]
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    own = {"app.kubernetes.io/name", "app.kubernetes.io/part-of"}
    rule_labels = {k: v for k, v in rule["metadata"]["labels"].items() if k not in own}
    assert rule_labels == values["monitoring"]["ruleLabels"]
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
    out = tmp_path / "out"
    assert gen.main(["--out", str(out)]) == 0
    assert gen.main(["--out", str(out), "--check"]) == 0
    (out / "prometheusrule.yaml").write_text("stale")
    assert gen.main(["--out", str(out), "--check"]) == 1
    assert (out / "prometheusrule.yaml").read_text() == "stale"  # --check writes nothing
    # a file an earlier rendering made that these settings do not (the web-config Secret
    # once TLS is off) is stale too, and removed on rendering
    leftover = out / "agent-web-config.yaml"
    leftover.write_text("# Generated by `python deploy/generate.py` from the values\n")
    assert gen.main(["--out", str(out), "--check"]) == 1
    assert gen.main(["--out", str(out)]) == 0
    assert not leftover.exists()
    assert gen.main(["--out", str(out), "--check"]) == 0


@pytest.mark.parametrize(
    ("values", "says"),
    [
        (
            "monitoring:\n  serviceMonitorLabel: {release: x}\n",
            "monitoring.serviceMonitorLabel: no such",
        ),
        ("monitoring:\n  ruleLabels: {enabled: true}\n", "ruleLabels.enabled: True is not a"),
        ("monitoring:\n  ruleLabels: {'bad key!': x}\n", "is not a Kubernetes label name"),
        ("agent:\n  port: 70000\n", "agent.port: 70000 is not a TCP port"),
        ("agent:\n  listenAddress: 'not an address'\n", "'not an address' is not an IP address"),
        ("agent:\n  interval: soon\n", "agent.interval"),
        (
            "agent:\n  webConfig:\n    basicAuth:\n      users: {prometheus: hunter2}\n",
            "users.prometheus: not a bcrypt hash",
        ),
        ("agent: [1, 2]\n", "values agent: expected a mapping"),
        ("monitoring: {scrapeInterval: often}\n", "scrapeInterval: 'often' is not a duration"),
        ("agent: {port: 1\n", "not valid YAML"),
    ],
)
def test_bad_values_are_refused_with_the_setting_named(
    tmp_path: Path, values: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text(values)
    out = tmp_path / "out"
    assert _generate().main(["--values", str(path), "--out", str(out)]) == 2
    assert says in capsys.readouterr().err
    assert not out.exists()  # nothing half-rendered
    missing = tmp_path / "missing.yaml"
    assert _generate().main(["--values", str(missing)]) == 2
    assert "cannot read it" in capsys.readouterr().err


def test_web_config_turns_on_tls_and_auth_everywhere_it_must(tmp_path: Path) -> None:
    """One setting, five places kept in step: the agent's argument and mounts, its probes'
    scheme, the Secret with the web-config, the ServiceMonitor's scheme and credentials."""
    gen = _generate()
    docs = _documents(_render(tmp_path, "tls-and-basic-auth"))
    ds = next(d for d in docs if d["kind"] == "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    (agent,) = pod["containers"]
    (arg,) = [a for a in agent["args"] if a.startswith("--web-config=")]
    path = Path(arg.partition("=")[2])
    mounts = {m["name"]: m for m in agent["volumeMounts"]}
    assert mounts["web-config"]["mountPath"] == str(path.parent) and mounts["tls"]["readOnly"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["tls"]["secret"]["secretName"] == "aivitals-agent-tls"
    (secret,) = [d for d in docs if d["kind"] == "Secret"]
    assert volumes["web-config"]["secret"]["secretName"] == secret["metadata"]["name"]
    web = yaml.safe_load(secret["stringData"][path.name])
    assert web["basic_auth_users"] == {"prometheus": GUIDE_HASH}
    tls_dir = mounts["tls"]["mountPath"]
    assert web["tls_server_config"] == {
        "cert_file": f"{tls_dir}/tls.crt",
        "key_file": f"{tls_dir}/tls.key",
    }
    assert agent["livenessProbe"]["httpGet"]["scheme"] == "HTTPS"
    assert agent["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
    monitor = next(
        d
        for d in docs
        if d["kind"] == "ServiceMonitor" and d["metadata"]["name"] == "aivitals-agent"
    )
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["scheme"] == "https"
    assert endpoint["tlsConfig"]["serverName"] == "agent.example"
    assert endpoint["tlsConfig"]["ca"]["secret"] == {"name": "aivitals-agent-tls", "key": "ca.crt"}
    assert endpoint["basicAuth"]["password"] == {"name": "auth", "key": "password"}
    # and the default turns none of it on
    default = _documents(BASE)
    assert not [d for d in default if d["kind"] == "Secret"]
    ds = next(d for d in default if d["kind"] == "DaemonSet")
    assert not any(
        a.startswith("--web-config")
        for a in ds["spec"]["template"]["spec"]["containers"][0]["args"]
    )
    assert gen.web_config_text(gen.load_values()) is None


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


@pytest.mark.parametrize("variant", ["default", "tls-and-basic-auth", "cpu-nodes-elsewhere"])
def test_kustomize_builds_when_kubectl_is_here(tmp_path: Path, variant: str) -> None:
    """Where kubectl (with its built-in kustomize) is installed, `kubectl kustomize` renders
    the rendered directory and every document validates; elsewhere the resource check
    above stands in for it."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl not installed: the kustomization was checked by listing its resources")
    base = BASE if variant == "default" else _render(tmp_path, variant)
    proc = subprocess.run(
        [kubectl, "kustomize", str(base)], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr
    docs = [d for d in yaml.safe_load_all(proc.stdout) if d]
    assert len(docs) == len(_documents(base))
    namespace = _kustomization(base)["namespace"]
    for doc in docs:
        assert doc["metadata"].get("namespace", namespace) == namespace
        if doc["kind"] not in CRDS:
            kv.validate(doc, VERSIONS[-1], strict=True)
    images = {
        c["image"]
        for d in docs
        if d["kind"] in ("DaemonSet", "Deployment")
        for c in d["spec"]["template"]["spec"]["containers"]
    }
    expected = {
        "default": {"aivitals-agent:0.1.0", "aivitals-example-service:0.1.0"},
        "tls-and-basic-auth": {"aivitals-agent:0.1.0", "aivitals-example-service:0.1.0"},
        "cpu-nodes-elsewhere": {"registry.example/aivitals-agent:1.2.3"},
    }
    assert images == expected[variant]


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
