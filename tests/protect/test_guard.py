from __future__ import annotations

import json
import logging
import time

import pytest
from prometheus_client import CollectorRegistry

from aivitals.errors import ConfigError
from aivitals.protect import GUARD_SCOPE_KEY, GuardConfig, GuardResult, InputGuard

from ._asgi import Echo, call, sample

pytestmark = pytest.mark.anyio

JSON = [("content-type", "application/json")]


def guard(registry: CollectorRegistry, **kwargs: object) -> tuple[InputGuard, Echo]:
    echo = Echo()
    routes = kwargs.pop("routes", None)
    config = GuardConfig(**kwargs)  # type: ignore[arg-type]
    return InputGuard(echo, config=config, routes=routes, registry=registry), echo  # type: ignore[arg-type]


def rejected(registry: CollectorRegistry, reason: str, route: str = "*") -> float:
    return sample(registry, "input_rejections_total", route=route, reason=reason)


async def test_streamed_body_over_the_limit_is_refused_after_one_chunk_past_it() -> None:
    registry = CollectorRegistry()
    app, echo = guard(registry, max_body_bytes=100_000)
    chunk = b"a" * 65_536
    chunks = [chunk] * (10 * 2**20 // len(chunk))  # 10 MB, no Content-Length
    reply = await call(app, chunks=chunks, headers=[("x-request-id", "req-413")])
    assert reply.status == 413
    assert reply.bytes_read <= 100_000 + len(chunk)
    assert reply.json() == {
        "error": {"code": "INPUT_TOO_LARGE", "message": reply.json()["error"]["message"]},
        "request_id": "req-413",
    }
    assert echo.calls == 0
    assert rejected(registry, "INPUT_TOO_LARGE") == 1


async def test_declared_length_over_the_limit_is_refused_before_reading() -> None:
    registry = CollectorRegistry()
    app, _ = guard(registry, max_body_bytes=1000)
    reply = await call(app, chunks=[b"x" * 5000], headers=[("content-length", "5000")])
    assert reply.status == 413
    assert reply.bytes_read == 0
    assert "5000" in reply.json()["error"]["message"]


async def test_a_lying_small_content_length_does_not_lift_the_limit() -> None:
    registry = CollectorRegistry()
    app, _ = guard(registry, max_body_bytes=1000)
    reply = await call(app, chunks=[b"x" * 800, b"x" * 800], headers=[("content-length", "10")])
    assert reply.status == 413


async def test_body_exactly_at_the_limit_passes_and_is_replayed() -> None:
    registry = CollectorRegistry()
    app, echo = guard(registry, max_body_bytes=1000)
    reply = await call(app, chunks=[b"x" * 600, b"y" * 400])
    assert reply.status == 200
    assert echo.bodies == [b"x" * 600 + b"y" * 400]
    result = echo.scopes[0][GUARD_SCOPE_KEY]
    assert isinstance(result, GuardResult) and result.body_bytes == 1000


async def test_invalid_utf8_is_400() -> None:
    registry = CollectorRegistry()
    app, echo = guard(registry)
    reply = await call(app, chunks=[b'{"prompt": "caf\xe9"}'], headers=JSON)
    assert reply.status == 400
    assert reply.json()["error"]["code"] == "INPUT_INVALID_UTF8"
    assert echo.calls == 0
    assert rejected(registry, "INPUT_INVALID_UTF8") == 1


async def test_utf8_split_across_chunks_is_fine() -> None:
    registry = CollectorRegistry()
    app, echo = guard(registry)
    data = "héllo wörld".encode()
    reply = await call(app, chunks=[data[:2], data[2:]])
    assert reply.status == 200
    assert echo.bodies == [data]


@pytest.mark.parametrize("char", ["\x00", "\x08", "\x0b", "\x0c", "\x0e", "\x1f", "\x7f"])
async def test_control_characters_are_422(char: str) -> None:
    registry = CollectorRegistry()
    app, _ = guard(registry)
    reply = await call(app, chunks=[f"hello{char}world".encode()])
    assert reply.status == 422
    assert reply.json()["error"]["code"] == "INPUT_CONTROL_CHARS"
    assert rejected(registry, "INPUT_CONTROL_CHARS") == 1


async def test_escaped_control_characters_inside_json_strings_are_422() -> None:
    registry = CollectorRegistry()
    app, _ = guard(registry)
    reply = await call(app, chunks=[b'{"prompt": "a\\u0000b"}'], headers=JSON)
    assert reply.status == 422
    assert reply.json()["error"]["code"] == "INPUT_CONTROL_CHARS"
    assert "JSON string" in reply.json()["error"]["message"]


async def test_tab_newline_and_carriage_return_are_allowed() -> None:
    registry = CollectorRegistry()
    app, _ = guard(registry)
    reply = await call(app, chunks=[b'{"prompt": "a\\tb\\nc\\r"}\r\n'], headers=JSON)
    assert reply.status == 200


async def test_fullwidth_rejected_by_default() -> None:
    registry = CollectorRegistry()
    app, _ = guard(registry)
    reply = await call(app, chunks=['{"prompt": "\uff11\uff12\uff13"}'.encode()], headers=JSON)
    assert reply.status == 422
    assert reply.json()["error"]["code"] == "INPUT_FULLWIDTH"
    assert rejected(registry, "INPUT_FULLWIDTH") == 1


async def test_fullwidth_escaped_in_json_is_seen_too() -> None:
    registry = CollectorRegistry()
    app, _ = guard(registry)
    reply = await call(app, chunks=[b'{"prompt": "\\uff21"}'], headers=JSON)
    assert reply.status == 422
    assert reply.json()["error"]["code"] == "INPUT_FULLWIDTH"


async def test_fullwidth_normalized_json_is_rewritten_with_correct_length() -> None:
    registry = CollectorRegistry()
    app, echo = guard(registry, fullwidth="normalize")
    raw = '{"prompt": "\uff21\uff22\uff23\uff11\uff12\uff13\uff02\uff58\uff02"}'.encode()
    reply = await call(app, chunks=[raw], headers=[*JSON, ("content-length", str(len(raw)))])
    assert reply.status == 200
    body = echo.bodies[0]
    assert json.loads(body) == {"prompt": 'ABC123"x"'}
    headers = dict(echo.scopes[0]["headers"])
    assert int(headers[b"content-length"]) == len(body)
    assert echo.scopes[0][GUARD_SCOPE_KEY].normalized is True


async def test_fullwidth_normalized_plain_text() -> None:
    registry = CollectorRegistry()
    app, echo = guard(registry, fullwidth="normalize")
    text = "\uff48\uff45\uff4c\uff4c\uff4f"  # full-width "hello"
    reply = await call(app, chunks=[text.encode()], headers=[("content-type", "text/plain")])
    assert reply.status == 200
    assert echo.bodies == [b"hello"]


async def test_fullwidth_allowed_passes_unchanged() -> None:
    registry = CollectorRegistry()
    app, echo = guard(registry, fullwidth="allow")
    raw = "\uff11\uff12\uff13".encode()
    reply = await call(app, chunks=[raw])
    assert reply.status == 200
    assert echo.bodies == [raw]


def count_words(text: str) -> int:
    return len(text.split())


async def test_token_limit_is_422_and_counts_only_text_fields() -> None:
    registry = CollectorRegistry()
    app, echo = guard(registry, tokenizer=count_words, max_tokens=3, text_fields=("prompt",))
    ok = await call(
        app, chunks=[b'{"prompt": "one two three", "meta": "a b c d e f"}'], headers=JSON
    )
    assert ok.status == 200
    assert echo.scopes[0][GUARD_SCOPE_KEY].tokens == 3
    over = await call(app, chunks=[b'{"prompt": "one two three four"}'], headers=JSON)
    assert over.status == 422
    assert over.json()["error"]["code"] == "INPUT_TOO_MANY_TOKENS"
    assert "4 tokens" in over.json()["error"]["message"]
    assert rejected(registry, "INPUT_TOO_MANY_TOKENS") == 1


async def test_a_tokenizer_that_crashes_is_422_tokenizer_error() -> None:
    def broken(text: str) -> int:
        raise IndexError("token id out of range")

    registry = CollectorRegistry()
    app, _ = guard(registry, tokenizer=broken, max_tokens=10)
    reply = await call(app, chunks=[b"hello"])
    assert reply.status == 422
    assert reply.json()["error"]["code"] == "TOKENIZER_ERROR"


@pytest.mark.parametrize(
    "raw",
    [b'{"prompt": ', b"not json", b"[1, 2,]", b'{"a": 1} trailing', b"[" * 5000 + b"]" * 5000],
)
async def test_json_that_does_not_parse_is_400(raw: bytes) -> None:
    registry = CollectorRegistry()
    app, _ = guard(registry, max_body_bytes=1_000_000)
    reply = await call(app, chunks=[raw], headers=JSON)
    assert reply.status == 400
    assert reply.json()["error"]["code"] == "INPUT_BAD_JSON"
    assert rejected(registry, "INPUT_BAD_JSON") == 1


async def test_json_nested_deeper_than_the_limit_is_400() -> None:
    registry = CollectorRegistry()
    app, _ = guard(registry, max_json_depth=8)
    reply = await call(app, chunks=[b'{"a": ' * 10 + b"1" + b"}" * 10], headers=JSON)
    assert reply.status == 400
    assert "deeper than 8" in reply.json()["error"]["message"]


async def test_lone_surrogate_escape_is_invalid_utf8() -> None:
    registry = CollectorRegistry()
    app, _ = guard(registry)
    reply = await call(app, chunks=[b'{"prompt": "\\ud800"}'], headers=JSON)
    assert reply.status == 400
    assert reply.json()["error"]["code"] == "INPUT_INVALID_UTF8"


async def test_json_required_on_a_route_even_without_content_type() -> None:
    registry = CollectorRegistry()
    app, _ = guard(registry, json=True)
    reply = await call(app, chunks=[b"plain text"])
    assert reply.status == 400
    assert reply.json()["error"]["code"] == "INPUT_BAD_JSON"


async def test_per_route_configuration_and_unguarded_routes() -> None:
    registry = CollectorRegistry()
    echo = Echo()
    app = InputGuard(
        echo,  # type: ignore[arg-type]
        config=GuardConfig(max_body_bytes=10),
        routes={"/big": GuardConfig(max_body_bytes=1000), "/raw/*": None},
        registry=registry,
    )
    assert (await call(app, path="/other", chunks=[b"x" * 50])).status == 413
    assert (await call(app, path="/big", chunks=[b"x" * 50])).status == 200
    assert (await call(app, path="/raw/upload", chunks=[b"\x00" * 5000])).status == 200
    assert rejected(registry, "INPUT_TOO_LARGE", route="*") == 1


async def test_methods_without_a_checked_body_pass_through() -> None:
    registry = CollectorRegistry()
    app, echo = guard(registry, max_body_bytes=1)
    reply = await call(app, method="GET", chunks=[b"\x00\x00"])
    assert reply.status == 200 and echo.calls == 1


async def test_slow_loris_is_cut_off_after_the_body_timeout() -> None:
    registry = CollectorRegistry()
    app, echo = guard(registry, body_timeout=0.2)
    began = time.monotonic()
    reply = await call(app, chunks=[b"x" * 10, b"never sent"], stall_after=1)
    elapsed = time.monotonic() - began
    assert reply.status == 408
    assert reply.json()["error"]["code"] == "TIMEOUT"
    assert 0.15 <= elapsed < 1.0
    assert echo.calls == 0
    assert sample(registry, "request_timeouts_total", route="*", reason="body_read") == 1


async def test_client_leaving_mid_body_gets_nothing_and_is_counted() -> None:
    registry = CollectorRegistry()
    echo = Echo()
    app = InputGuard(echo, registry=registry)  # type: ignore[arg-type]
    scope = {"type": "http", "method": "POST", "path": "/", "headers": []}
    messages = [
        {"type": "http.request", "body": b"abc", "more_body": True},
        {"type": "http.disconnect"},
    ]
    sent: list[object] = []

    async def receive() -> dict[str, object]:
        return messages.pop(0)

    async def send(message: object) -> None:
        sent.append(message)

    await app(scope, receive, send)
    assert sent == [] and echo.calls == 0
    assert sample(registry, "request_timeouts_total", route="*", reason="client_disconnect") == 1


async def test_rejection_is_logged_with_request_id_and_error_code(
    caplog: pytest.LogCaptureFixture,
) -> None:
    registry = CollectorRegistry()
    app, _ = guard(registry)
    with caplog.at_level(logging.WARNING, logger="aivitals.protect"):
        reply = await call(app, chunks=[b"\x00"], headers=[("x-request-id", "abc-123")])
    assert reply.json()["request_id"] == "abc-123"
    record = next(r for r in caplog.records if r.name == "aivitals.protect")
    assert record.__dict__["request_id"] == "abc-123"
    assert record.__dict__["error_code"] == "INPUT_CONTROL_CHARS"


async def test_an_unsafe_request_id_header_is_replaced() -> None:
    registry = CollectorRegistry()
    app, _ = guard(registry)
    reply = await call(app, chunks=[b"\x00"], headers=[("x-request-id", "a b\tc" * 100)])
    request_id = reply.json()["request_id"]
    assert request_id and " " not in request_id and len(request_id) <= 128


async def test_websocket_and_lifespan_pass_through() -> None:
    registry = CollectorRegistry()
    seen: list[str] = []

    async def inner(scope: dict[str, object], receive: object, send: object) -> None:
        seen.append(str(scope["type"]))

    app = InputGuard(inner, registry=registry)  # type: ignore[arg-type]
    await app({"type": "lifespan"}, None, None)  # type: ignore[arg-type]
    assert seen == ["lifespan"]


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"max_body_bytes": 0}, "max_body_bytes"),
        ({"max_body_bytes": True}, "max_body_bytes"),
        ({"body_timeout": -1}, "body_timeout"),
        ({"body_timeout": float("inf")}, "body_timeout"),
        ({"fullwidth": "strip"}, "fullwidth"),
        ({"max_tokens": 10}, "tokenizer"),
        ({"max_json_depth": 0}, "max_json_depth"),
        ({"methods": frozenset({"post"})}, "methods"),
    ],
)
def test_bad_config_names_the_key(kwargs: dict[str, object], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        GuardConfig(**kwargs)  # type: ignore[arg-type]


def test_routes_must_map_to_configs() -> None:
    with pytest.raises(ConfigError, match="/x"):
        InputGuard(Echo(), routes={"/x": 5}, registry=CollectorRegistry())  # type: ignore[dict-item,arg-type]
