from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from aivitals import signals
from aivitals.collect import HostCollector
from aivitals.errors import ConfigError

FILES = {
    "stat": "cpu  1000 20 300 5000 40 0 10 7 0 0\ncpu0 500 10 150 2500 20 0 5 3 0 0\n"
    "cpu1 500 10 150 2500 20 0 5 4 0 0\nintr 12345\nctxt 999\n",
    "loadavg": "1.50 0.75 0.25 3/512 4242\n",
    "pressure/cpu": "some avg10=1.00 avg60=0.50 avg300=0.10 total=2500000\n"
    "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n",
    "pressure/memory": "some avg10=0.00 avg60=0.00 avg300=0.00 total=1000\n"
    "full avg10=0.00 avg60=0.00 avg300=0.00 total=500\n",
    "pressure/io": "some avg10=0.00 avg60=0.00 avg300=0.00 total=3000000\n"
    "full avg10=0.00 avg60=0.00 avg300=0.00 total=2000000\n",
    "meminfo": "MemTotal:       16384000 kB\nMemFree:         1000000 kB\n"
    "MemAvailable:    8192000 kB\nSwapTotal:       2048000 kB\nSwapFree:        1024000 kB\n",
    "vmstat": "nr_free_pages 12345\npswpin 11\npswpout 22\noom_kill 3\n",
    "diskstats": "   7       0 loop0 5 0 10 1 0 0 0 0 0 1 1 0 0 0 0\n"
    "   8       0 sda 100 5 2000 250 50 2 800 1500 0 1200 1750 0 0 0 0\n"
    "   8       1 sda1 90 5 1900 240 50 2 800 1500 0 1100 1740 0 0 0 0\n"
    " 259       0 nvme0n1 10 0 80 4 20 0 160 8 0 9 12 0 0 0 0\n",
    "net/dev": "Inter-|   Receive                            |  Transmit\n"
    " face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs "
    "drop fifo colls carrier compressed\n"
    "    lo:    1000      10    0    0    0     0          0         0     1000      10    0 "
    "   0    0     0       0          0\n"
    "  eth0: 5000000    4000    2    7    0     0          0         0   300000    2000    1 "
    "   4    0     0       0          0\n",
    "net/snmp": "Ip: Forwarding DefaultTTL\nIp: 1 64\n"
    "Tcp: RtoAlgorithm RtoMin RtoMax MaxConn ActiveOpens PassiveOpens AttemptFails EstabResets "
    "CurrEstab InSegs OutSegs RetransSegs InErrs OutRsts InCsumErrors\n"
    "Tcp: 1 200 120000 -1 31 2 0 0 3 10358 5458 17 0 40 0\n",
    "net/tcp": "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid "
    " timeout inode\n"
    "   0: 0100007F:1F40 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000 0 100 1\n"
    "   1: 0100007F:1F40 0100007F:C350 01 00000000:00000000 00:00000000 00000000  1000 0 101 1\n"
    "   2: 0100007F:1F40 0100007F:C351 01 00000000:00000000 00:00000000 00000000  1000 0 102 1\n"
    "   3: 0100007F:1F40 0100007F:C352 08 00000000:00000000 00:00000000 00000000  1000 0 103 1\n"
    "   4: 0100007F:18EB 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000 0 104 1\n",
    "net/tcp6": "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid "
    " timeout inode\n"
    "   0: 00000000000000000000000001000000:1F40 00000000000000000000000001000000:D000 06 "
    "00000000:00000000 00:00000000 00000000  1000 0 0 1\n",
    "self/cgroup": "12:memory:/docker/abc\n0::/system.slice/app.service\n",
    # "/" holds data everywhere, so the real statvfs answers for it; the rest is pseudo
    "self/mounts": "/dev/root / ext4 rw,relatime 0 0\nproc /proc proc rw 0 0\n"
    "sysfs /sys sysfs rw 0 0\ncgroup2 /sys/fs/cgroup cgroup2 rw 0 0\n",
}


def make_proc(root: Path, overrides: dict[str, str | None] | None = None) -> Path:
    proc = root / "proc"
    files = {**FILES, **(overrides or {})}
    for rel, text in files.items():
        if text is None:
            continue
        path = proc / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return proc


def make_sys_v1(root: Path, limit: str = "4294967296") -> Path:
    sys = root / "sys"
    mem = sys / "fs" / "cgroup" / "memory" / "docker" / "abc"
    mem.mkdir(parents=True)
    (mem / "memory.limit_in_bytes").write_text(limit + "\n")
    (mem / "memory.usage_in_bytes").write_text("1073741824\n")
    (sys / "fs" / "cgroup" / "unified").mkdir()  # hybrid: unified exists without memory
    return sys


def by_name(samples: list[signals.Sample]) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for s in samples:
        out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def test_every_field_from_a_fake_tree(tmp_path: Path) -> None:
    proc, sys = make_proc(tmp_path), make_sys_v1(tmp_path)
    host = HostCollector(proc=str(proc), sys=str(sys), ports=[8000])
    got = by_name(list(host.collect()))
    tck = 100.0  # the fixture is written in USER_HZ=100 ticks
    assert got["host_cpu_seconds_total"][(("mode", "user"),)] == pytest.approx(1000 / tck)
    assert got["host_cpu_seconds_total"][(("mode", "iowait"),)] == pytest.approx(40 / tck)
    assert got["host_cpu_seconds_total"][(("mode", "steal"),)] == pytest.approx(7 / tck)
    assert got["host_cpus"][()] == 2
    assert got["host_load1"][()] == 1.5 and got["host_load15"][()] == 0.25
    psi = got["host_pressure_stalled_seconds_total"]
    assert psi[(("kind", "some"), ("resource", "cpu"))] == 2.5
    assert psi[(("kind", "full"), ("resource", "io"))] == 2.0
    assert got["host_memory_total_bytes"][()] == 16384000 * 1024
    assert got["host_memory_available_bytes"][()] == 8192000 * 1024
    assert got["host_swap_used_bytes"][()] == 1024000 * 1024
    assert got["host_oom_kills_total"][()] == 3
    assert got["host_swap_in_pages_total"][()] == 11 and got["host_swap_out_pages_total"][()] == 22
    # Whole disks only: loop devices and partitions would double-count.
    assert set(got["host_disk_io_time_seconds_total"]) == {
        (("device", "sda"),),
        (("device", "nvme0n1"),),
    }
    assert got["host_disk_io_time_seconds_total"][(("device", "sda"),)] == 1.2
    # the summed time in flight (field 11 of the stats): what bounds the busy share
    assert got["host_disk_io_time_weighted_seconds_total"][(("device", "sda"),)] == 1.75
    assert got["host_disk_read_time_seconds_total"][(("device", "sda"),)] == 0.25
    assert got["host_disk_writes_completed_total"][(("device", "sda"),)] == 50
    assert got["host_network_receive_bytes_total"][(("interface", "eth0"),)] == 5000000
    assert got["host_network_receive_drops_total"][(("interface", "eth0"),)] == 7
    assert got["host_network_transmit_errors_total"][(("interface", "eth0"),)] == 1
    assert got["host_network_receive_packets_total"][(("interface", "eth0"),)] == 4000
    assert got["host_network_transmit_packets_total"][(("interface", "eth0"),)] == 2000
    assert got["host_tcp_retransmitted_segments_total"][()] == 17
    assert got["host_tcp_out_segments_total"][()] == 5458
    tcp = got["host_tcp_connections"]
    assert tcp[(("port", "8000"), ("state", "established"))] == 2
    assert tcp[(("port", "8000"), ("state", "listen"))] == 1
    assert tcp[(("port", "8000"), ("state", "close_wait"))] == 1
    assert tcp[(("port", "8000"), ("state", "time_wait"))] == 1  # from tcp6
    assert tcp[(("port", "8000"), ("state", "syn_recv"))] == 0  # zeros are series too
    assert not any(lb[0][1] == "6379" for lb in tcp)  # only the ports asked about
    cg = (("cgroup", "/docker/abc"),)
    assert got["host_cgroup_memory_limit_bytes"][cg] == 4294967296
    assert got["host_cgroup_memory_usage_bytes"][cg] == 1073741824
    assert got["aivitals_collector_up"][(("collector", "host"),)] == 1
    assert "aivitals_collector_errors_total" not in got
    for name in got:
        assert signals.family_of(name) is not None, name


def test_cgroup_v2_and_unlimited(tmp_path: Path) -> None:
    proc = make_proc(tmp_path, {"self/cgroup": "0::/user.slice/app\n"})
    sys = tmp_path / "sys"
    cg = sys / "fs" / "cgroup"
    (cg / "user.slice" / "app").mkdir(parents=True)
    (cg / "cgroup.controllers").write_text("cpu memory io\n")
    (cg / "user.slice" / "app" / "memory.max").write_text("max\n")
    (cg / "user.slice" / "app" / "memory.current").write_text("123456\n")
    got = by_name(list(HostCollector(proc=str(proc), sys=str(sys)).collect()))
    assert got["host_cgroup_memory_usage_bytes"] == {(("cgroup", "/user.slice/app"),): 123456}
    assert "host_cgroup_memory_limit_bytes" not in got  # unlimited: absent, not a fake number


def test_cgroup_v1_unlimited_and_container_root(tmp_path: Path) -> None:
    proc = make_proc(tmp_path, {"self/cgroup": "4:memory:/process_api/xyz\n0::/\n"})
    sys = tmp_path / "sys"
    mem = sys / "fs" / "cgroup" / "memory"
    mem.mkdir(parents=True)
    # Inside a container the named cgroup is mounted as the root.
    (mem / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    (mem / "memory.usage_in_bytes").write_text("777\n")
    got = by_name(list(HostCollector(proc=str(proc), sys=str(sys)).collect()))
    assert got["host_cgroup_memory_usage_bytes"] == {(("cgroup", "/process_api/xyz"),): 777}
    assert "host_cgroup_memory_limit_bytes" not in got


def test_unreadable_and_garbage_files_cost_only_their_series(tmp_path: Path) -> None:
    proc = make_proc(
        tmp_path,
        {"meminfo": None, "pressure/cpu": "some avg10=1.0 nototal\n", "net/snmp": "garbage\n"},
    )
    (proc / "meminfo").mkdir()  # reading a directory fails like an unreadable file
    got = by_name(list(HostCollector(proc=str(proc), sys=str(tmp_path / "nosys")).collect()))
    assert "host_memory_total_bytes" not in got
    assert "host_pressure_stalled_seconds_total" not in got
    assert "host_tcp_retransmitted_segments_total" not in got
    assert got["host_load1"][()] == 1.5  # the rest keeps working
    assert got["aivitals_collector_up"][(("collector", "host"),)] == 1
    errors = {dict(k)["reason"]: v for k, v in got["aivitals_collector_errors_total"].items()}
    assert errors == {
        "meminfo_os_error": 1,
        "pressure_parse": 1,
        "snmp_parse": 1,
        "cgroup_missing": 1,
    }


def test_missing_psi_is_not_an_error(tmp_path: Path) -> None:
    proc = make_proc(tmp_path, {"pressure/cpu": None, "pressure/memory": None, "pressure/io": None})
    got = by_name(list(HostCollector(proc=str(proc), sys=str(make_sys_v1(tmp_path))).collect()))
    assert "host_pressure_stalled_seconds_total" not in got
    assert "aivitals_collector_errors_total" not in got


def test_nothing_readable_is_down(tmp_path: Path) -> None:
    got = by_name(list(HostCollector(proc=str(tmp_path / "none"), sys=str(tmp_path)).collect()))
    assert got["aivitals_collector_up"][(("collector", "host"),)] == 0
    assert set(got) == {
        "aivitals_collector_up",
        "aivitals_collector_duration_seconds",
        "aivitals_collector_errors_total",
    }


# --- filesystems ---------------------------------------------------------------------------
MOUNTS = (
    "/dev/vda1 / ext4 rw,relatime 0 0\n"
    "proc /proc proc rw 0 0\n"
    "tmpfs /run tmpfs rw,nosuid 0 0\n"
    "devtmpfs /dev devtmpfs rw 0 0\n"
    "tmpfs /dev/shm tmpfs rw 0 0\n"
    "cgroup2 /sys/fs/cgroup cgroup2 rw 0 0\n"
    "overlay /var/lib/docker/overlay2/abc/merged overlay rw 0 0\n"
    "/dev/vda1 /var/lib/docker/volumes/v ext4 rw 0 0\n"
    "/dev/loop3 /snap/core/1 squashfs ro 0 0\n"
    "/dev/vdb1 /srv/model\\040cache xfs ro,relatime 0 0\n"
    # mounted over: only the top mount is what statvfs reads
    "/dev/vdc1 /data ext4 rw 0 0\n"
    "/dev/vdd1 /data xfs rw 0 0\n"
)


def _statvfs(
    blocks: int, bfree: int, bavail: int, *, readonly: bool = False, frsize: int = 4096
) -> os.statvfs_result:
    flag = os.ST_RDONLY if readonly else 0
    # bsize differs from frsize on purpose: blocks are counted in fragments
    return os.statvfs_result((65536, frsize, blocks, bfree, bavail, 1000, 400, 400, flag, 255))


def test_filesystems_of_every_mount_that_holds_data(tmp_path: Path) -> None:
    stats = {
        "/": _statvfs(1000, 300, 250),
        "/run": _statvfs(100, 99, 99, frsize=1024),
        "/srv/model cache": _statvfs(2000, 0, 0, readonly=True),
        "/data": _statvfs(500, 50, 40),
    }
    asked: list[str] = []

    def statvfs(path: str) -> os.statvfs_result:
        asked.append(path)
        return stats[path]

    proc = make_proc(tmp_path, {"self/mounts": MOUNTS})
    host = HostCollector(proc=str(proc), sys=str(make_sys_v1(tmp_path)), statvfs=statvfs)
    got = by_name(list(host.collect()))
    # pseudo types and node_exporter's excluded mount points are never asked about
    assert sorted(asked) == ["/", "/data", "/run", "/srv/model cache"]
    root = (("device", "/dev/vda1"), ("fstype", "ext4"), ("mountpoint", "/"))
    assert got["host_filesystem_size_bytes"][root] == 1000 * 4096
    assert got["host_filesystem_free_bytes"][root] == 300 * 4096
    assert got["host_filesystem_available_bytes"][root] == 250 * 4096
    assert got["host_filesystem_files"][root] == 1000
    assert got["host_filesystem_files_free"][root] == 400
    assert got["host_filesystem_readonly"][root] == 0
    assert got["host_filesystem_device_error"][root] == 0
    run = (("device", "tmpfs"), ("fstype", "tmpfs"), ("mountpoint", "/run"))
    assert got["host_filesystem_size_bytes"][run] == 100 * 1024
    cache = (("device", "/dev/vdb1"), ("fstype", "xfs"), ("mountpoint", "/srv/model cache"))
    assert got["host_filesystem_readonly"][cache] == 1  # the octal escape undone
    data = (("device", "/dev/vdd1"), ("fstype", "xfs"), ("mountpoint", "/data"))
    assert {k for k in got["host_filesystem_size_bytes"] if dict(k)["mountpoint"] == "/data"} == {
        data
    }
    assert "aivitals_collector_errors_total" not in got
    for name in got:
        assert signals.family_of(name) is not None, name


def test_a_mount_whose_statvfs_fails_costs_only_its_own_series(tmp_path: Path) -> None:
    def statvfs(path: str) -> os.statvfs_result:
        if path == "/data":
            raise PermissionError(13, "Permission denied", path)
        return _statvfs(10, 5, 5)

    proc = make_proc(tmp_path, {"self/mounts": MOUNTS})
    host = HostCollector(proc=str(proc), sys=str(make_sys_v1(tmp_path)), statvfs=statvfs)
    got = by_name(list(host.collect()))
    data = (("device", "/dev/vdd1"), ("fstype", "xfs"), ("mountpoint", "/data"))
    assert got["host_filesystem_device_error"][data] == 1
    assert data not in got["host_filesystem_available_bytes"]  # no fake 0
    assert len(got["host_filesystem_available_bytes"]) == 3
    errors = {dict(k)["reason"]: v for k, v in got["aivitals_collector_errors_total"].items()}
    assert errors == {"filesystem_permission": 1}
    assert got["aivitals_collector_up"][(("collector", "host"),)] == 1


def test_a_hung_mount_never_holds_the_scrape_and_is_not_asked_again_while_stuck(
    tmp_path: Path,
) -> None:
    import threading
    import time

    release = threading.Event()
    calls: list[str] = []

    def statvfs(path: str) -> os.statvfs_result:
        calls.append(path)
        if path == "/data":
            release.wait(10)  # a dead NFS server: the call blocks in the kernel
        return _statvfs(10, 5, 5)

    proc = make_proc(tmp_path, {"self/mounts": MOUNTS})
    host = HostCollector(
        proc=str(proc), sys=str(make_sys_v1(tmp_path)), statvfs=statvfs, fs_timeout=0.2
    )
    data = (("device", "/dev/vdd1"), ("fstype", "xfs"), ("mountpoint", "/data"))
    try:
        t0 = time.monotonic()
        first = by_name(list(host.collect()))
        assert time.monotonic() - t0 < 1.5
        assert first["host_filesystem_device_error"][data] == 1
        assert len(first["host_filesystem_available_bytes"]) == 3  # the others answered
        t0 = time.monotonic()
        second = by_name(list(host.collect()))
        assert time.monotonic() - t0 < 0.5  # a stuck mount is not waited for again
        assert calls.count("/data") == 1  # nor asked again: one thread, not one a scrape
        errors = {
            dict(k)["reason"]: v for k, v in second["aivitals_collector_errors_total"].items()
        }
        assert errors == {"filesystem_timeout": 1, "filesystem_stuck": 1}
        assert second["aivitals_collector_up"][(("collector", "host"),)] == 1
    finally:
        release.set()
    deadline = time.monotonic() + 5
    while calls.count("/data") < 2 and time.monotonic() < deadline:
        third = by_name(list(host.collect()))  # once the call returns, it is asked again
    assert third["host_filesystem_device_error"][data] == 0
    assert third["host_filesystem_available_bytes"][data] == 5 * 4096


def test_the_real_mounts_are_reported_as_statvfs_counts_them() -> None:
    got = by_name(list(HostCollector().collect()))
    sizes = {dict(k)["mountpoint"]: v for k, v in got.get("host_filesystem_size_bytes", {}).items()}
    if not sizes:
        pytest.skip("no mount here holds data (every one is pseudo or excluded)")
    for mountpoint, size in sizes.items():
        real = os.statvfs(mountpoint)
        assert size == real.f_blocks * real.f_frsize, mountpoint


@pytest.mark.parametrize("bad", [0, -1, float("nan")])
def test_a_bad_fs_timeout_is_a_config_error(bad: float) -> None:
    with pytest.raises(ConfigError, match="fs_timeout"):
        HostCollector(fs_timeout=bad)


def test_bad_port_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="70000"):
        HostCollector(ports=[70000])


# --- other network namespaces -----------------------------------------------------------
def _netns_dir(root: Path, *names: str) -> Path:
    d = root / "run-netns"
    d.mkdir()
    for name in names:
        (d / name).touch()
    return d


def test_named_and_globbed_namespaces_are_read_and_labelled(tmp_path: Path) -> None:
    proc = make_proc(tmp_path)
    d = _netns_dir(tmp_path, "edge-1", "edge-2", "other")
    host = HostCollector(
        proc=str(proc), sys=str(make_sys_v1(tmp_path)), netns=["edge-*"], netns_dir=str(d)
    )
    asked: list[tuple[str, tuple[str, ...]]] = []
    snmp = FILES["net/snmp"].replace("5458 17", "900 60")  # OutSegs 900, RetransSegs 60

    def fake(path: str, files: Sequence[str], **_: Any) -> dict[str, str]:
        asked.append((path, tuple(files)))
        return {"snmp": snmp, "dev": FILES["net/dev"]}

    host.read_netns = fake
    got = by_name(list(host.collect()))
    assert [p for p, _ in asked] == [str(d / "edge-1"), str(d / "edge-2")]
    out = got["host_tcp_out_segments_total"]
    assert out[()] == 5458  # the host's own, unlabelled, unchanged
    assert out[(("netns", "edge-1"),)] == 900
    assert got["host_tcp_retransmitted_segments_total"][(("netns", "edge-2"),)] == 60
    lo = got["host_network_transmit_packets_total"]
    assert lo[(("interface", "lo"), ("netns", "edge-1"))] == 10
    assert lo[(("interface", "lo"),)] == 10
    assert "aivitals_collector_errors_total" not in got


def test_a_namespace_that_fails_costs_only_its_series(tmp_path: Path) -> None:
    proc = make_proc(tmp_path)
    d = _netns_dir(tmp_path, "a", "b")
    ns_file = tmp_path / "ns-file"
    ns_file.touch()
    host = HostCollector(
        proc=str(proc),
        sys=str(make_sys_v1(tmp_path)),
        netns=["a", "b", "gone", str(ns_file), "nomatch-*"],
        netns_dir=str(d),
    )

    def fake(path: str, files: Sequence[str], **_: Any) -> dict[str, str]:
        if path.endswith("/a"):
            raise PermissionError(1, "Operation not permitted")
        if path == str(ns_file):
            return {"snmp": "garbage\n", "dev": ""}
        return {"snmp": FILES["net/snmp"], "dev": FILES["net/dev"]}

    host.read_netns = fake
    got = by_name(list(host.collect()))
    labelled = {dict(k).get("netns") for k in got["host_tcp_out_segments_total"]}
    assert labelled == {None, "b"}  # the host's and b's; a, the file and "gone" cost theirs
    errors = {dict(k)["reason"]: v for k, v in got["aivitals_collector_errors_total"].items()}
    # a glob that matches nothing is no error: the namespaces it stands for come and go
    assert errors == {"netns_permission": 1, "netns_parse": 1, "netns_missing": 1}
    assert got["aivitals_collector_up"][(("collector", "host"),)] == 1


@pytest.mark.parametrize("bad", ["", "a/b", "run/netns/x"])
def test_a_netns_that_is_neither_a_name_nor_an_absolute_path_is_a_config_error(bad: str) -> None:
    with pytest.raises(ConfigError, match="netns"):
        HostCollector(netns=[bad])


@pytest.mark.integration
@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None, reason="creates a network namespace (root)"
)
def test_a_real_namespace_is_read_from_inside_it(tmp_path: Path) -> None:
    # a fresh namespace has sent no TCP segment: its counters are its own, not the host's
    name = f"aivitals-test-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", name], check=True, timeout=15)
    try:
        subprocess.run(
            ["ip", "netns", "exec", name, "ip", "link", "set", "lo", "up"], check=True, timeout=15
        )
        before = os.readlink("/proc/thread-self/ns/net")
        got = by_name(list(HostCollector(netns=["aivitals-test-*"]).collect()))
        out = got["host_tcp_out_segments_total"]
        assert out[(("netns", name),)] == 0
        assert out[()] > 0  # this machine's own traffic (the test runner's, at least)
        assert (("interface", "lo"), ("netns", name)) in got["host_network_transmit_packets_total"]
        # the collecting thread never left the host's namespace
        assert os.readlink("/proc/thread-self/ns/net") == before
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False, timeout=15)
