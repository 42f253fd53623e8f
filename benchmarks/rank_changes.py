"""rank_changes: accuracy on the recorded H200 run, and speed on ~5,800 series.

- recorded_top1 / recorded_top3: over the REAL H200 fault recording
  (``tests/fixtures/gpu/h200/scenarios.csv``, every column a gauge), each fault
  phase against a fault-free phase before it (7 cases, the test's ``CASES``):
  share where an expected metric (the test's ``EXPECTED``) ranks first / in the
  first three;
- live_top3 / live_layer: five faults made for real on this machine by a child
  process (a thread leak, a memory leak, a descriptor leak, a CPU-bound loop, a
  disk being filled with fsynced writes), read every 0.5 s by the real host and
  process collectors, 12 s before and 12 s during; share with an expected
  metric in the top 3 / with the expected top layer (``LIVE``). ``--no-live``
  skips them (about two minutes; they load the machine a little);
- rank_s: seconds to rank ~5,800 stored series (250 families x 10 label sets: gauges, counters
  and 4-bucket histograms mixed) over a 20 min baseline and a 10 min incident at 5 s,
  on the embedded store (median of 3); queries: the range queries it sent.

    .venv/bin/python benchmarks/rank_changes.py

The machine is shared: the timing is noisy; the accuracy figures are not.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.diagnose.test_rank import CASES, EXPECTED, INC, T0, _h200, _times  # noqa: E402

from aivitals.diagnose import rank_changes  # noqa: E402
from aivitals.tsdb import Store  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"

#: A process that idles through the baseline, then does one thing wrong until killed.
CHILD = r"""
import os, sys, tempfile, threading, time
mode, start = sys.argv[1], float(sys.argv[2])
hold = []
while time.time() < start:
    time.sleep(0.02)
if mode == "disk":
    f = tempfile.TemporaryFile(dir=sys.argv[3])
while True:
    if mode == "threads":  # a thread leak: 20 parked threads a second
        t = threading.Thread(target=time.sleep, args=(3600,), daemon=True)
        t.start()
        hold.append(t)
        time.sleep(0.05)
    elif mode == "memory":  # a memory leak: 20 MB a second, touched
        hold.append(bytearray(b"x" * 2 * 2**20))
        time.sleep(0.1)
    elif mode == "fds":  # a descriptor leak: 50 a second
        hold.append(open(os.devnull))
        time.sleep(0.02)
    elif mode == "cpu":  # a CPU-bound step in the request path
        sum(i * i for i in range(20000))
    elif mode == "disk":  # a log filling the disk: 1 MB fsynced every 50 ms
        f.write(b"x" * 2**20)
        f.flush()
        os.fsync(f.fileno())
        time.sleep(0.05)
"""
#: Live fault -> (the metrics that show it, the layer they should name).
LIVE = {
    "threads": ({"service_process_threads"}, "service"),
    "memory": ({"service_process_resident_memory_bytes", "host_memory_available_bytes"}, None),
    "fds": ({"service_process_open_fds"}, "service"),
    "cpu": ({"service_process_cpu_seconds_total", "host_cpu_seconds_total"}, None),
    "disk": (
        {
            "host_disk_writes_completed_total",
            "host_disk_write_time_seconds_total",
            "host_disk_io_time_seconds_total",
        },
        "infrastructure",
    ),
}


def recorded() -> tuple[float, float, list[tuple[str, str, list[str]]]]:
    store, phases = _h200()
    rows = []
    top1 = top3 = 0
    for fault, normal in CASES:
        res = rank_changes(store, baseline=phases[normal], incident=phases[fault], step=0.5)
        names = [c.metric for c in res.changes[:3]]
        top1 += bool(names[:1] and names[0] in EXPECTED[fault])
        top3 += bool(EXPECTED[fault] & set(names))
        rows.append((fault, normal, names))
    return top1 / len(CASES), top3 / len(CASES), rows


def live(phase_s: float = 12.0, every: float = 0.5) -> list[tuple[str, list[str], bool, bool]]:
    """Real faults in a child process on this machine, read by the real collectors.

    Rows: the fault, its top 3 (metric and layer), whether an expected metric is
    among them, whether the top layer is the expected one (True where either fits).
    """
    import subprocess
    import tempfile

    from aivitals.collect import HostCollector, ProcessCollector

    rows = []
    for mode, (expected, layer) in LIVE.items():
        store = Store(retention=1e7)
        start = time.time() + phase_s + 1.0
        with tempfile.TemporaryDirectory(prefix="aivitals-rank-") as tmp:
            child = subprocess.Popen([sys.executable, "-c", CHILD, mode, str(start), tmp])
            try:
                collectors = [HostCollector(), ProcessCollector(pid=child.pid)]
                t0 = time.time()
                end = start + phase_s
                while (now := time.time()) < end:
                    for c in collectors:
                        store.append_samples(c.collect(), default_timestamp=now)
                    time.sleep(max(0.0, every - (time.time() - now)))
            finally:
                child.kill()
                child.wait(10)
        res = rank_changes(
            store, baseline=(t0, start - every), incident=(start + every, end), step=every
        )
        top3 = res.changes[:3]
        hit = bool(expected & {c.metric for c in top3})
        layer_ok = layer is None or res.top_layer == layer
        rows.append((mode, [f"{c.metric} ({c.layer})" for c in top3], hit, layer_ok))
    return rows


def big_store(families: int = 250, per: int = 10) -> Store:
    rng = np.random.default_rng(0)
    t = _times()
    after = t >= INC[0]
    store = Store(retention=1e7)
    for f in range(families):
        kind = f % 3
        for s in range(per):
            labels = {"instance": f"i{s}"}
            if kind == 0:  # gauge
                values = 100 * (1 + 0.05 * rng.standard_normal(len(t)))
                store_name = f"level_{f}"
            elif kind == 1:  # counter
                values = np.cumsum(rng.poisson(50, len(t))).astype(float)
                store_name = f"events_{f}_total"
            else:  # a histogram with 4 buckets counts as 4 + 1 series
                store_name = f"wait_{f}_seconds_bucket"
                values = np.empty(0)
            if kind < 2:
                for ts, v in zip(t, values, strict=True):
                    store.append(store_name, labels, float(v), float(ts))
                continue
            cum = np.zeros(4)
            for ts, late in zip(t, after, strict=True):
                lat = rng.exponential(0.3 if late and f == 2 and s == 0 else 0.1, 20)
                cum += [np.count_nonzero(lat <= le) for le in (0.1, 0.25, 1.0, np.inf)]
                for le, c in zip(("0.1", "0.25", "1", "+Inf"), cum, strict=True):
                    store.append(store_name, {**labels, "le": le}, float(c), float(ts))
                store.append(f"wait_{f}_seconds_count", labels, float(cum[-1]), float(ts))
    return store


def _share(hits: list[bool]) -> float | None:
    return round(sum(hits) / len(hits), 3) if hits else None


def main() -> None:
    top1, top3, rows = recorded()
    print("recorded H200 run (real), fault phase vs a fault-free phase before it")
    print(f"{'fault':<12} {'baseline':<10} top 3")
    for fault, normal, names in rows:
        print(f"{fault:<12} {normal:<10} {', '.join(names)}")
    live_rows = [] if "--no-live" in sys.argv else live()
    if live_rows:
        print("\nlive faults on this machine (real collectors, shared and noisy)")
        print(f"{'fault':<12} {'top3':<5} {'layer':<6} top 3")
        for mode, names, hit, layer_ok in live_rows:
            yes = {True: "yes", False: "NO"}
            print(f"{mode:<12} {yes[hit]:<5} {yes[layer_ok]:<6} {', '.join(names)}")
    store = big_store()
    n_series = store.series_count
    times, res = [], None
    for _ in range(3):
        t0 = time.perf_counter()
        res = rank_changes(store, baseline=(T0, INC[0] - 5), incident=INC, step=5.0)
        times.append(time.perf_counter() - t0)
    assert res is not None
    rank_s = statistics.median(times)
    print(
        f"\n{n_series} stored series, {res.families} families, {res.series} scored: "
        f"{rank_s:.2f} s (median of 3), {res.queries} queries; top: "
        f"{res.changes[0].series if res.changes else '-'}"
    )
    out = {
        "recorded_top1": round(top1, 3),
        "recorded_top3": round(top3, 3),
        "recorded_cases": len(rows),
        "live_top3": _share([r[2] for r in live_rows]),
        "live_layer": _share([r[3] for r in live_rows]),
        "live_cases": len(live_rows),
        "rank_s": round(rank_s, 3),
        "series": n_series,
        "queries": res.queries,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "rank_changes.json").write_text(json.dumps(out, indent=2) + "\n")
    print("RESULT " + " ".join(f"{k}={v}" for k, v in out.items()))


if __name__ == "__main__":
    main()
