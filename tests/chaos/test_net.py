from __future__ import annotations

import subprocess
import time
from pathlib import Path

import httpx
import pytest

from aivitals.chaos import FaultContext
from aivitals.load import LoadConfig, run_load
from tests.chaos.conftest import assert_clean, netns_names, require_root, require_tool
from tests.load._server import tiny_server


def _retransmits() -> int:
    lines = Path("/proc/net/snmp").read_text().splitlines()
    tcp = [line.split() for line in lines if line.startswith("Tcp:")]
    return int(tcp[1][tcp[0].index("RetransSegs")])


@pytest.fixture(autouse=True)
def _needs_netns() -> None:
    require_root()
    require_tool("ip")
    require_tool("nft")


def test_network_loss_drops_in_the_runs_own_namespace(runner_factory, chaos_root: Path) -> None:  # type: ignore[no-untyped-def]
    with tiny_server() as srv, runner_factory(FaultContext(target=srv.url)) as runner:
        active = runner.start("network_loss", duration=30, percent=30)
        ns = active.effect.details["netns"]
        assert ns in netns_names()
        rules = subprocess.run(
            ["ip", "netns", "exec", ns, "nft", "list", "ruleset"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert "numgen random mod 100 < 30 drop" in rules
        # The host's own ruleset does not carry the run's table.
        host = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout
        assert f"aivitals_{runner.run.run_id[-6:]}" not in host
        # Traffic through the returned address crosses the lossy path and still arrives
        # (TCP retransmits), slower at the tail than on loopback.
        retrans_before = _retransmits()
        rep = run_load(
            LoadConfig(
                url=active.client_url + "/",
                rate=30,
                duration=1.0,
                timeout=3,
                allow_hosts=active.allow_hosts,
            )
        )
        assert rep.completed > 15
        # The client's sockets live in the host namespace: the host's TCP counters
        # (what the host collector reads) see the retransmissions.
        assert _retransmits() > retrans_before
        assert rep.e2e.max_ms > 150  # at least one retransmission timeout (>= 200 ms)
        runner.stop(active)
        assert ns not in netns_names()
        run_id = runner.run.run_id
    assert_clean(run_id, chaos_root)


def test_network_latency_adds_delay_through_the_proxy(runner_factory, chaos_root: Path) -> None:  # type: ignore[no-untyped-def]
    with tiny_server() as srv, runner_factory(FaultContext(target=srv.url)) as runner:
        active = runner.start("network_latency", duration=30, delay_ms=100)
        t0 = time.monotonic()
        r = httpx.get(active.client_url + "/", timeout=5)
        elapsed = time.monotonic() - t0
        assert r.text == "ok"
        # Connect goes to the proxy at once; request and answer each wait 100 ms.
        assert 0.19 < elapsed < 1.5
        runner.stop(active)
        assert not Path("/sys/class/net", active.effect.details["veth"]).exists()
        run_id = runner.run.run_id
    assert_clean(run_id, chaos_root)


def test_two_network_faults_in_one_run_do_not_collide(runner_factory, chaos_root: Path) -> None:  # type: ignore[no-untyped-def]
    with tiny_server() as srv, runner_factory(FaultContext(target=srv.url)) as runner:
        a = runner.start("network_loss", duration=30, percent=5)
        b = runner.start("network_latency", duration=30, delay_ms=10)
        assert a.effect.details["netns"] != b.effect.details["netns"]
        assert httpx.get(b.client_url + "/", timeout=5).text == "ok"
        run_id = runner.run.run_id
    assert_clean(run_id, chaos_root)
