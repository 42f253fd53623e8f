"""``aivitals demo``: the whole story on one machine, from healthy to diagnosed.

Starts Redis, the demo service and the agent, measures what the service
carries on this machine, replays the Azure conversation trace at a share of
that (``_workload``), shows the golden signals and the load generator's own
counters live, and with ``--fault NAME`` breaks the service and prints the
diagnosis. Ctrl-C (or the end of ``--duration``) stops everything it started.
A part that fails to start or dies (a load stream, Redis, the service, the
agent) stops the demo with the reason and exit status 1.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Any

import click

from ..errors import ConfigError

__all__ = ["demo"]

#: Without a terminal (``make demo`` in CI, a pipe) the demo ends by itself.
NON_TTY_DURATION = 60.0


@click.command("demo")
@click.option(
    "--fault", default=None, metavar="NAME", help="Inject this fault (aivitals chaos list)."
)
@click.option(
    "--fault-after",
    type=float,
    default=20.0,
    show_default=True,
    help="Seconds of healthy traffic first.",
)
@click.option(
    "--fault-duration", type=float, default=60.0, show_default=True, help="Seconds the fault lasts."
)
@click.option(
    "--duration",
    type=float,
    default=None,
    help=f"Stop after this many seconds (default: Ctrl-C; {NON_TTY_DURATION:g} s without a TTY).",
)
@click.option(
    "--trace",
    default="azure-conv",
    show_default=True,
    help="Trace to replay: azure-conv, azure-code or a CSV file with the same columns.",
)
@click.option(
    "--rate",
    type=float,
    default=None,
    help="Completions per second to replay at (default: measured, see --utilization).",
)
@click.option(
    "--utilization",
    type=float,
    default=0.5,
    show_default=True,
    help="Share of the measured capacity to replay at.",
)
@click.option(
    "--hit-ratio",
    type=float,
    default=0.4,
    show_default=True,
    help="Cache hit ratio the prompt pool is sized for (steady state).",
)
@click.option(
    "--probe-seconds",
    type=float,
    default=5.0,
    show_default=True,
    help="Length of the closed-loop capacity probe.",
)
@click.option(
    "--embeddings-rate", type=float, default=2.0, show_default=True, help="Embedding requests/s."
)
@click.option(
    "--port", type=int, default=None, help="Serve the demo service on this port (default: free)."
)
@click.option(
    "--compressed-rules/--real-time-rules",
    default=None,
    help="Compress the rules' windows and for: durations so a fault shows within a minute "
    "(default: compressed with --fault, real time without).",
)
def demo(
    fault: str | None,
    fault_after: float,
    fault_duration: float,
    duration: float | None,
    trace: str,
    rate: float | None,
    utilization: float,
    hit_ratio: float,
    probe_seconds: float,
    embeddings_rate: float,
    port: int | None,
    compressed_rules: bool | None,
) -> None:
    """Run the demo AI service under the Azure trace with a live view; --fault breaks it.

    The generation model has RANDOM weights (real compute, meaningless text);
    without an NVIDIA GPU the GPU signals come from a simulated device and are
    labelled backend="sim".
    """
    if fault is not None:
        from ..chaos import get_fault

        get_fault(fault)  # an unknown name fails before anything starts
    for key, value in (
        ("fault-after", fault_after),
        ("fault-duration", fault_duration),
        ("probe-seconds", probe_seconds),
        ("embeddings-rate", embeddings_rate),
    ):
        if not value > 0:
            raise ConfigError(f"--{key}={value!r}: expected > 0")
    if rate is not None and not rate > 0:
        raise ConfigError(f"--rate={rate!r}: expected > 0 requests per second")
    if not 0 < utilization <= 1:
        raise ConfigError(f"--utilization={utilization!r}: expected 0 < share <= 1")
    if not 0 < hit_ratio < 1:
        raise ConfigError(f"--hit-ratio={hit_ratio!r}: expected 0 < ratio < 1")
    if duration is None and not sys.stdin.isatty():
        duration = NON_TTY_DURATION
    if duration is not None and not duration > 0:
        raise ConfigError(f"--duration={duration!r}: expected > 0 seconds")
    options = DemoOptions(
        fault=fault,
        fault_after=fault_after,
        fault_duration=fault_duration,
        duration=duration,
        trace=trace,
        rate=rate,
        utilization=utilization,
        hit_ratio=hit_ratio,
        probe_seconds=probe_seconds,
        embeddings_rate=embeddings_rate,
        port=port,
        compressed=fault is not None if compressed_rules is None else compressed_rules,
    )
    from ..chaos import interrupt_on_signals

    with interrupt_on_signals():
        try:
            _run(options)
        except KeyboardInterrupt:
            click.echo("\nstopped; everything the demo started is down.", err=True)


@dataclass(frozen=True)
class DemoOptions:
    fault: str | None
    fault_after: float
    fault_duration: float
    duration: float | None
    trace: str
    rate: float | None
    utilization: float
    hit_ratio: float
    probe_seconds: float
    embeddings_rate: float
    port: int | None
    compressed: bool


def _run(opts: DemoOptions) -> None:
    from rich.console import Console
    from rich.live import Live

    from ._session import DemoSession, SessionOptions
    from ._view import History, read_snapshot, render

    console = Console(stderr=False)
    session = DemoSession(
        SessionOptions(
            trace=opts.trace,
            duration=opts.duration,
            rate=opts.rate,
            utilization=opts.utilization,
            hit_ratio=opts.hit_ratio,
            probe_seconds=opts.probe_seconds,
            embeddings_rate=opts.embeddings_rate,
            port=opts.port,
            compressed_rules=opts.compressed,
        ),
        say=console.print,
    )
    console.print("[bold]aivitals demo[/]: starting Redis, the demo service and the agent ...")
    runner: Any = None
    try:
        session.start()
        stack = session.stack
        why = session.workload.why()
        started = time.monotonic()
        fault_at = started + opts.fault_after if opts.fault else None
        active: Any = None
        diagnosis: Any = None
        history = History()
        with Live(console=console, refresh_per_second=2, transient=False) as live:
            while opts.duration is None or time.monotonic() - started < opts.duration:
                now = time.monotonic()
                if fault_at is not None and now >= fault_at and runner is None:
                    runner, active = _inject(stack, opts.fault or "", opts.fault_duration)
                    session.active_fault = active
                if active is not None and diagnosis is None and time.time() > active.ends_at - 2:
                    diagnosis = _diagnose(stack)  # while the fault is still on
                session.check()
                status = _status(now - started, opts.duration, opts.fault, active)
                snap = read_snapshot(stack, session.clients())
                history.add(snap)
                live.update(
                    render(snap, title="aivitals demo", status=status, history=history, header=why)
                )
                time.sleep(1.0)
        _print_summary(console, stack, session.streams)
        if opts.fault is not None and runner is not None:
            _print_diagnosis(console, diagnosis or _diagnose(stack), opts.fault)
    finally:
        session.stop_event.set()
        if runner is not None:
            runner.close()
        session.stop()


def _inject(stack: Any, fault: str, seconds: float) -> tuple[Any, Any]:
    from ..chaos import ChaosRunner

    # signals stay ours: Ctrl-C unwinds through the finally blocks that close the runner
    runner = ChaosRunner(stack.fault_context(), handle_signals=False).open()
    return runner, runner.start(fault, duration=seconds)


def _status(elapsed: float, duration: float | None, fault: str | None, active: Any) -> str:
    total = f" of {duration:.0f}" if duration is not None else " (Ctrl-C to stop)"
    parts = [f"{elapsed:.0f} s{total}"]
    if fault and active is None:
        parts.append(f"fault {fault} pending")
    elif active is not None:
        left = active.ends_at - time.time()
        parts.append(f"fault {fault}: " + (f"{left:.0f} s left" if left > 0 else "reverted"))
    parts.append("generation model with random weights")
    return " | ".join(parts)


def _print_summary(console: Any, stack: Any, streams: list[Any]) -> None:
    for st in streams:
        c = st.counts()
        console.print(
            f"load {c.name}: sent {c.sent}, answered {c.answered}, errors {c.errors}, "
            f"timeouts {c.timeouts}"
        )
    fired = sorted({e.alertname for e in stack.engine.history() if e.state == "firing"})
    console.print("alerts that fired: " + (", ".join(fired) if fired else "none"))


def _diagnose(stack: Any) -> Any:
    # through the stack's memory: the report agrees with what the agent's page showed
    live = getattr(stack, "live_diagnosis", None) or stack.diagnose
    try:
        return live()
    except Exception as exc:  # the demo still ends cleanly; it says why there is no diagnosis
        return exc


def _print_diagnosis(console: Any, diagnosis: Any, fault: str) -> None:
    from rich.markdown import Markdown

    if isinstance(diagnosis, Exception):
        console.print(f"[red]no diagnosis: {type(diagnosis).__name__}: {diagnosis}[/]")
        return
    console.rule(f"diagnosis after injecting {fault}")
    console.print(Markdown(diagnosis.to_markdown()))
