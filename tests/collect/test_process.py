from __future__ import annotations

import os
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
    assert labels == {"pid": "4242", "process": "uvicorn"}


def test_find_listener_and_by_port(tmp_path: Path) -> None:
    proc = make_proc(tmp_path)
    assert find_listener(8000, proc=str(proc)) == 4242
    assert find_listener(9999, proc=str(proc)) is None
    got = values(list(ProcessCollector(port=8000, proc=str(proc)).collect()))
    assert got[("service_process_threads", "")] == 12


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
