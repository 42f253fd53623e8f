"""Pod labels on per-process GPU series, from fixture /proc trees (see fixtures/pods/README.md)."""

from __future__ import annotations

import http.server
import json
import logging
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from aivitals.collect import (
    CgroupPod,
    Event,
    KubeletPodsFile,
    KubeletPodsURL,
    PodLogDirs,
    PodNames,
    PodResolver,
    parse_pod_cgroup,
    parse_pod_list,
    pod_source,
)
from aivitals.collect.gpu import GpuCollector
from aivitals.errors import ConfigError
from aivitals.signals import Sample

FIX = Path(__file__).parent / "fixtures" / "pods"
PODS_JSON = FIX / "kubelet-pods.json"

UID_A = "6f1c2b3a-8d4e-4f5a-9b6c-7d8e9f0a1b2c"
UID_B = "0e2d4c6b-1a3f-4e5d-8c7b-9a0f1e2d3c4b"
UID_C = "9a8b7c6d-5e4f-4a3b-8c1d-0e9f8a7b6c5d"
UID_D = "5c2f0b8e9d7a6c4b3e1f0a9d8c7b6e5f"  # a static pod: the manifest's hash
UID_E = "1b2c3d4e-5f6a-4b7c-8d9e-0f1a2b3c4d5e"  # not in the kubelet's list
SERVER_ID = "ff501c46dc38aa2074581f8660a94f526924a506f31db87388af6a7d088299aa"
U_A, U_B = UID_A.replace("-", "_"), UID_B.replace("-", "_")  # as systemd slices write them

LLM = {"namespace": "team-a", "pod": "llm-serve-7d9f8b6c5d-x2k4p", "container": "server"}
TRAINER = {"namespace": "team-b", "pod": "trainer-0", "container": "trainer"}
NOTEBOOK = {"namespace": "batch", "pod": "notebook-5f6g", "container": "jupyter"}
VALIDATOR = {"namespace": "kube-system", "pod": "gpu-validator-gpu-node-1"}

NAMED = {
    4242: {**LLM, "pod_uid": UID_A},
    4343: {**TRAINER, "pod_uid": UID_B},
    4444: {**NOTEBOOK, "pod_uid": UID_C},
    4545: {**VALIDATOR, "container": "validator", "pod_uid": UID_D},
    4646: {"pod_uid": UID_E},
}
OUTSIDE = (1, 2100, 2200)  # init, a systemd service, Docker without Kubernetes


class Counter:
    def __init__(self) -> None:
        self.reasons: list[str] = []

    def __call__(self, reason: str) -> None:
        self.reasons.append(reason)


class CountingSource:
    """A pod source that counts its reads and can be told what it knows."""

    def __init__(self, names: PodNames) -> None:
        self.names = names
        self.reads = 0

    def read(self) -> PodNames:
        self.reads += 1
        return self.names


class FakeBackend:
    """GPU samples for the given pids: one device series, one per-process series each."""

    name = "fake"

    def __init__(self, pids: list[int]) -> None:
        self.pids = pids

    def read(self, count: object) -> list[Sample]:
        out = [Sample("gpu_memory_used_bytes", {"gpu": "0", "backend": "fake"}, 3e9)]
        for pid in self.pids:
            labels = {"gpu": "0", "backend": "fake", "pid": str(pid), "process": "python3"}
            out.append(Sample("gpu_process_memory_used_bytes", labels, 1e9))
        return out

    def drain_events(self) -> list[Event]:
        return []

    def close(self) -> None:
        return None


def _copy(tree: str, tmp_path: Path) -> Path:
    dest = tmp_path / tree
    shutil.copytree(FIX / tree, dest)
    return dest


# --- the cgroup file -------------------------------------------------------------------
@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (f"0::/kubepods/burstable/pod{UID_A}/{SERVER_ID}", CgroupPod(UID_A, SERVER_ID)),
        (
            "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
            f"{U_A}.slice/cri-containerd-{SERVER_ID}.scope",
            CgroupPod(UID_A, SERVER_ID),
        ),
        (
            f"0::/kubepods.slice/kubepods-pod{U_B}.slice/docker-{SERVER_ID}.scope",
            CgroupPod(UID_B, SERVER_ID),
        ),
        (f"0::/kubepods/pod{UID_B}/crio-{SERVER_ID}", CgroupPod(UID_B, SERVER_ID)),
        (f"0::/kubepods/pod{UID_B}", CgroupPod(UID_B, "")),  # the pod's own cgroup
        (f"0::/kubepods/besteffort/pod{UID_D}/{SERVER_ID}", CgroupPod(UID_D, SERVER_ID)),
        ("0::/system.slice/docker-" + SERVER_ID + ".scope", None),
        ("0::/", None),
        ("4:memory:/process_api/c6af2d862437d42398e681b9c7806f3d", None),  # a sandbox, no pod
        ("0::/kubepods.slice/kubepods-burstable.slice", None),  # a QoS slice, no pod
    ],
)
def test_cgroup_paths(line: str, expected: CgroupPod | None) -> None:
    assert parse_pod_cgroup(line + "\n") == expected


def test_a_container_line_wins_over_a_pod_only_line() -> None:
    text = f"1:name=systemd:/kubepods/pod{UID_B}\n0::/kubepods/pod{UID_B}/{SERVER_ID}\n"
    assert parse_pod_cgroup(text) == CgroupPod(UID_B, SERVER_ID)


@pytest.mark.parametrize("text", ["", "garbage\n", f"kubepods-pod{UID_A}.slice\n", "x::/a\n"])
def test_malformed_cgroup_text_raises_value_error(text: str) -> None:
    with pytest.raises(ValueError, match="hierarchy"):
        parse_pod_cgroup(text)


# --- the two trees, with the kubelet's list --------------------------------------------
@pytest.mark.parametrize("tree", ["proc-v1", "proc-v2"])
def test_every_layout_maps_to_its_pod(tree: str) -> None:
    resolver = PodResolver(proc_root=FIX / tree, source=KubeletPodsFile(PODS_JSON))
    count = Counter()
    for pid, labels in NAMED.items():
        assert resolver.labels(pid, count) == labels, (tree, pid)
    for pid in OUTSIDE:
        assert resolver.labels(pid, count) == {}, (tree, pid)  # off, not empty strings
    assert count.reasons == []


def test_v1_malformed_cgroup_leaves_labels_off_and_counts() -> None:
    count = Counter()
    resolver = PodResolver(proc_root=FIX / "proc-v1", source=KubeletPodsFile(PODS_JSON))
    assert resolver.labels(2300, count) == {}
    assert count.reasons == ["pod_cgroup_malformed"]


def test_v2_specifics() -> None:
    count = Counter()
    resolver = PodResolver(proc_root=FIX / "proc-v2", source=KubeletPodsFile(PODS_JSON))
    # CRI-O's monitor sits in the pod, outside any container
    assert resolver.labels(4747, count) == {
        "namespace": "team-b",
        "pod": "trainer-0",
        "pod_uid": UID_B,
    }
    assert resolver.labels(2300, count) == {}  # a user session
    assert resolver.labels(2400, count) == {}  # a bare word: not mistaken for a pod
    assert count.reasons == ["pod_cgroup_malformed"]


@pytest.mark.parametrize("tree", ["proc-v1", "proc-v2"])
def test_without_a_source_the_pod_uid_alone(tree: str) -> None:
    resolver = PodResolver(proc_root=FIX / tree)
    for pid, labels in NAMED.items():
        assert resolver.labels(pid) == {"pod_uid": labels["pod_uid"]}
    for pid in OUTSIDE:
        assert resolver.labels(pid) == {}


def test_log_directories_name_pods_and_containers() -> None:
    source = PodLogDirs(FIX / "var-log" / "pods")
    resolver = PodResolver(proc_root=FIX / "proc-v2", source=source)
    for pid in (4242, 4343, 4444, 4646):
        assert resolver.labels(pid) == NAMED[pid]
    # the static pod has no /var/log/containers link: its pod named, its container not
    assert resolver.labels(4545) == {**VALIDATOR, "pod_uid": UID_D}


# --- through the GPU collector ----------------------------------------------------------
def _errors(collector: GpuCollector) -> dict[str, float]:
    return {
        s.labels["reason"]: s.value
        for s in collector.collect()
        if s.name == "aivitals_collector_errors_total"
    }


def test_collector_labels_process_series_only() -> None:
    pids = [4242, 4646, 2100]
    resolver = PodResolver(proc_root=FIX / "proc-v2", source=KubeletPodsFile(PODS_JSON))
    collector = GpuCollector(FakeBackend(pids), pods=resolver)
    samples = list(collector.collect())
    device = next(s for s in samples if s.name == "gpu_memory_used_bytes")
    assert dict(device.labels) == {"gpu": "0", "backend": "fake"}
    procs = {
        s.labels["pid"]: dict(s.labels)
        for s in samples
        if s.name == "gpu_process_memory_used_bytes"
    }
    base = {"gpu": "0", "backend": "fake", "process": "python3"}
    assert procs["4242"] == {**base, "pid": "4242", **NAMED[4242]}
    assert procs["4646"] == {**base, "pid": "4646", "pod_uid": UID_E}
    assert procs["2100"] == {**base, "pid": "2100"}
    up = next(s for s in samples if s.name == "aivitals_collector_up")
    assert up.value == 1.0


def test_an_unreadable_cgroup_is_counted_and_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    proc = _copy("proc-v2", tmp_path)
    (proc / "4242" / "cgroup").unlink()
    (proc / "4242" / "cgroup").mkdir()  # reading it fails (IsADirectoryError), even as root
    resolver = PodResolver(proc_root=proc, source=KubeletPodsFile(PODS_JSON))
    collector = GpuCollector(FakeBackend([4242, 4343, 9999]), pods=resolver)
    with caplog.at_level(logging.WARNING, logger="aivitals.collect"):
        for _ in range(3):
            errors = _errors(collector)
    assert errors == {"pod_cgroup_unreadable": 1.0, "pod_pid_not_found": 1.0}
    assert len([r for r in caplog.records if "pod_cgroup_unreadable" in r.getMessage()]) == 1
    sample = resolver.annotate(FakeBackend([4242]).read(0), Counter())[1]
    assert "pod" not in sample.labels and "pod_uid" not in sample.labels


def test_cached_per_process_and_a_reused_pid_is_read_again(tmp_path: Path) -> None:
    proc = _copy("proc-v2", tmp_path)
    resolver = PodResolver(proc_root=proc, source=KubeletPodsFile(PODS_JSON))
    count = Counter()
    assert resolver.annotate(FakeBackend([4242]).read(0), count)[1].labels["pod"] == LLM["pod"]
    # the same process (same start time): the cgroup is not read again
    cgroup = proc / "4242" / "cgroup"
    cgroup.write_text(f"0::/kubepods/pod{UID_B}/{SERVER_ID}\n")
    assert resolver.annotate(FakeBackend([4242]).read(0), count)[1].labels["pod"] == LLM["pod"]
    # pid 4242 reused by a new process: another start time, read again
    stat = proc / "4242" / "stat"
    fields = stat.read_text().split()
    fields[21] = str(int(fields[21]) + 500)
    stat.write_text(" ".join(fields) + "\n")
    assert resolver.annotate(FakeBackend([4242]).read(0), count)[1].labels["pod"] == "trainer-0"
    assert count.reasons == []


def test_the_cache_keeps_only_processes_still_reported() -> None:
    resolver = PodResolver(proc_root=FIX / "proc-v2")
    resolver.annotate(FakeBackend([4242, 4343]).read(0), Counter())
    assert {pid for pid, _ in resolver._cache} == {"4242", "4343"}
    resolver.annotate(FakeBackend([4343]).read(0), Counter())
    assert {pid for pid, _ in resolver._cache} == {"4343"}


# --- asking the source ------------------------------------------------------------------
def test_the_source_is_asked_only_on_a_miss_and_at_most_every_min_refresh() -> None:
    now = [0.0]
    known = parse_pod_list(json.loads(PODS_JSON.read_text()))
    source = CountingSource(known)
    resolver = PodResolver(
        proc_root=FIX / "proc-v2", source=source, min_refresh=10.0, clock=lambda: now[0]
    )
    assert resolver.labels(2100) == {}  # outside any pod: nothing to ask
    assert source.reads == 0
    assert resolver.labels(4242) == NAMED[4242]
    assert source.reads == 1
    assert resolver.labels(4343) == NAMED[4343]  # already known: not asked again
    assert resolver.labels(4646) == {"pod_uid": UID_E}  # unknown, but asked 0 s ago
    assert source.reads == 1
    now[0] = 10.0
    pods = {**known.pods, UID_E: ("team-c", "late-pod")}
    source.names = PodNames(pods, known.containers)
    assert resolver.labels(4646) == {"namespace": "team-c", "pod": "late-pod", "pod_uid": UID_E}
    assert source.reads == 2


def test_a_container_the_source_never_lists_is_given_up_after_a_few_tries() -> None:
    now = [0.0]
    source = CountingSource(PodLogDirs(FIX / "var-log" / "pods").read())
    resolver = PodResolver(proc_root=FIX / "proc-v2", source=source, clock=lambda: now[0])
    for _ in range(10):
        now[0] += 60.0
        resolver.annotate(FakeBackend([4545]).read(0), Counter())
    assert source.reads == 3


def test_a_failing_source_leaves_the_pod_uid_and_never_fails_the_scrape(tmp_path: Path) -> None:
    broken = tmp_path / "pods.json"
    broken.write_text("{not json")
    for source in (KubeletPodsFile(broken), KubeletPodsFile(tmp_path / "absent.json")):
        resolver = PodResolver(proc_root=FIX / "proc-v1", source=source)
        collector = GpuCollector(FakeBackend([4242]), pods=resolver)
        samples = list(collector.collect())
        proc = next(s for s in samples if s.name == "gpu_process_memory_used_bytes")
        assert proc.labels["pod_uid"] == UID_A and "pod" not in proc.labels
        assert next(s for s in samples if s.name == "aivitals_collector_up").value == 1.0
        assert _errors(collector) == {"pod_source_error": 1.0}


def test_the_file_is_read_again_when_it_changes(tmp_path: Path) -> None:
    path = tmp_path / "pods.json"
    doc = json.loads(PODS_JSON.read_text())
    path.write_text(json.dumps(doc))
    source = KubeletPodsFile(path)
    assert source.read().pods[UID_A] == ("team-a", "llm-serve-7d9f8b6c5d-x2k4p")
    doc["items"][0]["metadata"]["name"] = "llm-serve-renamed"
    path.write_text(json.dumps(doc, indent=1))
    assert source.read().pods[UID_A] == ("team-a", "llm-serve-renamed")


def test_a_mirror_pod_is_found_under_its_static_hash() -> None:
    doc = {
        "kind": "PodList",
        "items": [
            {
                "metadata": {
                    "name": "etcd-node-1",
                    "namespace": "kube-system",
                    "uid": "d6b1b5a4-0c9e-4f1a-9a53-2f6c8e7d1b0a",
                    "annotations": {"kubernetes.io/config.mirror": UID_D},
                },
                "status": {"containerStatuses": [{"name": "etcd", "containerID": "x"}]},
            },
            {"metadata": {"name": "no-uid"}},
            "not a pod",
        ],
    }
    names = parse_pod_list(doc)
    assert names.pods[UID_D] == ("kube-system", "etcd-node-1")
    assert names.containers == {}  # "x" is no <runtime>://<id>
    with pytest.raises(ValueError, match="PodList"):
        parse_pod_list({"kind": "Pod"})


@pytest.fixture
def kubelet() -> Iterator[str]:
    body = PODS_JSON.read_bytes()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path != "/pods":
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            return None

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_the_kubelet_read_only_port(kubelet: str) -> None:
    resolver = PodResolver(proc_root=FIX / "proc-v2", source=KubeletPodsURL(kubelet + "/pods"))
    assert resolver.labels(4444) == NAMED[4444]
    with pytest.raises(OSError, match="404"):
        KubeletPodsURL(kubelet + "/nope").read()


def test_pod_source_from_a_setting(tmp_path: Path) -> None:
    assert isinstance(pod_source("http://127.0.0.1:10255/pods"), KubeletPodsURL)
    assert isinstance(pod_source(str(FIX / "var-log" / "pods")), PodLogDirs)
    assert isinstance(pod_source(str(tmp_path / "pods.json")), KubeletPodsFile)
    with pytest.raises(ConfigError, match="ftp"):
        pod_source("ftp://node/pods")
