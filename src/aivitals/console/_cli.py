"""``aivitals console``: the web console over an agent or a Prometheus / VictoriaMetrics."""

from __future__ import annotations

import signal
import threading
from types import FrameType

import click

from ..agent import parse_duration, parse_listen
from ..errors import ConfigError
from ..tsdb import DEFAULT_AGENT, RemoteConnection, remote_options
from ._server import ConsoleServer
from ._source import RemoteSource

__all__ = ["console"]


@click.command("console")
@click.option("--agent", "agent_url", metavar="URL", help=f"An aivitals agent [{DEFAULT_AGENT}].")
@click.option("--prometheus", metavar="URL", help="A Prometheus or VictoriaMetrics instead.")
@click.option("--listen", default="127.0.0.1:9465", show_default=True, help="host:port to serve.")
@click.option("--port", type=int, help="Shorthand for --listen 127.0.0.1:PORT.")
@click.option("--allow-remote", is_flag=True, help="Allow listening on a non-loopback address.")
@click.option(
    "--interval",
    default=None,
    help="How often the pages refresh (default: 5s for an agent, 15s for Prometheus).",
)
@remote_options
def console(
    agent_url: str | None,
    prometheus: str | None,
    listen: str,
    port: int | None,
    allow_remote: bool,
    interval: str | None,
    connection: RemoteConnection,
) -> None:
    """Serve the web console (live charts, alerts, diagnosis, fleet, daily report).

    Reads an agent's API, or any Prometheus or VictoriaMetrics (the diagnosis is
    then computed here). Listens on 127.0.0.1 unless --allow-remote; read-only.
    """
    if agent_url and prometheus:
        raise ConfigError("choose one of --agent and --prometheus")
    kind = "prometheus" if prometheus else "agent"
    url = prometheus or agent_url or DEFAULT_AGENT
    tick = parse_duration("interval", interval) if interval else (15.0 if prometheus else 5.0)
    if port is not None:
        listen = f"127.0.0.1:{port}"
    host, bind_port = parse_listen(listen, allow_remote=allow_remote)
    source = RemoteSource(url, kind=kind, tick=tick, connection=connection)
    server = ConsoleServer(source, host, bind_port)
    done = threading.Event()

    def _stop(signum: int, frame: FrameType | None) -> None:
        done.set()

    previous = {s: signal.signal(s, _stop) for s in (signal.SIGINT, signal.SIGTERM)}
    server.start()
    try:
        click.echo(f"aivitals console on {server.url} (reading the {kind} at {url})", err=True)
        while not done.wait(1.0):
            pass
    finally:
        server.stop()
        for s, handler in previous.items():
            signal.signal(s, handler)
