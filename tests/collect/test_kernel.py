from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from aivitals.collect import DmesgSource, KernelLogCollector, KmsgSource, classify_line

FIXTURE = Path(__file__).parent / "fixtures" / "kmsg.txt"


def _values(samples: list, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {tuple(sorted(s.labels.items())): s.value for s in samples if s.name == name}


def _collector(tmp_path: Path, text: str | None = None) -> tuple[KernelLogCollector, Path]:
    log = tmp_path / "kmsg"
    if text is None:
        shutil.copy(FIXTURE, log)
    else:
        log.write_text(text)
    source = KmsgSource(str(log), from_start=True)
    return KernelLogCollector(source, pci_to_gpu={"0000:3b:00": "0"}), log


def test_rules_count_each_kind(tmp_path: Path) -> None:
    collector, _ = _collector(tmp_path)
    samples = list(collector.collect())
    lines = _values(samples, "kernel_log_lines_total")
    assert lines[(("kind", "xid"),)] == 4
    assert lines[(("kind", "oom"),)] == 3
    assert lines[(("kind", "hung_task"),)] == 1
    assert lines[(("kind", "io_error"),)] == 3
    assert lines[(("kind", "other"),)] == 3  # banner, "Not tainted", the rename
    xids = {
        (lb["gpu"], lb["xid"], lb["meaning"]): s.value
        for s in samples
        if s.name == "gpu_xid_errors_total"
        for lb in [s.labels]
    }
    assert xids[("0", "79", "GPU has fallen off the bus")] == 1  # PCI id mapped to index 0
    assert xids[("0", "13", "Graphics engine exception")] == 1
    assert xids[("0000:af:00", "31", "GPU memory page fault")] == 1  # unmapped: PCI id kept
    assert xids[("0000:03:00", "43", "GPU stopped processing (channel reset)")] == 1
    assert {s.labels["backend"] for s in samples if s.name == "gpu_xid_errors_total"} == {
        "kernel_log"
    }
    ooms = _values(samples, "kernel_oom_kills_total")
    assert ooms == {(("process", "python"),): 2, (("process", "uvicorn"),): 1}
    assert _values(samples, "kernel_hung_tasks_total") == {(): 1}
    io = _values(samples, "kernel_io_errors_total")
    assert io == {(("device", "sda"),): 1, (("device", "nvme0n1"),): 1, (("device", "sda1"),): 1}
    # The line that is not a kernel record is counted as an error; the rest went on.
    errors = _values(samples, "aivitals_collector_errors_total")
    assert errors == {(("collector", "kernel"), ("reason", "malformed")): 1}
    assert _values(samples, "aivitals_collector_up") == {(("collector", "kernel"),): 1}


def test_events_carry_time_kind_text_fields(tmp_path: Path) -> None:
    collector, _ = _collector(tmp_path)
    list(collector.collect())
    events = collector.drain_events()
    assert {e.kind for e in events} == {"kernel"}
    kinds = [e.fields["rule"] for e in events]
    assert kinds.count("xid") == 4 and kinds.count("oom") == 3 and kinds.count("hung_task") == 1
    first = events[0]
    assert first.fields["xid"] == "79" and first.fields["pid"] == "1234"
    assert first.fields["name"] == "python" and first.fields["gpu"] == "0"
    assert "fallen off the bus" in first.text
    assert events[1].time - first.time == pytest.approx(1.0)  # kmsg microsecond stamps
    assert collector.drain_events() == []


def test_nothing_is_counted_twice(tmp_path: Path) -> None:
    collector, log = _collector(tmp_path)
    list(collector.collect())
    list(collector.collect())  # nothing new
    with log.open("a") as f:
        # A record the cursor has passed (a re-read of the buffer) and a new one.
        f.write("4,1002,61000000,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, x\n")
        f.write("4,1020,99000000,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=99, name=python, again\n")
    samples = list(collector.collect())
    xids = {
        s.labels["xid"]: s.value
        for s in samples
        if s.name == "gpu_xid_errors_total" and s.labels["gpu"] == "0"
    }
    assert xids["79"] == 2


def test_partial_record_waits_for_its_end(tmp_path: Path) -> None:
    collector, log = _collector(tmp_path, "4,1,1000,-;NVRM: Xid (PCI:0000:3b:00): 4")
    list(collector.collect())
    with log.open("a") as f:
        f.write("8, pid=1, name=python, Double Bit ECC Error\n")
    samples = list(collector.collect())
    assert [s.labels["xid"] for s in samples if s.name == "gpu_xid_errors_total"] == ["48"]


@pytest.mark.parametrize(
    ("line", "kind", "field", "value"),
    [
        ("NVRM: Xid (PCI:0000:3B:00): 94, pid=7, name=x, Contained", "xid", "pci", "0000:3b:00"),
        ("NVRM: Xid (PCI:0000:3b:00): 999, pid=7, name=x", "xid", "meaning", "unknown"),
        (
            "NVRM: Xid (PCI:0000:3b:00): 119, pid='<unknown>', name=<unknown>, Timeout",
            "xid",
            "xid",
            "119",
        ),
        ("Out of memory: Killed process 12 (my app) total-vm:1kB", "oom", "process", "my app"),
        ("INFO: task python3:77 blocked for more than 600 seconds.", "hung_task", "seconds", "600"),
        ("critical medium error, dev sdb, sector 1 op 0x0:(READ)", "io_error", "device", "sdb"),
        ("NVRM: Xid (PCI:): , broken", "other", None, None),
        ("Out of memory: Killed process (python)", "other", None, None),
        ("\x00\x01 binary junk \ufffd", "other", None, None),
        ("", "other", None, None),
    ],
)
def test_classify_line_odd_formats(line: str, kind: str, field: str | None, value: str) -> None:
    got_kind, fields = classify_line(line)
    assert got_kind == kind
    if field is not None:
        assert fields[field] == value


def test_unreadable_kernel_log_is_down_not_raised(tmp_path: Path) -> None:
    source = KmsgSource(str(tmp_path / "missing"), from_start=True)
    collector = KernelLogCollector(source)
    samples = list(collector.collect())
    assert _values(samples, "aivitals_collector_up") == {(("collector", "kernel"),): 0}
    assert sum(_values(samples, "aivitals_collector_errors_total").values()) == 1
    # Left alone for a while, still reported down, without touching the source.
    (tmp_path / "missing").write_text("4,1,1,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1\n")
    samples = list(collector.collect())
    assert _values(samples, "aivitals_collector_up") == {(("collector", "kernel"),): 0}
    collector._retry_at = 0.0  # the retry time has come
    samples = list(collector.collect())
    assert _values(samples, "aivitals_collector_up") == {(("collector", "kernel"),): 1}
    assert _values(samples, "kernel_log_lines_total")[(("kind", "xid"),)] == 1


DMESG = """[   61.000000] NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU off the bus.
[   70.000000] Out of memory: Killed process 4321 (python) total-vm:35165044kB
[   70.000000] oom_reaper: reaped process 4321 (python), now anon-rss:0kB
dmesg: read kernel buffer failed: Operation not permitted
"""


def test_dmesg_source_with_cursor() -> None:
    outputs = [DMESG, DMESG + "[   80.500000] INFO: task a:1 blocked for more than 120 seconds.\n"]
    source = DmesgSource(runner=lambda: outputs.pop(0), from_start=True)
    collector = KernelLogCollector(source)
    first = list(collector.collect())
    assert _values(first, "kernel_log_lines_total")[(("kind", "oom"),)] == 1
    assert _values(first, "kernel_log_lines_total")[(("kind", "other"),)] == 1
    second = list(collector.collect())  # the same lines again plus one: only the new one counts
    lines = _values(second, "kernel_log_lines_total")
    assert lines[(("kind", "xid"),)] == 1 and lines[(("kind", "hung_task"),)] == 1
    assert lines[(("kind", "oom"),)] == 1 and lines[(("kind", "other"),)] == 1
    errors = _values(second, "aivitals_collector_errors_total")
    assert errors[(("collector", "kernel"), ("reason", "malformed"))] == 2  # the dmesg complaint


def test_dmesg_without_history_skips_what_was_there() -> None:
    outputs = [DMESG, DMESG + "[   81.000000] INFO: task a:1 blocked for more than 120 seconds.\n"]
    collector = KernelLogCollector(DmesgSource(runner=lambda: outputs.pop(0)))
    list(collector.collect())
    lines = _values(list(collector.collect()), "kernel_log_lines_total")
    assert lines[(("kind", "hung_task"),)] == 1 and lines[(("kind", "xid"),)] == 0
