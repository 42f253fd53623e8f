"""Scrape a Prometheus /metrics target, capped in size and time, with aliases applied.

Engines rename metrics between releases; the catalogue's aliases
(``signals.translate``) rewrite foreign names (vLLM, TGI, Triton, DCGM, OTel)
onto ours, in the text itself, before the store parses it, so a rename never
silently blanks a rule. The body is read in chunks and refused once it passes
``max_bytes`` (a declared Content-Length over the cap is refused without
reading anything), and the whole fetch is bounded by ``timeout``.
"""

from __future__ import annotations

import http.client
import socket
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

from ..errors import ConfigError
from ..signals import ALIASES, Sample, alias_for, translate

__all__ = ["ScrapeResult", "Scraper", "translate_exposition"]

_CHUNK = 64 * 1024
#: Every foreign family name an alias knows (histogram samples share the prefix).
_FOREIGN = tuple(sorted({a.foreign for a in ALIASES}))
#: Their distinct first five characters: a handful of substring scans rule a body out.
_STEMS = tuple(sorted({name[:5] for name in _FOREIGN}))
#: The text format only. prometheus_client answers OpenMetrics whenever the header names
#: it, whatever its q, and OpenMetrics goes to its reference parser: 89 ms a scrape of the
#: demo service's 962 samples against 0.8 ms for the same samples as text on the store's
#: fast path, which at quick mode's 1 s scrapes would cost validate a tenth of a core. A
#: target that speaks only OpenMetrics still answers */* with it, and parses.
_ACCEPT = "text/plain;version=0.0.4;q=1.0, */*;q=0.1"


@dataclass(frozen=True, slots=True)
class ScrapeResult:
    """One scrape: the (translated) body when it worked, else the failure reason."""

    text: str | None
    reason: str  # "" when it worked; else timeout, refused, too_large, http_status, parse, error
    duration: float
    nbytes: int
    samples: int = 0

    @property
    def ok(self) -> bool:
        return self.text is not None


class Scraper:
    """Fetches one target. ``fetch`` never raises.

    **Usage**::

        result = Scraper("http://127.0.0.1:8000/metrics", job="vllm").fetch()
        if result.ok:
            store.ingest_exposition(result.text, timestamp=time.time(), target=scraper.url)
    """

    def __init__(
        self, url: str, *, job: str = "scrape", timeout: float = 10.0, max_bytes: int = 64 * 2**20
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(f"url: {url!r} is not an http(s) URL")
        if not timeout > 0:
            raise ConfigError(f"timeout: must be > 0, got {timeout!r}")
        if max_bytes < 1:
            raise ConfigError(f"max_bytes: must be >= 1, got {max_bytes!r}")
        self.url = url
        self.job = job
        self.instance = parts.netloc
        self.timeout = float(timeout)
        self.max_bytes = int(max_bytes)
        self._parts = parts

    def fetch(self) -> ScrapeResult:
        start = time.monotonic()
        try:
            body = self._get(start + self.timeout)
        except _Failed as exc:
            return ScrapeResult(None, exc.reason, time.monotonic() - start, exc.nbytes)
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError:
            return ScrapeResult(None, "parse", time.monotonic() - start, len(body))
        text, samples = translate_exposition(text)
        return ScrapeResult(text, "", time.monotonic() - start, len(body), samples)

    def health_samples(self, result: ScrapeResult, errors: dict[str, int]) -> list[Sample]:
        """``up``, duration, samples and error counts for this target."""
        lab = {"job": self.job, "instance": self.instance}
        out = [
            Sample("up", lab, 1.0 if result.ok else 0.0),
            Sample("aivitals_scrape_duration_seconds", lab, result.duration),
        ]
        if result.ok:
            out.append(Sample("aivitals_scrape_samples", lab, float(result.samples)))
        out += [
            Sample("aivitals_scrape_errors_total", {**lab, "reason": r}, float(n))
            for r, n in sorted(errors.items())
        ]
        return out

    def _connection(self, timeout: float) -> http.client.HTTPConnection:
        p = self._parts
        cls = http.client.HTTPSConnection if p.scheme == "https" else http.client.HTTPConnection
        return cls(p.hostname or "", p.port, timeout=timeout)

    def _get(self, deadline: float) -> bytes:
        path = self._parts.path or "/"
        if self._parts.query:
            path += "?" + self._parts.query
        conn = self._connection(max(0.01, deadline - time.monotonic()))
        try:
            conn.request("GET", path, headers={"Accept": _ACCEPT, "Accept-Encoding": "identity"})
            sock = conn.sock  # kept: getresponse() may drop it from the connection
            conn.sock.settimeout(max(0.01, deadline - time.monotonic()))
            resp = conn.getresponse()
            if resp.status != 200:
                raise _Failed("http_status")
            declared = resp.getheader("Content-Length")
            if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
                raise _Failed("too_large")
            return self._read_capped(resp, sock, deadline)
        except _Failed:
            raise
        except TimeoutError:
            raise _Failed("timeout") from None
        except ConnectionRefusedError:
            raise _Failed("refused") from None
        except (OSError, http.client.HTTPException):
            raise _Failed("error") from None
        finally:
            conn.close()  # also abandons an oversize body unread

    def _read_capped(
        self, resp: http.client.HTTPResponse, sock: socket.socket, deadline: float
    ) -> bytes:
        chunks: list[bytes] = []
        size = 0
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise _Failed("timeout", size)
            sock.settimeout(left)  # a trickling server cannot stretch the deadline
            chunk = resp.read1(_CHUNK)
            if not chunk:
                break
            size += len(chunk)
            if size > self.max_bytes:
                raise _Failed("too_large", size)
            chunks.append(chunk)
        if resp.length:  # the server promised more than it sent: truncated
            raise _Failed("parse", size)
        return b"".join(chunks)


class _Failed(Exception):
    def __init__(self, reason: str, nbytes: int = 0) -> None:
        super().__init__(reason)
        self.reason = reason
        self.nbytes = nbytes


def translate_exposition(text: str) -> tuple[str, int]:
    """The text with foreign metric names replaced by ours, and its sample count.

    Lines whose name has no alias are kept byte for byte; an aliased line gets
    our name, its value scaled and the alias's labels added.
    """
    lines = text.split("\n")
    samples = sum(1 for line in lines if line and line[0] != "#")
    if not any(stem in text for stem in _STEMS):
        return text, samples  # the common case, decided by C-speed substring scans
    out: list[str] | None = None
    for i, line in enumerate(lines):
        if not line.startswith(_FOREIGN) and not line[7:].startswith(_FOREIGN):
            new = None
        elif line[0] == "#":
            new = _translate_comment(line) if line.startswith(("# HELP ", "# TYPE ")) else None
        else:
            new = _translate_sample(line)
        if new is not None:
            if out is None:
                out = lines[:i]
            out.append(new)
        elif out is not None:
            out.append(line)
    return ("\n".join(out) if out is not None else text), samples


def _name_end(line: str) -> int:
    for i, ch in enumerate(line):
        if ch in "{ \t":
            return i
    return len(line)


def _translate_comment(line: str) -> str | None:
    head, body = line[:7], line[7:]
    name, _, rest = body.partition(" ")
    alias = alias_for(name)
    if alias is None:
        return None
    return f"{head}{alias.ours} {rest}".rstrip()


def _translate_sample(line: str) -> str | None:
    end = _name_end(line)
    mapped = translate(line[:end])
    if mapped is None:
        return None
    ours, scale, add = mapped
    rest = line[end:]
    labels = ""
    if rest.startswith("{"):
        close = rest.rfind("}")
        if close < 0:
            return None  # malformed; the parser will reject the whole body
        labels, rest = rest[1:close], rest[close + 1 :]
    if add:
        extra = ",".join(f'{k}="{v}"' for k, v in add)
        labels = f"{labels},{extra}" if labels.strip() else extra
    parts = rest.split()
    if scale != 1.0 and parts:
        try:
            parts[0] = repr(float(parts[0]) * scale)
        except ValueError:
            return None
    label_block = "{" + labels + "}" if labels else ""
    return f"{ours}{label_block} {' '.join(parts)}"
