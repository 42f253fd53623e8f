from __future__ import annotations

import asyncio
import json
import math
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry

from aivitals.demo import LM_MODEL_NAME, DemoConfig, DemoModels, create_app

TOKEN = "test-chaos-token"


@asynccontextmanager
async def client_for(app: Any) -> AsyncIterator[httpx.AsyncClient]:
    # ASGITransport does not run the lifespan; drive it by hand so models warm up.
    async with app.fastapi.router.lifespan_context(app.fastapi):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://demo") as client:
            yield client


def run(fn: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(fn())


def make_app(models: DemoModels, tmp_path: Path | None = None, **changes: Any) -> Any:
    cfg = DemoConfig(
        registry=CollectorRegistry(),
        sim_gpu_dir=None if tmp_path is None else tmp_path / "sim",
        **changes,
    )
    return create_app(cfg, models=models)


def test_embeddings_shape_and_determinism(demo_models: DemoModels) -> None:
    async def body() -> None:
        async with client_for(make_app(demo_models, cache_enabled=False)) as c:
            r1 = await c.post("/v1/embeddings", json={"input": ["hello world", "a cat"]})
            r2 = await c.post("/v1/embeddings", json={"input": ["hello world", "a cat"]})
        assert r1.status_code == 200, r1.text
        data = r1.json()["data"]
        assert len(data) == 2 and len(data[0]["embedding"]) == 384
        norm = math.sqrt(sum(x * x for x in data[0]["embedding"]))
        assert abs(norm - 1.0) < 1e-4
        assert data[0]["embedding"] != data[1]["embedding"]
        for a, b in zip(data[0]["embedding"], r2.json()["data"][0]["embedding"], strict=True):
            assert abs(a - b) < 1e-6
        assert r1.json()["usage"]["prompt_tokens"] > 0

    run(body)


def test_embeddings_similar_texts_are_closer(demo_models: DemoModels) -> None:
    vec = demo_models.embed(["a cat sits on the mat", "a kitten on a rug", "stock market crash"])
    dot = [sum(x * y for x, y in zip(vec[0], v, strict=True)) for v in vec[1:]]
    assert dot[0] > dot[1]  # real weights: meaning is captured


def test_cache_hit_on_repeat(demo_models: DemoModels) -> None:
    async def body() -> None:
        app = make_app(demo_models)
        async with client_for(app) as c:
            first = await c.post("/v1/embeddings", json={"input": "cache me"})
            second = await c.post("/v1/embeddings", json={"input": "cache me"})
            metrics = app.service.config.registry
        assert first.headers["x-cache"] == "miss"
        assert second.headers["x-cache"] == "hit"
        assert first.json() == second.json()

        def count(kind: str, result: str) -> float | None:
            labels = {"cache": kind, "backend": "memory", "result": result}
            return metrics.get_sample_value("cache_requests_total", labels)

        assert count("embeddings", "hit") == 1.0 and count("embeddings", "miss") == 1.0
        # the completions' cache is counted apart, at zero from the start
        assert count("completions", "hit") == 0.0 and count("completions", "miss") == 0.0

    run(body)


def test_streaming_completion_ttft_before_total(demo_models: DemoModels) -> None:
    async def body() -> None:
        async with client_for(make_app(demo_models)) as c:
            loop = asyncio.get_running_loop()
            start = loop.time()
            first: float | None = None
            chunks: list[dict[str, Any]] = []
            req = {"prompt": "tell me a story", "max_tokens": 24, "stream": True}
            async with c.stream("POST", "/v1/completions", json=req) as r:
                assert r.status_code == 200
                assert r.headers["content-type"].startswith("text/event-stream")
                async for line in r.aiter_lines():
                    if not line.startswith("data: "):
                        continue
                    if first is None:
                        first = loop.time() - start
                    if line == "data: [DONE]":
                        break
                    chunks.append(json.loads(line[6:]))
            total = loop.time() - start
        assert first is not None and first < total
        texts = [c["choices"][0]["text"] for c in chunks if c["choices"][0]["text"]]
        assert len(texts) == 24
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"
        assert chunks[0]["model"] == LM_MODEL_NAME

    run(body)


def test_completion_is_deterministic_for_a_seed(demo_models: DemoModels) -> None:
    async def body() -> None:
        async with client_for(make_app(demo_models, cache_enabled=False)) as c:
            req = {"prompt": "hello", "max_tokens": 8, "seed": 7}
            a = (await c.post("/v1/completions", json=req)).json()
            b = (await c.post("/v1/completions", json=req)).json()
        assert a["choices"][0]["text"] == b["choices"][0]["text"]
        assert a["usage"]["completion_tokens"] == 8
        assert "random weights" in a["model"]

    run(body)


@pytest.mark.parametrize(
    ("path", "payload", "status", "code"),
    [
        ("/v1/completions", {"prompt": "x", "max_tokens": 100_000}, 422, "INPUT_REJECTED"),
        ("/v1/completions", {"prompt": "word " * 2000}, 422, "INPUT_TOO_MANY_TOKENS"),
        ("/v1/embeddings", {"input": []}, 422, "INPUT_REJECTED"),
        ("/v1/embeddings", {"input": ["x"] * 100}, 422, "INPUT_REJECTED"),
        ("/v1/embeddings", {"input": ["x"] * 1000}, 422, "INPUT_TOO_MANY_TOKENS"),
    ],
)
def test_bad_input_is_refused_with_a_code(
    demo_models: DemoModels, path: str, payload: dict[str, Any], status: int, code: str
) -> None:
    async def body() -> None:
        async with client_for(make_app(demo_models)) as c:
            r = await c.post(path, json=payload)
        assert r.status_code == status, r.text
        assert r.json()["error"]["code"] == code

    run(body)


def test_bad_json_and_schema_are_refused(demo_models: DemoModels) -> None:
    async def body() -> None:
        async with client_for(make_app(demo_models)) as c:
            r1 = await c.post("/v1/embeddings", content=b"{not json")
            r2 = await c.post("/v1/completions", json={"max_tokens": 3})
            r3 = await c.post(
                "/v1/completions", json={"prompt": "x"}, headers={"X-Request-Timeout": "-1"}
            )
            r4 = await c.post("/v1/embeddings", json={"input": "bad \x01 control"})
            r5 = await c.post("/v1/embeddings", content=b"x" * 200_000)
        assert r1.status_code == 400 and r1.json()["error"]["code"] == "INPUT_BAD_JSON"
        assert r2.status_code == 422 and r2.json()["error"]["code"] == "INPUT_REJECTED"
        assert "prompt" in r2.json()["error"]["message"]
        assert r3.status_code == 400 and r3.json()["error"]["code"] == "INPUT_REJECTED"
        assert r4.status_code == 422 and r4.json()["error"]["code"] == "INPUT_CONTROL_CHARS"
        assert r5.status_code == 413 and r5.json()["error"]["code"] == "INPUT_TOO_LARGE"

    run(body)


def test_deadline_aborts_the_generation(demo_models: DemoModels) -> None:
    async def body() -> None:
        app = make_app(demo_models, cache_enabled=False, max_new_tokens=256)
        async with client_for(app) as c:
            r = await c.post(
                "/v1/completions",
                json={"prompt": "long", "max_tokens": 256},
                headers={"X-Request-Timeout": "0.05"},
            )
        assert r.status_code == 504
        assert r.json()["error"]["code"] == "TIMEOUT"

    run(body)


def test_chaos_hook_refuses_without_token(demo_models: DemoModels) -> None:
    async def body() -> None:
        async with client_for(make_app(demo_models)) as c:
            r = await c.post("/_aivitals/chaos", json={"fault": "gpu_leak", "action": "start"})
            g = await c.get("/_aivitals/chaos")
        # the demo mounts the same hook as any service: off, it answers 403 naming the variable
        assert r.status_code == 403 and g.status_code == 403
        assert g.json()["env"] == "AIVITALS_CHAOS_TOKEN"

    run(body)


def test_chaos_endpoint_starts_lists_and_stops(demo_models: DemoModels, tmp_path: Path) -> None:
    async def body() -> None:
        app = make_app(demo_models, tmp_path, chaos_token=TOKEN)
        hdr = {"X-Aivitals-Token": TOKEN}
        async with client_for(app) as c:
            denied = await c.post("/_aivitals/chaos", json={"fault": "gpu_leak", "action": "start"})
            bad = await c.post(
                "/_aivitals/chaos", json={"fault": "nope", "action": "start"}, headers=hdr
            )
            bad_param = await c.post(
                "/_aivitals/chaos",
                json={"fault": "gpu_leak", "action": "start", "params": {"duration": -1}},
                headers=hdr,
            )
            ok = await c.post(
                "/_aivitals/chaos",
                json={"fault": "slow_inference", "action": "start", "params": {"factor": 3}},
                headers=hdr,
            )
            listed = (await c.get("/_aivitals/chaos", headers=hdr)).json()
            stop = await c.post(
                "/_aivitals/chaos", json={"fault": "slow_inference", "action": "stop"}, headers=hdr
            )
            after = (await c.get("/_aivitals/chaos", headers=hdr)).json()
        assert denied.status_code == 403
        assert bad.status_code == 400 and "nope" in bad.json()["error"]
        assert bad_param.status_code == 400 and "duration" in bad_param.json()["error"]
        assert ok.status_code == 200
        assert [f["fault"] for f in listed["active"]] == ["slow_inference"]
        assert stop.json()["stopped"] is True
        assert after["active"] == []

    run(body)


def test_gpu_leak_grows_sim_memory_and_reverts(demo_models: DemoModels, tmp_path: Path) -> None:
    from aivitals.collect.gpu import SimGPU

    async def body() -> None:
        app = make_app(demo_models, tmp_path, chaos_token=TOKEN, cache_enabled=False)
        hdr = {"X-Aivitals-Token": TOKEN}
        async with client_for(app) as c:
            sim = SimGPU(tmp_path / "sim")
            base = sim.device(0).memory_used
            await c.post(
                "/_aivitals/chaos",
                json={"fault": "gpu_leak", "action": "start", "params": {"mib_per_request": 64}},
                headers=hdr,
            )
            for _ in range(3):
                assert (await c.post("/v1/embeddings", json={"input": "x"})).status_code == 200
            leaked = sim.device(0).memory_used - base
            await c.post(
                "/_aivitals/chaos", json={"fault": "gpu_leak", "action": "stop"}, headers=hdr
            )
            after = sim.device(0).memory_used - base
        assert leaked == 3 * 64 * 2**20
        assert after == 0

    run(body)


def test_sim_oom_answers_503_cuda_oom(demo_models: DemoModels, tmp_path: Path) -> None:
    from aivitals.collect.gpu import SimGPU

    async def body() -> None:
        app = make_app(demo_models, tmp_path, cache_enabled=False)
        async with client_for(app) as c:
            SimGPU(tmp_path / "sim").inject_oom(0, 1)
            r = await c.post("/v1/completions", json={"prompt": "hi", "max_tokens": 4})
            ok = await c.post("/v1/completions", json={"prompt": "hi", "max_tokens": 4})
        assert r.status_code == 503 and r.json()["error"]["code"] == "CUDA_OOM"
        assert "CUDA out of memory" in r.json()["error"]["message"]
        assert ok.status_code == 200

    run(body)


def test_config_rejects_bad_values() -> None:
    from aivitals.errors import ConfigError

    for bad in ({"workers": 0}, {"cache_jitter": 1.5}, {"device": "tpu"}, {"redis_url": "x"}):
        with pytest.raises(ConfigError, match=next(iter(bad))):
            DemoConfig(**bad)
    with pytest.raises(ConfigError, match="AIVITALS_DEMO_WORKERS"):
        DemoConfig.from_env({"AIVITALS_DEMO_WORKERS": "many"})
    assert DemoConfig.from_env({"AIVITALS_CHAOS_TOKEN": "abcdefghij"}).chaos_token == "abcdefghij"


def test_metrics_and_json_logs_carry_the_model_call(demo_models: DemoModels) -> None:
    import io

    from aivitals.instrument import configure_logging

    stream = io.StringIO()

    async def body() -> None:
        registry = CollectorRegistry()
        app = create_app(DemoConfig(registry=registry, cache_enabled=False), models=demo_models)
        writer = configure_logging(stream, registry=registry)
        try:
            async with client_for(app) as c:
                await c.post("/v1/embeddings", json={"input": "metrics"})
                await c.post("/v1/completions", json={"prompt": "hi", "max_tokens": 3})
                timed_out = await c.post(
                    "/v1/completions",
                    json={"prompt": "slow", "max_tokens": 256},
                    headers={"X-Request-Timeout": "0.3", "X-Request-ID": "rid-timeout-1"},
                )
                await asyncio.sleep(0.3)  # the worker notices the abort at its next token
                text = (await c.get("/metrics")).text
        finally:
            writer.stop()
        assert timed_out.status_code == 504
        assert 'model_inference_time_seconds_count{device="cpu",model="all-MiniLM-L6-v2"' in text
        assert 'model="random-tiny-gpt2"' in text
        aborts = registry.get_sample_value(
            "model_aborts_total", {"model": "random-tiny-gpt2", "reason": "deadline"}
        )
        assert aborts == 1.0

    run(body)
    lines = [json.loads(line) for line in stream.getvalue().splitlines() if line]
    errors = [r for r in lines if r.get("request_id") == "rid-timeout-1" and r.get("error_code")]
    assert errors, lines[-5:]
    for record in errors:
        for key in ("request_id", "model_version", "input_token_count", "gpu_device_id"):
            assert key in record
        assert record["error_code"] == "TIMEOUT"


def test_a_streamed_completion_is_cached_and_replayed(demo_models: DemoModels) -> None:
    async def text_of(c: httpx.AsyncClient, req: dict[str, Any]) -> tuple[str, str]:
        pieces = []
        async with c.stream("POST", "/v1/completions", json=req) as r:
            assert r.status_code == 200
            cache = r.headers["x-cache"]
            async for line in r.aiter_lines():
                if line.startswith("data: {"):
                    pieces.append(json.loads(line[6:])["choices"][0]["text"])
        return cache, "".join(pieces)

    async def body() -> None:
        app = make_app(demo_models)
        req = {"prompt": "the same question again", "max_tokens": 6, "stream": True}
        async with client_for(app) as c:
            first = await text_of(c, req)
            second = await text_of(c, req)
            plain = (await c.post("/v1/completions", json={**req, "stream": False})).json()
        assert first[0] == "miss" and second[0] == "hit"
        assert first[1] == second[1] == plain["choices"][0]["text"] != ""
        hits = app.service.config.registry.get_sample_value(
            "cache_requests_total", {"cache": "completions", "backend": "memory", "result": "hit"}
        )
        assert hits == 2.0

    run(body)


def test_embeddings_have_their_own_lane_when_the_model_pool_is_stuck(
    demo_models: DemoModels,
) -> None:
    # a cheap embedding must not wait behind generations: with every model worker
    # blocked it is still answered, from the "embeddings" pool
    async def body() -> None:
        app = make_app(demo_models, chaos_token=TOKEN)
        hdr = {"X-Aivitals-Token": TOKEN}
        async with client_for(app) as c:
            stuck = await c.post(
                "/_aivitals/chaos",
                json={"fault": "worker_pool_stuck", "action": "start", "params": {"duration": 30}},
                headers=hdr,
            )
            emb = await asyncio.wait_for(c.post("/v1/embeddings", json={"input": "x y"}), 10)
            metrics = (await c.get("/metrics")).text
            await c.post(
                "/_aivitals/chaos",
                json={"fault": "worker_pool_stuck", "action": "stop"},
                headers=hdr,
            )
        assert stuck.status_code == 200
        assert emb.status_code == 200 and emb.json()["data"][0]["embedding"]
        assert 'worker_pool_max_workers{pool="embeddings"} 1.0' in metrics
        assert 'worker_pool_active_workers{pool="model"} 2.0' in metrics
        assert 'queue_wait_seconds_count{queue="pool:embeddings"} 1.0' in metrics

    run(body)


def test_the_admission_limit_never_starves_the_workers(demo_models: DemoModels) -> None:
    # cache hits (a few ms) beside generations (100+ ms) drive the gradient to its floor;
    # the floor keeps both lanes' workers busy with one request waiting each
    app = make_app(demo_models, workers=2, embedding_workers=1)
    controller = app.protected.controller
    assert controller is not None
    assert controller.config.min_limit == 6 and controller.limit >= 6
    limiter = controller._limiter
    now = 0.0
    for latency in [0.002] * 20 + [0.2] * 400:  # a window of hits, then generations only
        now += 0.01
        limiter.on_sample(latency, 2, now)
    assert controller.limit == 6
