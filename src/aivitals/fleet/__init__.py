"""aivitals.fleet: many SIMULATED nodes on one machine, watched by the real engines.

N nodes (a demo service replica plus ``aivitals agent --exporter`` with its own
sim GPU, labelled ``node="sim-node-<i>"``), one real Prometheus with the
exported rule pack, a real Alertmanager posting to a recording webhook,
VictoriaMetrics scraping the same targets with ``vmalert`` on the same pack.
``aivitals fleet up --nodes 3`` / ``aivitals fleet down``; the tests use the
same class.

**Usage**::

    from aivitals.fleet import Fleet, FleetConfig
    with Fleet(FleetConfig(nodes=3)) as fleet:
        print(fleet.prometheus_url, fleet.victoriametrics_url, fleet.alertmanager_url)
        fleet.alerts()
"""

from __future__ import annotations

from ._fleet import NODE_PREFIX, Fleet, FleetConfig, FleetNode, default_state_path
from ._receiver import read_alerts

__all__ = [
    "NODE_PREFIX",
    "Fleet",
    "FleetConfig",
    "FleetNode",
    "default_state_path",
    "read_alerts",
]
