"""``aivitals demo``: the whole story on one machine, from healthy to diagnosed.

Starts Redis, the demo service and the agent, replays the Azure LLM trace
(time-scaled) through the load generator, shows the golden signals live,
and with ``--fault NAME`` breaks the service and prints the diagnosis.
Ctrl-C (or the end of ``--duration``) stops everything it started.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import time
from collections.abc import Iterator
from types import FrameType
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
@click.option("--trace", default="azure-conv", show_default=True, help="Azure trace to replay.")
@click.option(
    "--time-scale",
    type=float,
    default=2.0,
    show_default=True,
    help="Trace gaps multiplied by this.",
)
@click.option(
    "--embeddings-rate", type=float, default=2.0, show_default=True, help="Embedding requests/s."
)
@click.option(
    "--real-time-rules", is_flag=True, help="Use the rule pack's real for: durations and windows."
)
def demo(
    fault: str | None,
    fault_after: float,
    fault_duration: float,
    duration: float | None,
    trace: str,
    time_scale: float,
    embeddings_rate: float,
    real_time_rules: bool,
) -> None:
    """Run the demo AI service under realistic load with a live view; --fault breaks it.

    The generation model has RANDOM weights (real compute, meaningless text);
    GPU signals come from a simulated device and are labelled backend="sim".
    """
    if fault is not None:
        from ..chaos import get_fault

        get_fault(fault)  # an unknown name fails before anything starts
    for key, value in (("fault-after", fault_after), ("fault-duration", fault_duration)):
        if not value > 0:
            raise ConfigError(f"--{key}={value!r}: expected > 0 seconds")
    if duration is None and not sys.stdin.isatty():
        duration = NON_TTY_DURATION
    if duration is not None and not duration > 0:
        raise ConfigError(f"--duration={duration!r}: expected > 0 seconds")
    with _sigterm_as_interrupt():
        try:
            _run(
                fault,
                fault_after,
                fault_duration,
                duration,
                trace,
                time_scale,
                embeddings_rate,
                not real_time_rules,
            )
        except KeyboardInterrupt:
            click.echo("\nstopped; everything the demo started is down.", err=True)


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM / SIGHUP unwind like Ctrl-C, so every finally block runs."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    old = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def _run(
    fault: str | None,
    fault_after: float,
    fault_duration: float,
    duration: float | None,
    trace: str,
    time_scale: float,
    embeddings_rate: float,
    quick: bool,
) -> None:
    from rich.console import Console
    from rich.live import Live

    from ._stack import Stack, StackConfig
    from ._view import read_snapshot, render

    console = Console(stderr=False)
    console.print("[bold]aivitals demo[/]: starting Redis, the demo service and the agent ...")
    stack = Stack(StackConfig(quick=quick, rule_params={"sla_seconds": 0.25}))
    stop = threading.Event()
    threads: list[threading.Thread] = []
    runner: Any = None
    try:
        stack.start()
        assert stack.service is not None
        console.print(f"service {stack.service.url}  agent {stack.agent.url}  (Ctrl-C stops all)")
        threads = _start_load(stack, trace, time_scale, embeddings_rate, stop, duration)
        started = time.monotonic()
        fault_at = started + fault_after if fault else None
        active: Any = None
        diagnosis: Any = None
        with Live(console=console, refresh_per_second=2, transient=False) as live:
            while duration is None or time.monotonic() - started < duration:
                now = time.monotonic()
                if fault_at is not None and now >= fault_at and runner is None:
                    runner, active = _inject(stack, fault or "", fault_duration)
                if active is not None and diagnosis is None and time.time() > active.ends_at - 2:
                    diagnosis = _diagnose(stack)  # while the fault is still on
                status = _status(now - started, duration, fault, active)
                live.update(render(read_snapshot(stack), title="aivitals demo", status=status))
                time.sleep(1.0)
        _print_alert_summary(console, stack)
        if fault is not None and runner is not None:
            _print_diagnosis(console, diagnosis or _diagnose(stack), fault)
    finally:
        stop.set()
        if runner is not None:
            runner.close()
        for t in threads:
            t.join(timeout=30)
        stack.stop()


def _start_load(
    stack: Any,
    trace: str,
    time_scale: float,
    embeddings_rate: float,
    stop: threading.Event,
    duration: float | None,
) -> list[threading.Thread]:
    from ..load import LoadConfig, run_load

    span = duration if duration is not None else 24 * 3600.0
    url = stack.service.url
    configs = [
        LoadConfig(
            url=url + "/v1/completions",
            trace=trace,
            time_scale=time_scale,
            duration=span,
            max_prompt_tokens=256,
            max_output_tokens=48,
            timeout=30.0,
        ),
        LoadConfig(url=url + "/v1/embeddings", rate=embeddings_rate, duration=span, input_pool=32),
    ]
    threads = []
    for cfg in configs:
        t = threading.Thread(target=_quiet_load, args=(run_load, cfg, stop), daemon=True)
        t.start()
        threads.append(t)
    return threads


def _quiet_load(run_load: Any, cfg: Any, stop: threading.Event) -> None:
    with contextlib.suppress(Exception):  # the view shows what the service saw
        run_load(cfg, stop=stop)


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
    parts.append("sim GPU: simulated device, random-weight generation model")
    return " | ".join(parts)


def _print_alert_summary(console: Any, stack: Any) -> None:
    fired = sorted({e.alertname for e in stack.engine.history() if e.state == "firing"})
    console.print("alerts that fired: " + (", ".join(fired) if fired else "none"))


def _diagnose(stack: Any) -> Any:
    try:
        return stack.diagnose()
    except Exception as exc:  # the demo still ends cleanly; it says why there is no diagnosis
        return exc


def _print_diagnosis(console: Any, diagnosis: Any, fault: str) -> None:
    from rich.markdown import Markdown

    if isinstance(diagnosis, Exception):
        console.print(f"[red]no diagnosis: {type(diagnosis).__name__}: {diagnosis}[/]")
        return
    console.rule(f"diagnosis after injecting {fault}")
    console.print(Markdown(diagnosis.to_markdown()))
