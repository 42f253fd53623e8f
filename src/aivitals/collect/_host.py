"""Host signals from /proc and /sys: CPU, load, PSI, memory, disks, filesystems, network,
TCP, cgroup.

Read straight from the kernel's files (no psutil on this path): every source is
injectable (``proc=``, ``sys=``) so tests run on fake trees, and one
unreadable or odd file costs only its own series plus an error count.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path

from ..errors import CollectorError, ConfigError
from ..signals import Sample
from . import _procfs as pf
from ._filesystem import StatvfsPool, parse_mounts, stats_of
from ._health import BaseCollector, reason_of
from ._netns import RUN_NETNS, check_netns, read_in_netns, resolve_netns
from ._sockdiag import tcp_sockets

__all__ = ["HostCollector"]

_UNLIMITED = 2**62  # cgroup v1 reports "no limit" as a huge page-aligned number

#: /proc/net/dev's columns, in ``parse_net_dev``'s order.
_NET_DEV = (
    "host_network_receive_bytes_total",
    "host_network_receive_packets_total",
    "host_network_receive_errors_total",
    "host_network_receive_drops_total",
    "host_network_transmit_bytes_total",
    "host_network_transmit_packets_total",
    "host_network_transmit_errors_total",
    "host_network_transmit_drops_total",
)


class HostCollector(BaseCollector):
    """The ``host`` collector.

    ``ports`` are the local TCP ports whose connections are counted by state
    (the served port, Redis...). ``cgroup_pid`` chooses whose cgroup is read.

    ``netns`` names other network namespaces whose TCP counters and interfaces are
    read too, labelled ``netns``: ``ip netns`` names, globs over them (``cni-*``,
    whichever exist at each run) or namespace files (``/proc/<pid>/ns/net``). A
    service in a container, or behind a proxy in its own namespace, sends and resends
    its segments there, where the host's /proc/net/snmp never counts them. Entering a
    namespace needs root; a failure costs that namespace's series and counts an error
    (``netns_<reason>``), as does a name given outright that does not exist
    (``netns_missing``; a glob matching nothing is no error).

    Filesystems: size, free and available bytes and inodes of every mount of
    ``/proc/self/mounts`` that holds data (node_exporter's default exclusions), each
    ``statvfs`` bounded by ``fs_timeout`` seconds. A mount whose call fails or hangs
    reads ``host_filesystem_device_error 1`` and counts an error
    (``filesystem_<reason>``, ``filesystem_timeout``, then ``filesystem_stuck`` until
    the hung call returns); the rest of the scrape goes on. ``statvfs`` is injectable
    for tests.

    **Usage**::

        host = HostCollector(ports=[8000])
        for sample in host.collect():
            print(sample.name, sample.labels, sample.value)
    """

    name = "host"

    def __init__(
        self,
        *,
        proc: str = "/proc",
        sys: str = "/sys",
        ports: Iterable[int] = (),
        cgroup_pid: int | str = "self",
        netns: Iterable[str] = (),
        netns_dir: str = RUN_NETNS,
        statvfs: Callable[[str], os.statvfs_result] = os.statvfs,
        fs_timeout: float = 1.0,
    ) -> None:
        super().__init__()
        self.proc = Path(proc)
        self.sys = Path(sys)
        self.ports = frozenset(int(p) for p in ports)
        for p in self.ports:
            if not 0 < p < 65536:
                raise ConfigError(f"ports: {p!r} is not a TCP port")
        self.cgroup_pid = str(cgroup_pid)
        self.netns = check_netns(netns)
        self.netns_dir = netns_dir
        if not fs_timeout > 0:
            raise ConfigError(f"fs_timeout: {fs_timeout!r} must be > 0 seconds")
        self._statvfs = StatvfsPool(statvfs, fs_timeout)
        #: reads ``/proc/net`` files inside a namespace (replaced in tests)
        self.read_netns = read_in_netns
        self._clk_tck = float(os.sysconf("SC_CLK_TCK"))
        self._sections: tuple[tuple[str, Callable[[], list[Sample]]], ...] = (
            ("stat", self._cpu),
            ("loadavg", self._load),
            ("pressure", self._pressure),
            ("meminfo", self._memory),
            ("vmstat", self._vmstat),
            ("diskstats", self._disks),
            ("filesystem", self._filesystems),
            ("net_dev", self._net),
            ("snmp", self._snmp),
            ("tcp", self._tcp),
            ("cgroup", self._cgroup),
            ("netns", self._namespaces),
        )

    def _read(self, *parts: str) -> str:
        return self.proc.joinpath(*parts).read_text()

    def _collect(self) -> Iterable[Sample]:
        out: list[Sample] = []
        failed = 0
        for section, fn in self._sections:
            try:
                out += fn()
            except (OSError, ValueError, IndexError) as exc:
                failed += 1
                self.count_error(f"{section}_{reason_of(exc)}")
        if failed and not out:
            raise CollectorError(f"no host source under {self.proc} was readable")
        return out

    def _cpu(self) -> list[Sample]:
        modes, cpus = pf.parse_stat_cpu(self._read("stat"), self._clk_tck)
        out = [Sample("host_cpu_seconds_total", {"mode": m}, v) for m, v in modes.items()]
        return [*out, Sample("host_cpus", {}, float(cpus))]

    def _load(self) -> list[Sample]:
        one, five, fifteen = pf.parse_loadavg(self._read("loadavg"))
        return [
            Sample("host_load1", {}, one),
            Sample("host_load5", {}, five),
            Sample("host_load15", {}, fifteen),
        ]

    def _pressure(self) -> list[Sample]:
        out: list[Sample] = []
        for resource in ("cpu", "memory", "io"):
            try:
                text = self._read("pressure", resource)
            except FileNotFoundError:
                continue  # a kernel without PSI (or without irq pressure) has no file
            for kind, seconds in pf.parse_pressure(text).items():
                labels = {"resource": resource, "kind": kind}
                out.append(Sample("host_pressure_stalled_seconds_total", labels, seconds))
        return out

    def _memory(self) -> list[Sample]:
        m = pf.parse_meminfo(self._read("meminfo"))
        out = [
            Sample("host_memory_total_bytes", {}, float(m["MemTotal"])),
            Sample("host_memory_available_bytes", {}, float(m["MemAvailable"])),
        ]
        if "SwapTotal" in m:
            out.append(Sample("host_swap_total_bytes", {}, float(m["SwapTotal"])))
            used = m["SwapTotal"] - m.get("SwapFree", m["SwapTotal"])
            out.append(Sample("host_swap_used_bytes", {}, float(used)))
        return out

    def _vmstat(self) -> list[Sample]:
        v = pf.parse_key_values(self._read("vmstat"))
        names = (
            ("oom_kill", "host_oom_kills_total"),
            ("pswpin", "host_swap_in_pages_total"),
            ("pswpout", "host_swap_out_pages_total"),
        )
        return [Sample(ours, {}, float(v[key])) for key, ours in names if key in v]

    def _disks(self) -> list[Sample]:
        out: list[Sample] = []
        for dev, (reads, read_ms, writes, write_ms, io_ms, weighted_ms) in pf.parse_diskstats(
            self._read("diskstats")
        ).items():
            lab = {"device": dev}
            out += [
                Sample("host_disk_reads_completed_total", lab, float(reads)),
                Sample("host_disk_read_time_seconds_total", lab, read_ms / 1000.0),
                Sample("host_disk_writes_completed_total", lab, float(writes)),
                Sample("host_disk_write_time_seconds_total", lab, write_ms / 1000.0),
                Sample("host_disk_io_time_seconds_total", lab, io_ms / 1000.0),
                # the sum of every request's time in flight: the busy share can never
                # exceed its rate, which is what tells a real saturation from the kernel's
                # io_ticks jumps (an idle stretch added at one completion reads > 100 %)
                Sample("host_disk_io_time_weighted_seconds_total", lab, weighted_ms / 1000.0),
            ]
        return out

    def _filesystems(self) -> list[Sample]:
        mounts = parse_mounts(self._read("self", "mounts"))
        results = self._statvfs.stat([m.mountpoint for m in mounts])
        out: list[Sample] = []
        for mount in mounts:
            lab, got = mount.labels, results[mount.mountpoint]
            if isinstance(got, str | OSError):
                # the mount stays visible, flagged, as node_exporter's device_error does
                self.count_error(f"filesystem_{got if isinstance(got, str) else reason_of(got)}")
                out.append(Sample("host_filesystem_device_error", lab, 1.0))
                continue
            st = stats_of(got)
            out += [
                Sample("host_filesystem_device_error", lab, 0.0),
                Sample("host_filesystem_size_bytes", lab, st.size),
                Sample("host_filesystem_free_bytes", lab, st.free),
                Sample("host_filesystem_available_bytes", lab, st.available),
                Sample("host_filesystem_files", lab, st.files),
                Sample("host_filesystem_files_free", lab, st.files_free),
                Sample("host_filesystem_readonly", lab, 1.0 if st.readonly else 0.0),
            ]
        return out

    def _net(self) -> list[Sample]:
        out: list[Sample] = []
        for iface, values in pf.parse_net_dev(self._read("net", "dev")).items():
            lab = {"interface": iface}
            out += [Sample(n, lab, float(v)) for n, v in zip(_NET_DEV, values, strict=True)]
        return out

    def _snmp(self) -> list[Sample]:
        tcp = pf.parse_snmp_tcp(self._read("net", "snmp"))
        return [
            Sample("host_tcp_out_segments_total", {}, float(tcp["OutSegs"])),
            Sample("host_tcp_retransmitted_segments_total", {}, float(tcp["RetransSegs"])),
        ]

    def _namespaces(self) -> list[Sample]:
        if not self.netns:
            return []
        found, missing = resolve_netns(self.netns, self.netns_dir)
        for _ in missing:
            self.count_error("netns_missing")
        out: list[Sample] = []
        for label, path in found.items():
            try:
                files = self.read_netns(path, ("snmp", "dev"))
                tcp = pf.parse_snmp_tcp(files["snmp"])
                dev = pf.parse_net_dev(files["dev"])
            except (OSError, ValueError, IndexError, KeyError) as exc:
                # one namespace gone mid-read (a container stopped) costs only its series
                self.count_error(f"netns_{reason_of(exc)}")
                continue
            ns = {"netns": label}
            out += [
                Sample("host_tcp_out_segments_total", ns, float(tcp["OutSegs"])),
                Sample("host_tcp_retransmitted_segments_total", ns, float(tcp["RetransSegs"])),
            ]
            for iface, values in dev.items():
                lab = {"interface": iface, **ns}
                out += [Sample(n, lab, float(v)) for n, v in zip(_NET_DEV, values, strict=True)]
        return out

    def _tcp(self) -> list[Sample]:
        if not self.ports:
            return []
        counts = self._tcp_counts()
        out: list[Sample] = []
        for port in sorted(self.ports):
            # Every state of every port of interest, zeros included, so rate()
            # and "== 0" rules see a series rather than nothing.
            for state in pf.TCP_STATES.values():
                value = float(counts.get((port, state), 0))
                labels = {"port": str(port), "state": state}
                out.append(Sample("host_tcp_connections", labels, value))
        return out

    def _tcp_counts(self) -> dict[tuple[int, str], int]:
        counts: dict[tuple[int, str], int] = {}
        if self.proc == Path("/proc"):
            try:
                for port, state, _ in tcp_sockets():
                    if port in self.ports:
                        key = (port, pf.TCP_STATES.get(state, "unknown"))
                        counts[key] = counts.get(key, 0) + 1
                return counts
            except OSError:
                pass  # netlink refused: read the text tables
        for table in ("tcp", "tcp6"):
            try:
                text = self._read("net", table)
            except FileNotFoundError:
                continue  # no IPv6
            for key, n in pf.parse_tcp_table(text, self.ports).items():
                counts[key] = counts.get(key, 0) + n
        return counts

    def _cgroup(self) -> list[Sample]:
        v1, v2 = pf.parse_cgroup_paths(self._read(self.cgroup_pid, "cgroup"))
        root = self.sys / "fs" / "cgroup"
        if v2 is not None and (root / "cgroup.controllers").exists():
            return _cgroup_files(root, v2, "memory.max", "memory.current")
        if v1 is not None:
            return _cgroup_files(
                root / "memory", v1, "memory.limit_in_bytes", "memory.usage_in_bytes"
            )
        return []


def _cgroup_files(root: Path, path: str, limit_file: str, usage_file: str) -> list[Sample]:
    # Inside a container the cgroup named in /proc/<pid>/cgroup may be mounted
    # as the root: walk up until the files exist.
    rel = Path(path.lstrip("/"))
    while not (root / rel / usage_file).exists():
        if rel == Path("."):
            raise FileNotFoundError(f"no {usage_file} for cgroup {path}")
        rel = rel.parent
    lab = {"cgroup": path}
    out = [
        Sample("host_cgroup_memory_usage_bytes", lab, float((root / rel / usage_file).read_text()))
    ]
    limit = (root / rel / limit_file).read_text().strip()
    if limit != "max" and int(limit) < _UNLIMITED:
        out.append(Sample("host_cgroup_memory_limit_bytes", lab, float(limit)))
    return out
