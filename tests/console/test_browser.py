"""The console in a real headless Chromium, over a running demo stack.

Every page loads with no console error and no failed request; the overview's
charts hold data points from the stack; a GPU memory leak injected with
compressed time shows as GPUProcessMemoryGrowth firing on the alerts page and
as the named leak with its timeline on the diagnosis page; "sim" is shown.
Markup in label values and alert annotations shows as text. Screenshots go to
``$AIVITALS_CONSOLE_SHOTS`` when set (``docs/console`` refreshes the docs).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from aivitals.signals import Sample

from ._browser import XSS, open_page, problems, shot, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PAGES = ("overview", "alerts", "diagnosis", "fleet", "report")


def _points(driver: Any) -> dict[str, int]:
    rows = driver.execute_script(
        "return window.__aivitals ? [...window.__aivitals.registry]"
        ".map(p => [p.spec.id, p.points]) : []"
    )
    return dict(rows)


@pytest.fixture(scope="module")
def stack() -> Iterator[Any]:
    from aivitals.demo import Stack, StackConfig
    from aivitals.load import LoadConfig, run_load

    with Stack(StackConfig(quick=True)) as st:
        stop = threading.Event()
        cfg = LoadConfig(url=st.service.url + "/v1/completions", rate=4, duration=600, max_tokens=8)
        t = threading.Thread(target=run_load, args=(cfg,), kwargs={"stop": stop}, daemon=True)
        t.start()
        try:
            yield st
        finally:
            stop.set()
            t.join(timeout=30)


def test_pages_load_clean_with_data_and_sim_labels(stack: Any, browser: Any) -> None:
    url = stack.agent.url
    # markup in a label value: must show as text in the legend, never run
    for i in range(5):
        stack.agent.store.append_samples(
            [Sample("queue_length", {"queue": XSS, "job": "demo"}, 1.0)],
            default_timestamp=time.time() - 4 + i,
        )
    open_page(browser, url, "overview")
    problems(browser)  # drop what the first navigation logged before meta (none expected)
    pts = wait_until(
        lambda: (
            (p := _points(browser))
            and all(
                p.get(k, 0) >= 3 for k in ("req_rate", "latency", "gpu_process_memory", "host_cpu")
            )
            and p
        ),
        60,
        "overview charts with data points",
    )
    assert sum(pts.values()) > 40, pts
    sim = browser.find_element("id", "gpu-kind")
    assert sim.is_displayed() and "sim" in sim.text
    gpu_panel = browser.find_element("css selector", '[data-testid="panel-gpu_memory"]')
    assert "sim" in gpu_panel.text
    assert "times in" in browser.find_element("id", "tz").text
    legend = browser.find_element("css selector", '[data-testid="panel-queue_length"]').text
    wait_until(
        lambda: (
            XSS in browser.find_element("css selector", '[data-testid="panel-queue_length"]').text
        ),
        15,
        "the label value shown as text",
    )
    assert browser.execute_script("return window.__pwned") is None, legend
    for page in PAGES[1:]:
        open_page(browser, url, page)
        testid = {"alerts": "alerts-active", "diagnosis": "diagnosis", "fleet": "fleet"}.get(
            page, "report"
        )
        wait_until(
            lambda testid=testid: (
                "loading"
                not in browser.find_element("css selector", f'[data-testid="{testid}"]').text
                and "computing"
                not in browser.find_element("css selector", f'[data-testid="{testid}"]').text
            ),
            40,
            f"{page} rendered",
        )
        if page == "fleet":
            assert "sim" in browser.find_element("css selector", '[data-testid="fleet"]').text
            # one machine: its agent, its service's target and its GPU are one node
            nodes = browser.find_elements("css selector", '[data-testid="node"]')
            assert len(nodes) == 1, [n.text for n in nodes]
            assert nodes[0].find_elements("css selector", '[data-testid="gpu"]')
    assert problems(browser) == []
    assert browser.execute_script("return window.__pwned") is None


def test_gpu_leak_shows_on_alerts_and_diagnosis(stack: Any, browser: Any, tmp_path: Path) -> None:
    from aivitals.chaos import ChaosRunner

    ctx = stack.fault_context()
    with ChaosRunner(ctx, root=tmp_path / "chaos", handle_signals=False) as runner:
        t0 = time.monotonic()
        runner.start("gpu_memory_leak", duration=120, mib_per_request=48)
        open_page(browser, stack.agent.url, "alerts")
        row = wait_until(
            lambda: [
                r
                for r in browser.find_elements(
                    "css selector",
                    '[data-testid="alerts-active"] [data-testid="alert-GPUProcessMemoryGrowth"]',
                )
                if "firing" in r.text
            ],
            90,
            "GPUProcessMemoryGrowth firing on the alerts page",
        )
        fired_after = time.monotonic() - t0
        text = row[0].text
        assert "P1" in text and "model" in text and "nvidia-smi" in text  # severity, layer, runbook
        shot(browser, "alerts")
        open_page(browser, stack.agent.url, "diagnosis")
        finding = wait_until(
            lambda: browser.find_elements(
                "css selector", '[data-testid="finding-gpu_memory_leak"]'
            ),
            60,
            "the diagnosis naming the GPU memory leak",
        )[0]
        assert "GPU memory leak" in finding.text
        timeline = finding.find_element("css selector", '[data-testid="timeline"]')
        assert timeline.find_elements("css selector", "li")
        # the evidence's series charted, with points
        wait_until(
            lambda: any(k.startswith("evidence_") and v > 0 for k, v in _points(browser).items()),
            30,
            "the evidence charts",
        )
        shot(browser, "diagnosis", 1900)
        open_page(browser, stack.agent.url, "overview")
        wait_until(lambda: _points(browser).get("gpu_process_memory", 0) > 0, 30, "overview")
        browser.find_element("id", "range").send_keys("5 min")
        time.sleep(2.5)
        shot(browser, "overview", 2200)
        # "diagnose this window": drag across a chart; a read-only GET of that window
        from selenium.webdriver.common.action_chains import ActionChains

        over = browser.find_element(
            "css selector", '[data-testid="panel-gpu_process_memory"] .u-over'
        )
        width = over.size["width"]
        ActionChains(browser).move_to_element_with_offset(
            over, width // 2 - 10, 0
        ).click_and_hold().move_by_offset(-width // 3, 0).release().perform()
        wait_until(lambda: "#/diagnosis?start=" in browser.current_url, 10, "the drag's window")
        heading = wait_until(
            lambda: (
                (h := browser.find_element("css selector", "main h2").text).startswith(
                    "Diagnosis of"
                )
                and h
            ),
            10,
            "the window's diagnosis page",
        )
        wait_until(
            lambda: (
                "window" in browser.find_element("css selector", '[data-testid="diagnosis"]').text
            ),
            60,
            f"the diagnosis of {heading}",
        )
        # the fleet's screenshot is tests/console/test_fleet.py's, over a real fleet
        for page in ("report",):
            open_page(browser, stack.agent.url, page)
            time.sleep(3)
            shot(browser, page)
    assert problems(browser) == []
    print(f"GPUProcessMemoryGrowth firing {fired_after:.0f} s after the leak started")


def test_markup_in_alerts_shows_as_text(browser: Any) -> None:
    """A hostile alert (labels, annotations, runbook) through an agent: text, never markup."""
    from aivitals.agent import Agent, AgentConfig

    alert = {
        "alertname": "QueueBacklog",
        "labels": {"severity": "P0", "layer": "service", "queue": XSS},
        "annotations": {"summary": XSS, "runbook": f"curl {XSS}"},
        "state": "firing",
        "active_at": time.time() - 60,
        "fired_at": time.time() - 30,
        "resolved_at": None,
        "value": 42.0,
    }
    with Agent(AgentConfig(listen="127.0.0.1:0", interval=1.0, gpu="none")) as agent:
        agent.set_alerts_provider(lambda: {"alerts": [alert], "history": [alert]})
        open_page(browser, agent.url, "alerts")
        row = wait_until(
            lambda: browser.find_elements("css selector", '[data-testid="alert-QueueBacklog"]'),
            20,
            "the alert row",
        )[0]
        assert XSS in row.text and "42" in row.text and "> 20" in row.text
        assert browser.execute_script("return window.__pwned") is None
        assert not browser.find_elements("css selector", "main img, main script")
        open_page(browser, agent.url, "overview")
        wait_until(
            lambda: browser.find_elements("css selector", '[data-testid="not-collected"]'),
            20,
            "not collected on an agent without those series",
        )
        # Judged while the agent still serves. Leaving the block at once would stop it
        # while the overview's range requests are still queued on kept-alive connections,
        # and they would meet the agent's 503 "the agent has stopped".
        _wait_for_requests_to_settle(browser)
        assert problems(browser) == []
        browser.get("about:blank")  # nothing left polling the agent that is about to stop


def _wait_for_requests_to_settle(browser: Any, quiet: float = 2.0, limit: float = 20.0) -> None:
    """Until no request of the page has completed for ``quiet`` seconds (at most ``limit``)."""
    count = "return performance.getEntriesByType('resource').length"
    last, since, end = -1, time.monotonic(), time.monotonic() + limit
    while time.monotonic() < end:
        n = browser.execute_script(count)
        if n != last:
            last, since = n, time.monotonic()
        elif time.monotonic() - since >= quiet:
            return
        time.sleep(0.25)


class _SlowPrometheus:
    """A Prometheus stand-in: range queries take ``delay`` s and find nothing; alerts fail."""

    def __init__(self, delay: float) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        outer = self
        self.delay = delay
        self.in_flight = 0
        self.max_in_flight = 0
        self.ranges = 0
        self.lock = threading.Lock()

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a: Any) -> None:
                pass

            def do_GET(self) -> None:
                path = self.path.split("?")[0]
                if path == "/api/v1/query_range":
                    with outer.lock:
                        outer.in_flight += 1
                        outer.ranges += 1
                        outer.max_in_flight = max(outer.max_in_flight, outer.in_flight)
                    time.sleep(outer.delay)
                    with outer.lock:
                        outer.in_flight -= 1
                    body = b'{"status":"success","data":{"resultType":"matrix","result":[]}}'
                    code = 200
                elif path == "/api/v1/query":
                    body = b'{"status":"success","data":{"resultType":"vector","result":[]}}'
                    code = 200
                else:
                    body = b'{"status":"error","errorType":"unavailable","error":"overloaded"}'
                    code = 503
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


NON_OVERLAP = """
const out = {};
for (const e of performance.getEntriesByType("resource")) {
  if (!e.name.includes("/console/api/range")) continue;
  const u = new URL(e.name);
  const key = u.searchParams.getAll("q").join("\\n");
  (out[key] = out[key] || []).push([e.startTime, e.responseEnd]);
}
return out;
"""


def test_slow_and_failing_backend_is_said_and_never_piled_up(browser: Any) -> None:
    from aivitals.console import ConsoleServer, RemoteSource

    slow = _SlowPrometheus(delay=1.5)
    try:
        source = RemoteSource(slow.url, kind="prometheus", tick=1.0, timeout=5.0)
        with ConsoleServer(source) as server:
            browser.get(server.url + "#/overview")
            conn = wait_until(
                lambda: "backend problem" in (t := browser.find_element("id", "conn").text) and t,
                20,
                "the status bar saying the backend has a problem",
            )
            assert "retrying" in conn
            wait_until(
                lambda: (
                    len(browser.find_elements("css selector", '[data-testid="not-collected"]')) >= 5
                ),
                30,
                "panels saying not collected",
            )
            time.sleep(6)  # ticks of 1 s against answers of 1.5 s or more per expression
            per_panel = browser.execute_script(NON_OVERLAP)
            assert len(per_panel) >= 10
            for key, spans in per_panel.items():
                spans.sort()
                for (_, end), (start, _) in itertools.pairwise(spans):
                    assert start >= end - 1, f"two requests in flight for one panel: {key}"
            browser.get(server.url + "#/alerts")
            banner = wait_until(
                lambda: browser.find_elements("css selector", ".banner"), 20, "alerts banner"
            )[0].text
            assert "Alerts unavailable" in banner and "Retrying in" in banner
            browser.get("about:blank")
    finally:
        slow.close()
    # one in flight per panel: the backend never saw more than the panels at once
    assert slow.max_in_flight <= 20, slow.max_in_flight
    browser.get_log("browser")  # the 502s of this test are expected: not the next test's


def test_agent_gone_is_said_and_retried_with_backoff(browser: Any) -> None:
    from aivitals.agent import Agent, AgentConfig

    agent = Agent(AgentConfig(listen="127.0.0.1:0", interval=1.0, gpu="none"))
    agent.start()
    try:
        open_page(browser, agent.url, "overview")
    finally:
        agent.stop()
    conn = wait_until(
        lambda: "unreachable" in (t := browser.find_element("id", "conn").text) and t,
        20,
        "the status bar saying the console's server is unreachable",
    )
    assert "retrying" in conn
    # backoff: after the failures, far fewer tries than one per panel per second
    count = "return performance.getEntriesByType('resource').length"
    before = browser.execute_script(count)
    time.sleep(6)
    tries = browser.execute_script(count) - before
    panels = len(browser.find_elements("css selector", ".panel"))
    assert tries < panels * 6 / 2, (tries, panels)
    msg = browser.find_element("css selector", ".panel .msg.err").text
    assert "unreachable" in msg and "retrying in" in msg
    browser.get("about:blank")
    browser.get_log("browser")  # the refused connections were expected here
