"""netloss_counters: where does the ``network_loss`` fault's loss show in TCP's counters?

TCPRetransmitsHigh reads the retransmitted share of the segments a host sends. In
full-length validate runs, 10 % packet loss read 2.8 % against the rule's 5 %. This
measures why, without the demo: a local HTTP server (a plain ~5 KB JSON answer, or
16 small streamed chunks like a token stream), the real ``network_loss`` fault in
front of it (its namespace, veth, nft table and proxy), and an open-loop client
through the fault's address. Before and after, it reads ``/proc/net/snmp`` (Tcp
OutSegs, RetransSegs) and ``/proc/net/netstat`` (TcpExt TCPOrigDataSent) in the
host namespace, where the agent reads them, and in the fault's namespace, where the
proxy's sockets answer the clients; and the loopback packets the rule subtracts.

Run as root (it creates a network namespace; everything is reverted):
``.venv/bin/python benchmarks/netloss_counters.py [--percent 10] [--stream]``.
Prints the shares and one line:
``RESULT percent=... stream=0|1 host_ratio=... fault_ns_ratio=... fault_ns_data_ratio=...
agent_ns_ratio=...`` (``host_ratio`` as the rule computes it: retransmits over
out-segments less lo's; ``agent_ns_ratio`` the same from what the agent's host collector
reads in the fault's namespace with ``netns=``, as the demo stack's agent does).
"""

from __future__ import annotations

import argparse
import http.server
import json
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from aivitals.chaos import FaultContext
from aivitals.chaos._runner import ChaosRunner
from aivitals.collect import HostCollector
from aivitals.load import LoadConfig, run_load

#: About the size of one embeddings answer (384 floats as JSON).
BODY = json.dumps({"data": [{"embedding": [0.0123456789] * 384}]}).encode()


def _handler(stream: bool) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self.send_response(200)
            if not stream:
                self.send_header("Content-Length", str(len(BODY)))
                self.end_headers()
                self.wfile.write(BODY)
                return
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for i in range(16):  # a token stream: one small write every 20 ms
                chunk = b'data: {"choices":[{"text":" tok%d"}]}\n\n' % i
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                self.wfile.flush()
                time.sleep(0.02)
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()

        def log_message(self, format: str, *args: object) -> None:
            pass

    return Handler


def _counters(ns: str | None) -> dict[str, int]:
    """Tcp OutSegs and RetransSegs, TcpExt TCPOrigDataSent, in the host or ``ns``."""
    out: dict[str, int] = {}
    for path, prefix in (("/proc/net/snmp", "Tcp:"), ("/proc/net/netstat", "TcpExt:")):
        argv = ["cat", path] if ns is None else ["ip", "netns", "exec", ns, "cat", path]
        text = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
        rows = [line.split() for line in text.splitlines() if line.startswith(prefix)]
        out.update({k: int(v) for k, v in zip(rows[0][1:], rows[1][1:], strict=True)})
    out["lo_tx"] = int(Path("/sys/class/net/lo/statistics/tx_packets").read_text())
    return out


def _agent(ns: str) -> dict[str, float]:
    """What ``HostCollector(netns=[ns])`` reads in the namespace (the rule's inputs)."""
    out: dict[str, float] = {}
    for sample in HostCollector(netns=[ns]).collect():
        if sample.labels.get("netns") != ns:
            continue
        if sample.name.startswith("host_tcp_"):
            out[sample.name] = sample.value
        elif sample.name == "host_network_transmit_packets_total" and (
            sample.labels.get("interface") == "lo"
        ):
            out["lo_tx"] = sample.value
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--percent", type=float, default=10.0)
    parser.add_argument("--stream", action="store_true", help="16 streamed chunks per answer")
    parser.add_argument("--rate", type=float, default=20.0)
    parser.add_argument("--seconds", type=float, default=40.0)
    args = parser.parse_args()

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler(args.stream))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    target = f"http://127.0.0.1:{server.server_address[1]}"
    with tempfile.TemporaryDirectory() as root:
        runner = ChaosRunner(FaultContext(target=target), root=Path(root), handle_signals=False)
        with runner:
            active = runner.start("network_loss", duration=args.seconds + 60, percent=args.percent)
            url = active.client_url
            assert url is not None
            listed = subprocess.run(
                ["ip", "netns", "list"], capture_output=True, text=True, check=True
            ).stdout
            ns = next(line.split()[0] for line in listed.splitlines() if "-loss" in line)
            host0, ns0, agent0 = _counters(None), _counters(ns), _agent(ns)
            report = run_load(
                LoadConfig(
                    url=url.rstrip("/") + ("/v1/completions" if args.stream else "/v1/embeddings"),
                    rate=args.rate,
                    duration=args.seconds,
                    allow_hosts=active.allow_hosts,
                )
            )
            host1, ns1, agent1 = _counters(None), _counters(ns), _agent(ns)
            runner.stop(active)
    server.shutdown()

    def d(a: dict[str, int], b: dict[str, int], key: str) -> int:
        return b[key] - a[key]

    link = d(host0, host1, "OutSegs") - d(host0, host1, "lo_tx")
    host_ratio = d(host0, host1, "RetransSegs") / max(link, 1)
    ns_ratio = d(ns0, ns1, "RetransSegs") / max(d(ns0, ns1, "OutSegs"), 1)
    ns_data = d(ns0, ns1, "RetransSegs") / max(d(ns0, ns1, "TCPOrigDataSent"), 1)
    out_key, re_key = "host_tcp_out_segments_total", "host_tcp_retransmitted_segments_total"
    agent_link = agent1[out_key] - agent0[out_key] - (agent1["lo_tx"] - agent0["lo_tx"])
    agent_ratio = (agent1[re_key] - agent0[re_key]) / max(agent_link, 1)
    print(f"{args.percent:g} % dropped each way; {report.sent} requests, errors {report.errors}")
    for where, a, b in (("host", host0, host1), ("fault ns", ns0, ns1)):
        print(
            f"{where:>8}: OutSegs {d(a, b, 'OutSegs')}, RetransSegs {d(a, b, 'RetransSegs')}, "
            f"TCPOrigDataSent {d(a, b, 'TCPOrigDataSent')}"
        )
    print(f"    host: lo packets {d(host0, host1, 'lo_tx')}, segments on links {link}")
    print(
        f"RESULT percent={args.percent:g} stream={int(args.stream)} host_ratio={host_ratio:.4f} "
        f"fault_ns_ratio={ns_ratio:.4f} fault_ns_data_ratio={ns_data:.4f} "
        f"agent_ns_ratio={agent_ratio:.4f}"
    )


if __name__ == "__main__":
    main()
