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


def _retransmits(ns: str | None = None) -> int:
    argv = (
        ["cat", "/proc/net/snmp"]
        if ns is None
        else ["ip", "netns", "exec", ns, "cat", "/proc/net/snmp"]
    )
    lines = subprocess.run(argv, capture_output=True, text=True, check=True).stdout.splitlines()
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
        # The answers are dropped where they arrive, in the host namespace: by a table of
        # the run's own that matches only packets in from the fault's veth (dropped on the
        # proxy's output hook, TCP resent them as local send failures, not as losses).
        table = f"aivitals_{runner.run.run_id[-6:]}_answers"
        host = subprocess.run(
            ["nft", "list", "table", "inet", table], capture_output=True, text=True, check=True
        ).stdout
        assert f'iifname "{active.effect.details["veth"]}"' in host
        assert "numgen random mod 100 < 30 drop" in host
        # Traffic through the returned address crosses the lossy path and still arrives
        # (TCP retransmits), slower at the tail than on loopback.
        retrans_before, proxy_before = _retransmits(), _retransmits(ns)
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
        # ...and the proxy's, in the fault's namespace, see its answers lost and resent
        assert _retransmits(ns) > proxy_before
        assert rep.e2e.max_ms > 150  # at least one retransmission timeout (>= 200 ms)
        runner.stop(active)
        assert ns not in netns_names()
        gone = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout
        assert table not in gone
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
