"""Grafana dashboards generated from the signal catalogue and the rule pack.

Six dashboards (overview, model, queue and workers, GPU, host, alerts) share
the template variables node, instance, model and GPU (the GPU dashboard adds
namespace and pod, a GPU process's Kubernetes pod); every query reads our
metric name or any vLLM / TGI / Triton / DCGM alias the catalogue maps onto
it, every panel that mirrors an alert draws that alert's threshold, and a
"Not collected" panel names each metric no target exports. Built with
grafana-foundation-sdk (imported only when dashboards are built).

**Usage**::

    from aivitals.dashboards import build_dashboards, export_dashboards
    docs = build_dashboards()                 # uid -> dashboard JSON (dict)
    export_dashboards(Path("out/"))           # out/aivitals-overview.json, ...
"""

from __future__ import annotations

from ._build import build_dashboards, panel_families
from ._export import configmaps_yaml, dashboard_text, export_dashboards
from ._query import FOREIGN_LABELS, absent_all, alternatives, families_in, render_variables, series
from ._spec import COMMON_VARIABLES, DASHBOARDS, DashboardSpec, PanelSpec, RowSpec, Target
from ._thresholds import Threshold, alert_threshold

__all__ = [
    "COMMON_VARIABLES",
    "DASHBOARDS",
    "FOREIGN_LABELS",
    "DashboardSpec",
    "PanelSpec",
    "RowSpec",
    "Target",
    "Threshold",
    "absent_all",
    "alert_threshold",
    "alternatives",
    "build_dashboards",
    "configmaps_yaml",
    "dashboard_text",
    "export_dashboards",
    "families_in",
    "panel_families",
    "render_variables",
    "series",
]
