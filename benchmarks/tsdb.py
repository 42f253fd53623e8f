"""Benchmark of the embedded store: scrape ingest, the alert query, memory per sample,
and the same query answered by a real Prometheus over HTTP on the same data.

Run: ``.venv/bin/python benchmarks/tsdb.py``. Prints a table, ends with one
``RESULT`` line and writes ``benchmarks/results/tsdb.json``. Timings are
medians; the machine may be shared, so expect noise (ratios are measured in
the same run to cancel most of it).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "src"))

from aivitals.tsdb import Store  # noqa: E402

T0 = 1_700_000_000
QUERY = "histogram_quantile(0.99, sum by (le) (rate(x_bucket[5m])))"
LES = ("0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1", "2.5", "+Inf")
PODS = 10  # 10 pods x 10 buckets = 100 label sets of x_bucket


def scrape_text(n: int) -> str:
    lines = ["# HELP http_requests_total Requests.", "# TYPE http_requests_total counter"]
    for i in range(n):
        lines.append(
            f'http_requests_total{{method="GET",path="/api/v{i % 50}",'
            f'pod="pod-{i // 50}",code="200"}} {i * 1.5}'
        )
    return "\n".join(lines) + "\n"


def bench_ingest() -> dict[str, float]:
    text = scrape_text(10_000)
    store = Store()
    t = time.perf_counter()
    store.ingest_exposition(text, timestamp=T0, target="bench")
    cold = (time.perf_counter() - t) * 1000
    times = []
    for k in range(1, 21):
        t = time.perf_counter()
        stats = store.ingest_exposition(text, timestamp=T0 + 15 * k, target="bench")
        times.append((time.perf_counter() - t) * 1000)
        assert stats.appended == 10_000
    return {"ingest_10k_ms": statistics.median(times), "ingest_10k_cold_ms": cold}


def histogram_rows() -> list[tuple[tuple[tuple[str, str], ...], np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(1)
    ts = np.arange(T0 * 1000, (T0 + 3600) * 1000, 1000, dtype=np.int64)
    rows = []
    for pod in range(PODS):
        per_step = rng.poisson(20, (len(ts), len(LES))).cumsum(axis=1)  # cumulative buckets
        counts = per_step.cumsum(axis=0).astype(np.float64)
        for j, le in enumerate(LES):
            labels = (("__name__", "x_bucket"), ("le", le), ("pod", f"p{pod}"))
            rows.append((labels, ts, counts[:, j].copy()))
    return rows


def bench_query(rows: list) -> tuple[float, float]:
    store = Store(retention=7200)
    for labels, ts, vals in rows:
        series = store._get_or_create(labels)
        assert series is not None
        series.ts.frombytes(ts.tobytes())
        series.vals.frombytes(vals.tobytes())
    at = T0 + 3599
    answer = store.query(QUERY, at).values()[0]
    times = []
    for _ in range(30):
        t = time.perf_counter()
        store.query(QUERY, at)
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times), answer


def bench_many_series() -> dict[str, float]:
    """Instant queries over 10,000 series with 10 minutes of 1 s data (extra figures)."""
    store = Store(retention=7200)
    ts = np.arange(T0 * 1000, (T0 + 600) * 1000, 1000, dtype=np.int64)
    values = np.arange(len(ts), dtype=np.float64)
    for i in range(10_000):
        labels = (("__name__", "m_total"), ("i", str(i)), ("job", f"j{i % 10}"))
        series = store._get_or_create(labels)
        assert series is not None
        series.ts.frombytes(ts.tobytes())
        series.vals.frombytes(values.tobytes())
    out = {}
    for key, expr in (
        ("selector_10k_series_ms", "m_total"),
        ("rate_10k_series_ms", "rate(m_total[5m])"),
        ("sum_rate_10k_series_ms", "sum by (job) (rate(m_total[5m]))"),
    ):
        times = []
        for _ in range(5):
            t = time.perf_counter()
            store.query(expr, T0 + 599)
            times.append((time.perf_counter() - t) * 1000)
        out[key] = statistics.median(times)
    return out


def bench_prometheus(rows: list) -> tuple[float | None, float | None]:
    from tests._servers import prometheus, promtool

    with tempfile.TemporaryDirectory(prefix="aivitals-bench-") as tmp:
        om = Path(tmp) / "data.om"
        with om.open("w") as f:
            f.write("# TYPE x_bucket gauge\n")
            for labels, ts, vals in rows:
                key = ",".join(f'{k}="{v}"' for k, v in labels[1:])
                f.writelines(
                    f"x_bucket{{{key}}} {v!r} {t // 1000}\n"
                    for t, v in zip(ts.tolist(), vals.tolist(), strict=True)
                )
            f.write("# EOF\n")
        blocks = Path(tmp) / "data"
        done = promtool("tsdb", "create-blocks-from", "openmetrics", str(om), str(blocks))
        if done.returncode != 0:
            raise RuntimeError(done.stderr)
        with prometheus(data_dir=blocks) as server, httpx.Client() as client:
            params = {"query": QUERY, "time": str(T0 + 3599)}
            url = f"{server.url}/api/v1/query"
            for _ in range(100):
                body = client.get(url, params=params).json()
                if body["data"]["result"]:
                    break
                time.sleep(0.1)
            answer = float(body["data"]["result"][0]["value"][1])
            times = []
            for _ in range(30):
                t = time.perf_counter()
                client.get(url, params=params).raise_for_status()
                times.append((time.perf_counter() - t) * 1000)
            return statistics.median(times), answer


MEMORY_CHILD = """
import sys, time
sys.path.insert(0, {src!r})
from aivitals.tsdb import Store
def rss():
    with open('/proc/self/statm') as f:
        return int(f.read().split()[1]) * 4096
series, scrapes = 10_000, 1_000
text = ''.join(f'm{{{{i="{{i}}"}}}} {{i}}.5\\n' for i in range(series))
store = Store(retention=10**9, max_series=series)
store.ingest_exposition(text, timestamp=1e9, target='t')
before = rss()
for k in range(1, scrapes):
    store.ingest_exposition(text, timestamp=1e9 + 15 * k, target='t')
after = rss()
samples = store.stats()['samples'] - series
print((after - before) / samples, store.stats()['samples'])
"""


def bench_memory() -> tuple[float, int]:
    code = MEMORY_CHILD.format(src=str(ROOT / "src"))
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=900, check=True
    )
    per_sample, total = out.stdout.split()
    return float(per_sample), int(total)


def main() -> None:
    results: dict[str, float | None] = {"load_average_1m_at_start": os.getloadavg()[0]}
    results.update(bench_ingest())
    rows = histogram_rows()
    results["query_ms"], ours = bench_query(rows)
    try:
        prom_ms, theirs = bench_prometheus(rows)
    except Exception as exc:  # report it; the other figures still stand
        print(f"Prometheus comparison failed: {exc}", file=sys.stderr)
        prom_ms, theirs = None, None
    results["prometheus_query_ms"] = prom_ms
    results["query_ratio_vs_prometheus"] = (
        results["query_ms"] / prom_ms if prom_ms else None  # type: ignore[operator]
    )
    results.update(bench_many_series())
    results["bytes_per_sample"], total = bench_memory()
    results["memory_samples"] = total
    targets = {"ingest_10k_ms": "< 50", "query_ms": "< 20", "bytes_per_sample": "<= 20"}
    print(f"{'figure':32} {'value':>12}  target")
    for key, value in results.items():
        shown = "n/a" if value is None else f"{value:12.3f}"
        print(f"{key:32} {shown:>12}  {targets.get(key, '')}")
    print(f"answers: ours {ours!r}, prometheus {theirs!r} (must agree)")
    print(
        "note: timings are medians on a shared 2-core machine (load average "
        f"{os.getloadavg()[0]:.1f} at the end); expect noise"
    )
    keys = ("ingest_10k_ms", "query_ms", "bytes_per_sample", "query_ratio_vs_prometheus")
    line = " ".join(
        f"{k}={'nan' if results[k] is None else round(results[k], 3)}"  # type: ignore[arg-type]
        for k in keys
    )
    out = ROOT / "benchmarks" / "results" / "tsdb.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"benchmark": "tsdb", **results}, indent=2) + "\n")
    print(f"RESULT {line}")


if __name__ == "__main__":
    main()
