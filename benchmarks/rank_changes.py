"""rank_changes: accuracy on the recorded H200 run, and speed on ~5,800 series.

- recorded_top1 / recorded_top3: over the REAL H200 fault recording
  (``tests/fixtures/gpu/h200/scenarios.csv``, every column a gauge), each fault
  phase against a fault-free phase before it (7 cases, the test's ``CASES``):
  share where an expected metric (the test's ``EXPECTED``) ranks first / in the
  first three;
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


def main() -> None:
    top1, top3, rows = recorded()
    print("recorded H200 run (real), fault phase vs a fault-free phase before it")
    print(f"{'fault':<12} {'baseline':<10} top 3")
    for fault, normal, names in rows:
        print(f"{fault:<12} {normal:<10} {', '.join(names)}")
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
        "rank_s": round(rank_s, 3),
        "series": n_series,
        "queries": res.queries,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "rank_changes.json").write_text(json.dumps(out, indent=2) + "\n")
    print("RESULT " + " ".join(f"{k}={v}" for k, v in out.items()))


if __name__ == "__main__":
    main()
