"""Small apps the instrument tests serve (importable by uvicorn subprocesses too)."""

from __future__ import annotations

import asyncio
import os
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse
from prometheus_client import REGISTRY, CollectorRegistry

import aivitals
from aivitals.instrument import instrument


def fastapi_app(
    registry: CollectorRegistry | None = REGISTRY, *, instrumented: bool = True, **settings: Any
) -> FastAPI:
    app = FastAPI()

    @app.post("/v1/echo")
    async def echo(request: Request) -> dict[str, int]:
        body = await request.body()
        return {"n": len(body)}

    @app.get("/v1/items/{item_id}")
    async def item(item_id: int) -> dict[str, int]:
        return {"id": item_id}

    @app.get("/v1/boom")
    async def boom() -> None:
        raise RuntimeError("boom")

    @app.get("/v1/stream")
    async def stream() -> StreamingResponse:
        async def tokens() -> Any:
            with aivitals.inference(
                model="toy", version="v1.0.0-3-gabcdef1", registry=registry, input_tokens=4
            ) as call:
                for i in range(5):
                    await asyncio.sleep(0.02)
                    call.token()
                    yield f"tok{i} ".encode()

        return StreamingResponse(tokens(), media_type="text/plain")

    @app.get("/v1/pid")
    async def pid() -> dict[str, int]:
        return {"pid": os.getpid()}

    if instrumented:
        instrument(app, registry=registry, **settings)
    return app
