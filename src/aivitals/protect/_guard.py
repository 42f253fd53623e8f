"""The input guard: refuse bad bodies before the application reads a byte of them.

A pure ASGI middleware. It reads the body itself, enforcing the byte limit
while the body streams in (a 10 MB upload against a 100 KB limit costs at most
the limit plus one chunk) and a whole-body read timeout (a slow-loris client is
cut off, and it never held an admission slot because admission comes after
the guard). It then checks, in this order: UTF-8, control characters, JSON,
the strings inside the JSON (escapes such as ``\\u0000`` decode to control
characters), full-width characters, token count. A body that passes is
replayed to the application unchanged, or rewritten when full-width
characters are normalised (with a correct ``content-length``).

**Usage**::

    from aivitals.protect import GuardConfig, InputGuard

    app = InputGuard(
        app,
        config=GuardConfig(max_body_bytes=100_000, fullwidth="normalize"),
        routes={"/v1/generate": GuardConfig(max_tokens=4096, tokenizer=count_tokens),
                "/upload/*": None},          # no guard under /upload/
    )
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import unicodedata
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from prometheus_client import REGISTRY, CollectorRegistry

from aivitals.errors import ConfigError
from aivitals.signals import ErrorCode

from ._asgi import ASGIApp, Message, Receive, Scope, Send, ensure_request_id, log, send_error
from ._metrics import ProtectMetrics, metrics_for

__all__ = [
    "GUARD_SCOPE_KEY",
    "GuardConfig",
    "GuardResult",
    "GuardRoutes",
    "InputGuard",
    "check_body_blocking",
    "inspect_body",
    "is_json",
    "record_disconnect",
    "record_refusal",
]

#: Where the guard leaves its findings (a ``GuardResult``) in the ASGI scope.
GUARD_SCOPE_KEY = "aivitals.guard"

FullwidthPolicy = Literal["reject", "normalize", "allow"]

CONTROL_CHARS = re.compile(r"[\x00-\x08\x0B\x0C\x0E-\x1F\x7F]")
FULLWIDTH = re.compile(r"[\uFF01-\uFF5E]")
SURROGATE = re.compile(r"[\uD800-\uDFFF]")
# Tokenizing a long text can take milliseconds: off the event loop past this size.
_THREAD_TOKENIZE_CHARS = 32_768


@dataclass(frozen=True, kw_only=True, slots=True)
class GuardConfig:
    """What the guard accepts on one route.

    ``max_body_bytes``: UTF-8 bytes actually received (Content-Length can lie).
    ``body_timeout``: seconds for the whole body to arrive; a client that stalls
    is answered 408 and cut off. ``fullwidth``: ``"reject"`` (422),
    ``"normalize"`` (NFKC; the application receives the rewritten body) or
    ``"allow"``. ``json``: ``None`` parses bodies whose content type is JSON,
    ``True`` requires every body to be JSON, ``False`` never parses.
    ``tokenizer``: ``text -> token count``; with ``max_tokens`` longer inputs are
    refused (422). ``text_fields``: the top-level JSON keys whose strings are
    tokenized (``None``: every string). ``methods``: the methods whose bodies
    are checked.
    """

    max_body_bytes: int = 100_000
    body_timeout: float = 10.0
    reject_control_chars: bool = True
    fullwidth: FullwidthPolicy = "reject"
    json: bool | None = None
    max_json_depth: int = 64
    tokenizer: Callable[[str], int] | None = None
    max_tokens: int | None = None
    text_fields: tuple[str, ...] | None = None
    methods: frozenset[str] = field(default_factory=lambda: frozenset({"POST", "PUT", "PATCH"}))

    def __post_init__(self) -> None:
        _positive_int("max_body_bytes", self.max_body_bytes)
        _positive_int("max_json_depth", self.max_json_depth)
        if self.max_tokens is not None:
            _positive_int("max_tokens", self.max_tokens)
            if self.tokenizer is None:
                raise ConfigError("GuardConfig: max_tokens is set but tokenizer is None")
        if not (isinstance(self.body_timeout, int | float) and 0 < self.body_timeout < math.inf):
            raise ConfigError(f"GuardConfig: body_timeout must be > 0, got {self.body_timeout!r}")
        if self.fullwidth not in ("reject", "normalize", "allow"):
            raise ConfigError(
                f"GuardConfig: fullwidth must be 'reject', 'normalize' or 'allow', "
                f"got {self.fullwidth!r}"
            )
        if self.tokenizer is not None and not callable(self.tokenizer):
            raise ConfigError(f"GuardConfig: tokenizer must be callable, got {self.tokenizer!r}")
        bad = sorted(m for m in self.methods if not isinstance(m, str) or m != m.upper())
        if bad:
            raise ConfigError(f"GuardConfig: methods must be upper-case names, got {bad!r}")


def _positive_int(key: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ConfigError(f"GuardConfig: {key} must be a positive integer, got {value!r}")


@dataclass(frozen=True, slots=True)
class GuardResult:
    """What the guard learnt about an accepted body, for admission and the app."""

    body_bytes: int
    tokens: int | None
    document: Any = None
    normalized: bool = False


class _Refusal(Exception):
    def __init__(self, code: ErrorCode, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status


class _Disconnected(Exception):
    pass


class GuardRoutes:
    """Which ``GuardConfig`` applies to a path (shared by the ASGI and WSGI guards).

    ``routes`` maps a path (exact) or a prefix ending in ``*`` to the config of
    those paths, or to ``None`` to leave them unguarded; the longest match wins,
    ``config`` applies elsewhere.
    """

    def __init__(
        self,
        config: GuardConfig | None = None,
        routes: Mapping[str, GuardConfig | None] | None = None,
    ) -> None:
        self.config = config if config is not None else GuardConfig()
        self._exact: dict[str, GuardConfig | None] = {}
        self._prefixes: list[tuple[str, GuardConfig | None]] = []
        for pattern, cfg in (routes or {}).items():
            if cfg is not None and not isinstance(cfg, GuardConfig):
                raise ConfigError(f"InputGuard: routes[{pattern!r}] is not a GuardConfig")
            if pattern.endswith("*"):
                self._prefixes.append((pattern[:-1], cfg))
            else:
                self._exact[pattern] = cfg
        self._prefixes.sort(key=lambda item: len(item[0]), reverse=True)

    def config_for(self, path: str) -> tuple[str, GuardConfig | None]:
        """The route label and the config that apply to ``path``."""
        if path in self._exact:
            return path, self._exact[path]
        for prefix, cfg in self._prefixes:
            if path.startswith(prefix):
                return prefix + "*", cfg
        return "*", self.config


class InputGuard:
    """Pure ASGI middleware enforcing a ``GuardConfig`` per route (see ``GuardRoutes``)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        config: GuardConfig | None = None,
        routes: Mapping[str, GuardConfig | None] | None = None,
        registry: CollectorRegistry | None = REGISTRY,
    ) -> None:
        self.app = app
        self._routes = GuardRoutes(config, routes)
        self.config = self._routes.config
        self._metrics = metrics_for(registry)

    def config_for(self, path: str) -> tuple[str, GuardConfig | None]:
        """The route label and the config that apply to ``path``."""
        return self._routes.config_for(path)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        route, cfg = self.config_for(scope.get("path", ""))
        if cfg is None or scope.get("method", "GET") not in cfg.methods:
            await self.app(scope, receive, send)
            return
        request_id = ensure_request_id(scope)
        try:
            body = await _read_body(scope, receive, cfg)
            body, result = await _check(scope, body, cfg)
        except _Refusal as refusal:
            await self._refuse(send, route, request_id, refusal)
            return
        except _Disconnected:
            self._count_disconnect(route, request_id)
            return
        await self.app(_with_result(scope, body, result), _replay(body, receive), send)

    async def _refuse(self, send: Send, route: str, request_id: str, refusal: _Refusal) -> None:
        record_refusal(self._metrics, route, request_id, refusal)
        await send_error(
            send, refusal.code, refusal.message, request_id=request_id, status=refusal.status
        )

    def _count_disconnect(self, route: str, request_id: str) -> None:
        record_disconnect(self._metrics, route, request_id)


def record_refusal(metrics: ProtectMetrics, route: str, request_id: str, refusal: _Refusal) -> None:
    """Count and log a refused body (the answer is the caller's: ASGI or WSGI)."""
    if refusal.code is ErrorCode.TIMEOUT:
        metrics.request_timeouts.labels(route, "body_read").inc()
    else:
        metrics.input_rejections.labels(route, refusal.code.value).inc()
    log.warning(
        "input refused: %s",
        refusal.message,
        extra={"error_code": refusal.code.value, "request_id": request_id, "route": route},
    )


def record_disconnect(metrics: ProtectMetrics, route: str, request_id: str) -> None:
    metrics.request_timeouts.labels(route, "client_disconnect").inc()
    log.info(
        "client left while sending the body",
        extra={"error_code": "CLIENT_DISCONNECT", "request_id": request_id, "route": route},
    )


def _declared_length(scope: Scope) -> int | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None  # the server validates framing; count what arrives
    return None


async def _read_body(scope: Scope, receive: Receive, cfg: GuardConfig) -> bytes:
    limit = cfg.max_body_bytes
    declared = _declared_length(scope)
    if declared is not None and declared > limit:
        raise _Refusal(
            ErrorCode.INPUT_TOO_LARGE,
            f"body of {declared} bytes (Content-Length) is over the limit of {limit} bytes",
        )
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(cfg.body_timeout):
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    raise _Disconnected
                chunk = bytes(message.get("body", b""))
                size += len(chunk)
                if size > limit:
                    raise _Refusal(
                        ErrorCode.INPUT_TOO_LARGE,
                        f"body is over the limit of {limit} bytes (refused at {size} bytes)",
                    )
                chunks.append(chunk)
                if not message.get("more_body", False):
                    return b"".join(chunks)
    except TimeoutError:
        raise _Refusal(
            ErrorCode.TIMEOUT,
            f"body not received within {cfg.body_timeout:g} s ({size} bytes arrived)",
            status=408,
        ) from None


def _is_json(scope: Scope, cfg: GuardConfig) -> bool:
    for key, value in scope.get("headers", ()):
        if key.lower() == b"content-type":
            return is_json(bytes(value).decode("latin-1"), cfg)
    return is_json(None, cfg)


def is_json(content_type: str | None, cfg: GuardConfig) -> bool:
    """Whether the body is to be parsed as JSON: ``cfg.json``, else its media type says so."""
    if cfg.json is not None:
        return cfg.json
    if content_type is None:
        return False
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or media.endswith("+json")


async def _check(scope: Scope, body: bytes, cfg: GuardConfig) -> tuple[bytes, GuardResult]:
    body, text, document, normalized = inspect_body(body, _is_json(scope, cfg), cfg)
    tokens = await _count_tokens(text, cfg)
    return body, GuardResult(len(body), tokens, document, normalized)


def check_body_blocking(body: bytes, is_json: bool, cfg: GuardConfig) -> tuple[bytes, GuardResult]:
    """``_check`` for a thread that may block (WSGI): the tokenizer runs right here."""
    body, text, document, normalized = inspect_body(body, is_json, cfg)
    return body, GuardResult(len(body), _tokens(text, cfg), document, normalized)


def inspect_body(body: bytes, is_json: bool, cfg: GuardConfig) -> tuple[bytes, str, Any, bool]:
    """Every check but the token count: (body to hand on, text to tokenize, JSON, normalized).

    Raises ``_Refusal``. The text is the one to count tokens of: the body's, or
    the JSON's chosen strings.
    """
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _Refusal(
            ErrorCode.INPUT_INVALID_UTF8, f"body is not valid UTF-8 (byte {exc.start})"
        ) from None
    _check_text(text, cfg, where="body")
    if is_json:
        return _check_json(body, text, cfg)
    normalized = cfg.fullwidth == "normalize" and FULLWIDTH.search(text) is not None
    if normalized:
        text = unicodedata.normalize("NFKC", text)
        _check_text(text, cfg, where="normalized body")
        body = _within_limit(text.encode("utf-8"), cfg)
    return body, text, None, normalized


def _check_text(text: str, cfg: GuardConfig, *, where: str) -> None:
    if cfg.reject_control_chars and (found := CONTROL_CHARS.search(text)):
        raise _Refusal(
            ErrorCode.INPUT_CONTROL_CHARS,
            f"control character U+{ord(found.group()):04X} in the {where} "
            f"at position {found.start()}",
        )
    if SURROGATE.search(text):
        raise _Refusal(ErrorCode.INPUT_INVALID_UTF8, f"unpaired surrogate in the {where}")
    if cfg.fullwidth == "reject" and (found := FULLWIDTH.search(text)):
        raise _Refusal(
            ErrorCode.INPUT_FULLWIDTH,
            f"full-width character {found.group()!r} (U+{ord(found.group()):04X}) in the "
            f"{where} at position {found.start()}",
        )


def _check_json(body: bytes, text: str, cfg: GuardConfig) -> tuple[bytes, str, Any, bool]:
    try:
        document = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise _Refusal(ErrorCode.INPUT_BAD_JSON, f"body is not valid JSON: {exc}") from None
    for string, _, _ in _strings(document, cfg.max_json_depth):
        _check_text(string, cfg, where="JSON string")
    normalized = cfg.fullwidth == "normalize" and any(
        FULLWIDTH.search(s) for s, _, _ in _strings(document, cfg.max_json_depth)
    )
    if normalized:
        document = _map_strings(document, lambda s: unicodedata.normalize("NFKC", s))
        for string, _, _ in _strings(document, cfg.max_json_depth):
            _check_text(string, cfg, where="normalized JSON string")
        body = _within_limit(json.dumps(document, ensure_ascii=False).encode("utf-8"), cfg)
    return body, _token_text(document, cfg), document, normalized


def _within_limit(body: bytes, cfg: GuardConfig) -> bytes:
    # NFKC can expand a character to up to 18; the limit holds for what the app gets.
    if len(body) > cfg.max_body_bytes:
        raise _Refusal(
            ErrorCode.INPUT_TOO_LARGE,
            f"normalized body of {len(body)} bytes is over the limit of {cfg.max_body_bytes}",
        )
    return body


def _strings(document: Any, max_depth: int) -> Iterator[tuple[str, str | None, bool]]:
    """Every string with its top-level key and whether it is a key; depth-checked."""
    stack: list[tuple[Any, int, str | None]] = [(document, 0, None)]
    while stack:
        node, depth, top = stack.pop()
        if depth > max_depth:
            raise _Refusal(ErrorCode.INPUT_BAD_JSON, f"JSON nested deeper than {max_depth}")
        if isinstance(node, str):
            yield node, top, False
        elif isinstance(node, dict):
            for key, value in node.items():
                owner = key if depth == 0 else top
                yield key, owner, True
                stack.append((value, depth + 1, owner))
        elif isinstance(node, list):
            stack.extend((item, depth + 1, top) for item in node)


def _map_strings(node: Any, fn: Callable[[str], str]) -> Any:
    # Depth was bounded by _strings before this recursion runs.
    if isinstance(node, str):
        return fn(node)
    if isinstance(node, dict):
        return {fn(k): _map_strings(v, fn) for k, v in node.items()}
    if isinstance(node, list):
        return [_map_strings(item, fn) for item in node]
    return node


def _token_text(document: Any, cfg: GuardConfig) -> str:
    if cfg.tokenizer is None:
        return ""
    fields = cfg.text_fields
    parts = [
        s
        for s, top, is_key in _strings(document, cfg.max_json_depth)
        if not is_key and (fields is None or top in fields)
    ]
    return "\n".join(reversed(parts))


async def _count_tokens(text: str, cfg: GuardConfig) -> int | None:
    if cfg.tokenizer is not None and len(text) > _THREAD_TOKENIZE_CHARS:
        return await asyncio.to_thread(_tokens, text, cfg)
    return _tokens(text, cfg)


def _tokens(text: str, cfg: GuardConfig) -> int | None:
    tokenizer = cfg.tokenizer
    if tokenizer is None:
        return None
    try:
        count = tokenizer(text)
    except Exception as exc:
        raise _Refusal(
            ErrorCode.TOKENIZER_ERROR, f"the tokenizer failed on the input: {type(exc).__name__}"
        ) from None
    if cfg.max_tokens is not None and count > cfg.max_tokens:
        raise _Refusal(
            ErrorCode.INPUT_TOO_MANY_TOKENS,
            f"input has {count} tokens, over the limit of {cfg.max_tokens}",
        )
    return int(count)


def _with_result(scope: Scope, body: bytes, result: GuardResult) -> Scope:
    scope[GUARD_SCOPE_KEY] = result
    if not result.normalized:
        return scope
    headers = [(k, v) for k, v in scope.get("headers", ()) if k.lower() != b"content-length"]
    headers.append((b"content-length", str(len(body)).encode()))
    return {**scope, "headers": headers}


def _replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that yields the buffered body once, then the server's messages."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
