"""The demo service's HTTP surface (FastAPI): embeddings, streaming completions, and the
chaos hook every service can mount (``aivitals.chaos.mount``) with the demo's hooks."""

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
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, Field

from .. import signals
from ..chaos import CHAOS_ENV, CHAOS_PATH, mount
from ..errors import ConfigError
from ..instrument import REQUEST_STATE, InferenceAborted, abort_request, current_request_id
from ..instrument import instrument as instrument_app
from ..protect import AdmissionConfig, GuardConfig, HealthConfig, Protected, protect
from ._cache import cache_key
from ._config import LM_MODEL_NAME, DemoConfig
from ._models import EMBED_MODEL_NAME, DemoModels, GenerationResult
from ._service import DemoService, QueueFullError, WorkHandle

__all__ = ["DemoApp", "create_app"]

#: POST: a planned model reload, warm (``DemoService.reload_models``); same token as chaos
RELOAD_PATH = "/_aivitals/reload"
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


def error_response(code: signals.ErrorCode, message: str, **headers: str) -> JSONResponse:
    _note_error(code)
    info = signals.ERROR_CODES[code]
    body = {"error": {"code": str(code), "message": message, "layer": str(info.layer)}}
    return JSONResponse(body, status_code=info.http_status, headers=headers or None)


class DemoApp:
    """The served ASGI app: instrumentation around protection around the FastAPI routes.

    ``fastapi`` runs the lifespan (model load, warm-up); ``service`` does the work;
    ``protected`` holds the admission controller and the health checks.
    """

    def __init__(self, fastapi: FastAPI, service: DemoService, protected: Protected, outer: Any):
        self.fastapi = fastapi
        self.service = service
        self.protected = protected
        self._outer = outer

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self._outer(scope, receive, send)


def create_app(config: DemoConfig | None = None, *, models: DemoModels | None = None) -> DemoApp:
    """The demo AI service as an ASGI app. Models load at startup unless passed in.

    From the outside in: ``aivitals.instrument`` (metrics, request id, JSON
    lifecycle logs, ``/metrics``), ``aivitals.protect`` (health endpoints,
    admission control with 429, the input guard, deadlines that abort), the chaos
    hook (``aivitals.chaos.mount``, on with ``chaos_token``; its per-request faults
    on the model routes only), then the routes.

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
    app.add_exception_handler(RequestValidationError, _schema_error)
    _add_model_routes(app, service)
    if cfg.chaos_token:
        _add_reload_route(app, service, cfg.chaos_token)
    # inside protect and instrument: a fault's delay counts in the request's latency
    # and deadline as the app's own work would; the per-request faults act on the model
    # routes, as a real handler's slow code would, never on /metrics or the probes
    chaos = mount(
        app,
        hooks=service.chaos_hooks(),
        paths=("/v1/embeddings", "/v1/completions"),
        gpu=lambda: service.gpu,
        environ={CHAOS_ENV: cfg.chaos_token} if cfg.chaos_token else {},
    )
    service.faults = chaos.faults
    protected = protect(
        chaos,
        guard=GuardConfig(
            max_body_bytes=cfg.max_body_bytes,
            json=True,
            tokenizer=service.count_tokens,
            max_tokens=cfg.max_input_tokens,
            text_fields=("input", "prompt"),
        ),
        guard_routes={CHAOS_PATH: None, RELOAD_PATH: None, "/docs": None, "/openapi.json": None},
        admission=AdmissionConfig(
            # the adaptive limit never falls below what the lanes can run and queue:
            # every worker busy and as many waiting. Under it the limiter would starve
            # the workers (DOMAIN 7: "only N run on the GPU"), and it does get there
            # on its own: a window of cache hits (a few ms) sets the no-contention
            # baseline that generations (100+ ms) then always exceed, so the gradient
            # shrinks the limit to its floor and a half-loaded service queues at
            # admission (QueueWaitHigh on queue="admission").
            min_limit=_admission_floor(cfg),
            initial_limit=max(4, _admission_floor(cfg)),
            queue_size=cfg.queue_size,
            default_timeout=cfg.request_timeout,
            max_timeout=max(600.0, cfg.request_timeout),
            paths=("/v1/embeddings", "/v1/completions"),
        ),
        health=HealthConfig(
            probe=service.probe,
            model_loaded=lambda: service.models_loaded and service.ready,
            gpu_memory=service.gpu_memory,
            dependencies=service.dependencies(),
            probe_interval=cfg.probe_interval,
            probe_timeout=cfg.probe_timeout,
        ),
        registry=service.registry,
    )
    routes = ["/v1/embeddings", "/v1/completions", CHAOS_PATH, RELOAD_PATH]
    # health probes stay out of the HTTP metrics: a 503 from /readyz is not a served error
    probes = frozenset({"/healthz", "/readyz", "/health/queue"})
    outer = instrument_app(
        protected, registry=service.registry, routes=routes, exclude_paths=probes
    )
    return DemoApp(app, service, protected, outer)


async def _schema_error(request: Request, exc: Exception) -> Response:
    """A body that parses but does not fit the schema: 422 with a catalogue code."""
    errors = exc.errors() if isinstance(exc, RequestValidationError) else []
    where = "; ".join(
        f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg', '')}" for e in errors[:5]
    )
    return error_response(signals.ErrorCode.INPUT_REJECTED, where or str(exc))


def _admission_floor(cfg: DemoConfig) -> int:
    """The lowest admission limit: both lanes' workers busy and one waiting per worker."""
    return 2 * (cfg.workers + cfg.embedding_workers)


def _add_model_routes(app: FastAPI, service: DemoService) -> None:
    cfg = service.config

    @app.post("/v1/embeddings")
    async def embeddings(body: EmbeddingRequest) -> Response:
        texts = [body.input] if isinstance(body.input, str) else list(body.input)
        if not texts or len(texts) > cfg.max_batch:
            return error_response(
                signals.ErrorCode.INPUT_REJECTED, f"input must hold 1..{cfg.max_batch} texts"
            )
        key = cache_key("embeddings", {"input": texts})
        if (hit := await asyncio.to_thread(service.cache.get, "embeddings", key)) is not None:
            return Response(hit, media_type="application/json", headers={"X-Cache": "hit"})
        try:
            vectors, tokens, _ = await service.run_embedding(lambda: service.embed_sync(texts))
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
        await asyncio.to_thread(service.cache.set, "embeddings", key, raw)
        return Response(raw, media_type="application/json", headers={"X-Cache": "miss"})

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest) -> Response:
        max_tokens = body.max_tokens or cfg.default_max_tokens
        if max_tokens > cfg.max_new_tokens:
            return error_response(
                signals.ErrorCode.INPUT_REJECTED,
                f"max_tokens={max_tokens} exceeds the limit {cfg.max_new_tokens}",
            )
        try:
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
        # streamed or not, the same request has the same answer: one cache entry serves both
        key = cache_key("completions", {"p": body.prompt, "n": max_tokens, "s": seed})
        hit = await asyncio.to_thread(service.cache.get, "completions", key)
        if body.stream:
            if hit is not None:
                return _stream_cached(hit)
            return _stream(service, prompt_ids, max_tokens, seed, key)
        if hit is not None:
            return Response(hit, media_type="application/json", headers={"X-Cache": "hit"})
        try:
            handle = _start_generation(service, prompt_ids, max_tokens, seed, lambda t, p: None)
            result = await _await_generation(service, handle)
        except Exception as exc:
            return _failure(exc, "completions")
        raw = json.dumps(_completion_payload(result, len(prompt_ids))).encode()
        await asyncio.to_thread(service.cache.set, "completions", key, raw)
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


async def _await_generation(service: DemoService, handle: WorkHandle) -> GenerationResult:
    try:
        return await asyncio.wrap_future(handle.future)
    except asyncio.CancelledError:
        # the deadline middleware cancelled us (and fired the abort hooks): make sure
        # a generation still queued never starts, unless the fault says otherwise
        _abort(service, handle)
        raise


def _abort(service: DemoService, handle: WorkHandle) -> None:
    """Abort the generation through the model call's abort hook (it stops at the next token)."""
    rid = current_request_id()
    if rid is not None:
        abort_request(rid, "deadline")
    if service.aborts_on_timeout:
        handle.abort.set()


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


def _stream_cached(raw: bytes) -> Response:
    """A cached completion replayed as a stream: its whole text in one event."""
    try:
        cached = json.loads(raw)
        text = str(cached["choices"][0]["text"])
        finish = str(cached["choices"][0]["finish_reason"])
    except (ValueError, KeyError, IndexError, TypeError):
        text, finish = "", "length"  # an entry of another shape: an empty answer, not a 500
    cid = f"cmpl-{uuid.uuid4().hex[:16]}"

    def chunk(piece: str, reason: str | None) -> str:
        data = {
            "id": cid,
            "object": "text_completion",
            "created": int(time.time()),
            "model": LM_MODEL_NAME,
            "choices": [{"index": 0, "text": piece, "finish_reason": reason}],
        }
        return f"data: {json.dumps(data)}\n\n"

    async def events() -> AsyncIterator[str]:
        yield chunk(text, None)
        yield chunk("", finish)
        yield "data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream", headers={"X-Cache": "hit"})


def _stream(
    service: DemoService, prompt_ids: list[int], max_tokens: int, seed: int, key: str
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
                piece = await queue.get()
                if piece is None:
                    break
                yield chunk(piece, None)
            result = handle.future.result()
            yield chunk("", "abort" if result.aborted else "length")
            yield "data: [DONE]\n\n"
            if not result.aborted:
                raw = json.dumps(_completion_payload(result, len(prompt_ids))).encode()
                await asyncio.to_thread(service.cache.set, "completions", key, raw)
        except InferenceAborted as exc:
            _note_error(signals.ErrorCode.TIMEOUT)
            err = {"error": {"code": "TIMEOUT", "message": str(exc)}}
            yield f"data: {json.dumps(err)}\n\n"
        except Exception as exc:
            code = signals.classify_exception(exc)
            _note_error(code)
            log.error("completion failed: %s", type(exc).__name__)
            yield f"data: {json.dumps({'error': {'code': str(code), 'message': str(exc)}})}\n\n"
        finally:
            # client gone or generator closed: stop the work unless the fault says otherwise
            if not handle.future.done():
                _abort(service, handle)

    return StreamingResponse(events(), media_type="text/event-stream", headers={"X-Cache": "miss"})


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


def _note_error(code: signals.ErrorCode) -> None:
    state = REQUEST_STATE.get()
    if state is not None and state.error_code is None:
        state.error_code = str(code)


def _add_reload_route(app: FastAPI, service: DemoService, token: str) -> None:
    def authorised(request: Request) -> bool:
        given = request.headers.get("x-aivitals-token", "")
        return hmac.compare_digest(given.encode(), token.encode())

    @app.post(RELOAD_PATH, include_in_schema=False)
    async def reload(request: Request) -> Response:
        if not authorised(request):
            return JSONResponse({"error": "bad or missing X-Aivitals-Token"}, status_code=403)
        seconds = await asyncio.to_thread(service.reload_models)
        log.warning("models reloaded (warm swap)", extra={"duration_ms": round(seconds * 1000)})
        return JSONResponse({"reloaded_s": seconds})
