"""NAB: the diagnosis detector (aivitals.diagnose.StreamingDetector) over the
Numenta Anomaly Benchmark, scored as ../shared/datasets/nab/SCORING.md says.

One detector configuration for every file (the only per-file input is the
daily period in rows, derived from the file's own timestamps). Prints the
standard, low-FP and low-FN scores beside NAB's published scoreboard, writes
every row's score to benchmarks/results/nab/<group>/<name>.csv and the
figures to benchmarks/results/nab.json.

    .venv/bin/python benchmarks/nab.py
"""

from __future__ import annotations

import csv
import json
import sys
import time
from datetime import datetime
from pathlib import Path

import numpy as np

from aivitals.diagnose import DetectorConfig, StreamingDetector
from aivitals.diagnose._nab import PROFILES, NabFile, score_corpus

ROOT = Path(__file__).resolve().parent.parent
NAB = ROOT.parent / "shared" / "datasets" / "nab"
RESULTS = ROOT / "benchmarks" / "results"

# From the NAB README (standard profile), as quoted in datasets/README.md.
SCOREBOARD = [
    ("ARTime", 74.9),
    ("Numenta HTM", 70.5),
    ("CAD OSE", 69.9),
    ("earthgecko Skyline", 58.2),
    ("KNN CAD", 58.0),
    ("Relative Entropy", 54.6),
    ("Random Cut Forest", 51.7),
    ("Twitter ADVec", 47.1),
    ("Windowed Gaussian", 39.6),
    ("random", 11.0),
]

# One configuration for the whole corpus, chosen in the open on this corpus (see
# docs/diagnose.md); the same method as the diagnosis, reporting each episode's rise.
CONFIG = DetectorConfig(
    novelty=True,
    novelty_decay=0.999,
    novelty_log=True,
    cusum_h=60.0,
    spike_z=6.0,
    shift_z=4.5,
    alpha=0.005,
    alpha_scale=0.003,
    rel_floor=0.01,
    range_breach=0.05,
)


def _parse(ts: str) -> float:
    return datetime.strptime(ts, "%Y-%m-%d %H:%M:%S").timestamp()


def load(path: Path) -> tuple[list[str], np.ndarray, np.ndarray]:
    with path.open() as fh:
        rows = list(csv.DictReader(fh))
    stamps = [r["timestamp"] for r in rows]
    times = np.array([_parse(s) for s in stamps])
    values = np.array([float(r["value"]) for r in rows])
    return stamps, times, values


def windows_as_rows(times: np.ndarray, windows: list[list[str]]) -> list[tuple[int, int]]:
    out = []
    for start, end in windows:
        t0, t1 = _parse(start[:19]), _parse(end[:19])
        idx = np.flatnonzero((times >= t0) & (times <= t1))
        if idx.size:
            out.append((int(idx[0]), int(idx[-1])))
    return out


def daily_season(times: np.ndarray) -> int:
    step = float(np.median(np.diff(times))) if len(times) > 1 else 0.0
    if step <= 0:
        return 0
    rows = round(86400.0 / step)
    # a season needs a few repetitions in the file to be learnt from
    return rows if 3 * rows < len(times) else 0


def run_file(times: np.ndarray, values: np.ndarray) -> np.ndarray:
    cfg = DetectorConfig(**{**_fields(CONFIG), "season": daily_season(times)})
    det = StreamingDetector(1, cfg)
    return np.array([float(det.update([v])[0]) for v in values])


def _fields(cfg: DetectorConfig) -> dict[str, object]:
    return {k: getattr(cfg, k) for k in cfg.__dataclass_fields__}


def main() -> int:
    if not NAB.is_dir():
        print(f"NAB data not found at {NAB}", file=sys.stderr)
        return 2
    labels = json.loads((NAB / "labels" / "combined_windows.json").read_text())
    files: list[NabFile] = []
    t0 = time.perf_counter()
    for key in sorted(labels):
        stamps, times, values = load(NAB / "data" / key)
        scores = run_file(times, values)
        files.append(NabFile(scores, windows_as_rows(times, labels[key])))
        write_scores(key, stamps, values, scores)
    elapsed = time.perf_counter() - t0
    results = {p.name: score_corpus(files, p) for p in PROFILES}
    std = results["standard"]
    print(f"NAB: {len(files)} files, {sum(len(f.windows) for f in files)} windows, {elapsed:.1f} s")
    print(f"{'detector':<24}{'standard':>10}{'low_FP':>10}{'low_FN':>10}")
    row = [results[p.name].normalized for p in PROFILES]
    print(f"{'aivitals (this run)':<24}{row[0]:>10.1f}{row[1]:>10.1f}{row[2]:>10.1f}")
    for name, value in SCOREBOARD:
        print(f"{name:<24}{value:>10.1f}")
    figures = {
        "standard": round(row[0], 2),
        "low_fp": round(row[1], 2),
        "low_fn": round(row[2], 2),
        "threshold_standard": round(std.threshold, 4),
        "files": len(files),
        "seconds": round(elapsed, 1),
        "target_standard": 55.0,
        "config": {k: v for k, v in _fields(CONFIG).items() if k != "season"},
        "season": "daily, in rows, from each file's median step (0 when < 3 days)",
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "nab.json").write_text(json.dumps(figures, indent=2) + "\n")
    print(f"RESULT standard={row[0]:.2f} low_fp={row[1]:.2f} low_fn={row[2]:.2f}")
    return 0


def write_scores(key: str, stamps: list[str], values: np.ndarray, scores: np.ndarray) -> None:
    out = RESULTS / "nab" / key
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["timestamp", "value", "anomaly_score"])
        for s, v, a in zip(stamps, values, scores, strict=True):
            w.writerow([s, repr(float(v)), f"{a:.6f}"])


if __name__ == "__main__":
    sys.exit(main())
