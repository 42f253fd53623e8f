"""Dashboard JSON through grafana-foundation-sdk, Grafana's official typed builder.

The SDK is imported here only, when dashboards are built: ``import aivitals``
never needs it. Each dashboard gets the template variables of its spec
(datasource, node, instance, model, gpu; the GPU dashboard namespace and pod
too), a "Not collected" panel first, and the panels of its spec; thresholds
come from the rule pack.
"""

from __future__ import annotations

import json
from typing import Any

from ..alerts import AlertingRule, RulePack, default_pack
from ..errors import ConfigError
from ._query import absent_all, families_in, render_variables
from ._spec import DASHBOARDS, DashboardSpec, PanelSpec, Target
from ._thresholds import Threshold, alert_threshold

__all__ = ["build_dashboards", "panel_families"]

#: Values Grafana would put in place of the variables, used to parse a query for its families.
_PARSE_VALUES = {
    "node": ".*",
    "instance": ".*",
    "model": ".*",
    "gpu": ".*",
    "namespace": ".*",
    "pod": ".*",
    "datasource": "prometheus",
    "__rate_interval": "1m",
    "__interval": "15s",
    "__range": "1h",
}


def _sdk() -> Any:
    try:
        from grafana_foundation_sdk.builders import (  # noqa: F401
            common,
            dashboard,
            heatmap,
            prometheus,
            stat,
            table,
            text,
            timeseries,
        )
        from grafana_foundation_sdk.cog.encoder import JSONEncoder  # noqa: F401
        from grafana_foundation_sdk.models import common as common_m  # noqa: F401
        from grafana_foundation_sdk.models import dashboard as dashboard_m  # noqa: F401
    except ImportError as exc:
        raise ConfigError(
            "building dashboards needs grafana-foundation-sdk: pip install grafana-foundation-sdk "
            f"({exc})"
        ) from None
    import grafana_foundation_sdk as sdk

    return sdk


def panel_families(panel: PanelSpec) -> set[str]:
    """Catalogue families the panel's queries read."""
    out: set[str] = set()
    for target in panel.targets:
        out |= families_in(render_variables(target.expr, _PARSE_VALUES))
    return out


def build_dashboards(pack: RulePack | None = None) -> dict[str, dict[str, Any]]:
    """Every dashboard as Grafana JSON (a dict), by uid; thresholds from ``pack``
    (the default pack when None)."""
    chosen = pack or default_pack()
    return {spec.uid: _dashboard(spec, chosen) for spec in DASHBOARDS}


def _dashboard(spec: DashboardSpec, pack: RulePack) -> dict[str, Any]:
    _sdk()
    from grafana_foundation_sdk.builders import dashboard as db
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.models import dashboard as dm

    ds = dm.DataSourceRef(type_val="prometheus", uid="${datasource}")
    builder = (
        db.Dashboard(spec.title)
        .uid(spec.uid)
        .description(spec.description)
        .tags(list(spec.tags))
        .refresh("30s")
        .time("now-1h", "now")
        .timezone("browser")
        .tooltip(dm.DashboardCursorSync.CROSSHAIR)
        .link(
            db.DashboardLink("aivitals dashboards")
            .type(dm.DashboardLinkType.DASHBOARDS)
            .tags(["aivitals"])
            .as_dropdown(True)
            .include_vars(True)
            .keep_time(True)
        )
    )
    for variable in _variables(ds, spec.variables):
        builder = builder.with_variable(variable)
    next_id = 1
    families: set[str] = set()
    lazy: set[str] = set()
    for row in spec.rows:
        for panel in row.panels:
            families |= panel_families(panel)
            lazy |= set(panel.lazy)
    families -= lazy
    if families:
        builder = builder.with_panel(_coverage_panel(sorted(families), ds, next_id))
        next_id += 1
    if spec.uid == "aivitals-alerts":
        builder = builder.with_panel(_pack_panel(pack, next_id))
        next_id += 1
    for row in spec.rows:
        builder = builder.with_row(db.Row(row.title).id(next_id))
        next_id += 1
        for panel in row.panels:
            threshold = alert_threshold(pack, panel.alert) if panel.alert else None
            builder = builder.with_panel(_panel(panel, ds, next_id, threshold))
            next_id += 1
    built = builder.build()
    doc: dict[str, Any] = json.loads(json.dumps(built, cls=JSONEncoder, sort_keys=False))
    return doc


#: Every template variable a dashboard may name: its dropdown label and values query.
_VARIABLES = {
    "node": ("Node", "label_values(up, node)"),
    "instance": ("Instance", 'label_values(up{node=~"$node"}, instance)'),
    "model": ("Model", "label_values(model)"),
    "gpu": ("GPU", 'label_values(gpu_memory_used_bytes{node=~"$node"}, gpu)'),
    # the pods of GPU processes (the only series that carry them, see the catalogue)
    "namespace": (
        "Namespace",
        'label_values(gpu_process_memory_used_bytes{node=~"$node"}, namespace)',
    ),
    "pod": (
        "Pod",
        'label_values(gpu_process_memory_used_bytes{node=~"$node", namespace=~"$namespace"}, pod)',
    ),
}


def _variables(ds: Any, names: tuple[str, ...]) -> list[Any]:
    from grafana_foundation_sdk.builders import dashboard as db
    from grafana_foundation_sdk.models import dashboard as dm

    unknown = [n for n in names if n not in _VARIABLES]
    if unknown:
        raise ConfigError(f"variables: {unknown} are not among {sorted(_VARIABLES)}")
    out: list[Any] = [db.DatasourceVariable("datasource").label("Data source").type("prometheus")]
    for name in names:
        label, query = _VARIABLES[name]
        out.append(
            db.QueryVariable(name)
            .label(label)
            .datasource(ds)
            .query(query)
            .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
            .sort(dm.VariableSort.ALPHABETICAL_ASC)
            .multi(True)
            .include_all(True)
            # ".*" also matches a series without the label (a service with no GPU,
            # a target scraped without a node label): "All" never hides one
            .all_value(".*")
            .current(dm.VariableOption(selected=True, text="All", value="$__all"))
        )
    return out


def _target(target: Target, ref: str) -> Any:
    from grafana_foundation_sdk.builders import prometheus
    from grafana_foundation_sdk.models import prometheus as pm

    q = prometheus.Dataquery().expr(target.expr).ref_id(ref)
    if target.legend:
        q = q.legend_format(target.legend)
    q = q.instant() if target.instant else q.range()
    formats = {"time_series": pm.PromQueryFormat.TIME_SERIES, "table": pm.PromQueryFormat.TABLE}
    formats["heatmap"] = pm.PromQueryFormat.HEATMAP
    return q.format(formats[target.format])


def _thresholds(threshold: Threshold | None) -> Any:
    from grafana_foundation_sdk.builders import dashboard as db
    from grafana_foundation_sdk.models import dashboard as dm

    steps = [dm.Threshold(value=None, color="green")]
    if threshold is not None:
        color = "red" if threshold.severity == "P0" else "orange"
        if threshold.op in ("<", "<="):
            # a lower bound (utilization too low): the alert's colour below, green above
            steps = [
                dm.Threshold(value=None, color=color),
                dm.Threshold(value=threshold.value, color="green"),
            ]
        elif threshold.op == "==":
            # a 0/1 flag that alerts at 0 (up, ready): green from the next value up
            steps = [
                dm.Threshold(value=None, color=color),
                dm.Threshold(value=threshold.value + 1, color="green"),
            ]
        else:
            steps.append(dm.Threshold(value=threshold.value, color=color))
    return db.ThresholdsConfig().mode(dm.ThresholdsMode.ABSOLUTE).steps(steps)


def _no_value(panel: PanelSpec) -> str:
    names = ", ".join(sorted(panel_families(panel))) or "no metric"
    return f"No data: {names} (or its vLLM/TGI/Triton/DCGM alias) not collected here"


def _panel(panel: PanelSpec, ds: Any, pid: int, threshold: Threshold | None) -> Any:
    from grafana_foundation_sdk.builders import common, heatmap, stat, table, timeseries
    from grafana_foundation_sdk.models import common as cm

    description = panel.description
    if threshold is not None:
        description = (
            f"{description} Threshold: alert {threshold.alert} ({threshold.severity}) fires at "
            f"{threshold.op} {threshold.value:g}, from the rule pack."
        ).strip()
    refs = "ABCDEFGHIJ"
    b: Any
    if panel.kind == "timeseries":
        b = (
            timeseries.Panel()
            .legend(
                common.VizLegendOptions()
                .display_mode(cm.LegendDisplayMode.LIST)
                .placement(cm.LegendPlacement.BOTTOM)
                .show_legend(True)
            )
            .tooltip(
                common.VizTooltipOptions()
                .mode(cm.TooltipDisplayMode.MULTI)
                .sort(cm.SortOrder.DESCENDING)
            )
            .line_width(1)
            .fill_opacity(10 if not panel.stack else 60)
        )
        if panel.stack:
            b = b.stacking(common.StackingConfig().mode(cm.StackingMode.NORMAL))
        if threshold is not None:
            # The SDK's Grafana 11 builds fixed the enum's misspelt name (GraphTresholds...);
            # the 10.x builds have only that one, so either pin builds the same JSON.
            mode: Any = getattr(cm, "GraphThresholdsStyleMode", None) or getattr(
                cm, "GraphTresholdsStyleMode", None
            )
            b = b.thresholds_style(common.GraphThresholdsStyleConfig().mode(mode.LINE))
    elif panel.kind == "stat":
        b = (
            stat.Panel()
            .reduce_options(common.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
            .color_mode(cm.BigValueColorMode.BACKGROUND)
            .graph_mode(cm.BigValueGraphMode.NONE)
            .text_mode(cm.BigValueTextMode.VALUE_AND_NAME)
        )
    elif panel.kind == "table":
        b = table.Panel().show_header(True).cell_height(cm.TableCellHeight.SM)
        if hasattr(b, "align"):
            # Grafana 11's table model defaults its custom field config when it reads a
            # dashboard; written out here, the JSON is what Grafana keeps. 10.x builds lack it.
            b = b.align(cm.FieldTextAlignment.AUTO).inspect(False)
    elif panel.kind == "heatmap":
        # the buckets come from Prometheus (format=heatmap), Grafana does not re-bucket;
        # hide_from sets the plugin's custom field config, which Grafana fills in anyway
        b = (
            heatmap.Panel()
            .calculate(False)
            .hide_from(common.HideSeriesConfig().legend(False).tooltip(False).viz(False))
        )
    else:
        raise ConfigError(f"panel {panel.title!r}: kind {panel.kind!r} takes no queries")
    b = (
        b.id(pid)
        .title(panel.title)
        .datasource(ds)
        .unit(panel.unit)
        .span(panel.width)
        .height(panel.height)
        .no_value(_no_value(panel))
        .thresholds(_thresholds(threshold))
    )
    if description:
        b = b.description(description)
    for i, target in enumerate(panel.targets):
        b = b.with_target(_target(target, refs[i]))
    return b


def _coverage_panel(families: list[str], ds: Any, pid: int) -> Any:
    """One stat naming every family of the dashboard that no target exports: a renamed or
    missing metric says so here instead of leaving an empty graph."""
    from grafana_foundation_sdk.builders import common, stat
    from grafana_foundation_sdk.models import common as cm

    expr = " or ".join(absent_all(f) for f in families)
    return (
        stat.Panel()
        .id(pid)
        .title("Not collected")
        .description(
            "Metrics this dashboard reads that no selected target exports, under our name or any "
            "alias (vLLM, TGI, Triton, DCGM). Empty is good."
        )
        .datasource(ds)
        .span(24)
        .height(3)
        .with_target(_target(Target(expr, "{{metric}}", instant=True), "A"))
        .reduce_options(common.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
        .text_mode(cm.BigValueTextMode.NAME)
        .color_mode(cm.BigValueColorMode.BACKGROUND)
        .graph_mode(cm.BigValueGraphMode.NONE)
        .no_value("Every metric of this dashboard is collected")
        .thresholds(_thresholds(Threshold("not collected", ">=", 1, "P1")))
    )


def _pack_panel(pack: RulePack, pid: int) -> Any:
    from grafana_foundation_sdk.builders import text
    from grafana_foundation_sdk.models import text as tm

    lines = ["| alert | severity | layer | fires when |", "|---|---|---|---|"]
    for group in pack.groups:
        for rule in group.rules:
            if isinstance(rule, AlertingRule):
                sev = rule.labels.get("severity")
                layer = rule.labels.get("layer")
                expr = " ".join(rule.expr.split()).replace("|", "\\|")
                lines.append(
                    f"| {rule.alert} | {sev.source if sev else ''} | "
                    f"{layer.source if layer else ''} | `{expr}` |"
                )
    return (
        text.Panel()
        .id(pid)
        .title("The rule pack")
        .description("Generated from the aivitals rule pack the dashboards were built with.")
        .span(24)
        .height(10)
        .mode(tm.TextMode.MARKDOWN)
        .content("\n".join(lines))
    )
