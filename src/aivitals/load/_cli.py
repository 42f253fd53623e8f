"""``aivitals load`` and ``aivitals capacity``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from ._capacity import sweep_capacity
from ._config import LoadConfig
from ._run import run_load
from ._trace import TraceRequest, load_trace
from ._units import parse_duration

__all__ = ["capacity", "load"]


def _ms(value: float | None) -> float | None:
    return None if value is None else value / 1000.0


def _common(fn: Any) -> Any:
    options = [
        click.option(
            "--payload",
            type=click.Choice(["auto", "get", "embeddings", "completions"]),
            default="auto",
            show_default=True,
            help="Request body (auto: from the path).",
        ),
        click.option("--prompt-tokens", type=int, default=32, show_default=True),
        click.option("--max-tokens", type=int, default=16, show_default=True),
        click.option("--no-stream", is_flag=True, help="Ask completions without SSE."),
        click.option(
            "--input-pool",
            type=int,
            default=64,
            show_default=True,
            help="Distinct inputs cycled (0: all different).",
        ),
        click.option("--timeout", default="30s", show_default=True, help="Per-request timeout."),
        click.option(
            "--allow-host",
            "allow_hosts",
            multiple=True,
            help="Allow a non-loopback target host (repeatable).",
        ),
        click.option("--seed", type=int, default=None),
    ]
    for opt in reversed(options):
        fn = opt(fn)
    return fn


def _load_options(kw: dict[str, Any]) -> dict[str, Any]:
    return {
        "payload": kw["payload"],
        "prompt_tokens": kw["prompt_tokens"],
        "max_tokens": kw["max_tokens"],
        "stream": not kw["no_stream"],
        "input_pool": kw["input_pool"],
        "timeout": parse_duration(kw["timeout"], key="timeout"),
        "allow_hosts": tuple(kw["allow_hosts"]),
        "seed": kw["seed"],
    }


def _dry_run_summary(trace: str, reqs: list[TraceRequest], duration: float) -> str:
    """What a replay of ``reqs`` would send: count, span, rate and token statistics."""
    span = reqs[-1].at
    within = sum(1 for r in reqs if r.at < duration)

    def stats(values: list[int]) -> str:
        ordered = sorted(values)
        p50 = ordered[len(ordered) // 2]
        p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
        mean = sum(ordered) / len(ordered)
        return f"mean {mean:.0f}  p50 {p50}  p99 {p99}  max {ordered[-1]}"

    rate = (len(reqs) - 1) / span if span > 0 else float("nan")
    return "\n".join(
        [
            f"trace {trace}: {len(reqs)} requests over {span:.1f} s ({rate:.2f} req/s), "
            "dry run: nothing sent",
            f"  within --duration {duration:g} s: {within} requests",
            f"  prompt tokens: {stats([r.prompt_tokens for r in reqs])}",
            f"  output tokens: {stats([r.max_tokens for r in reqs])}",
        ]
    )


@click.command("load")
@click.argument("url", required=False)
@click.option("--rate", type=float, help="Open loop: Poisson arrivals per second.")
@click.option("--concurrency", type=int, help="Closed loop: requests kept in flight.")
@click.option("--trace", help="Replay azure-code, azure-conv or a CSV file (open loop).")
@click.option(
    "--time-scale",
    type=float,
    default=1.0,
    show_default=True,
    help="Multiply trace gaps (0.1 = ten times faster).",
)
@click.option("--duration", default="30s", show_default=True, help="e.g. 30s, 2m.")
@click.option(
    "--arrival", type=click.Choice(["poisson", "uniform"]), default="poisson", show_default=True
)
@click.option("--slo-ttft", type=float, help="Goodput SLO: time to first token, ms.")
@click.option("--slo-tpot", type=float, help="Goodput SLO: time per output token, ms.")
@click.option("--slo-e2e", type=float, help="Goodput SLO: end-to-end latency, ms.")
@click.option(
    "--json",
    "json_out",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write the report as JSON.",
)
@click.option("--no-progress", is_flag=True)
@click.option(
    "--dry-run",
    is_flag=True,
    help="With --trace: read the trace and print its size and token statistics; send nothing.",
)
@_common
def load(
    url: str | None,
    rate: float | None,
    concurrency: int | None,
    trace: str | None,
    time_scale: float,
    duration: str,
    arrival: str,
    slo_ttft: float | None,
    slo_tpot: float | None,
    slo_e2e: float | None,
    json_out: Path | None,
    no_progress: bool,
    dry_run: bool,
    **kw: Any,
) -> None:
    """Send open-loop (--rate), closed-loop (--concurrency) or trace load to URL."""
    if dry_run:
        if trace is None:
            raise click.UsageError("--dry-run needs --trace")
        # The whole trace (the caps the replay applies change no count or span).
        reqs = load_trace(trace, time_scale=time_scale)
        click.echo(_dry_run_summary(trace, reqs, parse_duration(duration)))
        return
    if url is None:
        raise click.UsageError("Missing argument 'URL'.")
    config = LoadConfig(
        url=url,
        rate=rate,
        concurrency=concurrency,
        trace=trace,
        time_scale=time_scale,
        duration=parse_duration(duration),
        arrival=arrival,
        slo_ttft=_ms(slo_ttft),
        slo_tpot=_ms(slo_tpot),
        slo_e2e=_ms(slo_e2e),
        progress=not no_progress,
        **_load_options(kw),
    )
    report = run_load(config)
    click.echo(report.format())
    if json_out is not None:
        json_out.write_text(report.to_json())
        click.echo(f"report written to {json_out}")


@click.command("capacity")
@click.argument("url")
@click.option(
    "--levels",
    default="1,2,4,8,16,32,64",
    show_default=True,
    help="Concurrency levels, comma separated, increasing.",
)
@click.option(
    "--step", "step_duration", default="10s", show_default=True, help="Duration of each level."
)
@click.option(
    "--jump",
    type=float,
    default=1.5,
    show_default=True,
    help="P95 ratio to the previous level that marks the knee.",
)
@click.option("--max-error-rate", type=float, default=0.05, show_default=True)
@click.option("--json", "json_out", type=click.Path(dir_okay=False, path_type=Path))
@_common
def capacity(
    url: str,
    levels: str,
    step_duration: str,
    jump: float,
    max_error_rate: float,
    json_out: Path | None,
    **kw: Any,
) -> None:
    """Sweep concurrency on URL and report the knee where P95 jumps."""
    try:
        parsed = [int(x) for x in levels.split(",") if x.strip()]
    except ValueError as exc:
        raise click.BadParameter(f"{levels!r}: integers separated by commas") from exc

    def show(lv: Any) -> None:
        click.echo(
            f"concurrency {lv.concurrency:>4}: {lv.throughput:8.1f} req/s  "
            f"p95 {lv.p95_ms:8.2f} ms  errors {lv.error_rate:.1%}"
        )

    report = sweep_capacity(
        url,
        levels=parsed,
        step_duration=parse_duration(step_duration, key="step"),
        jump=jump,
        max_error_rate=max_error_rate,
        on_level=show,
        **_load_options(kw),
    )
    click.echo(report.format())
    if json_out is not None:
        json_out.write_text(json.dumps(report.to_dict(), indent=2))
        click.echo(f"report written to {json_out}")
