"""``aivitals collectors``: list the collectors this machine offers and run each once."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

import click

from ..signals import Sample
from ._base import Collector
from ._health import BaseCollector

__all__ = ["collectors"]


@dataclass(frozen=True, slots=True)
class _Row:
    collector: str
    up: bool
    duration_ms: float
    samples: int
    errors: dict[str, int]

    def line(self) -> str:
        errors = ", ".join(f"{k}={v}" for k, v in sorted(self.errors.items()))
        up = "yes" if self.up else "NO"
        return f"{self.collector:<10} {up:<4} {self.duration_ms:>8.2f} {self.samples:>8}  {errors}"


def _run_once(c: Collector) -> tuple[_Row, list[Sample]]:
    if isinstance(c, BaseCollector):
        result = c.run()
        row = _Row(c.name, result.ok, result.duration * 1000, len(result.samples), c.error_counts())
        return row, result.samples
    samples = [s for s in c.collect() if not s.name.startswith("aivitals_collector_")]
    return _Row(c.name, True, 0.0, len(samples), {}), samples


@click.command("collectors")
@click.option("--gpu", type=click.Choice(["auto", "nvml", "smi", "sim", "none"]), default="auto")
@click.option("--sim-gpu-dir", type=click.Path(file_okay=False), help="State dir of the sim GPU.")
@click.option("--pid", type=int, help="Include the process collector for this pid.")
@click.option("--port", type=int, help="Include the process collector for this listening port.")
@click.option("--samples", "show_samples", is_flag=True, help="Print every sample too.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def collectors(
    gpu: str,
    sim_gpu_dir: str | None,
    pid: int | None,
    port: int | None,
    show_samples: bool,
    as_json: bool,
) -> None:
    """List the collectors and run each once: up, time taken, samples, errors."""
    from ..agent._build import build_collectors
    from ..agent._config import AgentConfig
    from ..agent._exposition import render

    found = build_collectors(AgentConfig(gpu=gpu, sim_gpu_dir=sim_gpu_dir, pid=pid, port=port))
    rows: list[_Row] = []
    all_samples: list[Sample] = []
    for c in found:
        row, samples = _run_once(c)
        rows.append(row)
        all_samples += samples
        close = getattr(c, "close", None)
        if callable(close):
            close()
    if as_json:
        click.echo(json.dumps({"collectors": [dataclasses.asdict(r) for r in rows]}, indent=2))
        return
    click.echo(f"{'collector':<10} {'up':<4} {'ms':>8} {'samples':>8}  errors")
    for r in rows:
        click.echo(r.line())
    if gpu == "auto" and not any(r.collector == "gpu" for r in rows):
        click.echo(
            "(no GPU found: NVML did not load, nvidia-smi is absent; --gpu sim simulates one)"
        )
    if show_samples:
        click.echo(render(all_samples), nl=False)
