"""Schemathesis against a small FastAPI app's OpenAPI, behind protect(): never a 500."""

from __future__ import annotations

import ast
import inspect
import sys

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


def _parse_lambda_sources_now() -> None:
    """Parse the sources hypothesis reads to describe lambdas, here at a shallow stack.

    Hypothesis describes a strategy's lambdas by parsing their module, lazily,
    wherever it first needs one: deep inside schemathesis' recursion, where
    CPython 3.11.7's ast.parse can fail with "SystemError: AST constructor
    recursion depth mismatch" (fixed in later CPythons), which hypothesis then
    reports as a flaky test. Its cache of parsed sources is internal, so on
    any other hypothesis this quietly does nothing.
    """
    try:
        from hypothesis.internal import lambda_sources

        cache = lambda_sources.AST_LAMBDAS_CACHE
        extract = lambda_sources.extract_all_lambdas
    except (ImportError, AttributeError):
        return
    prefixes = ("schemathesis.", "hypothesis.strategies._internal.", "hypothesis.internal.")
    for name, module in list(sys.modules.items()):
        if not name.startswith(prefixes):
            continue
        try:
            lines = tuple(inspect.findsource(module)[0])
        except (OSError, TypeError):
            continue
        if any("lambda" in line for line in lines):
            cache[lines] = extract(ast.parse("".join(lines)))


_parse_lambda_sources_now()


@schema.parametrize()
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_operation_answers_500(case: schemathesis.Case) -> None:
    response = case.call()
    assert response.status_code < 500, (response.status_code, response.text)
    if response.status_code in (400, 408, 413, 422, 429) and "error" in response.json():
        error = response.json()["error"]
        assert isinstance(error, dict) and error["code"] and error["message"]
