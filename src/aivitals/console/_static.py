"""The console's static files: resolved inside the package's ``static`` folder only.

A request path is decoded once and refused when it could leave the folder
(``..``, an absolute path, a backslash, a NUL, a hidden name) before it is
resolved; the resolved file must still lie inside the folder (a symlink out
is refused too). Files are read once and kept with a gzip copy: they are
package data and do not change while the process runs.
"""

from __future__ import annotations

import gzip
import hashlib
import threading
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

__all__ = ["STATIC_DIR", "StaticFile", "load_static", "resolve_static"]

STATIC_DIR = Path(__file__).resolve().parent / "static"

_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".txt": "text/plain; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
}
# Worth compressing: text. PNGs are compressed already.
_GZIP = {".html", ".js", ".css", ".txt", ".svg"}


@dataclass(frozen=True, slots=True)
class StaticFile:
    body: bytes
    gzipped: bytes | None
    content_type: str
    etag: str


_cache: dict[Path, StaticFile] = {}
_lock = threading.Lock()


def resolve_static(url_path: str, root: Path = STATIC_DIR) -> Path | None:
    """The file ``url_path`` (relative to ``root``, URL-encoded) names, or None when refused.

    >>> resolve_static("../_api.py") is None
    True
    """
    try:
        rel = unquote(url_path, errors="strict")
    except UnicodeDecodeError:
        return None
    if not rel or rel.startswith(("/", "\\")) or "\\" in rel or "\x00" in rel:
        return None
    parts = rel.split("/")
    if any(p in ("", ".", "..") or p.startswith(".") for p in parts):
        return None
    if Path(parts[-1]).suffix not in _TYPES:
        return None
    base = root.resolve()
    path = (base / rel).resolve()
    if not path.is_relative_to(base) or not path.is_file():
        return None
    return path


def load_static(path: Path) -> StaticFile:
    """The file's bytes, gzip copy, type and ETag (read once, then cached)."""
    with _lock:
        hit = _cache.get(path)
    if hit is not None:
        return hit
    body = path.read_bytes()
    gz = gzip.compress(body, 9, mtime=0) if path.suffix in _GZIP else None
    item = StaticFile(
        body=body,
        gzipped=gz if gz is not None and len(gz) < len(body) else None,
        content_type=_TYPES[path.suffix],
        etag='"' + hashlib.sha256(body).hexdigest()[:20] + '"',
    )
    with _lock:
        _cache[path] = item
    return item
