"""Replay of a real request trace: arrival times and prompt / output lengths.

The shipped names point at the Azure LLM inference trace 2023 (CC-BY 4.0),
kept beside the repository in ``../shared/datasets/azure-llm-inference-2023/``
(or under ``$AIVITALS_DATASETS``). Any CSV with the same three columns
``TIMESTAMP,ContextTokens,GeneratedTokens`` works too.
"""

from __future__ import annotations

import csv
import os
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from ..errors import ConfigError, ParseError

__all__ = ["TRACES", "TraceRequest", "dataset_dir", "load_trace"]

TRACES = {
    "azure-code": "azure-llm-inference-2023/AzureLLMInferenceTrace_code.csv",
    "azure-conv": "azure-llm-inference-2023/AzureLLMInferenceTrace_conv.csv",
}


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request of a trace: send offset (s from the first), prompt and output tokens."""

    at: float
    prompt_tokens: int
    max_tokens: int


def dataset_dir() -> Path:
    """``$AIVITALS_DATASETS``, else ``../shared/datasets`` beside the source checkout."""
    env = os.environ.get("AIVITALS_DATASETS")
    if env:
        return Path(env)
    repo = Path(__file__).resolve().parents[3]
    return repo.parent / "shared" / "datasets"


def _resolve(name_or_path: str) -> Path:
    if name_or_path in TRACES:
        path = dataset_dir() / TRACES[name_or_path]
        if not path.is_file():
            raise ConfigError(
                f"trace {name_or_path!r}: {path} not found; set AIVITALS_DATASETS to the "
                "folder holding azure-llm-inference-2023/"
            )
        return path
    path = Path(name_or_path)
    if not path.is_file():
        known = ", ".join(sorted(TRACES))
        raise ConfigError(f"trace {name_or_path!r} is neither a file nor one of: {known}")
    return path


def _parse_time(text: str) -> float:
    # The Azure files carry seven fractional digits, one more than datetime takes.
    head, _, frac = text.strip().partition(".")
    base = datetime.fromisoformat(head).timestamp()
    return base + (float("0." + frac) if frac else 0.0)


def _parse_row(row: dict[str, str], line: int, path: Path) -> tuple[float, int, int]:
    try:
        return (
            _parse_time(row["TIMESTAMP"]),
            int(row["ContextTokens"]),
            int(row["GeneratedTokens"]),
        )
    except (KeyError, ValueError, TypeError) as exc:
        raise ParseError(f"{path}:{line}: bad trace row {row!r} ({exc})") from exc


def load_trace(
    name_or_path: str,
    *,
    time_scale: float = 1.0,
    limit: int | None = None,
    duration: float | None = None,
    max_prompt_tokens: int | None = None,
    max_output_tokens: int | None = None,
) -> list[TraceRequest]:
    """Read a trace and turn it into send offsets, prompt lengths and ``max_tokens``.

    ``time_scale`` multiplies the gaps between arrivals: 0.1 replays ten times
    faster. ``duration`` keeps the requests whose scaled offset is below it.
    The token caps clip lengths to what a small demo model accepts.

    **Usage**::

        reqs = load_trace("azure-conv", time_scale=0.5, duration=60)
    """
    if not time_scale > 0:
        raise ConfigError(f"time_scale: {time_scale!r} must be > 0")
    path = _resolve(name_or_path)
    rows: list[tuple[float, int, int]] = []
    with path.open(newline="") as fh:
        for i, row in enumerate(csv.DictReader(fh), start=2):
            rows.append(_parse_row(row, i, path))
            if limit is not None and len(rows) >= limit:
                break
    if not rows:
        raise ParseError(f"{path}: no requests in trace")
    t0 = min(r[0] for r in rows)
    out: list[TraceRequest] = []
    for ts, prompt, gen in sorted(rows):
        at = (ts - t0) * time_scale
        if duration is not None and at >= duration:
            break
        if max_prompt_tokens is not None:
            prompt = min(prompt, max_prompt_tokens)
        if max_output_tokens is not None:
            gen = min(gen, max_output_tokens)
        out.append(TraceRequest(at, max(prompt, 1), max(gen, 1)))
    return out
