"""The Fleet page in a real headless Chromium, over a real multi-node VictoriaMetrics.

The fleet is SYNTHETIC (``aivitals.fleet._synth.SynthFleet``: 6 nodes x 8 GPUs, every
series shaped by the H200 recording in ``tests/fixtures/gpu/h200/scenarios.csv``,
30 minutes at 15 s ending now; GPU 5 of ``sim-node-4`` follows the recording's
leak). It is imported into a real VictoriaMetrics, read by ``aivitals console
--prometheus`` run as its command line, and shown in Chromium: every node is on
the page, the faulty node and its leaking GPU come first and red, every other
node and GPU green, "sim" is shown, and nothing errs or fails. The screenshot
goes to ``$AIVITALS_CONSOLE_SHOTS/fleet.png`` when that is set.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from aivitals.console import ConsoleServer, RemoteSource
from aivitals.errors import BackendError
from aivitals.fleet._synth import RecordedShapes, SynthFleet
from tests._servers import free_port, victoria_metrics

from ._browser import XSS, open_page, problems, shot, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

RECORDING = Path(__file__).resolve().parents[1] / "fixtures" / "gpu" / "h200" / "scenarios.csv"
NODES, GPUS, FAULTY_NODE, FAULTY_GPU = 6, 8, 4, 5


def _classes(element: Any) -> set[str]:
    return set((element.get_attribute("class") or "").split())


#: The fleet grid as data, read in one script (the page cannot redraw halfway through it).
_GRID_JS = """
const text = (e) => (e ? e.innerText.trim() : null);
const cls = (e) => e.className.split(/\\s+/).filter(Boolean);
const cards = [...document.querySelectorAll('[data-testid="node"]')].map((c) => ({
  text: text(c), cls: cls(c),
  gpus: [...c.querySelectorAll('[data-testid="gpu"]')].map((g) => ({text: text(g), cls: cls(g)})),
}));
const badges = [...document.querySelectorAll('[data-testid="fleet"] .badge.sim')].map((b) => ({
  text: text(b),
  shown: b.checkVisibility({checkOpacity: true, checkVisibilityCSS: true}),
}));
return {cards, badges, summary: text(document.querySelector('[data-testid="fleet-summary"]'))};
"""


def _grid(browser: Any) -> dict[str, Any]:
    return browser.execute_script(_GRID_JS)  # type: ignore[no-any-return]


def _import(vm_url: str, sf: SynthFleet) -> None:
    r = httpx.post(f"{vm_url}/api/v1/import", content="\n".join(sf.import_lines()) + "\n")
    assert r.status_code == 204, r.text
    httpx.get(f"{vm_url}/internal/force_flush")

    def every_up() -> bool:
        got = httpx.get(f"{vm_url}/api/v1/query", params={"query": "count(up)"}).json()
        rows = got["data"]["result"]
        return bool(rows) and int(float(rows[0]["value"][1])) == 2 * sf.nodes

    wait_until(every_up, 30, "VictoriaMetrics answering every node's up series")


def test_fleet_page_over_victoria_metrics_puts_the_faulty_node_first(browser: Any) -> None:
    sf = SynthFleet(
        RecordedShapes.load(RECORDING),
        nodes=NODES,
        gpus=GPUS,
        points=121,
        step=15.0,
        end=float(int(time.time())),
        fault="gpu_memory_leak",
        faulty_node=FAULTY_NODE,
        faulty_gpu=FAULTY_GPU,
    )
    faulty = sf.node_name(FAULTY_NODE)
    with victoria_metrics() as vm:
        _import(vm.url, sf)
        port = free_port()
        argv = ["console", "--prometheus", vm.url, "--port", str(port), "--interval", "2s"]
        proc = subprocess.Popen(
            [sys.executable, "-m", "aivitals.cli", *argv],
            stderr=subprocess.PIPE,
            env={**os.environ},
        )
        try:
            url = f"http://127.0.0.1:{port}/"
            wait_until(lambda: httpx.get(url, timeout=2).status_code == 200, 20, "the console")
            open_page(browser, url, "fleet")
            # the grid is drawn once the instant values, the alerts and the diagnosis are in;
            # read whole in one script: the page redraws every 2 s, and elements found
            # one call before can be gone the next (a stale element reference)
            grid = wait_until(
                lambda: (
                    (g := _grid(browser))["cards"]
                    and g["cards"][0]["text"].startswith(faulty)
                    and g
                ),
                30,
                f"the fleet grid with {faulty} first",
            )
            cards = grid["cards"]
            names = [c["text"].split()[0] for c in cards]
            assert sorted(names) == sorted(sf.node_name(i) for i in range(1, NODES + 1)), names
            top, rest = cards[0], cards[1:]
            assert "h-bad" in top["cls"] and "unhealthy" in top["text"]
            assert "diagnosis: gpu_memory_leak" in top["text"] and "targets up 2/2" in top["text"]
            gpus = top["gpus"]
            assert len(gpus) == GPUS
            assert gpus[0]["text"].startswith(f"GPU {FAULTY_GPU}")  # the leaking GPU first
            assert "h-bad" in gpus[0]["cls"] and "gpu memory leak" in gpus[0]["text"]
            assert all("h-ok" in g["cls"] for g in gpus[1:])
            for card in rest:
                assert "h-ok" in card["cls"] and "healthy" in card["text"], card["text"]
                assert "diagnosis: healthy" in card["text"] and "targets up 2/2" in card["text"]
                cells = card["gpus"]
                assert len(cells) == GPUS and all("h-ok" in g["cls"] for g in cells)
            # "sim" on every node and every GPU tile, and said in words above the grid
            badges = grid["badges"]
            assert len(badges) == NODES * (GPUS + 1)
            assert all(b["shown"] and b["text"] == "sim" for b in badges), badges
            assert grid["summary"] == (
                f"{NODES} nodes, {NODES * GPUS} GPUs (sim: simulated devices) · unhealthy: {faulty}"
            )
            time.sleep(2.5)  # one more refresh: the grid holds its order
            assert _grid(browser)["cards"][0]["text"].startswith(faulty)
            shot(browser, "fleet", 1000)
            assert problems(browser) == []
        finally:
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=15)
    assert proc.returncode == 0, err.decode()
    assert f"reading the prometheus at {vm.url}" in err.decode()


class _NoDiagnosis(RemoteSource):
    """A Prometheus source whose diagnosis fails (the backend erred mid-computation)."""

    def diagnosis(self, start: float | None, end: float | None) -> dict[str, Any]:
        raise BackendError("the diagnosis' queries failed")


def test_fleet_without_a_diagnosis_says_so_and_shows_hostile_labels_as_text(
    browser: Any,
) -> None:
    sf = SynthFleet(
        RecordedShapes.load(RECORDING),
        nodes=2,
        gpus=1,
        end=float(int(time.time())),
        fault=None,
        faulty_gpu=0,
    )
    with victoria_metrics() as vm:
        _import(vm.url, sf)
        # a node whose name is markup, its only target down
        hostile = {"__name__": "up", "node": XSS, "instance": "10.0.0.9:9478", "job": "agent"}
        line = {"metric": hostile, "values": [0, 0], "timestamps": [t * 1000 for t in _last(2)]}
        r = httpx.post(f"{vm.url}/api/v1/import", content=json.dumps(line) + "\n")
        assert r.status_code == 204, r.text
        httpx.get(f"{vm.url}/internal/force_flush")
        source = _NoDiagnosis(vm.url, kind="prometheus", tick=2.0)
        with ConsoleServer(source) as server:
            open_page(browser, server.url, "fleet")
            banner = wait_until(
                lambda: browser.find_elements("css selector", ".banner"), 30, "the banner"
            )[0].text
            assert "Diagnosis unavailable" in banner and "diagnosis' queries failed" in banner
            assert "health from targets and alerts only" in banner
            cards = wait_until(
                lambda: (
                    len(c := browser.find_elements("css selector", '[data-testid="node"]')) == 3
                    and c
                ),
                30,
                "3 nodes",
            )
            # the down node first, red, its name shown as the characters it is
            assert cards[0].text.startswith(XSS) and "h-bad" in _classes(cards[0])
            assert "targets up 0/1" in cards[0].text and "agent 10.0.0.9:9478 down" in cards[0].text
            assert all("h-ok" in _classes(c) for c in cards[1:])
            assert browser.execute_script("return window.__pwned") is None
            assert not browser.find_elements("css selector", "main img, main script")
            # the one failed request is the diagnosis (502), said on the page
            got = problems(browser)
            assert got and all("/console/api/diagnosis" in p for p in got), got
            browser.get("about:blank")
            browser.get_log("browser")


def _last(n: int, step: int = 15) -> list[int]:
    now = int(time.time())
    return [now - step * (n - 1 - i) for i in range(n)]
