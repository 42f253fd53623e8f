"""Parsers for the /proc and /sys files the host and process collectors read.

Each takes the file's text and returns plain values, so tests feed them fixture
text and the collectors stay thin.
"""

from __future__ import annotations

import re

__all__ = [
    "TCP_STATES",
    "parse_cgroup_paths",
    "parse_diskstats",
    "parse_key_values",
    "parse_listen_queues",
    "parse_loadavg",
    "parse_meminfo",
    "parse_net_dev",
    "parse_pressure",
    "parse_snmp_tcp",
    "parse_stat_cpu",
    "parse_tcp_table",
]

#: /proc/net/tcp ``st`` codes (include/net/tcp_states.h).
TCP_STATES = {
    1: "established",
    2: "syn_sent",
    3: "syn_recv",
    4: "fin_wait1",
    5: "fin_wait2",
    6: "time_wait",
    7: "close",
    8: "close_wait",
    9: "last_ack",
    10: "listen",
    11: "closing",
}
_CPU_MODES = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
# Partitions and pseudo devices node_exporter also leaves out: they double-count the disk.
_SKIP_DISK = re.compile(r"^(ram|loop|fd|sr|(h|s|v|xv)d[a-z]+\d+|nvme\d+n\d+p\d+|mmcblk\d+p\d+)")


def parse_stat_cpu(text: str, clk_tck: float) -> tuple[dict[str, float], int]:
    """Seconds per CPU mode (the aggregate ``cpu`` line) and the count of CPUs."""
    modes: dict[str, float] = {}
    cpus = 0
    for line in text.splitlines():
        if line.startswith("cpu "):
            values = line.split()[1:]
            modes = {m: int(v) / clk_tck for m, v in zip(_CPU_MODES, values, strict=False)}
        elif line.startswith("cpu"):
            cpus += 1
    if not modes:
        raise ValueError("no aggregate cpu line in /proc/stat")
    return modes, cpus


def parse_loadavg(text: str) -> tuple[float, float, float]:
    one, five, fifteen = (float(x) for x in text.split()[:3])
    return one, five, fifteen


def parse_pressure(text: str) -> dict[str, float]:
    """``{"some": seconds, "full": seconds}`` from one /proc/pressure file."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        parts = line.split()
        if not parts:
            continue
        total = next((p for p in parts if p.startswith("total=")), None)
        if total is None:
            raise ValueError(f"no total= in pressure line {line!r}")
        out[parts[0]] = int(total[6:]) / 1e6  # microseconds
    return out


def parse_key_values(text: str) -> dict[str, int]:
    """``key value`` lines (/proc/vmstat, memory.stat)."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("-").isdigit():
            out[parts[0]] = int(parts[1])
    return out


def parse_meminfo(text: str) -> dict[str, int]:
    """/proc/meminfo in bytes."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            scale = 1024 if len(parts) > 1 and parts[1] == "kB" else 1
            out[key.strip()] = int(parts[0]) * scale
    return out


def parse_diskstats(text: str) -> dict[str, tuple[int, int, int, int, int, int]]:
    """Per whole disk: reads, read ms, writes, write ms, busy (io) ms, weighted io ms."""
    out: dict[str, tuple[int, int, int, int, int, int]] = {}
    for line in text.splitlines():
        f = line.split()
        if len(f) < 14 or _SKIP_DISK.match(f[2]):
            continue
        out[f[2]] = (int(f[3]), int(f[6]), int(f[7]), int(f[10]), int(f[12]), int(f[13]))
    return out


def parse_net_dev(text: str) -> dict[str, tuple[int, ...]]:
    """Per interface: rx bytes, rx packets, rx errs, rx drop, tx bytes, tx packets, tx errs,
    tx drop."""
    out: dict[str, tuple[int, ...]] = {}
    for line in text.splitlines()[2:]:
        name, sep, rest = line.partition(":")
        f = rest.split()
        if not sep or len(f) < 12:
            raise ValueError(f"unexpected /proc/net/dev line {line!r}")
        out[name.strip()] = tuple(int(f[i]) for i in (0, 1, 2, 3, 8, 9, 10, 11))
    return out


def parse_snmp_tcp(text: str) -> dict[str, int]:
    """The ``Tcp:`` header/value pair of /proc/net/snmp as a dict."""
    rows = [line.split()[1:] for line in text.splitlines() if line.startswith("Tcp:")]
    if len(rows) < 2:
        raise ValueError("no Tcp: rows in /proc/net/snmp")
    return {k: int(v) for k, v in zip(rows[0], rows[1], strict=False)}


def parse_tcp_table(text: str, ports: frozenset[int]) -> dict[tuple[int, str], int]:
    """Connections per (local port, state) for the ports asked about."""
    counts: dict[tuple[int, str], int] = {}
    for line in text.splitlines()[1:]:
        f = line.split(maxsplit=4)
        if len(f) < 4:
            continue
        port = int(f[1].rpartition(":")[2], 16)
        if port not in ports:
            continue
        state = TCP_STATES.get(int(f[3], 16), "unknown")
        counts[(port, state)] = counts.get((port, state), 0) + 1
    return counts


def parse_listen_queues(text: str) -> dict[int, int]:
    """Listening port -> connections waiting to be accepted, from /proc/net/tcp text (a
    listening row's ``rx_queue`` is its accept queue; the text has no backlog limit)."""
    out: dict[int, int] = {}
    for line in text.splitlines()[1:]:
        f = line.split(maxsplit=5)
        if len(f) < 5 or f[3] != "0A":
            continue
        port = int(f[1].rpartition(":")[2], 16)
        out[port] = out.get(port, 0) + int(f[4].partition(":")[2], 16)
    return out


def parse_cgroup_paths(text: str) -> tuple[str | None, str | None]:
    """The memory cgroup path under v1 and the unified (v2) path of a process."""
    v1 = v2 = None
    for line in text.splitlines():
        hid, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hid == "0" and controllers == "":
            v2 = path
        elif "memory" in controllers.split(","):
            v1 = path
    return v1, v2
