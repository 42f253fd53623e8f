"""NAB: the diagnosis detector (aivitals.diagnose.StreamingDetector) over the
Numenta Anomaly Benchmark, scored as NAB's own scorer does (probation, sigmoid
position weights, one corpus-wide threshold per profile; see
``aivitals.diagnose._nab``).

One detector configuration for every file (the only per-file input is the
daily period in rows, derived from the file's own timestamps). Prints the
standard, low-FP and low-FN scores beside NAB's published scoreboard, writes
every row's score to benchmarks/results/nab/<group>/<name>.csv and the
figures to benchmarks/results/nab.json.

    git clone https://github.com/numenta/NAB /path/to/NAB
    .venv/bin/python benchmarks/nab.py --nab-dir /path/to/NAB   # or NAB_DIR=/path/to/NAB

NAB is AGPL-3.0, so it is never copied into this (Apache-2.0) repository: the
benchmark reads a clone of numenta/NAB from wherever it lies (its ``data/`` and
``labels/combined_windows.json``). No test needs it.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import time
from datetime import datetime
from pathlib import Path

import numpy as np

from aivitals.diagnose import DetectorConfig, StreamingDetector
from aivitals.diagnose._nab import PROFILES, NabFile, score_corpus

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"

# From the NAB README (standard profile).
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


HOW_TO_GET = (
    "NAB is not part of this repository (it is AGPL-3.0): clone it with "
    "`git clone https://github.com/numenta/NAB` and pass --nab-dir PATH or set NAB_DIR=PATH"
)


def nab_dir(argv: list[str] | None = None) -> Path:
    """The NAB clone from ``--nab-dir`` or ``$NAB_DIR``; exits with how to get it when missing."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--nab-dir",
        type=Path,
        default=os.environ.get("NAB_DIR") or None,
        help="a clone of https://github.com/numenta/NAB (default: $NAB_DIR)",
    )
    args = parser.parse_args(argv)
    if args.nab_dir is None:
        parser.error(f"no NAB directory given. {HOW_TO_GET}")
    nab = Path(args.nab_dir).expanduser()
    labels = nab / "labels" / "combined_windows.json"
    if not (labels.is_file() and (nab / "data").is_dir()):
        parser.error(
            f"{nab} is not a NAB clone (no data/ and labels/combined_windows.json). {HOW_TO_GET}"
        )
    return nab


def main(argv: list[str] | None = None) -> int:
    nab = nab_dir(argv)
    labels = json.loads((nab / "labels" / "combined_windows.json").read_text())
    files: list[NabFile] = []
    t0 = time.perf_counter()
    for key in sorted(labels):
        stamps, times, values = load(nab / "data" / key)
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
