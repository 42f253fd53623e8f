"""``aivitals fleet up|down|status``: a fleet of simulated nodes on the real engines."""

from __future__ import annotations

import json
from pathlib import Path

import click

from ._fleet import Fleet, FleetConfig, default_state_path

__all__ = ["fleet"]

_STATE = click.option(
    "--state",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help=f"State file [default {default_state_path()}].",
)


@click.group("fleet")
def fleet() -> None:
    """N simulated nodes (service + exporter agent + sim GPU) on real Prometheus,
    Alertmanager, VictoriaMetrics and vmalert."""


@fleet.command("up")
@click.option("--nodes", default=3, show_default=True, help="Simulated nodes (1-64).")
@click.option(
    "--quick/--real-time",
    default=True,
    show_default=True,
    help="1 s scrapes, short rule windows and for: / 60 (as validate --quick), or real time.",
)
@click.option("--rps", default=2.0, show_default=True, help="Steady requests/s per node (0: none).")
@click.option("--no-victoriametrics", is_flag=True, help="Prometheus only.")
@click.option(
    "--workdir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Configs, logs, data and sim GPUs [default: a new temp dir].",
)
@_STATE
def up(
    nodes: int,
    quick: bool,
    rps: float,
    no_victoriametrics: bool,
    workdir: Path | None,
    state: Path | None,
) -> None:
    """Start the fleet and return; it runs until `aivitals fleet down`."""
    f = Fleet(
        FleetConfig(
            nodes=nodes,
            quick=quick,
            rps=rps,
            victoriametrics=not no_victoriametrics,
            workdir=workdir,
            state=state,
        )
    )
    f.up()
    f.detach()  # the fleet outlives this command: `fleet down` stops it
    _print(f)


def _print(f: Fleet) -> None:
    click.echo(f"fleet of {len(f.nodes)} SIMULATED nodes (state {f.state_path})")
    for n in f.nodes:
        click.echo(
            f"  {n.name}: service {n.service_url}  agent {n.agent_url}  sim GPU {n.sim_gpu_dir}"
        )
    click.echo(f"  prometheus       {f.prometheus_url}")
    for name, url in (
        ("alertmanager", f.alertmanager_url),
        ("webhook", f.receiver_url),
        ("victoriametrics", f.victoriametrics_url),
        ("vmalert", f.vmalert_url),
    ):
        if url:
            click.echo(f"  {name:<16} {url}")
    click.echo(f"  alerts received  {f.alerts_file}")
    click.echo(f"diagnose: aivitals diagnose --prometheus {f.prometheus_url} --window 5m")


@fleet.command("down")
@_STATE
def down(state: Path | None) -> None:
    """Stop every process the fleet started (by pid and start time)."""
    f = Fleet.from_state(state)
    stopped = f.down()
    left = [name for name, up in f.running().items() if up]
    click.echo(f"stopped {len(stopped)} processes" + (f"; STILL RUNNING: {left}" if left else ""))


@fleet.command("status")
@_STATE
@click.option("--json", "as_json", is_flag=True, help="As JSON.")
def status(state: Path | None, as_json: bool) -> None:
    """The fleet's URLs and which of its processes run."""
    f = Fleet.from_state(state)
    running = f.running()
    if as_json:
        click.echo(
            json.dumps(
                {
                    "prometheus": f.prometheus_url,
                    "alertmanager": f.alertmanager_url,
                    "victoriametrics": f.victoriametrics_url,
                    "vmalert": f.vmalert_url,
                    "nodes": [
                        {"name": n.name, "service": n.service_url, "agent": n.agent_url}
                        for n in f.nodes
                    ],
                    "running": running,
                },
                indent=2,
            )
        )
        return
    _print(f)
    for name, up in running.items():
        click.echo(f"  {'up  ' if up else 'DOWN'} {name}")
