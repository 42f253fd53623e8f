"""Versioned snapshot files of the store: ``save`` / ``load``.

Layout (gzip-compressed): the 8-byte magic ``AIVSNAP\\n``, a little-endian
uint32 format version, a uint64 header length, a JSON header (store settings
and, per series, its labels and sample count), then per series its
timestamps as int64 deltas (first absolute) and its float64 values. Deltas
of regular scrapes are nearly constant, so gzip shrinks them to almost
nothing.
"""

from __future__ import annotations

import gzip
import json
import struct
import zlib
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..errors import StoreError

if TYPE_CHECKING:
    from ._store import Store

__all__ = ["FORMAT_VERSION", "load_snapshot", "save_snapshot"]

MAGIC = b"AIVSNAP\n"
FORMAT_VERSION = 1


def save_snapshot(store: Store, path: Path, *, start: float | None, end: float | None) -> int:
    mint = -(2**62) if start is None else round(start * 1000)
    maxt = 2**62 if end is None else round(end * 1000)
    chunks = []
    for series in store._all_series():
        with store._lock:
            t, v = series.window(mint, maxt)
        if len(t):
            chunks.append((series.labels, t, v))
    header = {
        "version": FORMAT_VERSION,
        "retention": store.retention,
        "max_series": store.max_series,
        "series": [{"labels": [list(p) for p in lb], "n": len(t)} for lb, t, _ in chunks],
    }
    raw = json.dumps(header, separators=(",", ":")).encode()
    total = 0
    with gzip.open(path, "wb", compresslevel=6) as f:
        f.write(MAGIC + struct.pack("<IQ", FORMAT_VERSION, len(raw)) + raw)
        for _, t, v in chunks:
            deltas = np.diff(t, prepend=np.int64(0))
            f.write(deltas.astype("<i8").tobytes())
            f.write(v.astype("<f8").tobytes())
            total += len(t)
    return total


def load_snapshot(cls: type[Store], path: Path) -> Store:
    try:
        with gzip.open(path, "rb") as f:
            data = f.read()
    except (OSError, EOFError, zlib.error) as exc:
        raise StoreError(f"{path}: not a readable aivitals snapshot ({exc})") from exc
    if not data.startswith(MAGIC) or len(data) < len(MAGIC) + 12:
        raise StoreError(f"{path}: not an aivitals snapshot (bad magic)")
    version, hlen = struct.unpack_from("<IQ", data, len(MAGIC))
    if version != FORMAT_VERSION:
        raise StoreError(f"{path}: snapshot format version {version} is not supported")
    pos = len(MAGIC) + 12
    try:
        header = json.loads(data[pos : pos + hlen])
        pos += hlen
        store = cls(retention=float(header["retention"]), max_series=int(header["max_series"]))
        for entry in header["series"]:
            n = int(entry["n"])
            t = np.cumsum(np.frombuffer(data, "<i8", n, pos))
            v = np.frombuffer(data, "<f8", n, pos + 8 * n)
            pos += 16 * n
            series = store._get_or_create(tuple((str(a), str(b)) for a, b in entry["labels"]))
            if series is None:
                raise StoreError(f"{path}: more series than its own max_series")
            series.ts.frombytes(t.astype(np.int64).tobytes())
            series.vals.frombytes(v.astype(np.float64).tobytes())
            if len(t):
                store._newest_ms = max(store._newest_ms, int(t[-1]))
    except (KeyError, TypeError, ValueError) as exc:
        raise StoreError(f"{path}: corrupt aivitals snapshot ({exc})") from exc
    if pos != len(data):
        raise StoreError(f"{path}: corrupt aivitals snapshot (trailing or missing data)")
    return store
