"""The native-name conversion (recording rules, the diagnosis's fallback) on the
exporters' own published expositions and metric lists (tests/fixtures/exporters)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from aivitals.alerts import (
    default_pack,
    native_expr,
    native_rule_group,
    native_rules_text,
    native_samples,
    with_native,
)
from aivitals.signals import ALIASES, DERIVED
from aivitals.tsdb import Store
from tests._paths import FIXTURES
from tests._servers import require_binary

EXPORTERS = FIXTURES / "exporters"
T = 1_700_000_000.0

#: Aliased names the fixtures cannot show, each with the reason.
NOT_IN_FIXTURES = {
    # dcgm-exporter's default counters named these until it moved to
    # DCGM_FI_PROF_PCIE_*_BYTES; older deployments still export them
    "DCGM_FI_DEV_PCIE_TX_THROUGHPUT",
    "DCGM_FI_DEV_PCIE_RX_THROUGHPUT",
    # node_exporter's meminfo collector exports every /proc/meminfo key as
    # node_memory_<key>_bytes; the fixture's meminfo predates MemAvailable (Linux 3.14)
    "node_memory_MemAvailable_bytes",
    # node_exporter's end-to-end fixture runs without its filesystem collector (what it
    # reads is the host's own mounts); these are that collector's names, as its
    # filesystem_common.go declares them and its mixin's disk alerts read them
    "node_filesystem_size_bytes",
    "node_filesystem_free_bytes",
    "node_filesystem_avail_bytes",
    "node_filesystem_files",
    "node_filesystem_files_free",
    "node_filesystem_readonly",
    "node_filesystem_device_error",
}


def _exposition(path: Path) -> str:
    """A published example as an exposition: its `$ curl` line and `...` elisions dropped."""
    lines = path.read_text().splitlines()
    return "\n".join(ln for ln in lines if not ln.startswith("$ ") and ln != "...") + "\n"


def _published() -> dict[str, set[str]]:
    dcgm = set()
    for line in (EXPORTERS / "dcgm-exporter/default-counters.csv").read_text().splitlines():
        field = line.lstrip("# ").split(",")[0].strip()
        if field.startswith("DCGM_"):
            dcgm.add(field)  # commented-out fields are documented ones, off by default
    node = (EXPORTERS / "node_exporter/e2e-output.txt").read_text()
    sglang = (EXPORTERS / "sglang/metrics-example.txt").read_text()
    return {
        "dcgm": dcgm,
        "node": set(re.findall(r"^# TYPE (\S+)", node, re.M)),
        "vllm": set((EXPORTERS / "vllm/expected-metrics-v1.txt").read_text().split()),
        "sglang": set(re.findall(r"^# TYPE (\S+)", sglang, re.M)),
    }


def test_every_alias_of_these_exporters_is_a_name_they_publish() -> None:
    published = _published()
    names = [(a.source, a.foreign) for a in ALIASES if a.source in published]
    for d in DERIVED:
        found = re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", d.expr)
        names += [(d.source, n) for n in found if n not in {"sum", "without", "or", "cpu"}]
    assert len(names) > 50
    for source, name in names:
        if name in NOT_IN_FIXTURES:
            continue
        # a prometheus_client counter is listed by its family or its _total sample
        forms = {name, name.removesuffix("_total"), name + "_total", name + "_sum"}
        assert forms & published[source], f"{source}: {name} is not in its published list"


def _store(*parts: tuple[str, str, dict[str, str]]) -> Store:
    store = Store(retention=3600)
    for text, target, labels in parts:
        lines = []
        for line in text.splitlines():
            if line and not line.startswith("#") and labels:
                name, sep, rest = line.partition("{")
                extra = ",".join(f'{k}="{v}"' for k, v in labels.items())
                line = f"{name}{{{extra},{rest}" if sep else f"{name}{{{extra}}}{line[len(name) :]}"
            lines.append(line)
        store.ingest_exposition("\n".join(lines) + "\n", timestamp=T, target=target)
    return store


def _values(store: Store, expr: str) -> dict[frozenset[tuple[str, str]], float]:
    res = store.query(expr, T)
    return {frozenset(s.labels.items()): float(s.value) for s in res.vector}


def test_sglang_and_vllm_examples_read_as_our_series() -> None:
    store = _store(
        (_exposition(EXPORTERS / "sglang/metrics-example.txt"), "sglang", {"job": "sglang"}),
        (_exposition(EXPORTERS / "vllm/metrics-example.txt"), "vllm", {"job": "vllm"}),
    )
    kv = _values(store, native_expr("kv_cache_usage_ratio") or "")
    ((labels, value),) = kv.items()
    assert value == 0.28 and ("model", "meta-llama/Llama-3.1-8B-Instruct") in labels
    queue = _values(store, native_expr("queue_length", [("queue", "=", "engine")]) or "")
    assert list(queue.values()) == [2826.0]
    # the finish reason becomes our reason label; the model its model label
    finished = _values(store, native_expr("model_requests_finished_total") or "")
    by_reason = {dict(k)["reason"]: v for k, v in finished.items()}
    assert by_reason == {"stop": 1.0, "length": 131.0, "abort": 0.0}
    assert all(dict(k)["model"] == "meta-llama/Llama-3.1-8B-Instruct" for k in finished)
    ttft = _values(store, native_expr("model_time_to_first_token_seconds_count") or "")
    assert sorted(ttft.values()) == [140.0, 11008.0]  # vLLM's and SGLang's


def test_node_exporter_e2e_output_reads_as_host_series() -> None:
    text = _node_families()
    store = _store((text, "node", {}))
    cpu = _values(store, native_expr("host_cpu_seconds_total", [("mode", "=", "idle")]) or "")
    ((labels, idle),) = cpu.items()  # one series per host: the cores summed
    per_core = [
        float(m)
        for m in re.findall(r'^node_cpu_seconds_total\{cpu="\d+",mode="idle"\} (\S+)', text, re.M)
    ]
    assert len(per_core) > 1 and idle == pytest.approx(sum(per_core))
    assert "cpu" not in dict(labels)
    errs = _values(store, native_expr("host_network_receive_errors_total") or "")
    assert errs and all("interface" in dict(k) for k in errs)
    swap = _values(store, native_expr("host_swap_used_bytes") or "")
    assert list(swap.values()) == [pytest.approx(4.2949632e09 - 3.23108864e09)]


def _node_families() -> str:
    """The fixture's families that the aliases read. The whole file also holds a DMI
    label with invalid UTF-8 (a fixture of node_exporter's own), which the embedded
    store refuses."""
    keep = ("node_cpu_", "node_memory_", "node_network_", "node_disk_", "node_vmstat_")
    keep += ("node_load", "node_netstat_")
    text = (EXPORTERS / "node_exporter/e2e-output.txt").read_text()
    out = [ln for ln in text.splitlines() if re.sub(r"^# (HELP|TYPE) ", "", ln).startswith(keep)]
    return "\n".join(out) + "\n"


def _dcgm_line(field: str, value: float, host_label: str = "Hostname") -> str:
    """A sample in dcgm-exporter's template shape (render_metrics.go); the value is ours."""
    labels = (
        'gpu="0",UUID="GPU-604ac76c-d9cf-fef3-62e9-d92044ab6e52",pci_bus_id="00000000:01:00.0",'
        f'device="nvidia0",modelName="NVIDIA H100 80GB HBM3",{host_label}="gpu-node-1"'
    )
    return f"{field}{{{labels}}} {value}"


@pytest.mark.parametrize("reserved", [True, False])
def test_dcgm_total_is_used_plus_free_plus_reserved_where_exported(reserved: bool) -> None:
    lines = [_dcgm_line("DCGM_FI_DEV_FB_USED", 70000), _dcgm_line("DCGM_FI_DEV_FB_FREE", 10000)]
    if reserved:
        lines.append(_dcgm_line("DCGM_FI_DEV_FB_RESERVED", 1559))
    store = _store(("\n".join(lines), "dcgm", {"job": "dcgm"}))
    total = _values(store, native_expr("gpu_memory_total_bytes") or "")
    ((labels, value),) = total.items()
    assert value == (81559 if reserved else 80000) * 1024 * 1024
    assert dict(labels)["node"] == "gpu-node-1"  # from Hostname
    ratio = _values(
        store,
        with_native(
            "gpu_memory_used_bytes / gpu_memory_total_bytes",
            {"gpu_memory_used_bytes", "gpu_memory_total_bytes"},
        ),
    )
    assert list(ratio.values()) == [pytest.approx(70000 / (81559 if reserved else 80000))]


def test_a_node_label_set_by_the_scrape_wins_over_dcgms_hostname() -> None:
    line = _dcgm_line("DCGM_FI_DEV_FB_USED", 1, host_label="hostname")
    store = _store((line, "dcgm", {"node": "k8s-node-7"}))
    ((labels, _),) = _values(store, native_expr("gpu_memory_used_bytes") or "").items()
    assert dict(labels)["node"] == "k8s-node-7"
    store = _store((line, "dcgm", {}))
    ((labels, _),) = _values(store, native_expr("gpu_memory_used_bytes") or "").items()
    assert dict(labels)["node"] == "gpu-node-1"  # the lower-case spelling of newer releases


def test_a_form_whose_added_label_fails_the_query_is_left_out() -> None:
    assert native_expr("queue_length", [("queue", "=", "admission")]) is None
    engine = native_expr("queue_length", [("queue", "=~", "e.*")]) or ""
    assert "vllm:num_requests_waiting" in engine


def test_with_native_leaves_other_names_and_unparsable_text_alone() -> None:
    expr = 'sum(rate(http_request_duration_seconds_count{status="504"}[1m]))'
    assert with_native(expr, {"kv_cache_usage_ratio"}) == expr
    assert with_native("max(kv_cache_usage_ratio", {"kv_cache_usage_ratio"}) == (
        "max(kv_cache_usage_ratio"
    )
    kv = {"kv_cache_usage_ratio"}
    out = with_native("max(rate(vllm_free[1m])) + max(kv_cache_usage_ratio)", kv)
    assert "vllm:kv_cache_usage_perc" in out and "vllm_free" in out
    # inside a range function the function is carried onto the native series, scaled after
    used = {"gpu_memory_used_bytes"}
    out = with_native("max_over_time(gpu_memory_used_bytes[5m] offset 1m)", used)
    assert "max_over_time(DCGM_FI_DEV_FB_USED[5m] offset 1m) * 1048576" in out
    # a count of samples is not scaled
    out = with_native("changes(gpu_memory_used_bytes[5m])", {"gpu_memory_used_bytes"})
    assert "changes(DCGM_FI_DEV_FB_USED[5m])" in out and "1048576" not in out


def test_double_counting_guard_on_the_embedded_store() -> None:
    """A target that exports our name keeps only it; another target's native series is
    read; and the recording rule's own output (aivitals_source set) is not 'ours'."""
    ours = 'kv_cache_usage_ratio{model="m"} 0.5\n'
    native = 'vllm:kv_cache_usage_perc{model_name="m"} 0.7\n'
    store = _store(
        (ours + native, "both", {"job": "a", "instance": "a:1"}),
        (native, "native", {"job": "b", "instance": "b:1"}),
    )
    got = _values(store, with_native("kv_cache_usage_ratio", {"kv_cache_usage_ratio"}))
    assert sorted(got.values()) == [0.5, 0.7]
    rule = next(r for r in native_rule_group()["rules"] if r["record"] == "kv_cache_usage_ratio")
    recorded = _values(store, rule["expr"])
    ((labels, value),) = recorded.items()
    assert value == 0.7 and dict(labels)["job"] == "b"
    assert dict(labels)["aivitals_source"] == "vllm"


def test_the_rule_file_has_one_rule_per_native_sample() -> None:
    doc = yaml.safe_load(native_rules_text(default_pack(evaluation_interval="5s")))
    (group,) = doc["groups"]
    assert group["interval"] == "5s"
    records = [r["record"] for r in group["rules"]]
    assert records == sorted(set(records)) and set(records) <= set(native_samples())
    for name in ("kv_cache_usage_ratio", "queue_length", "gpu_memory_total_bytes"):
        assert name in records
    for r in group["rules"]:
        assert r["expr"].endswith(f'unless on (job, instance) {r["record"]}{{aivitals_source=""}}')


def test_promtool_and_vmalert_accept_the_rule_file(tmp_path: Path) -> None:
    path = tmp_path / "aivitals-native.yml"
    path.write_text(native_rules_text(default_pack()))
    promtool = require_binary("promtool")
    proc = subprocess.run(
        [promtool, "check", "rules", str(path)], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    vmalert = require_binary("vmalert")
    proc = subprocess.run(
        [vmalert, "-dryRun", f"-rule={path}"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]


def test_with_native_rewrites_a_name_and_not_the_longer_names_it_begins() -> None:
    # host_load1 is the start of host_load15: only the first is asked through node_load1
    # (the parser prints every selector with its braces, so one name never matches the
    # beginning of another)
    out = with_native("max(host_load15) > max(host_load1)", {"host_load1"})
    assert "node_load1" in out and "node_load15" not in out
    assert "max(host_load15{})" in out
