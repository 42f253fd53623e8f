from __future__ import annotations

import multiprocessing
import os
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from aivitals import signals
from aivitals.collect.gpu import GpuCollector, SimBackend, SimGPU, SimOutOfMemoryError
from aivitals.errors import ConfigError

GIB = 2**30


def test_allocate_free_and_processes(tmp_path: Path) -> None:
    gpu = SimGPU(tmp_path, memory_total=10 * GIB)
    pid = os.getpid()
    gpu.allocate(pid, 2 * GIB, tag="weights")
    gpu.allocate(pid, 1 * GIB)
    assert gpu.processes(0) == {pid: 3 * GIB}
    dev = gpu.device(0)
    assert dev.memory_used == 3 * GIB and dev.memory_free == 7 * GIB
    gpu.free(pid, GIB)
    assert gpu.processes(0) == {pid: 2 * GIB}
    gpu.free(pid)
    assert gpu.processes(0) == {}


def test_oom_message_is_torchs_and_classified(tmp_path: Path) -> None:
    gpu = SimGPU(tmp_path, memory_total=4 * GIB)
    gpu.allocate(os.getpid(), 3 * GIB)
    with pytest.raises(SimOutOfMemoryError) as info:
        gpu.allocate(os.getpid(), 2 * GIB)
    msg = str(info.value)
    assert msg.startswith("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total")
    assert signals.classify_exception(info.value) is signals.ErrorCode.CUDA_OOM
    assert gpu.processes(0) == {os.getpid(): 3 * GIB}  # the failed allocation took nothing


def test_injected_oom_fails_next_allocations_only(tmp_path: Path) -> None:
    gpu = SimGPU(tmp_path, memory_total=4 * GIB)
    gpu.inject_oom(0, count=1)
    with pytest.raises(SimOutOfMemoryError):
        gpu.allocate(os.getpid(), 1)
    gpu.allocate(os.getpid(), 1)
    assert gpu.processes(0) == {os.getpid(): 1}


def test_state_is_shared_across_processes_and_dead_pids_are_released(tmp_path: Path) -> None:
    gpu = SimGPU(tmp_path, memory_total=8 * GIB)
    code = (
        "import sys; from aivitals.collect.gpu import SimGPU; import os;"
        f"SimGPU({str(tmp_path)!r}).allocate(os.getpid(), {GIB}, tag='child');"
        "print(os.getpid())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    child = int(out.stdout.strip())
    # The child has exited: the driver (and the sim) releases its memory.
    assert child not in gpu.processes(0)
    assert gpu.device(0).memory_used == 0


def _hold(path: str, q: multiprocessing.Queue[int]) -> None:  # runs in a child process
    SimGPU(path).allocate(os.getpid(), GIB, tag="child")
    q.put(os.getpid())
    time.sleep(30)


def test_live_child_allocation_is_visible(tmp_path: Path) -> None:
    gpu = SimGPU(tmp_path, memory_total=8 * GIB)
    ctx = multiprocessing.get_context("spawn")
    q: multiprocessing.Queue[int] = ctx.Queue()
    child = ctx.Process(target=_hold, args=(str(tmp_path), q), daemon=True)
    child.start()
    try:
        pid = q.get(timeout=60)
        assert gpu.processes(0) == {pid: GIB}
    finally:
        child.terminate()
        child.join(10)
        q.close()
        q.join_thread()
    assert gpu.processes(0) == {}


def test_utilization_follows_busy_time(tmp_path: Path) -> None:
    gpu = SimGPU(tmp_path)
    now = float(int(time.time()))  # on a bucket boundary, so the answer is exact
    assert gpu.devices(window=1.0, now=now)[0].utilization == 0.0
    for i in range(10):  # 10 kernels of 50 ms over the last second
        gpu.busy(0, 0.05, now=now - 0.9 + i * 0.1)
    util = gpu.devices(window=1.0, now=now)[0].utilization
    assert util == pytest.approx(0.5, abs=1e-3)
    # A window later with no new work the GPU is idle again.
    assert gpu.devices(window=1.0, now=now + 5)[0].utilization == 0.0


def test_clock_slowdown_and_xid(tmp_path: Path) -> None:
    gpu = SimGPU(tmp_path)
    gpu.set_clock_slowdown(0, 2.0)
    assert gpu.clock_slowdown(0) == 2.0
    assert gpu.device(0).utilization == pytest.approx(0.5)  # the co-tenant's share
    gpu.inject_xid(0, 79, pid=123)
    gpu.inject_xid(0, 79)
    dev = gpu.device(0)
    assert dev.xid_counts == {79: 2} and dev.last_xid == 79
    events = gpu.xid_events(0)
    assert [e["meaning"] for e in events] == ["GPU has fallen off the bus"] * 2
    assert gpu.xid_events(0, after_seq=events[0]["seq"]) == events[1:]


def test_first_creator_wins(tmp_path: Path) -> None:
    SimGPU(tmp_path, devices=2, memory_total=GIB)
    again = SimGPU(tmp_path, devices=1, memory_total=2 * GIB)
    devs = again.devices()
    assert len(devs) == 2 and devs[1].memory_total == GIB


@pytest.mark.parametrize(
    ("kwargs", "word"), [({"devices": 0}, "devices"), ({"memory_total": 0}, "memory_total")]
)
def test_bad_config_names_the_key(tmp_path: Path, kwargs: dict[str, int], word: str) -> None:
    with pytest.raises(ConfigError, match=word):
        SimGPU(tmp_path, **kwargs)


def test_bad_arguments(tmp_path: Path) -> None:
    gpu = SimGPU(tmp_path)
    with pytest.raises(ConfigError, match="gpu must be"):
        gpu.allocate(os.getpid(), 1, gpu=3)
    with pytest.raises(ConfigError, match="nbytes"):
        gpu.allocate(os.getpid(), -1)
    with pytest.raises(ConfigError, match="factor"):
        gpu.set_clock_slowdown(0, 0.5)
    with pytest.raises(ConfigError, match="seconds"):
        gpu.busy(0, -1.0)
    with pytest.raises(ConfigError, match="Xid code"):
        gpu.inject_xid(0, 0)


def test_corrupt_state_file_is_a_config_error(tmp_path: Path) -> None:
    SimGPU(tmp_path)
    (tmp_path / "simgpu.json").write_text("{not json")
    with pytest.raises(ConfigError, match="unreadable"):
        SimGPU(tmp_path)


def test_sim_backend_samples_all_say_sim(tmp_path: Path) -> None:
    gpu = SimGPU(tmp_path, memory_total=8 * GIB)
    gpu.allocate(os.getpid(), GIB)
    gpu.inject_xid(0, 79)
    collector = GpuCollector(SimBackend(gpu))
    samples = list(collector.collect())
    data = [s for s in samples if s.name.startswith("gpu_")]
    assert data and all(s.labels["backend"] == "sim" for s in data)
    by = {(s.name, s.labels.get("pid"), s.labels.get("xid")): s.value for s in data}
    assert by[("gpu_memory_used_bytes", None, None)] == GIB
    assert by[("gpu_process_memory_used_bytes", str(os.getpid()), None)] == GIB
    assert by[("gpu_xid_errors_total", None, "79")] == 1
    assert by[("gpu_last_xid", None, None)] == 79
    for s in data:
        assert signals.family_of(s.name) is not None, s.name
    up = [s for s in samples if s.name == "aivitals_collector_up"]
    assert up[0].value == 1.0 and up[0].labels == {"collector": "gpu"}
    events = collector.drain_events()
    assert [e.fields["xid"] for e in events] == ["79"]
    assert collector.drain_events() == []


def test_sim_backend_counts_a_broken_state_as_down(tmp_path: Path) -> None:
    gpu = SimGPU(tmp_path)
    collector = GpuCollector(SimBackend(gpu))
    (tmp_path / "simgpu.json").unlink()
    samples = list(collector.collect())
    up = {s.name: s.value for s in samples if s.name.startswith("aivitals_")}
    assert up["aivitals_collector_up"] == 0.0
    assert up["aivitals_collector_errors_total"] == 1.0


def test_concurrent_processes_never_lose_an_update(tmp_path: Path) -> None:
    gpu = SimGPU(tmp_path, memory_total=8 * GIB)
    code = (
        "import os, sys; from aivitals.collect.gpu import SimGPU;"
        f"g = SimGPU({str(tmp_path)!r});"
        "[(g.allocate(os.getpid(), 1024), g.busy(0, 0.0001)) for _ in range(100)];"
        "print(os.getpid(), flush=True); sys.stdin.read()"
    )
    children = [
        subprocess.Popen(
            [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        for _ in range(3)
    ]
    try:
        pending = [c.stdout for c in children if c.stdout is not None]
        pids: list[int] = []
        deadline = time.monotonic() + 60
        while pending and time.monotonic() < deadline:
            gpu.devices()  # read while they write: never half a file
            ready, _, _ = select.select(pending, [], [], 0.01)
            for out in ready:
                pids.append(int(out.readline()))
                pending.remove(out)
        assert len(pids) == 3
        held = gpu.processes(0)
        assert {pid: held.get(pid) for pid in pids} == dict.fromkeys(pids, 100 * 1024)
    finally:
        for c in children:
            if c.stdin is not None:
                c.stdin.close()
            c.wait(20)
            if c.stdout is not None:
                c.stdout.close()
    assert gpu.processes(0) == {}


def test_a_writer_killed_before_truncating_leaves_a_readable_state(tmp_path: Path) -> None:
    gpu = SimGPU(tmp_path)
    gpu.allocate(os.getpid(), GIB)
    path = tmp_path / "simgpu.json"
    path.write_text(path.read_text() + '"tail of a longer, older state"}}')
    assert gpu.processes(0) == {os.getpid(): GIB}
