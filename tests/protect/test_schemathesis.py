"""Schemathesis against a small FastAPI app's OpenAPI, behind protect(): never a 500."""

from __future__ import annotations

import schemathesis
from fastapi import FastAPI
from hypothesis import HealthCheck, settings
from prometheus_client import CollectorRegistry
from pydantic import BaseModel, Field

from aivitals.protect import AdmissionConfig, GuardConfig, HealthConfig, protect


class Generate(BaseModel):
    prompt: str = Field(max_length=2000)
    max_new_tokens: int = Field(default=16, ge=1, le=4096)


class Embed(BaseModel):
    texts: list[str] = Field(max_length=16)


api = FastAPI(title="protected test service")


@api.post("/v1/generate")
async def generate(request: Generate) -> dict[str, object]:
    return {"text": request.prompt[::-1][: request.max_new_tokens]}


@api.post("/v1/embed")
async def embed(request: Embed) -> dict[str, object]:
    return {"vectors": [[float(len(t))] for t in request.texts]}


@api.get("/v1/items/{item_id}")
async def item(item_id: int) -> dict[str, int]:
    return {"item_id": item_id}


app = protect(
    api,  # type: ignore[arg-type]
    guard=GuardConfig(
        max_body_bytes=20_000, tokenizer=lambda text: len(text.split()), max_tokens=500
    ),
    admission=AdmissionConfig(memory_capacity=10**12, max_timeout=60),
    health=HealthConfig(),
    registry=CollectorRegistry(),
)

schema = schemathesis.openapi.from_asgi("/openapi.json", app)


@schema.parametrize()
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_operation_answers_500(case: schemathesis.Case) -> None:
    response = case.call()
    assert response.status_code < 500, (response.status_code, response.text)
    if response.status_code in (400, 408, 413, 422, 429) and "error" in response.json():
        error = response.json()["error"]
        assert isinstance(error, dict) and error["code"] and error["message"]
