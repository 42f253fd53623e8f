"""``aivitals validate``: inject every fault this machine can host and check it is caught."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from ..errors import ConfigError
from ..load import OPENAI_KINDS
from ..tsdb import RemoteConnection, remote_options

__all__ = ["validate"]


@click.command("validate")
@click.option("--quick", is_flag=True, help="Short phases and compressed rule time (CI).")
@click.option(
    "--scenarios",
    default=None,
    metavar="A,B,C",
    help=(
        "Comma-separated faults, or two at once joined by + (redis_down+traffic_surge); "
        "default: every fault this machine can host, then the validated pairs."
    ),
)
@click.option(
    "--sweep",
    is_flag=True,
    help="Run every graded fault at three severities (threshold, moderate, severe), "
    "and once each fault with a single magnitude (fault@single).",
)
@click.option(
    "--soak",
    "soak",
    default=None,
    metavar="DURATION",
    help="No fault: the demo stack under a swinging replayed load for DURATION "
    "(300, 5m, 1h); passes with zero P0/P1 alerts and a healthy diagnosis at every poll.",
)
@click.option(
    "--record",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Save each case's window as a snapshot with its label in this directory.",
)
@click.option(
    "--report",
    "report_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=Path("validate-report.json"),
    show_default=True,
    help="Where the JSON report is written.",
)
@click.option(
    "--markdown",
    "markdown_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Also write the report as Markdown here.",
)
@click.option("--baseline", type=float, default=None, help="Baseline seconds per scenario.")
@click.option("--fault-max", type=float, default=None, help="Longest fault phase, seconds.")
@click.option("--recover-max", type=float, default=None, help="Longest wait for resolve, seconds.")
@click.option(
    "--workdir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Keep the service log, sim GPU state and chaos files here (default: a temp dir).",
)
@click.option(
    "--gpu",
    type=click.Choice(["auto", "sim", "nvml"]),
    default="auto",
    show_default=True,
    help="The simulated GPU, a real CUDA GPU read through NVML, or auto (nvml if present).",
)
@click.option(
    "-p",
    "--param",
    "params",
    multiple=True,
    metavar="FAULT.KEY=VALUE",
    help="Override a scenario's fault parameter, e.g. -p redis_down.method=1 (repeatable).",
)
@click.option("--list", "list_only", is_flag=True, help="List the scenarios and exit.")
@click.option(
    "--junit",
    "junit_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Also write the report as JUnit XML here (a case = a testcase; not tested = skipped).",
)
@click.option(
    "--target",
    default=None,
    metavar="URL",
    help="Run the drill against your running service at this base URL (on this machine) "
    "instead of the demo stack; it is never started or stopped.",
)
@click.option(
    "--request",
    "request_file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="With --target: what one request looks like (YAML or JSON: method, path, headers, "
    "a JSON body with a {{prompt}} placeholder).",
)
@click.option(
    "--openai",
    type=click.Choice(OPENAI_KINDS),
    default=None,
    help="With --target: the request of an OpenAI-compatible server (needs --model).",
)
@click.option("--model", default=None, help="The model name the --openai preset sends.")
@click.option(
    "--pid",
    type=int,
    default=None,
    help="With --target: the service's process (default: the one listening on its port).",
)
@click.option(
    "--metrics-path",
    default="/metrics",
    show_default=True,
    help="With --target: where the service serves its Prometheus metrics.",
)
@click.option(
    "--sla",
    type=float,
    default=None,
    metavar="SECONDS",
    help="With --target: the model SLA of the rules (default: 2.5 x the median time of "
    "the service's request, measured before the first fault).",
)
@click.option(
    "--chaos-token",
    envvar="AIVITALS_CHAOS_TOKEN",
    default=None,
    help="With --target: the token of the service's chaos hook (aivitals.chaos.mount); "
    "without it the in-process faults are not tested.",
)
@click.option(
    "--dependency",
    default=None,
    metavar="HOST:PORT",
    help="With --target: a dependency of the service (its Redis, its database) that "
    "redis_down takes down by resetting TCP to it; without it that fault is not tested.",
)
@click.option(
    "--log",
    "log_file",
    type=click.Path(path_type=Path),
    default=None,
    help="With --target: the service's JSON-lines log, or the directory of its logs (one "
    "file per worker: every *.jsonl, *.json and *.log in it); without it the log check is "
    "not tested.",
)
@click.option(
    "--prometheus",
    metavar="URL",
    default=None,
    help="With --target: read the alerts and run the diagnosis on your Prometheus (it "
    "scrapes the service and has aivitals' rules loaded) instead of the embedded agent's; "
    "a full run only (its rules run at their own windows).",
)
@click.option(
    "--alertmanager",
    metavar="URL",
    default=None,
    help="With --prometheus: an alert counts as fired once this Alertmanager holds it. "
    "The connection flags below (credentials, TLS, headers) apply to both URLs.",
)
@remote_options
def validate(
    quick: bool,
    scenarios: str | None,
    sweep: bool,
    soak: str | None,
    record: Path | None,
    report_path: Path,
    markdown_path: Path | None,
    baseline: float | None,
    fault_max: float | None,
    recover_max: float | None,
    workdir: Path | None,
    gpu: str,
    params: tuple[str, ...],
    list_only: bool,
    junit_path: Path | None,
    target: str | None,
    request_file: Path | None,
    openai: str | None,
    model: str | None,
    pid: int | None,
    metrics_path: str,
    sla: float | None,
    chaos_token: str | None,
    dependency: str | None,
    log_file: Path | None,
    prometheus: str | None,
    alertmanager: str | None,
    connection: RemoteConnection,
) -> None:
    """Inject each fault, check alerts, diagnosis and logs catch it, and that it resolves.

    Strict: clients must feel the faults that hurt them, no unlisted P0/P1 alert
    may fire, and the diagnosis must keep naming the fault on every poll after
    it first does. Prints one line per check ([ok] / [fail] / [info]), writes a
    JSON report and exits 1 when any check failed.

    With --target URL it checks your running service instead of the demo: every fault
    that can apply to it from outside (and in-process ones through its chaos hook when
    --chaos-token is given); a fault that cannot apply is reported as not tested, with
    the reason, and does not fail the run.
    """
    from ._config import ValidateConfig
    from ._runner import run_validate
    from ._scenarios import SCENARIOS, hostable

    options = _target_options(
        target,
        request_file=request_file,
        openai=openai,
        model=model,
        pid=pid,
        metrics_path=metrics_path,
        sla=sla,
        chaos_token=chaos_token,
        dependency=dependency,
        log_file=log_file,
        prometheus=prometheus,
        alertmanager=alertmanager,
        connection=connection,
    )
    if options is not None and list_only:
        from ._external import why_not

        for name in SCENARIOS:
            why = why_not(name, options)
            click.echo(f"{name:<24} {'applies' if why is None else 'not tested: ' + why}")
        return
    if options is not None and soak is not None:
        raise ConfigError("--soak runs on the demo stack; it takes no --target")
    if list_only:
        from ._severity import SINGLE, severities

        for name, s in SCENARIOS.items():
            why = hostable(s)
            text = "can run here" if why is None else "skipped: " + why
            if sweep:  # a fault with one magnitude runs once, not under three names
                sevs = severities(name)
                text += " (once, at single)" if sevs == (SINGLE,) else f" (at {', '.join(sevs)})"
            click.echo(f"{name:<24} {text}")
        if sweep:
            return  # a sweep runs no pair unless --scenarios names one
        from ._cases import PAIRS

        for pair in PAIRS:
            whys = [w for w in (hostable(SCENARIOS[f]) for f in pair) if w]
            text = "can run here" if not whys else "skipped: " + "; ".join(whys)
            click.echo(f"{'+'.join(pair):<24} {text} (two faults at once)")
        return
    names = _names(scenarios)
    if soak is not None and (names or sweep or params):
        raise ConfigError("--soak runs no fault: it takes no --scenarios, --sweep or --param")
    config = ValidateConfig(
        quick=quick,
        scenarios=names,
        report_path=report_path,
        baseline=baseline,
        fault_max=fault_max,
        recover_max=recover_max,
        workdir=workdir,
        gpu=gpu,
        params=_params(params),
        sweep=sweep,
        record=record,
        target=options,
        rule_params={} if sla is None else {"sla_seconds": sla},
    )
    report: Any
    from ..chaos import interrupt_on_signals

    with interrupt_on_signals():
        if soak is not None:
            from ._soak import parse_soak_duration, run_soak

            seconds = parse_soak_duration(soak)
            report = run_soak(config, seconds, echo=lambda line: click.echo(line))
        else:
            report = run_validate(config, echo=lambda line: click.echo(line))
    report.write(report_path)
    if markdown_path is not None:
        markdown_path.parent.mkdir(parents=True, exist_ok=True)
        markdown_path.write_text(report.to_markdown())
    if junit_path is not None:
        if not hasattr(report, "to_junit"):
            raise ConfigError("--junit: a soak has no cases to write as JUnit")
        junit_path.parent.mkdir(parents=True, exist_ok=True)
        junit_path.write_text(report.to_junit())
    click.echo(f"\n{report.summary()}; report: {report_path}")
    if report.interrupted:
        sys.exit(130)  # the shell's code for a job stopped by Ctrl-C
    if not report.passed:
        sys.exit(1)


def _target_options(
    target: str | None,
    *,
    request_file: Path | None,
    openai: str | None,
    model: str | None,
    pid: int | None,
    metrics_path: str,
    sla: float | None,
    chaos_token: str | None,
    dependency: str | None,
    log_file: Path | None,
    prometheus: str | None = None,
    alertmanager: str | None = None,
    connection: RemoteConnection | None = None,
) -> Any:
    """The user's service (``ExternalOptions``) from ``--target`` and the options that go
    with it; None without ``--target``, where those options are refused."""
    given = {
        "--request": request_file,
        "--openai": openai,
        "--model": model,
        "--pid": pid,
        "--sla": sla,
        "--dependency": dependency,
        "--log": log_file,
        "--prometheus": prometheus,
        "--alertmanager": alertmanager,
    }
    if metrics_path != "/metrics":
        given["--metrics-path"] = metrics_path
    connection = connection or RemoteConnection()
    if connection != RemoteConnection() and prometheus is None:
        # a token or CA meant for a Prometheus must not look as if it had been used
        raise ConfigError(
            "the connection flags (--bearer-token-file, --basic-auth, --ca-file, --cert-file, "
            "--key-file, --insecure-skip-verify, --header, --post) are for --prometheus and "
            "--alertmanager: give --prometheus URL with them"
        )
    if target is None:
        named = [k for k, v in given.items() if v is not None]
        if named:
            raise ConfigError(f"{', '.join(named)}: only with --target URL (your own service)")
        return None  # the demo stack makes its own token: an AIVITALS_CHAOS_TOKEN is unused
    from ..load import template_from_options
    from ._external import ExternalOptions, parse_dependency

    if request_file is None and openai is None:
        raise ConfigError(
            "--target: say what one request to it looks like: --request FILE (method, path, "
            "headers, a JSON body with a {{prompt}} placeholder), or --openai "
            "completions|chat --model NAME"
        )
    return ExternalOptions(
        url=target,
        request=template_from_options(request_file, openai, model),
        pid=pid,
        metrics_path=metrics_path,
        sla=sla,
        chaos_token=chaos_token,
        dependency=None if dependency is None else parse_dependency(dependency),
        log=log_file,
        prometheus=prometheus,
        alertmanager=alertmanager,
        connection=connection,
    )


def _params(raw: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    """``-p fault.key=value`` items by fault (values parsed as JSON, else text)."""
    out: dict[str, dict[str, Any]] = {}
    for item in raw:
        key, sep, value = item.partition("=")
        fault, dot, name = key.rpartition(".")
        if not sep or not dot or not fault or not name:
            raise ConfigError(f"--param {item!r}: expected FAULT.KEY=VALUE (redis_down.method=1)")
        try:
            parsed: Any = json.loads(value)
        except ValueError:
            parsed = value
        out.setdefault(fault, {})[name] = parsed
    return out


def _names(text: str | None) -> tuple[str, ...] | None:
    if text is None:
        return None
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    if not names:
        raise ConfigError(f"--scenarios={text!r}: name at least one fault")
    from ._cases import case

    for n in names:
        case(n)
    return names
