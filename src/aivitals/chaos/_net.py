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
import os
import random
import shutil
import socket
import subprocess
import time

from ..errors import FaultError
from ._fault import Fault, FaultContext, FaultEffect, Touch
from ._journal import netns_exists
from ._spec import FaultSpec, Grading, Knob, Needs, PhaseWindow, Runs, SweepBasis, peak, rise, up

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


def _root_net() -> str | None:
    """Why this machine cannot host a network fault, or None."""
    if os.geteuid() != 0:
        return "needs root for network namespaces and nftables"
    missing = [b for b in ("ip", "nft") if shutil.which(b) is None]
    return f"needs {', '.join(missing)} (apt-get install iproute2 nftables)" if missing else None


# -- network_loss ------------------------------------------------------------------------
def _loss_knob(b: SweepBasis) -> Knob:
    loss = b.pack.tcp_retransmit_ratio
    return Knob(
        param="percent",
        unit="share of TCP segments retransmitted on real links",
        bound=loss,
        source=f"TCPRetransmitsHigh tcp_retransmit_ratio {loss:g} (DOMAIN: packet loss > 5 %)",
        threshold={"percent": up(100 * loss, 1)},
        moderate={"percent": up(200 * loss, 1)},
    )


def _loss_measure(w: PhaseWindow, b: SweepBasis) -> float | str:
    # TCPRetransmitsHigh's ratio (segments sent on real links: loopback left out), in the
    # namespace where it is highest (the host's, or the fault proxy's the agent reads)
    return peak(
        w.end(
            "max(sum by (netns) (rate(host_tcp_retransmitted_segments_total[W])) / ((sum by "
            "(netns) (rate(host_tcp_out_segments_total[W])) - sum by (netns) (rate("
            'host_network_transmit_packets_total{interface="lo"}[W]))) or sum by (netns) '
            "(rate(host_tcp_out_segments_total[W]))))"
        ),
        "host_tcp_retransmitted_segments_total",
    )


NETWORK_LOSS = FaultSpec(
    name="network_loss",
    layer="infrastructure",
    description="packet loss between client and service (netns + nftables numgen drops)",
    alerts=("TCPRetransmitsHigh",),
    signature="network_loss",
    hurts_clients=True,  # resends on the clients' link
    consequences={
        "ProbeLatencyHigh": "the blackbox probe crosses the lossy link, and a lost segment "
        "waits for its retransmission timeout",
        "ProbeFailing": "a probe whose segments are lost again and again passes its timeout",
    },
    needs=Needs("root", _root_net),
    runs=Runs(params={"percent": 10}, quick_params={"percent": 30}),
    grading=Grading(
        knob=_loss_knob,
        magnitude=lambda p, b: float(p["percent"]) / 100.0,
        measure=_loss_measure,
        # A quick sweep on a 2-core machine measures TCPRetransmitsHigh's ratio over the
        # phase at 2.4 %, 3.2 % and 18.4 % for 5, 10 and 30 % of the link's packets
        # dropped (nftables drops exactly that share), so the value is reported, not judged.
        indirect="the retransmitted share under-reads the packets dropped (pure ACKs "
        "count among the segments sent, stalled connections send fewer)",
    ),
)


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
    spec = NETWORK_LOSS
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


# -- network_latency ---------------------------------------------------------------------
def _latency_knob(b: SweepBasis) -> Knob:
    signature_probe = b.signature_param("network_latency", "probe_seconds")
    alert_probe = float(b.pack.probe_latency_seconds)
    probe = min(signature_probe, alert_probe)
    return Knob(
        param="delay_ms",
        unit="s added to the probe's round trip",
        bound=probe,
        source=f"signature network_latency probe_seconds {signature_probe:g} and "
        f"ProbeLatencyHigh {alert_probe:g} s (the issue's 100 ms): the request and its "
        "answer each cross the delaying proxy",
        threshold={"delay_ms": up(1000 * probe / 2, 1)},
        moderate={"delay_ms": up(1000 * probe, 1)},
        note=""
        if signature_probe == alert_probe
        else f"ProbeLatencyHigh asks {alert_probe:g} s: {1000 * alert_probe / 2:g} ms each way",
    )


def _probe(w: PhaseWindow, b: SweepBasis) -> float | str:
    # the probe's mean round trip over 4 probes, its peak in the phase against the calm
    expr = f"max(avg_over_time(probe_duration_seconds[{int(4 * w.tick)}s]))"
    return rise(w, expr, "probe_duration_seconds")


NETWORK_LATENCY = FaultSpec(
    name="network_latency",
    layer="infrastructure",
    description="added latency between client and service (userspace delaying proxy). The "
    "service's own request times start when a request reaches it and do not move; the "
    "agent's blackbox probe, sent the way the clients come in, sees it",
    alerts=("ProbeLatencyHigh",),
    signature="network_latency",
    hurts_clients=True,  # delay on the clients' link
    needs=Needs("root", _root_net),
    runs=Runs(
        # the same 300 ms in both: the fault's default 100 ms is the sweep's at-threshold
        # magnitude (ProbeLatencyHigh 0.2 s over a request and its answer), which a full
        # run misses by a hair (a 0.20 s probe)
        params={"delay_ms": 300},
        quick_params={"delay_ms": 300},
        # the probe must be slower "than before": the diagnosis's 30 s window reached back
        # past a 4 s baseline into network_loss's revert, whose lost packets had slowed the
        # probe, so the before was not calm and the deviation was not seen
        quick_baseline=30.0,
    ),
    grading=Grading(
        knob=_latency_knob,
        magnitude=lambda p, b: 2 * float(p["delay_ms"]) / 1000.0,
        measure=_probe,
    ),
)


class NetworkLatency(_NetFault):
    """``delay_ms`` added each way (plus up to ``jitter_ms``) by the proxy."""

    name = "network_latency"
    spec = NETWORK_LATENCY
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
