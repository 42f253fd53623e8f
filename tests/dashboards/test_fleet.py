"""Every dashboard query on the fleet of `aivitals fleet`: its real Prometheus and its
VictoriaMetrics (scraping the same targets, vmalert writing ALERTS back), with the node
variable set to one node. A simulated Xid on that node fires GPUXidError in both.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from aivitals.collect.gpu import SimGPU
from aivitals.dashboards import build_dashboards, render_variables
from aivitals.fleet import Fleet, FleetConfig
from tests._servers import require_binary

from .test_prometheus import MAY_BE_EMPTY, NO_DATA_HERE, ask

pytestmark = [pytest.mark.integration, pytest.mark.slow]

#: Filled in test_prometheus.py only by the vLLM/TGI/DCGM fixture: no engine in the fleet.
FLEET_EMPTY: dict[tuple[str, str], str] = {
    ("KV cache in use", "A"): "kv_cache_usage_ratio: only an engine (vLLM) exports it; "
    "test_prometheus.py fills it through the vLLM alias",
    ("Time to first token P50 / P99", "A"): "the fleet's traffic is embeddings only: no "
    "generation, so no first token (test_prometheus.py streams completions)",
    ("Time to first token P50 / P99", "B"): "as above",
    ("Time per output token P50 / P99", "A"): "as above",
    ("Time per output token P50 / P99", "B"): "as above",
    ("Targets down", "A"): "every fleet target is up (test_prometheus.py has a down one)",
}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    for binary in ("prometheus", "prometheus-alertmanager", "victoria-metrics", "vmalert"):
        require_binary(binary)
    work = tmp_path_factory.mktemp("dash-fleet")
    f = Fleet(
        # with Alertmanager: FleetConfig(alertmanager=False) passes vmalert -notifier.blackhole,
        # which the Debian vmalert does not know
        FleetConfig(nodes=2, rps=2.0, workdir=work / "wd", state=work / "fleet.json")
    )
    stop = threading.Event()

    def xids() -> None:
        # simulated Xid 48s (double-bit ECC; labelled backend="sim") every 2 s: the compressed
        # pack's increase() window is seconds long, so GPUXidError stays firing while
        # queried. Not 79: the sim keeps a device that fell off the bus lost, and node 2's
        # model calls would all fail
        gpu = SimGPU(f.node(2).sim_gpu_dir)
        for _ in range(300):  # bounded
            gpu.inject_xid(0, 48)
            if stop.wait(2.0):
                return

    injector = threading.Thread(target=xids, daemon=True)
    try:
        f.up()
        injector.start()
        # VictoriaMetrics hides the newest 30 s from queries (-search.latencyOffset)
        time.sleep(45)
        yield f
    finally:
        stop.set()
        injector.join(timeout=10)
        f.down()
        left = [name for name, alive in f.running().items() if alive]
        assert left == [], f"still running after down(): {left}"


def _results(url: str, docs: dict[str, dict[str, Any]], node: str) -> dict[tuple[str, str], Any]:
    values = {"node": node, "instance": ".*", "model": ".*", "gpu": ".*", "__rate_interval": "10s"}
    values |= {"namespace": ".*", "pod": ".*"}
    now = time.time()
    out: dict[tuple[str, str], Any] = {}
    for doc in docs.values():
        for panel in doc["panels"]:
            for target in panel.get("targets", []):
                key = (panel["title"], target["refId"])
                out[key] = ask(url, target, render_variables(target["expr"], values), now)
    return out


@pytest.mark.parametrize("engine", ["prometheus", "victoriametrics"])
def test_every_panel_query_on_the_fleet(fleet: Fleet, engine: str, tmp_path: Path) -> None:
    docs = build_dashboards()
    url = fleet.prometheus_url if engine == "prometheus" else fleet.victoriametrics_url
    assert url is not None
    node = fleet.node(2).name
    results = _results(url, docs, node)
    allowed = {**NO_DATA_HERE, **MAY_BE_EMPTY, **FLEET_EMPTY}
    empty = sorted(
        f"{title} [{ref}]"
        for (title, ref), result in results.items()
        if not result and (title, ref) not in allowed and title != "Not collected"
    )
    assert not empty, f"{engine}: queries without data for {node}: {empty}"
    for (title, _ref), result in results.items():
        nodes = {s["metric"].get("node") for s in result} - {None}
        assert nodes <= {node}, f"{engine}: {title} leaks other nodes: {nodes}"
    xid = results[("Xid errors per code", "A")]
    assert any(s["metric"].get("xid") == "48" for s in xid), xid
    firing = results[("Firing alerts", "A")]
    assert any(s["metric"]["alertname"] == "GPUXidError" for s in firing), firing
