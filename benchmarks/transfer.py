"""transfer: does what catches each fault on the demo catch it on services it was not tuned on?

Runs the real CLI on three services, one after the other, under the same rule pack,
thresholds and signatures:

- ``demo``: ``aivitals validate --quick`` on the demo stack;
- ``wsgi``: ``examples/wsgi_service`` (Flask under gunicorn, two sync workers), started
  here as its README says, then ``aivitals validate --quick --target``;
- ``bento``: ``examples/bento_service`` (BentoML, an API worker in front of two batching
  model workers), the same way.

Each runs every single fault (no pairs), with the services' chaos hooks opened by a token
this run makes (so the in-process faults the hook carries apply) and their per-worker JSON
logs given to ``--log`` (so the log check runs). Per service, every fault
is one of: *caught* (the case passed every strict check: impact, expected alerts,
diagnosis on every poll, resolution, no false page), *missed* (a check failed, or the case
ended in an error), or *not tested* (the fault cannot apply to that service, with the
reason validate gave). Then one line:

``RESULT demo_caught=... wsgi_caught=... bento_caught=... not_tested=... false_p0p1=...``

- ``<service>_caught``: caught over tested on that service, as ``n/m`` (``n/a``: not run);
- ``not_tested``: cases not tested, over every service run;
- ``false_p0p1``: P0/P1 alerts that no case listed, during a fault or after its revert,
  over every service run.

Faults run at their quick-run values (the scenario's ``quick_params``, what CI runs), not at
the sweep's graded *moderate*: those magnitudes are computed from the demo's own capacity
and SLA, and validate does not grade an outside service (it refuses ``--sweep`` with
``--target``). Target: on every service, every applicable fault caught, and
``false_p0p1=0``. Writes benchmarks/results/transfer.json (``--output`` elsewhere).

    .venv/bin/python benchmarks/transfer.py [--services demo,wsgi,bento] [--scenarios a,b]
    .venv/bin/python benchmarks/transfer.py --from-reports demo=R1.json wsgi=R2.json

A quick run of every fault takes 15-40 minutes per service on a 2-core machine.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results" / "transfer.json"
EXAMPLES = REPO / "examples"
SERVICES = ("demo", "wsgi", "bento")
sys.path.insert(0, str(REPO / "src"))

from aivitals.validate import SCENARIOS  # noqa: E402

#: A started reference service: its base URL and validate's arguments for it.
Started = tuple[str, list[str]]


def case_outcome(case: Mapping[str, Any]) -> dict[str, Any]:
    """One case of a validate report: caught, missed or not tested, and its false pages."""
    checks = {c.get("name"): c for c in case.get("checks", [])}
    false = list(
        dict.fromkeys(
            a
            for n in ("other_alerts", "recovery_pages")
            for a in ((checks.get(n) or {}).get("data") or {}).get("false_paging", [])
        )
    )
    if case.get("skipped"):
        outcome = "not_tested"
    elif case.get("error") is None and case.get("passed"):
        outcome = "caught"
    else:
        outcome = "missed"
    failed = [str(n) for n, c in checks.items() if c.get("ok") is False]
    return {
        "case": case.get("fault"),
        "outcome": outcome,
        "why": case.get("skipped") or case.get("error") or ", ".join(failed) or None,
        "false_p0p1": false if outcome != "not_tested" else [],
    }


def summarize(reports: Mapping[str, Mapping[str, Any] | str]) -> dict[str, Any]:
    """Per service (a str is a run that produced no report: its error) and over all."""
    services: dict[str, Any] = {}
    for name, report in reports.items():
        if isinstance(report, str):
            services[name] = {"error": report, "cases": []}
            continue
        cases = [case_outcome(c) for c in report.get("scenarios", [])]
        count = {k: sum(c["outcome"] == k for c in cases) for k in ("caught", "missed")}
        services[name] = {
            "caught": count["caught"],
            "tested": count["caught"] + count["missed"],
            "not_tested": sum(c["outcome"] == "not_tested" for c in cases),
            "false_p0p1": sorted({a for c in cases for a in c["false_p0p1"]}),
            "false_p0p1_n": sum(len(c["false_p0p1"]) for c in cases),
            "cases": cases,
        }
    ran = [s for s in services.values() if "error" not in s]
    return {
        "services": services,
        "not_tested": sum(s["not_tested"] for s in ran),
        "false_p0p1": sum(s["false_p0p1_n"] for s in ran),
        "errors": [f"{n}: {s['error']}" for n, s in services.items() if "error" in s],
    }


def result_line(s: Mapping[str, Any]) -> str:
    def caught(name: str) -> str:
        svc = s["services"].get(name)
        if svc is None or "error" in svc:
            return "n/a"
        return f"{svc['caught']}/{svc['tested']}"

    parts = [f"{name}_caught={caught(name)}" for name in SERVICES]
    parts += [f"not_tested={s['not_tested']}", f"false_p0p1={s['false_p0p1']}"]
    return "RESULT " + " ".join(parts) + f" errors={len(s['errors'])}"


# -- the reference services, started as their READMEs say ------------------------------
def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _service_env(tmp: Path, token: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k.upper() != "PROMETHEUS_MULTIPROC_DIR"}
    logs = tmp / "logs"
    logs.mkdir(exist_ok=True)
    env.update(
        PYTHONPATH=str(REPO / "src"),
        ENCODE_LOG_DIR=str(logs),
        TMPDIR=str(tmp),
        AIVITALS_CHAOS_TOKEN=token,
        BENTOML_HOME=str(tmp / "bentoml"),
        BENTOML_DO_NOT_TRACK="True",
    )
    return env


def _wait_ready(proc: subprocess.Popen[bytes], url: str, metrics: str, loads: int) -> None:
    """Until the service answers its request and every model copy has loaded."""
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the service exited with {proc.returncode}")
        try:
            r = httpx.post(f"{url}/encode", json={"sentences": ["hi"]}, timeout=10)
            text = httpx.get(f"{url}{metrics}", timeout=5).text
            cold = sum(
                float(ln.rsplit(" ", 1)[1])
                for ln in text.splitlines()
                if ln.startswith("model_loads_total{") and 'mode="cold"' in ln
            )
            if r.status_code == 200 and cold >= loads:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"the service at {url} was not ready in 240 s")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
    except ProcessLookupError:
        pass
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)


@contextmanager
def _serve(cmd: list[str], cwd: Path, tmp: Path, token: str, metrics: str, loads: int,
           request: Path) -> Iterator[Started]:  # fmt: skip
    port = _free_port()
    cmd = [part.replace("{port}", str(port)) for part in cmd]
    with (tmp / "service.log").open("wb") as out:
        proc = subprocess.Popen(
            cmd,
            cwd=cwd,
            env=_service_env(tmp, token),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(proc, url, metrics, loads)
        yield url, ["--target", url, "--request", str(request), "--metrics-path", metrics,
                    "--chaos-token", token, "--log", str(tmp / "logs")]  # fmt: skip
    finally:
        _stop(proc)


def _wsgi(tmp: Path, token: str) -> Any:
    ex = EXAMPLES / "wsgi_service"
    cmd = [sys.executable, "-m", "gunicorn", "-c", str(ex / "gunicorn.conf.py"),
           "-b", "127.0.0.1:{port}", "-w", "2", "--no-control-socket", "app:service"]  # fmt: skip
    return _serve(cmd, ex, tmp, token, "/metrics", 2, ex / "request.json")


def _bento(tmp: Path, token: str) -> Any:
    ex = EXAMPLES / "bento_service"
    bentoml = str(Path(sys.executable).with_name("bentoml"))
    cmd = [bentoml, "serve", "service:EncodeAPI", "--host", "127.0.0.1", "--port", "{port}"]
    return _serve(cmd, ex, tmp, token, "/aivitals/metrics", 2, ex / "request.json")


STARTERS: dict[str, Callable[[Path, str], Any]] = {"wsgi": _wsgi, "bento": _bento}


def _validate(argv_extra: list[str], report: Path, scenarios: str) -> str | None:
    argv = [sys.executable, "-m", "aivitals.cli", "validate", "--quick", "--report",
            str(report), "--scenarios", scenarios, *argv_extra]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    t0 = time.time()
    proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, check=False)
    (report.with_suffix(".out")).write_text(proc.stdout + proc.stderr)
    print(f"  validate: exit {proc.returncode} in {time.time() - t0:.0f} s", flush=True)
    if not report.exists():
        return f"no report (exit {proc.returncode}): {(proc.stdout + proc.stderr)[-600:]}"
    return None


def run_service(name: str, scenarios: str, keep: Path) -> Mapping[str, Any] | str:
    """Run one service's drill; its report, or the error that left none."""
    report = keep / f"transfer-{name}.json"
    report.unlink(missing_ok=True)
    print(f"{name}: starting", flush=True)
    try:
        if name == "demo":
            error = _validate([], report, scenarios)
        else:
            tmp = Path(tempfile.mkdtemp(prefix=f"transfer-{name}-", dir=keep))
            with STARTERS[name](tmp, secrets.token_hex(12)) as (_url, extra):
                error = _validate(extra, report, scenarios)
    except (OSError, RuntimeError, TimeoutError) as exc:
        return f"{type(exc).__name__}: {exc}"
    if error is not None:
        return error
    loaded: Mapping[str, Any] = json.loads(report.read_text())
    return loaded


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--services", default=",".join(SERVICES))
    ap.add_argument("--scenarios", default=None, help="validate's --scenarios (default: all)")
    ap.add_argument("--from-reports", nargs="+", default=None, metavar="SERVICE=FILE")
    ap.add_argument("--keep", type=Path, default=None, help="keep the reports here")
    ap.add_argument("--output", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    reports: dict[str, Mapping[str, Any] | str] = {}
    if args.from_reports:
        for item in args.from_reports:
            name, sep, path = item.partition("=")
            if not sep or name not in SERVICES:
                ap.error(f"--from-reports {item!r}: expected SERVICE=FILE, SERVICE in {SERVICES}")
            try:
                reports[name] = json.loads(Path(path).read_text())
            except (OSError, ValueError) as exc:
                reports[name] = f"{path}: {exc}"
    else:
        names = [s.strip() for s in args.services.split(",") if s.strip()]
        unknown = sorted(set(names) - set(SERVICES))
        if unknown or not names:
            ap.error(f"--services: unknown {unknown}; choose from {', '.join(SERVICES)}")
        scenarios = args.scenarios or ",".join(SCENARIOS)
        keep = args.keep or Path(tempfile.mkdtemp(prefix="aivitals-transfer-"))
        keep.mkdir(parents=True, exist_ok=True)
        for name in names:
            reports[name] = run_service(name, scenarios, keep)
    s = summarize(reports)
    for name, svc in s["services"].items():
        if "error" in svc:
            print(f"{name}: ERROR {svc['error']}")
            continue
        print(f"{name}: caught {svc['caught']}/{svc['tested']}, not tested {svc['not_tested']}")
        for c in svc["cases"]:
            why = f"  ({c['why']})" if c["why"] and c["outcome"] != "caught" else ""
            false = f"  false P0/P1: {', '.join(c['false_p0p1'])}" if c["false_p0p1"] else ""
            print(f"  {c['case']:<26} {c['outcome']:<11}{why}{false}")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(s, indent=2) + "\n")
    print(result_line(s))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
