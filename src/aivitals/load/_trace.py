"""Replay of a real request trace: arrival times and prompt / output lengths.

The shipped names (``azure-conv``, ``azure-code``) are the Azure LLM inference
trace 2023 (Microsoft Azure, CC-BY 4.0; see ``NOTICE``), carried gzip-compressed
inside the package (``aivitals/load/traces/``) so a plain ``pip install`` can
replay them. Any CSV with the same three columns
``TIMESTAMP,ContextTokens,GeneratedTokens`` works too, plain or gzip-compressed.
"""

from __future__ import annotations

import csv
import gzip
import io
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import IO

from ..errors import ConfigError, ParseError

__all__ = ["TRACES", "TraceRequest", "dataset_dir", "load_trace"]

#: Packaged trace name -> file under ``aivitals/load/traces/``.
TRACES = {
    "azure-code": "azure-code.csv.gz",
    "azure-conv": "azure-conv.csv.gz",
}

COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
_GZIP_MAGIC = b"\x1f\x8b"


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request of a trace: send offset (s from the first), prompt and output tokens."""

    at: float
    prompt_tokens: int
    max_tokens: int


def dataset_dir() -> Traversable:
    """The folder of the packaged traces (``aivitals/load/traces``), with their LICENSE."""
    return resources.files(__package__).joinpath("traces")


def _resolve(name_or_path: str) -> tuple[Traversable | Path, str]:
    """The file to read and how to name it in errors."""
    if name_or_path in TRACES:
        res = dataset_dir().joinpath(TRACES[name_or_path])
        label = f"trace {name_or_path!r} (aivitals/load/traces/{TRACES[name_or_path]})"
        if not res.is_file():
            # Only a broken install gets here: the files ship in the wheel.
            raise ConfigError(f"{label}: packaged file missing; reinstall aivitals")
        return res, label
    path = Path(name_or_path)
    if not path.is_file():
        known = ", ".join(sorted(TRACES))
        raise ConfigError(f"trace {name_or_path!r} is neither a file nor one of: {known}")
    return path, str(path)


@contextmanager
def _open_text(source: Traversable | Path) -> Iterator[IO[str]]:
    """Open a trace as text, gunzipping it when it starts with the gzip magic bytes."""
    with source.open("rb") as raw:
        head = raw.read(2)
    with source.open("rb") as raw:
        stream: gzip.GzipFile | IO[bytes] = (
            gzip.GzipFile(fileobj=raw) if head == _GZIP_MAGIC else raw
        )
        with io.TextIOWrapper(stream, encoding="utf-8", newline="") as text:
            yield text


def _parse_time(text: str) -> float:
    # The Azure files carry seven fractional digits, one more than datetime takes.
    head, _, frac = text.strip().partition(".")
    base = datetime.fromisoformat(head).timestamp()
    return base + (float("0." + frac) if frac else 0.0)


def _parse_row(row: dict[str, str], line: int, label: str) -> tuple[float, int, int]:
    try:
        return (
            _parse_time(row["TIMESTAMP"]),
            int(row["ContextTokens"]),
            int(row["GeneratedTokens"]),
        )
    except (KeyError, ValueError, TypeError) as exc:
        raise ParseError(f"{label}:{line}: bad trace row {row!r} ({exc})") from exc


def _read_rows(
    source: Traversable | Path, label: str, limit: int | None
) -> list[tuple[float, int, int]]:
    rows: list[tuple[float, int, int]] = []
    try:
        with _open_text(source) as fh:
            reader = csv.DictReader(fh)
            header = reader.fieldnames or []
            missing = [c for c in COLUMNS if c not in header]
            if missing:
                raise ParseError(
                    f"{label}: columns {','.join(header) or '(none)'} lack "
                    f"{','.join(missing)}; a trace has the columns {','.join(COLUMNS)}"
                )
            for i, row in enumerate(reader, start=2):
                rows.append(_parse_row(row, i, label))
                if limit is not None and len(rows) >= limit:
                    break
    except (gzip.BadGzipFile, EOFError, zlib.error) as exc:
        raise ParseError(f"{label}: corrupt gzip data ({exc})") from exc
    except UnicodeDecodeError as exc:
        raise ParseError(f"{label}: not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
    except csv.Error as exc:
        raise ParseError(f"{label}: not a CSV file ({exc})") from exc
    except OSError as exc:
        raise ConfigError(f"{label}: cannot read ({exc})") from exc
    return rows


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

    ``name_or_path`` is a packaged name (``azure-conv``, ``azure-code``) or a
    CSV file, plain or gzip-compressed. ``time_scale`` multiplies the gaps
    between arrivals: 0.1 replays ten times faster. ``duration`` keeps the
    requests whose scaled offset is below it. The token caps clip lengths to
    what a small demo model accepts.

    Raises ``ConfigError`` for an unknown name or unreadable file and
    ``ParseError`` for corrupt gzip data, other columns or a bad row.

    **Usage**::

        reqs = load_trace("azure-conv", time_scale=0.5, duration=60)
    """
    if not time_scale > 0:
        raise ConfigError(f"time_scale: {time_scale!r} must be > 0")
    source, label = _resolve(name_or_path)
    rows = _read_rows(source, label, limit)
    if not rows:
        raise ParseError(f"{label}: no requests in trace")
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
