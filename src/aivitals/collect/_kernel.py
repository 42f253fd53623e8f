"""Kernel log rules: GPU Xids, OOM-killer kills, hung tasks, disk I/O errors.

Records come from ``/dev/kmsg`` (non-blocking, one record per read, with the
kernel's sequence number as the cursor) or, where that is not readable, from
``dmesg`` (its ``[seconds]`` stamp as the cursor). A record is counted once:
anything at or below the cursor is skipped. Lines in a format the rules do not
know are counted as ``other`` (or, when not a kernel record at all, as a
``malformed`` error) and the rest keeps flowing.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import subprocess
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from ..errors import CollectorError
from ..signals import Sample
from ._event import Event
from ._health import BaseCollector
from ._xid import xid_meaning

__all__ = ["DmesgSource", "KernelLogCollector", "KernelRecord", "KmsgSource", "classify_line"]

_KMSG_RECORD = re.compile(r"^(\d+),(\d+),(\d+),[^;]*;(.*)$")
_DMESG_LINE = re.compile(r"^\[\s*(\d+\.\d+)\]\s?(.*)$")
_XID = re.compile(
    r"NVRM: Xid \((?:PCI:)?([0-9A-Fa-f:.]+)\): (\d+)(?:, pid=(\d+|'<unknown>'))?(?:, name=([^,]*))?"
)
_OOM = re.compile(r"[Oo]ut of memory: Kill(?:ed)? process (\d+) \(([^)]*)\)")
_HUNG = re.compile(r"INFO: task (.+):(\d+) blocked for more than (\d+) seconds")
_IO = re.compile(
    r"(?:I/O error, dev ([\w.-]+),|Buffer I/O error on (?:dev|device) ([\w.-]+),"
    r"|critical (?:medium|target) error, dev ([\w.-]+),)"
)
_MAX_LABELS = 100  # distinct process/device label values kept before folding
_OTHER = "<other>"
KINDS = ("xid", "oom", "hung_task", "io_error", "other")
RETRY_S = 60.0  # how long an unreadable kernel log is left alone before trying again


@dataclass(frozen=True, slots=True)
class KernelRecord:
    """One kernel log record: its cursor position, time (epoch s) and message."""

    seq: float
    time: float
    message: str


def classify_line(message: str) -> tuple[str, dict[str, str]]:
    """The kind of a kernel message and the fields the rule took from it.

    **Usage**::

        classify_line("NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen")
        # ("xid", {"pci": "0000:3b:00", "xid": "79", "pid": "1234", "name": "python", ...})
    """
    if m := _XID.search(message):
        code = int(m.group(2))
        fields = {"pci": m.group(1).lower(), "xid": str(code), "meaning": xid_meaning(code)}
        if m.group(3) and m.group(3).isdigit():
            fields["pid"] = m.group(3)
        if m.group(4):
            fields["name"] = m.group(4).strip()
        return "xid", fields
    if m := _OOM.search(message):
        return "oom", {"pid": m.group(1), "process": m.group(2)}
    if m := _HUNG.search(message):
        return "hung_task", {"task": m.group(1), "pid": m.group(2), "seconds": m.group(3)}
    if m := _IO.search(message):
        device = next(g for g in m.groups() if g)
        return "io_error", {"device": device}
    return "other", {}


def _boot_time() -> float:
    return time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)


class KmsgSource:
    """Reads ``/dev/kmsg`` records without blocking; ``read`` returns the new ones.

    ``from_start`` also returns what the ring buffer held when first opened
    (the default skips history, so an agent restart does not recount old Xids).
    """

    name = "kmsg"

    def __init__(
        self, path: str = "/dev/kmsg", *, from_start: bool = False, max_records: int = 10_000
    ) -> None:
        self.path = path
        self.from_start = from_start
        self.max_records = max_records
        self._fd: int | None = None
        self._boot = _boot_time()
        self._partial = b""
        self.malformed = 0

    def _open(self) -> int:
        fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        if not self.from_start:
            with contextlib.suppress(OSError):
                os.lseek(fd, 0, os.SEEK_END)
        return fd

    def read(self) -> list[KernelRecord]:
        if self._fd is None:
            self._fd = self._open()
        out: list[KernelRecord] = []
        for _ in range(self.max_records):
            try:
                chunk = os.read(self._fd, 8192)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # records overwritten before we read them
                    continue
                raise
            if not chunk:
                break  # a plain file (tests): end of what is there for now
            out += self._records(chunk)
        return out

    def _records(self, chunk: bytes) -> list[KernelRecord]:
        data = self._partial + chunk
        lines = data.split(b"\n")
        self._partial = lines.pop()
        out: list[KernelRecord] = []
        for raw in lines:
            if not raw or raw[:1] == b" ":
                continue  # continuation (KEY=value) lines of the previous record
            m = _KMSG_RECORD.match(raw.decode("utf-8", "replace"))
            if m is None:
                self.malformed += 1
                continue
            ts = self._boot + int(m.group(3)) / 1e6
            out.append(KernelRecord(float(m.group(2)), ts, m.group(4)))
        return out

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class DmesgSource:
    """Runs ``dmesg`` (bounded by a timeout) where /dev/kmsg cannot be read.

    ``runner`` returns dmesg's text; injectable for tests.
    """

    name = "dmesg"

    def __init__(
        self,
        *,
        runner: Callable[[], str] | None = None,
        timeout: float = 5.0,
        from_start: bool = False,
    ) -> None:
        self.timeout = timeout
        self.runner = runner or self._run
        self._boot = _boot_time()
        # Without history, the first read only finds where "now" is in the log.
        self._floor: float | None = None if from_start else -1.0
        self.malformed = 0

    def _run(self) -> str:
        proc = subprocess.run(
            ["dmesg"], capture_output=True, text=True, timeout=self.timeout, check=False
        )
        if proc.returncode != 0:
            raise PermissionError(proc.stderr.strip() or f"dmesg exited {proc.returncode}")
        return proc.stdout

    def read(self) -> list[KernelRecord]:
        out: list[KernelRecord] = []
        for line in self.runner().splitlines():
            m = _DMESG_LINE.match(line)
            if m is None:
                self.malformed += 1
                continue
            seconds = float(m.group(1))
            out.append(KernelRecord(seconds, self._boot + seconds, m.group(2)))
        if self._floor == -1.0:
            self._floor = out[-1].seq if out else 0.0
            return []
        if self._floor is not None:
            out = [r for r in out if r.seq > self._floor]
        return out

    def close(self) -> None:
        return None


class KernelLogCollector(BaseCollector):
    """The ``kernel`` collector: counters from kernel log rules, plus events.

    **Usage**::

        kernel = KernelLogCollector()            # /dev/kmsg, else dmesg
        samples = list(kernel.collect())
        events = kernel.drain_events()           # Xid / OOM / hung task / I/O error events
    """

    name = "kernel"

    def __init__(
        self,
        source: KmsgSource | DmesgSource | None = None,
        *,
        pci_to_gpu: dict[str, str] | None = None,
    ) -> None:
        super().__init__()
        self.source = source
        self.pci_to_gpu = {k.lower(): v for k, v in (pci_to_gpu or {}).items()}
        self._cursor = -1.0
        # dmesg prints several records with one stamp; remember those already seen.
        self._seen_at_cursor: set[str] = set()
        self._lines = dict.fromkeys(KINDS, 0)
        self._xids: dict[tuple[str, str, str], int] = {}
        self._ooms: dict[str, int] = {}
        self._hung = 0
        self._io: dict[str, int] = {}
        self._events: list[Event] = []
        self._lock = threading.Lock()
        self._malformed_seen = 0
        self._retry_at = 0.0

    def _source(self) -> KmsgSource | DmesgSource:
        if self.source is None:
            try:
                src = KmsgSource()
                src.read()  # the first read positions the cursor (and proves permission)
                self.source = src
            except OSError:
                self.source = DmesgSource()
                self.source.read()
        return self.source

    def _collect(self) -> Iterable[Sample]:
        now = time.monotonic()
        if now < self._retry_at:
            # Unreadable a moment ago: do not spawn dmesg every second to learn it again.
            raise CollectorError("kernel log unreadable (retrying later)")
        try:
            records = self._source().read()
        except (OSError, subprocess.SubprocessError) as exc:
            self._retry_at = now + RETRY_S
            raise CollectorError(f"kernel log unreadable: {exc}") from exc
        for rec in records:
            self._take(rec)
        malformed = self.source.malformed if self.source is not None else 0
        if malformed > self._malformed_seen:
            self.count_error("malformed", malformed - self._malformed_seen)
            self._malformed_seen = malformed
        return self._samples()

    def _take(self, rec: KernelRecord) -> None:
        if rec.seq < self._cursor:
            return
        if rec.seq == self._cursor:
            if rec.message in self._seen_at_cursor:
                return
        else:
            self._cursor, self._seen_at_cursor = rec.seq, set()
        self._seen_at_cursor.add(rec.message)
        kind, fields = classify_line(rec.message)
        self._lines[kind] += 1
        if kind == "xid":
            gpu = self.pci_to_gpu.get(fields["pci"], fields["pci"])
            fields["gpu"] = gpu
            key = (gpu, fields["xid"], fields["meaning"])
            self._xids[key] = self._xids.get(key, 0) + 1
        elif kind == "oom":
            _bump(self._ooms, fields["process"])
        elif kind == "hung_task":
            self._hung += 1
        elif kind == "io_error":
            _bump(self._io, fields["device"])
        if kind != "other":
            event = Event(rec.time, "kernel", rec.message, {**fields, "rule": kind})
            with self._lock:
                self._events.append(event)
                del self._events[:-1000]

    def _samples(self) -> list[Sample]:
        out = [
            Sample("kernel_log_lines_total", {"kind": k}, float(n)) for k, n in self._lines.items()
        ]
        out.append(Sample("kernel_hung_tasks_total", {}, float(self._hung)))
        out += [
            Sample("kernel_oom_kills_total", {"process": p}, float(n))
            for p, n in self._ooms.items()
        ]
        out += [
            Sample("kernel_io_errors_total", {"device": d}, float(n)) for d, n in self._io.items()
        ]
        for (gpu, xid, meaning), n in self._xids.items():
            labels = {"gpu": gpu, "backend": "kernel_log", "xid": xid, "meaning": meaning}
            out.append(Sample("gpu_xid_errors_total", labels, float(n)))
        return out

    def drain_events(self) -> list[Event]:
        with self._lock:
            out, self._events = self._events, []
        return out

    def close(self) -> None:
        if self.source is not None:
            self.source.close()


def _bump(counts: dict[str, int], key: str) -> None:
    if key not in counts and len(counts) >= _MAX_LABELS:
        key = _OTHER
    counts[key] = counts.get(key, 0) + 1
