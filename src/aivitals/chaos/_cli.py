"""``aivitals chaos list|run|cleanup``."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import click

from ..errors import ConfigError
from ..load import OPENAI_KINDS, parse_duration, template_from_options
from ._fault import DEFAULT_MAX_DURATION, FaultContext
from ._journal import cleanup as cleanup_runs
from ._registry import FAULTS, get_fault
from ._runner import ChaosRunner

__all__ = ["chaos"]


@click.group("chaos")
def chaos() -> None:
    """Inject real faults with a bounded duration and a guaranteed revert."""


@chaos.command("list")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def list_faults(as_json: bool) -> None:
    """List the faults: layer, expected signature and alerts, parameters, and for
    each parameter value what it touches and who owns that afterwards."""
    rows: list[dict[str, Any]] = []
    for name, cls in FAULTS.items():
        info = cls.info()
        params = {k: v[0] for k, v in cls.params.items()}
        rows.append(
            {
                "name": name,
                "layer": info.layer,
                "signature": info.signature,
                "alerts": list(info.alerts),
                "params": params,
                "description": info.description,
                "touches": [
                    {
                        "when": t.when or "any",
                        "touches": t.touches,
                        "afterwards": t.afterwards,
                        "starts_processes": t.processes,
                    }
                    for t in cls.touches
                ],
            }
        )
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    pad = " " * 24
    for r in rows:
        shown = " ".join(f"{k}={v:g}" for k, v in dict(r["params"]).items())
        alerts = ",".join(r["alerts"]) or "-"
        click.echo(f"{r['name']:<24}{r['layer']:<16}{r['description']}")
        click.echo(f"{pad}alerts: {alerts}" + (f"   params: {shown}" if shown else ""))
        for t in r["touches"]:
            when = "any value" if t["when"] == "any" else t["when"]
            click.echo(f"{pad}{when}: {t['touches']}")
            click.echo(f"{pad}{' ' * len(when)}  afterwards: {t['afterwards']}")


def _parse_params(names: tuple[str, ...], raw: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    """``-p fault.key=value`` sets one fault's param; ``-p key=value`` sets it on every
    fault being run that has that param (in-process faults take any)."""
    out: dict[str, dict[str, Any]] = {n: {} for n in names}
    for item in raw:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"param {item!r}: expected key=value")
        try:
            parsed: Any = json.loads(value)
        except ValueError:
            parsed = value
        fault, dot, k = key.rpartition(".")
        if dot and fault not in out:
            raise ConfigError(f"param {item!r}: fault {fault!r} is not being run")
        targets = [fault] if dot else [n for n in names if _takes(n, k)]
        if not targets:
            raise ConfigError(f"param {item!r}: none of {', '.join(names)} takes {k!r}")
        for n in targets:
            out[n][k] = parsed
    return out


def _takes(name: str, key: str) -> bool:
    cls = get_fault(name)
    return cls.free_params or key in cls.params


@chaos.command("run")
@click.argument("names", nargs=-1, required=True)
@click.option("--duration", default="30s", show_default=True, help="e.g. 30s, 2m.")
@click.option("--target", help="Base URL of the service (loopback unless allowed).")
@click.option("--service-pid", type=int)
@click.option("--token", envvar="AIVITALS_CHAOS_TOKEN", help="Chaos token of the service.")
@click.option("--sim-gpu-dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--gpu", type=int, default=0, show_default=True)
@click.option("--redis-port", type=int)
@click.option("--redis-pid", type=int)
@click.option(
    "--work-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Where disk faults write (default /var/tmp).",
)
@click.option(
    "--base-rate",
    type=float,
    default=10.0,
    show_default=True,
    help="Normal request rate; traffic_surge multiplies it.",
)
@click.option("--allow-host", "allow_hosts", multiple=True)
@click.option(
    "--request",
    "request_file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="What one request to the service looks like (YAML or JSON: method, path, "
    "headers, a JSON body with a {{prompt}} placeholder); the faults that send requests "
    "use it. Default: the demo's POST /v1/embeddings.",
)
@click.option(
    "--openai",
    type=click.Choice(OPENAI_KINDS),
    help="Preset request for an OpenAI-compatible server (needs --model).",
)
@click.option("--model", help="The model name the --openai preset sends.")
@click.option(
    "-p",
    "--param",
    "params",
    multiple=True,
    help="key=value for every fault, or fault.key=value (repeatable).",
)
@click.option("--max-duration", default=f"{DEFAULT_MAX_DURATION:g}s", show_default=True)
@click.option(
    "--allow-foreign-restart",
    is_flag=True,
    help="Let a fault kill a process this run did not start (redis_down method=1) and "
    "start a new one on revert; the new one is yours to stop (its pid is printed).",
)
def run(
    names: tuple[str, ...],
    duration: str,
    target: str | None,
    service_pid: int | None,
    token: str | None,
    sim_gpu_dir: Path | None,
    gpu: int,
    redis_port: int | None,
    redis_pid: int | None,
    work_dir: Path | None,
    base_rate: float,
    allow_hosts: tuple[str, ...],
    request_file: Path | None,
    openai: str | None,
    model: str | None,
    params: tuple[str, ...],
    max_duration: str,
    allow_foreign_restart: bool,
) -> None:
    """Run the fault(s) NAMES together for --duration, then revert them."""
    for name in names:
        get_fault(name)
    seconds = parse_duration(duration)
    if sim_gpu_dir is None and os.environ.get("AIVITALS_SIM_GPU_DIR"):
        sim_gpu_dir = Path(os.environ["AIVITALS_SIM_GPU_DIR"])
    ctx = FaultContext(
        target=target,
        service_pid=service_pid,
        chaos_token=token,
        sim_gpu_dir=sim_gpu_dir,
        gpu=gpu,
        redis_port=redis_port,
        redis_pid=redis_pid,
        work_dir=work_dir,
        base_rate=base_rate,
        allow_hosts=allow_hosts,
        request=template_from_options(request_file, openai, model),
        allow_foreign_restart=allow_foreign_restart,
    )
    per_fault = _parse_params(names, params)
    limit = parse_duration(max_duration, key="max_duration")
    with ChaosRunner(ctx, max_duration=limit) as runner:
        assert runner.run is not None
        click.echo(f"run {runner.run.run_id} (journal {runner.run.path})")
        if runner.recovered and runner.recovered.cleaned:
            click.echo(f"cleaned up after crashed runs: {', '.join(runner.recovered.cleaned)}")
        started = []
        for name in names:
            active = runner.start(name, duration=seconds, **per_fault[name])
            started.append(active)
            where = f" -> clients use {active.client_url}" if active.client_url else ""
            click.echo(f"started {name} for {seconds:g}s{where}", err=False)
        _wait(runner, seconds)
    failed = False
    for active in started:
        status = "reverted" if not active.errors else "REVERT ERRORS: " + "; ".join(active.errors)
        failed = failed or bool(active.errors)
        click.echo(f"stopped {active.name}: {status}")
        for rep in active.fault.replacements:
            click.echo(f"  {_replacement_line(rep)}")
    if failed:
        raise SystemExit(1)


def _replacement_line(rep: Any) -> str:
    return f"{rep.describe()} (pid {rep.pid} start {rep.start})"


def _wait(runner: ChaosRunner, seconds: float) -> None:
    import time

    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0 and not runner.closed.is_set():
        time.sleep(min(0.5, left))


@chaos.command("cleanup")
@click.option("--force", is_flag=True, help="Also revert runs whose runner is still alive.")
def cleanup(force: bool) -> None:
    """Revert what crashed or killed runs left behind (journal replay)."""
    report = cleanup_runs(force=force)
    for run_id in report.cleaned:
        click.echo(f"cleaned {run_id}")
    for run_id in report.skipped:
        click.echo(f"skipped {run_id}: its runner (or stack) is still running (--force to revert)")
    for rep in report.replaced:
        click.echo(_replacement_line(rep))
    for err in report.errors:
        click.echo(f"error: {err}", err=True)
    click.echo(f"{len(report.cleaned)} run(s) cleaned, {report.reverted} resource(s) reverted")
    if report.errors:
        raise SystemExit(1)
