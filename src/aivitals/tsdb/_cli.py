"""``aivitals query``: evaluate PromQL on an agent, a snapshot file or Prometheus."""

from __future__ import annotations

import json
import math
import time
from typing import Any

import click

from ..errors import ConfigError
from ._options import remote_options
from ._prometheus import PrometheusBackend
from ._remote import RemoteConnection
from ._time import DEFAULT_AGENT, parse_duration, parse_time
from ._types import Backend, QueryResult

__all__ = ["query"]


def _backend(
    prometheus: str | None,
    snapshot: str | None,
    agent: str | None,
    connection: RemoteConnection | None = None,
) -> Backend:
    chosen = [x for x in (prometheus, snapshot, agent) if x]
    if len(chosen) > 1:
        raise ConfigError("choose one of --prometheus, --snapshot, --agent")
    if snapshot:
        from ._store import Store

        return Store.load(snapshot)
    return PrometheusBackend(prometheus or agent or DEFAULT_AGENT, connection=connection)


@click.command("query")
@click.argument("expr")
@click.option("--at", "at", help="Evaluation time: epoch seconds, now, now-5m.")
@click.option("--range", "range_", nargs=3, metavar="START END STEP", help="A range query instead.")
@click.option("--prometheus", metavar="URL", help="Query a Prometheus/VictoriaMetrics server.")
@click.option("--snapshot", metavar="FILE", help="Query a snapshot file (aivitals snapshot).")
@click.option("--agent", metavar="URL", help=f"Query an aivitals agent [default {DEFAULT_AGENT}].")
@remote_options
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def query(
    expr: str,
    at: str | None,
    range_: tuple[str, str, str] | None,
    prometheus: str | None,
    snapshot: str | None,
    agent: str | None,
    as_json: bool,
    connection: RemoteConnection,
) -> None:
    """Evaluate the PromQL EXPR and print the answer as a table (or --json)."""
    backend = _backend(prometheus, snapshot, agent, connection)
    now = time.time()
    if range_:
        start = parse_time("--range START", range_[0], now)
        end = parse_time("--range END", range_[1], now)
        result = backend.query_range(expr, start, end, parse_duration("--range STEP", range_[2]))
    else:
        result = backend.query(expr, None if at is None else parse_time("--at", at, now))
    if as_json:
        click.echo(json.dumps(to_json(result), indent=2))
    else:
        _print_table(expr, result)


def to_json(result: QueryResult) -> dict[str, Any]:
    """The result in the Prometheus HTTP API's ``data`` shape."""
    if result.type == "scalar" and result.scalar is not None:
        return {"resultType": "scalar", "result": [result.scalar[0], _num(result.scalar[1])]}
    if result.type == "string" and result.string is not None:
        return {"resultType": "string", "result": [result.string[0], result.string[1]]}
    if result.type == "vector":
        rows = [
            {"metric": dict(s.labels), "value": [s.timestamp, _num(s.value)]} for s in result.vector
        ]
        return {"resultType": "vector", "result": rows}
    rows = [
        {"metric": dict(s.labels), "values": [[t, _num(v)] for t, v in s.points]}
        for s in result.matrix
    ]
    return {"resultType": "matrix", "result": rows}


def _num(v: float) -> str:
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(v)


def _labels(labels: Any) -> str:
    lab = dict(labels)
    name = lab.pop("__name__", "")
    inner = ", ".join(f'{k}="{v}"' for k, v in sorted(lab.items()))
    return f"{name}{{{inner}}}" if inner or not name else name


def _print_table(expr: str, result: QueryResult) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{expr}  ({result.type})")
    if result.type in ("scalar", "string"):
        pair = result.scalar if result.type == "scalar" else result.string
        assert pair is not None
        table.add_column("time")
        table.add_column("value", justify="right")
        table.add_row(f"{pair[0]:.3f}", str(pair[1]))
    elif result.type == "vector":
        table.add_column("series")
        table.add_column("value", justify="right")
        for s in result.vector:
            table.add_row(_labels(s.labels), _num(s.value))
    else:
        table.add_column("series")
        table.add_column("points", justify="right")
        table.add_column("first", justify="right")
        table.add_column("last", justify="right")
        for r in result.matrix:
            first, last = r.points[0], r.points[-1]
            table.add_row(
                _labels(r.labels),
                str(len(r.points)),
                f"{_num(first[1])} @ {first[0]:.3f}",
                f"{_num(last[1])} @ {last[0]:.3f}",
            )
    Console().print(table)
