"""``aivitals console --prometheus`` over a real VictoriaMetrics: charts, diagnosis, report."""

from __future__ import annotations

import time

import httpx
import pytest

from aivitals.console import ConsoleServer, RemoteSource
from tests._servers import victoria_metrics

pytestmark = pytest.mark.integration


def test_console_over_victoria_metrics() -> None:
    now = int(time.time())
    lines = []
    for i in range(600):  # 10 minutes at 1 s: a GPU process leaking from minute 5
        t = now - 600 + i
        used = 14 * 2**30 + max(0, i - 300) * 40 * 2**20
        lines.append(
            f'gpu_process_memory_used_bytes{{gpu="0",backend="sim",pid="4242",process="python"}} '
            f"{used} {t * 1000}"
        )
        lines.append(f'gpu_memory_used_bytes{{gpu="0",backend="sim"}} {used} {t * 1000}')
        lines.append(f'gpu_memory_total_bytes{{gpu="0",backend="sim"}} {24 * 2**30} {t * 1000}')
        lines.append(f'queue_length{{queue="pool:model"}} {i % 3} {t * 1000}')
    with victoria_metrics() as vm:
        r = httpx.post(f"{vm.url}/api/v1/import/prometheus", content="\n".join(lines) + "\n")
        assert r.status_code == 204, r.text
        httpx.get(f"{vm.url}/internal/force_flush")
        source = RemoteSource(vm.url, kind="prometheus", tick=1.0)
        with ConsoleServer(source) as server:
            api = server.url + "console/api/"
            for _ in range(50):
                got = httpx.get(
                    api + "range",
                    params={"q": "gpu_process_memory_used_bytes", "start": now - 600, "end": now},
                ).json()["data"]
                if got["results"][0]["series"]:
                    break
                time.sleep(0.1)
            [series] = got["results"][0]["series"]
            assert series["metric"]["backend"] == "sim"
            assert sum(v is not None for v in series["values"]) > 100
            meta = httpx.get(api + "meta").json()["data"]
            assert meta["backend"]["kind"] == "prometheus"
            assert meta["thresholds"]["gpu_memory"][0]["value"] == 0.9  # the pack's default
            # computed here, over VictoriaMetrics, for a chosen window
            d = httpx.get(
                api + "diagnosis", params={"start": now - 600, "end": now}, timeout=60
            ).json()["data"]
            assert d["findings"] and d["findings"][0]["signature"] == "gpu_memory_leak"
            assert d["findings"][0]["timeline"]
            # VictoriaMetrics without vmalert answers no alerts and no rules
            alerts = httpx.get(api + "alerts")
            assert alerts.status_code == 200 and alerts.json()["data"]["alerts"] == []
            report = httpx.get(api + "report", timeout=60).json()["data"]
            assert report["peak_queue"] == 2.0
