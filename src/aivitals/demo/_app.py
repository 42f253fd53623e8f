"""The demo service's HTTP surface (FastAPI): embeddings, streaming completions, chaos."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import threading
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, Field

from .. import signals
from ..errors import ConfigError
from ._cache import cache_key
from ._config import LM_MODEL_NAME, DemoConfig
from ._faults import FAULTS
from ._models import EMBED_MODEL_NAME, DemoModels, GenerationResult
from ._service import DemoService, QueueFullError, WorkHandle

__all__ = ["CHAOS_PATH", "create_app"]

CHAOS_PATH = "/_aivitals/chaos"
log = logging.getLogger("aivitals.demo")


class EmbeddingRequest(BaseModel):
    input: str | list[str] = Field(description="A text or a list of texts.")
    model: str | None = None


class CompletionRequest(BaseModel):
    prompt: str
    max_tokens: int | None = Field(default=None, ge=1)
    stream: bool = False
    seed: int | None = Field(default=None, ge=0, le=2**31 - 1)
    model: str | None = None


class ChaosRequest(BaseModel):
    fault: str
    action: str
    params: dict[str, Any] = Field(default_factory=dict)


def error_response(code: signals.ErrorCode, message: str, **headers: str) -> JSONResponse:
    info = signals.ERROR_CODES[code]
    body = {"error": {"code": str(code), "message": message, "layer": str(info.layer)}}
    return JSONResponse(body, status_code=info.http_status, headers=headers or None)


def create_app(config: DemoConfig | None = None, *, models: DemoModels | None = None) -> FastAPI:
    """The demo AI service as an ASGI app. Models load at startup unless passed in.

    **Usage**::

        app = create_app(DemoConfig(redis_url="redis://127.0.0.1:6379/0"))
        uvicorn.run(app, port=8000)
    """
    cfg = config or DemoConfig.from_env()
    service = DemoService(cfg, models=models)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await asyncio.to_thread(service.start)
        try:
            yield
        finally:
            service.close()

    app = FastAPI(title="aivitals demo AI service", version=cfg.model_version, lifespan=lifespan)
    app.state.service = service
    _add_model_routes(app, service)
    if cfg.chaos_token:
        _add_chaos_routes(app, service, cfg.chaos_token)
    return app


def _deadline(request: Request, default: float) -> float:
    raw = request.headers.get("x-request-timeout")
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"X-Request-Timeout={raw!r}: expected seconds") from None
    if not 0 < value <= 3600:
        raise ConfigError(f"X-Request-Timeout={raw!r}: expected 0 < seconds <= 3600")
    return value


def _add_model_routes(app: FastAPI, service: DemoService) -> None:
    cfg = service.config

    @app.post("/v1/embeddings")
    async def embeddings(body: EmbeddingRequest, request: Request) -> Response:
        service.on_request()
        texts = [body.input] if isinstance(body.input, str) else list(body.input)
        if not texts or len(texts) > cfg.max_batch:
            return error_response(
                signals.ErrorCode.INPUT_REJECTED, f"input must hold 1..{cfg.max_batch} texts"
            )
        key = cache_key("embeddings", {"input": texts})
        if (hit := await asyncio.to_thread(service.cache.get, key)) is not None:
            return Response(hit, media_type="application/json", headers={"X-Cache": "hit"})
        try:
            timeout = _deadline(request, cfg.request_timeout)
            vectors, tokens, _ = await asyncio.wait_for(
                service.run(lambda: service.embed_sync(texts)), timeout
            )
        except Exception as exc:
            return _failure(exc, "embeddings")
        payload = {
            "object": "list",
            "model": EMBED_MODEL_NAME,
            "data": [
                {"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vectors)
            ],
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }
        raw = json.dumps(payload).encode()
        await asyncio.to_thread(service.cache.set, key, raw)
        return Response(raw, media_type="application/json", headers={"X-Cache": "miss"})

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Response:
        service.on_request()
        max_tokens = body.max_tokens or cfg.default_max_tokens
        if max_tokens > cfg.max_new_tokens:
            return error_response(
                signals.ErrorCode.INPUT_REJECTED,
                f"max_tokens={max_tokens} exceeds the limit {cfg.max_new_tokens}",
            )
        try:
            timeout = _deadline(request, cfg.request_timeout)
            models = await asyncio.to_thread(service.models)
        except Exception as exc:
            return _failure(exc, "completions")
        prompt_ids = models.encode_prompt(body.prompt)
        if len(prompt_ids) > cfg.max_input_tokens:
            return error_response(
                signals.ErrorCode.INPUT_TOO_MANY_TOKENS,
                f"prompt has {len(prompt_ids)} tokens; the limit is {cfg.max_input_tokens}",
            )
        seed = body.seed if body.seed is not None else _seed(body.prompt)
        if body.stream:
            return _stream(service, prompt_ids, max_tokens, seed, timeout)
        key = cache_key("completions", {"p": body.prompt, "n": max_tokens, "s": seed})
        if (hit := await asyncio.to_thread(service.cache.get, key)) is not None:
            return Response(hit, media_type="application/json", headers={"X-Cache": "hit"})
        handle = _start_generation(service, prompt_ids, max_tokens, seed, lambda t, p: None)
        try:
            result = await _await_generation(service, handle, timeout)
        except Exception as exc:
            return _failure(exc, "completions")
        raw = json.dumps(_completion_payload(result, len(prompt_ids))).encode()
        await asyncio.to_thread(service.cache.set, key, raw)
        return Response(raw, media_type="application/json", headers={"X-Cache": "miss"})


def _seed(prompt: str) -> int:
    return int.from_bytes(uuid.uuid5(uuid.NAMESPACE_OID, prompt).bytes[:4], "big")


def _start_generation(
    service: DemoService, prompt_ids: list[int], max_tokens: int, seed: int, on_token: Any
) -> WorkHandle:
    abort = threading.Event()
    future = service.submit(
        lambda: service.generate_sync(
            prompt_ids, max_tokens, seed=seed, on_token=on_token, abort=abort
        )
    )
    return WorkHandle(abort, future)


async def _await_generation(
    service: DemoService, handle: WorkHandle, timeout: float
) -> GenerationResult:
    try:
        return await asyncio.wait_for(asyncio.wrap_future(handle.future), timeout)
    except (TimeoutError, asyncio.CancelledError):
        if service.aborts_on_timeout:
            handle.abort.set()  # the worker stops at its next token
        raise


def _completion_payload(result: GenerationResult, prompt_tokens: int) -> dict[str, Any]:
    return {
        "id": f"cmpl-{uuid.uuid4().hex[:16]}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": LM_MODEL_NAME,
        "choices": [
            {
                "index": 0,
                "text": result.text,
                "finish_reason": "abort" if result.aborted else "length",
            }
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": result.tokens,
            "total_tokens": prompt_tokens + result.tokens,
        },
    }


def _stream(
    service: DemoService, prompt_ids: list[int], max_tokens: int, seed: int, timeout: float
) -> Response:
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[str | None] = asyncio.Queue()

    def on_token(token: int, piece: str) -> None:
        loop.call_soon_threadsafe(queue.put_nowait, piece)

    try:
        handle = _start_generation(service, prompt_ids, max_tokens, seed, on_token)
    except Exception as exc:
        return _failure(exc, "completions")
    handle.future.add_done_callback(lambda f: loop.call_soon_threadsafe(queue.put_nowait, None))
    cid = f"cmpl-{uuid.uuid4().hex[:16]}"
    deadline = loop.time() + timeout

    def chunk(text: str, finish: str | None) -> str:
        data = {
            "id": cid,
            "object": "text_completion",
            "created": int(time.time()),
            "model": LM_MODEL_NAME,
            "choices": [{"index": 0, "text": text, "finish_reason": finish}],
        }
        return f"data: {json.dumps(data)}\n\n"

    async def events() -> AsyncIterator[str]:
        try:
            while True:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    raise TimeoutError
                piece = await asyncio.wait_for(queue.get(), remaining)
                if piece is None:
                    break
                yield chunk(piece, None)
            result = handle.future.result()
            yield chunk("", "abort" if result.aborted else "length")
            yield "data: [DONE]\n\n"
        except TimeoutError:
            if service.aborts_on_timeout:
                handle.abort.set()
            log.warning(
                "completion deadline passed", extra={"error_code": str(signals.ErrorCode.TIMEOUT)}
            )
            err = {"error": {"code": "TIMEOUT", "message": f"deadline of {timeout:g} s passed"}}
            yield f"data: {json.dumps(err)}\n\n"
        except Exception as exc:
            code = signals.classify_exception(exc)
            log.error("completion failed", extra={"error_code": str(code)})
            yield f"data: {json.dumps({'error': {'code': str(code), 'message': str(exc)}})}\n\n"
        finally:
            # client gone or generator closed: stop the work unless the fault says otherwise
            if not handle.future.done() and service.aborts_on_timeout:
                handle.abort.set()

    return StreamingResponse(events(), media_type="text/event-stream")


def _failure(exc: BaseException, route: str) -> Response:
    if isinstance(exc, ConfigError):
        return error_response(signals.ErrorCode.INPUT_REJECTED, str(exc))
    if isinstance(exc, QueueFullError):
        return error_response(signals.ErrorCode.QUEUE_FULL, str(exc), **{"Retry-After": "1"})
    if isinstance(exc, TimeoutError):
        code = signals.ErrorCode.TIMEOUT
    else:
        code = signals.classify_exception(exc)
    log.error("%s failed: %s", route, type(exc).__name__, extra={"error_code": str(code)})
    return error_response(code, f"{type(exc).__name__}: {exc}" if str(exc) else code.value)


def _add_chaos_routes(app: FastAPI, service: DemoService, token: str) -> None:
    def authorised(request: Request) -> bool:
        given = request.headers.get("x-aivitals-token", "")
        return hmac.compare_digest(given.encode(), token.encode())

    @app.get(CHAOS_PATH, include_in_schema=False)
    async def chaos_list(request: Request) -> Response:
        if not authorised(request):
            return JSONResponse({"error": "bad or missing X-Aivitals-Token"}, status_code=403)
        return JSONResponse(
            {
                "active": service.faults.listing(),
                "available": {n: s.help for n, s in FAULTS.items()},
            }
        )

    @app.post(CHAOS_PATH, include_in_schema=False)
    async def chaos(body: ChaosRequest, request: Request) -> Response:
        if not authorised(request):
            return JSONResponse({"error": "bad or missing X-Aivitals-Token"}, status_code=403)
        try:
            if body.action == "start":
                described = await asyncio.to_thread(service.faults.start, body.fault, body.params)
                log.warning("chaos fault started", extra={"fault": body.fault})
                return JSONResponse({"started": described})
            if body.action == "stop":
                stopped = await asyncio.to_thread(service.faults.stop, body.fault)
                log.warning("chaos fault stopped", extra={"fault": body.fault})
                return JSONResponse({"stopped": stopped, "fault": body.fault})
        except ConfigError as exc:
            return JSONResponse({"error": str(exc)}, status_code=400)
        msg = f"action={body.action!r}: expected start or stop"
        return JSONResponse({"error": msg}, status_code=400)
