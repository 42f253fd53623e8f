"""validate's background load: the impatient client of timeouts_not_aborting."""

from __future__ import annotations

import asyncio
import json
import os
import random
from typing import Any

import pytest

from aivitals.validate._load import LoadPlan, impatient_requests
from tests.demo.test_app import client_for, make_app

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def demo_models():  # type: ignore[no-untyped-def]
    from aivitals.demo import DemoConfig, DemoModels

    return DemoModels.load(DemoConfig())


def test_impatient_requests_are_all_different_and_carry_the_deadline() -> None:
    plan = LoadPlan()
    specs = impatient_requests(plan, random.Random(1))
    bodies = [json.loads(s.body) for s in specs]
    assert len({b["prompt"] for b in bodies}) == plan.impatient_pool
    assert all(b["max_tokens"] == plan.impatient_tokens and b["stream"] is False for b in bodies)
    assert all(("X-Request-Timeout", "0.3") in s.headers for s in specs)
    # a new phase draws new prompts: nothing an earlier phase cached answers them
    again = {json.loads(s.body)["prompt"] for s in impatient_requests(plan, random.Random(2))}
    assert not again & {b["prompt"] for b in bodies}


async def _send(app: Any, specs: Any) -> list[Any]:
    async with client_for(app) as c:
        return [await c.post(s.path, content=s.body, headers=dict(s.headers)) for s in specs]


def test_every_impatient_request_reaches_the_model_even_when_it_fits(demo_models: Any) -> None:
    """A machine fast enough to finish one inside its deadline must not turn the rest
    into cache hits (a fixed prompt is cached, and then no deadline passes)."""
    plan = LoadPlan(impatient_tokens=4, impatient_deadline_s=30.0, impatient_pool=4)
    app = make_app(demo_models)  # the response cache on, as in validate's stack
    answers = asyncio.run(_send(app, impatient_requests(plan, random.Random(0)) * 2))
    assert [r.status_code for r in answers] == [200] * 8
    # the cache is on: repeating the pool (a phase longer than it) would be answered by it
    assert [r.headers["X-Cache"] for r in answers] == ["miss"] * 4 + ["hit"] * 4


def test_the_impatient_client_passes_its_deadline_and_the_fault_keeps_the_work(
    demo_models: Any,
) -> None:
    """A 256-token generation does not fit in the deadline: each request times out, and
    with no_abort_timeouts on, the model work runs on (no abort is counted)."""
    app = make_app(demo_models)
    app.service.faults.start("no_abort_timeouts", {"duration": 60})
    specs = impatient_requests(LoadPlan(), random.Random(0))[:3]
    answers = asyncio.run(_send(app, specs))
    assert [r.status_code for r in answers] == [504] * 3
    assert [r.json()["error"]["code"] for r in answers] == ["TIMEOUT"] * 3
    registry = app.service.registry
    timed_out = registry.get_sample_value(
        "request_timeouts_total", {"route": "/v1/completions", "reason": "deadline"}
    )
    assert timed_out == 3
    aborted = registry.get_sample_value(
        "model_aborts_total", {"model": "random-tiny-gpt2", "reason": "deadline"}
    )
    assert not aborted  # the work ran on: that is the fault
