"""Network faults between client and service, inside a namespace the run creates.

Layout (per fault)::

    host netns                          run's netns aivitals-<id>
    client --> 10.213.A.B+2:P  ==veth==>  proxy listening on 10.213.A.B+2:P
                                          nft table: numgen random mod 100 < N drop
    service <-- 127.0.0.1:svc  <---------- proxy's upstream socket (host netns)

The kernel here has no netem, so loss is an nftables rule in the run's own
table inside the namespace, and delay is added by the userspace proxy. The
client must use the URL the fault returns (``FaultEffect.client_url``); the
host's routes and firewall are never touched: the veth's connected /30 route
appears and goes with the veth.
"""

from __future__ import annotations

import ipaddress
import random
import socket
import subprocess
import time

from ..errors import FaultError
from ._fault import Fault, FaultContext, FaultEffect, Touch
from ._journal import netns_exists

__all__ = ["FAULT_NETNS_GLOB", "NetworkLatency", "NetworkLoss"]

#: Every namespace a network fault creates (``aivitals-<run>-<kind>``): the proxy that
#: answers the clients sends and resends its segments there, so an agent that should
#: see the fault's loss as the service's edge reads it (``AgentConfig.netns``).
_NETNS_PREFIX = "aivitals-"
FAULT_NETNS_GLOB = _NETNS_PREFIX + "*"

_BASE = ipaddress.IPv4Network("10.213.0.0/16")


def _ip(*argv: str) -> None:
    r = subprocess.run(argv, capture_output=True, text=True, timeout=15, check=False)
    if r.returncode != 0:
        raise FaultError(f"{' '.join(argv)}: {r.stderr.strip() or r.returncode}")


def _used_networks() -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    out = subprocess.run(
        ["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True, check=False, timeout=10
    ).stdout
    nets = []
    for line in out.splitlines():
        parts = line.split()
        if "inet" in parts:
            nets.append(ipaddress.ip_interface(parts[parts.index("inet") + 1]).network)
    return nets


def _pick_subnet() -> ipaddress.IPv4Network:
    used = _used_networks()
    subnets: list[ipaddress.IPv4Network] = list(_BASE.subnets(new_prefix=30))
    for _ in range(200):
        net = random.choice(subnets)
        if not any(net.overlaps(u) for u in used):
            return net
    raise FaultError("no free /30 left in 10.213.0.0/16 for the fault's veth")


def _wait_port(host: str, port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise FaultError(f"the fault's proxy did not listen on {host}:{port}")


class _NetFault(Fault):
    """Namespace + veth + proxy; subclasses add loss rules or delay."""

    proxy_port = 8080

    def _start(self, ctx: FaultContext) -> FaultEffect:
        assert self.run is not None
        svc_host, svc_port = ctx.host_port
        tag = self.run.run_id[-6:]
        ns = f"{_NETNS_PREFIX}{tag}-{self.name.split('_')[1][:4]}"
        host_if, ns_if = f"avh{tag}{self.name[8:10]}", f"avn{tag}{self.name[8:10]}"
        net = _pick_subnet()
        host_ip, ns_ip = (str(a) for a in list(net.hosts())[:2])
        self.record("netns", name=ns)
        _ip("ip", "netns", "add", ns)
        self.record("link", name=host_if)
        _ip("ip", "link", "add", host_if, "type", "veth", "peer", "name", ns_if, "netns", ns)
        _ip("ip", "addr", "add", f"{host_ip}/30", "dev", host_if)
        _ip("ip", "link", "set", host_if, "up")
        for argv in (
            ["ip", "addr", "add", f"{ns_ip}/30", "dev", ns_if],
            ["ip", "link", "set", ns_if, "up"],
            ["ip", "link", "set", "lo", "up"],
        ):
            _ip("ip", "netns", "exec", ns, *argv)
        self._rules(ns, self.proxy_port, host_if)
        delay = self.values.get("delay_ms", 0.0) / 1000.0
        jitter = self.values.get("jitter_ms", 0.0) / 1000.0
        self.helper(
            "proxy",
            f"{self.name}-proxy",
            netns=ns,
            listen=[ns_ip, self.proxy_port],
            upstream=[svc_host, svc_port],
            delay=delay,
            jitter=jitter,
        )
        _wait_port(ns_ip, self.proxy_port)
        url = f"http://{ns_ip}:{self.proxy_port}"
        return FaultEffect(
            client_url=url,
            allow_hosts=(ns_ip,),
            details={"netns": ns, "veth": host_if, "proxy": url},
        )

    def _rules(self, ns: str, port: int, host_if: str) -> None:
        """Add nft rules for the fault's packets; none by default."""


class NetworkLoss(_NetFault):
    """``percent`` of the packets between client and proxy dropped, both ways.

    Each direction is dropped where it arrives, as a lossy link loses it: the
    clients' segments at the namespace's input, the proxy's answers at the host's
    input from the fault's own veth. A drop on the sender's output hook is no loss:
    TCP takes it as a local send failure and sends again at once without counting a
    retransmit (``benchmarks/netloss_counters.py`` measures it: 10 % dropped there
    resends 2 % of the proxy's data segments).
    """

    name = "network_loss"
    params = {"percent": (10, 1, 100)}
    touches = (
        Touch(
            "",
            "creates a network namespace aivitals-<run>-loss, a veth pair, an nft table "
            "inside the namespace and one in the host namespace matching only packets "
            "from the fault's veth, and starts a proxy process",
            "the run: all deleted and stopped at revert; cleanup does it after a crash",
            processes=True,
        ),
    )

    def _rules(self, ns: str, port: int, host_if: str) -> None:
        assert self.run is not None
        table = f"aivitals_{self.run.run_id[-6:]}"
        n = int(self.values["percent"])
        inside = (
            f"table inet {table} {{\n"
            f" chain c_in {{ type filter hook input priority 0; policy accept;\n"
            f"  tcp dport {port} numgen random mod 100 < {n} drop\n }}\n"
            "}\n"
        )
        self.record("nft_table", family="inet", name=table, netns=ns)
        _nft(inside, ns)
        if not netns_exists(ns):
            raise FaultError(f"namespace {ns} vanished")
        # the answers, where they arrive: only packets in from this run's own veth
        host_table = f"{table}_answers"
        answers = (
            f"table inet {host_table} {{\n"
            f" chain c_in {{ type filter hook input priority 0; policy accept;\n"
            f'  iifname "{host_if}" tcp sport {port} numgen random mod 100 < {n} drop\n }}\n'
            "}\n"
        )
        self.record("nft_table", family="inet", name=host_table, netns=None)
        _nft(answers, None)


def _nft(ruleset: str, ns: str | None) -> None:
    prefix = ["ip", "netns", "exec", ns] if ns else []
    r = subprocess.run(
        [*prefix, "nft", "-f", "-"],
        input=ruleset,
        capture_output=True,
        text=True,
        timeout=15,
        check=False,
    )
    if r.returncode != 0:
        raise FaultError(f"nft in {ns or 'the host namespace'}: {r.stderr.strip()}")


class NetworkLatency(_NetFault):
    """``delay_ms`` added each way (plus up to ``jitter_ms``) by the proxy."""

    name = "network_latency"
    params = {"delay_ms": (100, 1, 10000), "jitter_ms": (0, 0, 10000)}
    touches = (
        Touch(
            "",
            "creates a network namespace aivitals-<run>-late and a veth pair, and starts a "
            "delaying proxy process",
            "the run: all deleted and stopped at revert; cleanup does it after a crash",
            processes=True,
        ),
    )
