"""The one entry point, ``aivitals``, with its subcommands.

Subcommands live beside the package they drive (``aivitals/<pkg>/_cli.py``)
and are imported only when used, so ``aivitals --help`` stays fast and never
loads numpy or torch. The package's base error is caught here and printed as
``Type: message`` with exit code 1: a user error never shows a traceback.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

import click

from . import __version__
from .errors import AivitalsError

#: name -> ("module", "attribute", "one-line help"); the help is here so that
#: listing the commands does not import them.
COMMANDS: dict[str, tuple[str, str, str]] = {
    "query": (
        "aivitals.tsdb._cli",
        "query",
        "Evaluate PromQL on a store, a snapshot or Prometheus.",
    ),
    "diagnose": (
        "aivitals.diagnose._cli",
        "diagnose",
        "Name the failing layer and root cause, with evidence, timeline and next commands.",
    ),
    "snapshot": (
        "aivitals.diagnose._cli",
        "snapshot",
        "Save a window of every series to a file for later diagnosis or a bug report.",
    ),
    "report": (
        "aivitals.diagnose._cli",
        "report",
        "Reports from the collected signals (report daily).",
    ),
    "load": (
        "aivitals.load._cli",
        "load",
        "Send open-loop, closed-loop or trace-replay load to a local service.",
    ),
    "capacity": (
        "aivitals.load._cli",
        "capacity",
        "Sweep concurrency and report the knee where P95 jumps.",
    ),
    "validate": (
        "aivitals.validate._cli",
        "validate",
        "Inject every fault this machine can host; check alerts, diagnosis, logs, resolve.",
    ),
    "demo": (
        "aivitals.demo._cli",
        "demo",
        "Run the demo AI service with Redis, the agent and live load; --fault NAME breaks it.",
    ),
    "fleet": (
        "aivitals.fleet._cli",
        "fleet",
        "Run N simulated nodes on real Prometheus, Alertmanager and VictoriaMetrics (up/down).",
    ),
    "chaos": (
        "aivitals.chaos._cli",
        "chaos",
        "Inject real faults (list, run, cleanup) with guaranteed revert.",
    ),
    "agent": (
        "aivitals.agent._cli",
        "agent",
        "Collect GPU, host, process and kernel signals; serve /metrics and a PromQL API.",
    ),
    "collectors": (
        "aivitals.agent._cli",
        "collectors",
        "List the collectors and run each once (up, time, samples, errors).",
    ),
    "rules": (
        "aivitals.alerts._cli",
        "rules",
        "Export, check and test the alert rule pack (Prometheus rule YAML).",
    ),
    "alerts": (
        "aivitals.alerts._cli",
        "alerts",
        "List active and recent alerts of an agent (or a Prometheus).",
    ),
    "console": (
        "aivitals.console._cli",
        "console",
        "Serve the web console (live charts, alerts, diagnosis) over an agent or a Prometheus.",
    ),
    "dashboards": (
        "aivitals.dashboards._cli",
        "dashboards",
        "Export Grafana dashboards generated from the signal catalogue and the rule pack.",
    ),
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*super().list_commands(ctx), *COMMANDS])

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in COMMANDS:
            module, attr, _ = COMMANDS[cmd_name]
            cmd = getattr(importlib.import_module(module), attr)
            assert isinstance(cmd, click.Command)
            return cmd
        return super().get_command(ctx, cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, COMMANDS[name][2]) for name in sorted(COMMANDS)]
        rows += [
            (name, cmd.get_short_help_str(80))
            for name in super().list_commands(ctx)
            if (cmd := super().get_command(ctx, name)) is not None
        ]
        with formatter.section("Commands"):
            formatter.write_dl(sorted(rows))


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="aivitals")
def cli() -> None:
    """aivitals keeps AI model-serving services healthy.

    It instruments and protects a service, collects GPU, host and kernel
    signals, evaluates alert rules, diagnoses the failing layer and root
    cause, and proves all of it by injecting real faults.
    """


def main(argv: list[str] | None = None) -> Any:
    try:
        return cli.main(args=argv, prog_name="aivitals", standalone_mode=False)
    except AivitalsError as exc:
        click.echo(f"{type(exc).__name__}: {exc}", err=True)
        sys.exit(1)
    except click.exceptions.Abort:
        click.echo("Aborted.", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)


if __name__ == "__main__":  # pragma: no cover
    main()
