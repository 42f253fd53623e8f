"""``aivitals dashboards export``: Grafana dashboards generated from the catalogue and the pack."""

from __future__ import annotations

from pathlib import Path

import click

from ..alerts import default_pack, parse_param_pairs
from ._export import configmaps_yaml, export_dashboards

__all__ = ["dashboards"]


@click.group("dashboards")
def dashboards() -> None:
    """Grafana dashboards built from the signal catalogue and the rule pack."""


@dashboards.command("export")
@click.option("--out", "out", required=True, type=click.Path(path_type=Path), help="Directory.")
@click.option(
    "--configmaps",
    is_flag=True,
    help="Also write dashboards-configmaps.yaml (ConfigMaps labelled grafana_dashboard=1).",
)
@click.option("--namespace", default=None, help="Namespace of the ConfigMaps.")
@click.option(
    "--param", "params", multiple=True, metavar="NAME=VALUE", help="A rule-pack parameter."
)
def export(out: Path, configmaps: bool, namespace: str | None, params: tuple[str, ...]) -> None:
    """Write one Grafana dashboard JSON per dashboard into OUT.

    Panel thresholds are the rule pack's (rendered with --param values, as
    `aivitals rules export` does), so graphs and alerts agree.
    """
    pack = default_pack(**parse_param_pairs(params))
    for path in export_dashboards(out, pack):
        click.echo(f"wrote {path}")
    if configmaps:
        path = out / "dashboards-configmaps.yaml"
        path.write_text(configmaps_yaml(pack, namespace), encoding="utf-8")
        click.echo(f"wrote {path}")
