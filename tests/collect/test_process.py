from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from aivitals.collect import ProcessCollector, find_listener
from aivitals.errors import ConfigError

TCP = (
    "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  "
    "timeout inode\n"
    "   0: 0100007F:1F40 00000000:0000 0A 00000000:00000000 00:00000000 00000000  0 0 500 1\n"
    "   1: 0100007F:1F40 0100007F:C350 01 00000000:00000000 00:00000000 00000000  0 0 501 1\n"
    "   2: 0100007F:1F40 0100007F:C351 01 00000000:00000000 00:00000000 00000000  0 0 502 1\n"
    "   3: 0100007F:1F40 0100007F:C352 08 00000000:00000000 00:00000000 00000000  0 0 503 1\n"
    "   4: 0100007F:C353 0100007F:1F40 01 00000000:00000000 00:00000000 00000000  0 0 999 1\n"
)
STAT = (
    "4242 (uvicorn worker) S 1 4242 4242 0 -1 4194560 1000 0 0 0 250 50 0 0 20 0 "
    "12 0 100 1000000 2000 18446744073709551615 0 0 0 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0\n"
)


def make_proc(root: Path, pid: int = 4242) -> Path:
    proc = root / "proc"
    base = proc / str(pid)
    (base / "fd").mkdir(parents=True)
    (base / "net").mkdir()
    (base / "comm").write_text("uvicorn\n")
    (base / "status").write_text("Name:\tuvicorn\nVmRSS:\t  204800 kB\nThreads:\t12\n")
    (base / "stat").write_text(STAT)
    (base / "limits").write_text(
        "Limit                     Soft Limit           Hard Limit           Units\n"
        "Max open files            1024                 1048576              files\n"
    )
    (base / "net" / "tcp").write_text(TCP)
    for i, target in enumerate(
        [
            "/dev/null",
            "socket:[500]",
            "socket:[501]",
            "socket:[502]",
            "socket:[503]",
            "pipe:[7]",
            "anon_inode:[eventfd]",
        ]
    ):
        os.symlink(target, base / "fd" / str(i))
    (proc / "self").symlink_to(str(pid))
    return proc


def values(samples: list) -> dict[tuple[str, str], float]:
    return {(s.name, s.labels.get("state", "")): s.value for s in samples}


def test_process_by_pid(tmp_path: Path) -> None:
    proc = make_proc(tmp_path)
    samples = list(ProcessCollector(pid=4242, proc=str(proc)).collect())
    got = values(samples)
    assert got[("service_process_resident_memory_bytes", "")] == 204800 * 1024
    assert got[("service_process_threads", "")] == 12
    assert got[("service_process_cpu_seconds_total", "")] == pytest.approx(3.0)  # (250+50)/100
    assert got[("service_process_open_fds", "")] == 7
    assert got[("service_process_max_fds", "")] == 1024
    assert got[("service_process_connections", "established")] == 2  # not the client's 999
    assert got[("service_process_connections", "listen")] == 1
    assert got[("service_process_connections", "close_wait")] == 1
    assert got[("aivitals_collector_up", "")] == 1
    labels = next(s.labels for s in samples if s.name == "service_process_threads")
    assert labels == {"pid": "4242", "process": "uvicorn", "role": "main"}


def test_find_listener_and_by_port(tmp_path: Path) -> None:
    proc = make_proc(tmp_path)
    assert find_listener(8000, proc=str(proc)) == 4242
    assert find_listener(9999, proc=str(proc)) is None
    got = values(list(ProcessCollector(port=8000, proc=str(proc)).collect()))
    assert got[("service_process_threads", "")] == 12


def test_the_listen_queue_by_port_from_the_text_table(tmp_path: Path) -> None:
    # a listening row's rx_queue is its accept queue: 0x26 = 38 connections waiting
    proc = make_proc(tmp_path)
    tcp = proc / "4242" / "net" / "tcp"
    tcp.write_text(tcp.read_text().replace("0A 00000000:00000000", "0A 00000000:00000026"))
    (proc / "4242" / "net" / "tcp6").write_text(
        TCP.splitlines()[0] + "\n"
        "   0: 00000000000000000000000000000000:1F40 00000000000000000000000000000000:0000 0A "
        "00000000:00000002 00:00000000 00000000  0 0 600 1\n"
    )
    samples = list(ProcessCollector(port=8000, proc=str(proc)).collect())
    queue = [s for s in samples if s.name.startswith("service_listen_queue")]
    # both families of the port summed; the text has no backlog limit, so none is made up
    assert [(s.name, s.labels, s.value) for s in queue] == [
        ("service_listen_queue_length", {"port": "8000"}, 40.0)
    ]
    # found by pid, the port is not known: no queue series
    by_pid = list(ProcessCollector(pid=4242, proc=str(proc)).collect())
    assert not [s for s in by_pid if s.name.startswith("service_listen_queue")]


def test_gone_process_is_down_and_counted(tmp_path: Path) -> None:
    proc = make_proc(tmp_path)
    collector = ProcessCollector(pid=77, proc=str(proc))
    got = values(list(collector.collect()))
    assert got[("aivitals_collector_up", "")] == 0
    assert collector.error_counts() == {"exception": 1}


def test_no_listener_is_down(tmp_path: Path) -> None:
    proc = make_proc(tmp_path)
    got = values(list(ProcessCollector(port=1234, proc=str(proc)).collect()))
    assert got[("aivitals_collector_up", "")] == 0


def test_unreadable_limits_cost_only_that_series(tmp_path: Path) -> None:
    proc = make_proc(tmp_path)
    (proc / "4242" / "limits").unlink()
    (proc / "4242" / "limits").mkdir()
    collector = ProcessCollector(pid=4242, proc=str(proc))
    got = values(list(collector.collect()))
    assert ("service_process_max_fds", "") not in got
    assert got[("service_process_threads", "")] == 12
    assert got[("aivitals_collector_up", "")] == 1
    assert collector.error_counts() == {"limits_unreadable": 1}


def test_this_process_for_real() -> None:
    got = values(list(ProcessCollector(pid=os.getpid()).collect()))
    assert got[("service_process_resident_memory_bytes", "")] > 1e6
    assert got[("service_process_open_fds", "")] >= 3


@pytest.mark.parametrize("kwargs", [{}, {"pid": 1, "port": 80}])
def test_needs_exactly_one_target(kwargs: dict[str, int]) -> None:
    with pytest.raises(ConfigError, match="exactly one"):
        ProcessCollector(**kwargs)


def test_bad_bounds_are_refused() -> None:
    with pytest.raises(ConfigError, match="max_processes"):
        ProcessCollector(pid=1, max_processes=0)
    with pytest.raises(ConfigError, match="rediscover"):
        ProcessCollector(pid=1, rediscover=0)


# A real service of several processes: a parent that listens, two forked workers that
# inherit the listening socket, and a helper one worker forks after closing its copy.
SERVICE = """
import json, os, socket, sys, time
sock = socket.socket()
sock.bind(("127.0.0.1", 0))
sock.listen()
r, w = os.pipe()
workers = []
for n in range(2):
    pid = os.fork()
    if pid == 0:
        if n == 0:
            helper = os.fork()
            if helper == 0:
                sock.close()
                os.write(w, b"%d\\n" % os.getpid())
                time.sleep(120)
                os._exit(0)
        time.sleep(120)
        os._exit(0)
    workers.append(pid)
helper = int(os.read(r, 64).split()[0])
print(json.dumps({"port": sock.getsockname()[1], "listener": os.getpid(),
                  "workers": workers, "helper": helper}), flush=True)
while True:
    try:
        os.waitpid(-1, 0)  # reap an exiting worker, as a pre-fork master does
    except ChildProcessError:
        time.sleep(0.1)
"""


def _roles(collector: ProcessCollector) -> dict[int, str]:
    samples = list(collector.collect())
    assert next(s.value for s in samples if s.name == "aivitals_collector_up") == 1
    return {
        int(s.labels["pid"]): s.labels["role"]
        for s in samples
        if s.name == "service_process_threads"
    }


def test_every_process_of_a_real_pre_fork_service_is_followed_with_its_role() -> None:
    service = subprocess.Popen(
        [sys.executable, "-c", SERVICE], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        assert service.stdout is not None
        tree = json.loads(service.stdout.readline())
        collector = ProcessCollector(port=tree["port"])
        worker, other = tree["workers"]
        assert _roles(collector) == {
            tree["listener"]: "listener",
            worker: "worker",
            other: "worker",
            tree["helper"]: "child",
        }
        assert find_listener(tree["port"]) == tree["listener"]  # the top, not a worker
        os.kill(other, signal.SIGKILL)  # a worker exits between two scrapes
        deadline = time.monotonic() + 10
        while (Path("/proc") / str(other)).exists() and time.monotonic() < deadline:
            time.sleep(0.05)  # until the parent reaps it
        roles = _roles(collector)
        assert other not in roles and roles[worker] == "worker" and len(roles) == 3
        capped = ProcessCollector(port=tree["port"], max_processes=2)
        assert set(_roles(capped).values()) == {"listener", "worker"}  # holders first
        assert capped.error_counts() == {"process_cap": 1}
    finally:
        os.killpg(service.pid, signal.SIGKILL)
        service.wait(10)


def test_by_pid_follows_the_children_of_this_process() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        roles = _roles(ProcessCollector(pid=os.getpid()))
        assert roles[os.getpid()] == "main" and roles[child.pid] == "child"
    finally:
        child.kill()
        child.wait(10)


def test_a_child_gone_mid_scrape_is_left_out_not_an_error(tmp_path: Path) -> None:
    proc = make_proc(tmp_path)
    task = proc / "4242" / "task" / "4242"
    task.mkdir(parents=True)
    (task / "children").write_text("5555 ")  # listed, but exited before its files are read
    collector = ProcessCollector(pid=4242, proc=str(proc))
    samples = list(collector.collect())
    assert {s.labels.get("pid") for s in samples if s.name == "service_process_threads"} == {"4242"}
    assert collector.error_counts() == {}
