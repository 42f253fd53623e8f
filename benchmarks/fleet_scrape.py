"""Benchmark: a SIMULATED fleet of 1,000 nodes x 8 GPUs, really scraped every 15 s.

One light process (``python -m aivitals.fleet._expose``, asyncio) serves every node's
exposition: ``/node/<i>/agent/metrics`` (the GPU families, shaped by the H200
recording in ``tests/fixtures/gpu/h200/scenarios.csv``, each GPU from its own offset,
and the host, process, kernel-log and collector families a real agent exports, at
steady simulated levels) and ``/node/<i>/service/metrics`` (request counters, a
latency histogram, Redis lookups, each node at its own rate and latency), values
advancing one recorded row per 15 s of wall time. After ``--warmup`` seconds one GPU
of one node (picked by the seed) follows the recording's ``leak`` phase (2 GB a row,
so 2 GB every 15 s). Two file_sd files list the 2,000 targets (``__metrics_path__``,
``node="sim-node-<i>"``).

Then, at the same time:

- a real Prometheus scrapes every target every 15 s and evaluates the shipped rule
  pack (its real windows; the alerts' firing is reported, not targeted);
- a real vmagent scrapes the same targets into a real VictoriaMetrics, and vmalert
  evaluates the same pack against it every 15 s.

After ``--duration`` seconds (default 600: the warm-up gives the diagnosis 20 steps of
baseline, the rest 18 steps of leak, still growing at the end; the leak signature
needs a minute of it) the node-aware ``aivitals.diagnose.diagnose`` runs against each
backend over the run (step 15 s), timed ``--repeat`` times (median kept).

Measured: series per scrape round (``sum(scrape_samples_scraped)`` on each backend),
each process's CPU over the scraping (utime + stime from ``/proc/<pid>/stat``, in % of
one core: Prometheus, vmagent, VictoriaMetrics, the exposition server), rule
evaluation time (Prometheus: ``prometheus_rule_group_last_duration_seconds`` summed
over the groups, averaged over samples every 15 s; vmalert: each group's mean
``vmalert_iteration_duration_seconds``, summed), the diagnosis time and queries, and
whether the faulty node's leak is named first. One ``RESULT`` line per backend::

    RESULT nodes=1000 series=... scrape_cpu_pct=... rules_eval_s=... diagnose_s=...
        named_faulty_node=... backend=prometheus queries=... expose_cpu_pct=...

``scrape_cpu_pct`` is the scraper's CPU (Prometheus, whose CPU also covers its rule
evaluation and storage; or vmagent alone, VictoriaMetrics' ingestion reported apart
as ``storage_cpu_pct``). Nothing here ran on 1,000 machines, and the machine (2 cores)
is shared with other work: CPU figures and times are noisy.

    .venv/bin/python benchmarks/fleet.py --scrape [--nodes 1000] [--duration 600]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from aivitals.alerts import default_pack  # noqa: E402
from aivitals.diagnose import diagnose  # noqa: E402
from aivitals.fleet._fleet import vmalert_rules  # noqa: E402
from aivitals.tsdb import PrometheusBackend  # noqa: E402
from fleet import free_port, wait_http  # noqa: E402  (the import benchmark's helpers)

RECORDING = ROOT / "tests" / "fixtures" / "gpu" / "h200" / "scenarios.csv"
RESULT = ROOT / "benchmarks" / "results" / "fleet.json"
TARGET_S = 10.0
STEP = 15.0
CLK_TCK = os.sysconf("SC_CLK_TCK")


def _head() -> str:
    """The commit measured (with "+dirty" when the work tree differs from it)."""
    try:
        rev = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
        ).stdout.strip()
    except OSError:
        return "not recorded"
    return (rev or "not recorded") + ("+dirty" if rev and dirty else "")


def start(
    argv: Sequence[str], log: Path, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            list(argv), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env
        )


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


def cpu_s(pid: int) -> float:
    """utime + stime of ``pid`` (all its threads), seconds."""
    text = Path(f"/proc/{pid}/stat").read_text()
    fields = text[text.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def scalar(url: str, query: str) -> float:
    with PrometheusBackend(url, timeout=60.0) as b:
        got = b.query(query, time.time()).values()
    return float(got[0]) if got else float("nan")


_PROM_GROUP = re.compile(r"^prometheus_rule_group_last_duration_seconds\{[^}]*\} (\S+)$", re.M)
_VMALERT = re.compile(
    r'^vmalert_iteration_duration_seconds_(sum|count)\{group="([^"]+)"[^}]*\} (\S+)$', re.M
)


def prom_rules_s(prom: str) -> float | None:
    """The sum over the pack's groups of the last evaluation's duration (None: none yet)."""
    values = [float(v) for v in _PROM_GROUP.findall(httpx.get(f"{prom}/metrics", timeout=10).text)]
    return sum(values) if values and all(v > 0 for v in values) else None


def vmalert_rules_s(vmalert: str) -> tuple[float, int]:
    """(sum of groups' mean iteration s, evaluations of the least evaluated group)."""
    text = httpx.get(f"{vmalert}/metrics", timeout=10).text
    sums: dict[str, float] = {}
    counts: dict[str, float] = {}
    for kind, group, value in _VMALERT.findall(text):
        (sums if kind == "sum" else counts)[group] = float(value)
    means = [sums[g] / counts[g] for g in counts if counts[g] > 0]
    return sum(means), int(min(counts.values(), default=0))


def count(value: float) -> int | None:
    """A count for the JSON file: None where the engine had no answer (NaN)."""
    return None if math.isnan(value) else int(value)


def own_metric(url: str, name: str) -> float:
    """An unlabelled metric from a process's own ``/metrics`` (NaN when absent)."""
    m = re.search(rf"^{name} (\S+)$", httpx.get(f"{url}/metrics", timeout=10).text, re.M)
    return float(m.group(1)) if m else float("nan")


def firing(url: str) -> list[str]:
    """``alertname@node`` of the alerts firing on a Prometheus-API alerts endpoint."""
    try:
        data = httpx.get(f"{url}/api/v1/alerts", timeout=10).json()
    except (httpx.HTTPError, ValueError):
        return ["(alerts unreadable)"]
    alerts = data.get("data", {}).get("alerts", []) or []
    return sorted(
        {
            f"{a['labels'].get('alertname')}@{a['labels'].get('node', '-')}"
            for a in alerts
            if a.get("state") == "firing"
        }
    )


class _TimedBackend(PrometheusBackend):
    """Times every request, so the report can name the queries the diagnosis waits on."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.took: list[tuple[float, str]] = []

    def _send(self, method: str, path: str, params: dict[str, str] | None) -> Any:
        t0 = time.perf_counter()
        try:
            return super()._send(method, path, params)
        finally:
            what = (params or {}).get("query") or (params or {}).get("match[]") or path
            self.took.append((time.perf_counter() - t0, f"{path} {what}"))


def run_diagnosis(
    url: str, dialect: str, end: float, window: float, repeat: int, workers: int
) -> tuple[float, list[float], Any, int]:
    runs = []
    for i in range(max(1, repeat)):
        with _TimedBackend(url, timeout=60.0) as backend:
            t0 = time.perf_counter()
            d = diagnose(
                backend,
                end=end,
                window=window,
                step=STEP,
                dialect=dialect,
                budget=120.0,
                workers=workers,
            )
            took = time.perf_counter() - t0
        runs.append((took, d, backend.queries))
        top = d.findings[0].title if d.findings else "-"
        print(f"  {dialect}: diagnosis in {took:.2f} s, {d.queries} queries; {top}", flush=True)
        if i == 0:
            total = sum(t for t, _ in backend.took)
            print(f"  {dialect}: request time {total:.2f} s over {len(backend.took)} requests; "
                  "slowest:", flush=True)  # fmt: skip
            for t, what in sorted(backend.took, reverse=True)[:8]:
                print(f"    {t:6.2f} s  {what[:160]}", flush=True)
    times = [r[0] for r in runs]
    runs.sort(key=lambda r: r[0])
    took, d, sent = runs[len(runs) // 2]
    return took, times, d, sent


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=1000)
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--duration", type=float, default=600.0, help="seconds of scraping")
    p.add_argument("--warmup", type=float, default=300.0, help="seconds before the leak")
    p.add_argument("--repeat", type=int, default=3, help="diagnoses timed per backend")
    p.add_argument("--workers", type=int, default=4, help="queries in flight at once")
    p.add_argument("--no-write", action="store_true", help="do not update fleet.json")
    p.add_argument(
        "--other-work", default="not recorded", help="what else ran on the machine, for the record"
    )
    args = p.parse_args(argv)
    if not 0 < args.warmup < args.duration:
        print("--warmup must be positive and below --duration", file=sys.stderr)
        return 2
    missing = [
        b for b in ("prometheus", "victoria-metrics", "vmagent", "vmalert") if not shutil.which(b)
    ]
    if missing:
        print(f"{', '.join(missing)} needed: apt-get install prometheus victoria-metrics")
        return 2
    rng = random.Random(args.seed)
    faulty = rng.randint(1, args.nodes)
    faulty_gpu = rng.randrange(args.gpus)
    faulty_name = f"sim-node-{faulty}"
    wall0 = time.monotonic()
    procs: dict[str, subprocess.Popen[bytes]] = {}
    with tempfile.TemporaryDirectory(prefix="aivitals-fleet-scrape-") as tmp:
        work = Path(tmp)
        ports = {k: free_port() for k in ("expose", "prometheus", "vm", "vmagent", "vmalert")}
        url = {k: f"http://127.0.0.1:{v}" for k, v in ports.items()}
        sd = work / "sd"
        try:
            env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
            procs["expose"] = start(
                [sys.executable, "-m", "aivitals.fleet._expose", "--recording", str(RECORDING),
                 "--nodes", str(args.nodes), "--gpus", str(args.gpus), "--seed", str(args.seed),
                 "--faulty-node", str(faulty), "--faulty-gpu", str(faulty_gpu),
                 "--warmup", str(args.warmup), "--step", str(STEP),
                 "--port", str(ports["expose"]), "--sd-dir", str(sd)],
                work / "expose.log", env,
            )  # fmt: skip
            deadline = time.monotonic() + 60
            while not (sd / "ai-service.json").exists():
                if procs["expose"].poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("exposition server: " + (work / "expose.log").read_text())
                time.sleep(0.2)
            t_start = time.time()  # the recording's row 0 (the server started a moment ago)
            rules = work / "rules.yml"
            rules.write_text(default_pack().text)
            (work / "rules.vmalert.yml").write_text(vmalert_rules(default_pack().text))
            jobs = [
                {"job_name": job, "file_sd_configs": [{"files": [str(sd / f"{job}.json")]}]}
                for job in ("aivitals-agent", "ai-service")
            ]
            glob = {"scrape_interval": "15s", "scrape_timeout": "10s"}
            (work / "prometheus.yml").write_text(
                yaml.safe_dump(
                    {"global": {**glob, "evaluation_interval": "15s"},
                     "rule_files": [str(rules)], "scrape_configs": jobs},
                    sort_keys=False,
                )
            )  # fmt: skip
            (work / "vmagent.yml").write_text(
                yaml.safe_dump({"global": glob, "scrape_configs": jobs}, sort_keys=False)
            )
            procs["prometheus"] = start(
                [str(shutil.which("prometheus")), f"--config.file={work / 'prometheus.yml'}",
                 f"--storage.tsdb.path={work / 'prom'}",
                 f"--web.listen-address=127.0.0.1:{ports['prometheus']}", "--log.level=warn"],
                work / "prometheus.log",
            )  # fmt: skip
            procs["vm"] = start(
                [str(shutil.which("victoria-metrics")), f"-storageDataPath={work / 'vm'}",
                 f"-httpListenAddr=127.0.0.1:{ports['vm']}", "-retentionPeriod=1",
                 "-search.latencyOffset=0s", "-search.maxUniqueTimeseries=1000000",
                 "-loggerLevel=ERROR"],
                work / "vm.log",
            )  # fmt: skip
            wait_http(f"{url['vm']}/health")
            procs["vmagent"] = start(
                [str(shutil.which("vmagent")), f"-promscrape.config={work / 'vmagent.yml'}",
                 f"-remoteWrite.url={url['vm']}/api/v1/write",
                 f"-remoteWrite.tmpDataPath={work / 'vmagent-buf'}",
                 f"-httpListenAddr=127.0.0.1:{ports['vmagent']}", "-loggerLevel=ERROR"],
                work / "vmagent.log",
            )  # fmt: skip
            procs["vmalert"] = start(
                [str(shutil.which("vmalert")), f"-rule={work / 'rules.vmalert.yml'}",
                 f"-datasource.url={url['vm']}", f"-remoteWrite.url={url['vm']}",
                 # vmalert 1.79 has no blackhole notifier: a port nobody listens on
                 f"-notifier.url=http://127.0.0.1:{free_port()}",
                 f"-httpListenAddr=127.0.0.1:{ports['vmalert']}",
                 "-evaluationInterval=15s", "-loggerLevel=ERROR"],
                work / "vmalert.log",
            )  # fmt: skip
            wait_http(f"{url['prometheus']}/-/ready")
            wait_http(f"{url['vmagent']}/health")
            wait_http(f"{url['vmalert']}/health")
            measured = ("expose", "prometheus", "vmagent", "vm")
            cpu0 = {k: cpu_s(procs[k].pid) for k in measured}
            c0 = time.monotonic()
            print(
                f"scraping {args.nodes} SIMULATED nodes ({2 * args.nodes} targets) for "
                f"{args.duration:.0f} s; the leak on {faulty_name} GPU {faulty_gpu} "
                f"from {args.warmup:.0f} s",
                flush=True,
            )
            prom_samples: list[float] = []
            next_log = 0.0
            while (elapsed := time.time() - t_start) < args.duration:
                for name, proc in procs.items():
                    if proc.poll() is not None:
                        raise RuntimeError(
                            f"{name} exited: " + (work / f"{name}.log").read_text()[-2000:]
                        )
                if elapsed > 120:  # past the first evaluations (the pack's groups all ran)
                    got = prom_rules_s(url["prometheus"])
                    if got is not None:
                        prom_samples.append(got)
                if elapsed >= next_log:
                    up_p = scalar(url["prometheus"], "sum(up)")
                    up_v = scalar(url["vm"], "sum(up)")
                    print(
                        f"  t={elapsed:5.0f} s  up: prometheus {up_p:.0f}  vm {up_v:.0f}",
                        flush=True,
                    )
                    next_log += 60.0
                time.sleep(STEP)
            span = time.monotonic() - c0
            cpu = {k: 100.0 * (cpu_s(procs[k].pid) - cpu0[k]) / span for k in measured}
            vm_eval_s, vm_evals = vmalert_rules_s(url["vmalert"])
            prom_eval_s = sum(prom_samples) / len(prom_samples) if prom_samples else float("nan")
            series = {
                "prometheus": scalar(url["prometheus"], "sum(scrape_samples_scraped)"),
                "victoriametrics": scalar(url["vm"], "sum(scrape_samples_scraped)"),
            }
            head_series = own_metric(url["prometheus"], "prometheus_tsdb_head_series")
            alerts = {
                "prometheus": firing(url["prometheus"]),
                "victoriametrics": firing(url["vmalert"]),
            }
            end = float(int(time.time()))
            # the window: from the first full scrape round to now, on the 15 s grid
            window = STEP * ((end - t_start - 2 * STEP) // STEP)
            print(f"diagnosing the last {window:.0f} s", flush=True)
            out: dict[str, dict[str, Any]] = {}
            for backend, dialect, link in (
                ("prometheus", "promql", url["prometheus"]),
                ("victoriametrics", "metricsql", url["vm"]),
            ):
                took, times, d, sent = run_diagnosis(
                    link, dialect, end, window, args.repeat, args.workers
                )
                top = d.findings[0] if d.findings else None
                named = int(
                    top is not None
                    and top.where.get("node") == faulty_name
                    and top.signature == "gpu_memory_leak"
                )
                scraper = "prometheus" if backend == "prometheus" else "vmagent"
                out[backend] = {
                    "series": count(series[backend]),
                    "scrape_cpu_pct": round(cpu[scraper], 1),
                    "rules_eval_s": round(prom_eval_s if backend == "prometheus" else vm_eval_s, 4),
                    "diagnose_s": round(took, 3),
                    "diagnose_runs_s": [round(t, 3) for t in times],
                    "queries": d.queries,
                    "queries_sent": sent,
                    "named_faulty_node": named,
                    "top_finding": top.title if top else None,
                    "top_node": top.where.get("node") if top else None,
                    "nodes_healthy": sum(v == "healthy" for v in d.nodes.values()),
                    "alerts_firing": alerts[backend][:20],
                }
        finally:
            for proc in reversed(list(procs.values())):
                stop(proc)
    wall = time.monotonic() - wall0
    rules_how = {
        "prometheus": f"groups' last durations summed, mean of {len(prom_samples)} samples",
        "victoriametrics": f"vmalert: groups' mean iteration over {vm_evals}+ evaluations, summed",
    }
    for backend, f in out.items():
        f["rules_eval_how"] = rules_how[backend]
    out["prometheus"]["head_series"] = count(head_series)
    out["victoriametrics"]["storage_cpu_pct"] = round(cpu["vm"], 1)
    print()
    for backend, f in out.items():
        print(
            f"{backend}: top finding: {f['top_finding']} (faulty: {faulty_name} GPU {faulty_gpu})"
        )
        print(f"{backend}: alerts firing: {', '.join(f['alerts_firing']) or 'none'}")
    print(f"exposition server CPU {cpu['expose']:.1f} %, VictoriaMetrics {cpu['vm']:.1f} % "
          f"(of one core); wall {wall:.0f} s; a 2-core machine shared with other work")  # fmt: skip
    for backend, f in out.items():
        print(
            f"RESULT nodes={args.nodes} series={f['series']} scrape_cpu_pct={f['scrape_cpu_pct']} "
            f"rules_eval_s={f['rules_eval_s']:.3f} diagnose_s={f['diagnose_s']:.2f} "
            f"named_faulty_node={f['named_faulty_node']} backend={backend} "
            f"queries={f['queries']} expose_cpu_pct={cpu['expose']:.1f}"
        )
    if not args.no_write:
        data = json.loads(RESULT.read_text()) if RESULT.exists() else {}
        data["scrape"] = {
            "nodes": args.nodes,
            "gpus": args.nodes * args.gpus,
            "scrape_targets": 2 * args.nodes,
            "scrape_interval_s": STEP,
            "duration_s": args.duration,
            "warmup_s": args.warmup,
            "diagnosis_window_s": window,
            "faulty_node": faulty_name,
            "faulty_gpu": faulty_gpu,
            "expose_cpu_pct": round(cpu["expose"], 1),
            "wall_s": round(wall),
            "prometheus": out["prometheus"],
            "victoriametrics": out["victoriametrics"],
            "targets": {"diagnose_s": TARGET_S, "named_faulty_node": 1},
            "machine": f"{os.cpu_count()} cores; Prometheus, vmagent, VictoriaMetrics, vmalert "
            "(Debian 12) and the exposition server all at once, the scraping going on while "
            f"each diagnosis runs; other work on the machine: {args.other_work}",
            "git_commit": _head(),
            "measured_at": time.time(),
        }
        RESULT.write_text(json.dumps(data, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
