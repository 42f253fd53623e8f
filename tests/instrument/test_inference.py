from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from aivitals.errors import ConfigError
from aivitals.instrument import (
    REQUEST_ID,
    InferenceAborted,
    InferenceCall,
    abort_request,
    active_requests,
    count_tokens,
    inference,
    model_load,
    normalize_version,
    record_kv_cache,
    timed_inference,
)
from tests._paths import H200

M = {"model": "m", "model_version": "v3.2.1", "device": "cpu"}


def _value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    value = registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def _torch_oom_text() -> str:
    for line in (H200 / "leak-stdout.txt").read_text().splitlines():
        if line.startswith("OOM_MSG "):
            return line[len("OOM_MSG ") :]
    raise AssertionError("no OOM_MSG line in the fixture")


def test_cpu_call_records_time_tokens_and_version() -> None:
    reg = CollectorRegistry()
    with inference(
        model="m", version="v3.2.1-234-ga1b2c3d", input_ids=[[1, 2, 3], [4, 5]], registry=reg
    ) as call:
        time.sleep(0.01)
        call.output_ids([7, 8, 9, 10])
    assert call.input_token_count == 5
    assert call.inference_time is not None and call.inference_time >= 0.01
    assert call.stream_wait_time is None  # no GPU: nothing waited for, no fake 0 recorded
    assert _value(reg, "model_inference_time_seconds_count", **M) == 1
    assert _value(reg, "model_inference_wall_time_seconds_count", **M) == 1
    assert _value(reg, "cuda_stream_wait_time_seconds_count", **M) == 0
    assert _value(reg, "model_input_tokens_sum", model="m") == 5
    assert _value(reg, "model_output_tokens_sum", model="m") == 4
    assert _value(reg, "model_info", **M) == 1
    assert _value(reg, "model_inferences_in_progress", model="m") == 0


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("v3.2.1-234-ga1b2c3d", "v3.2.1"),
        ("v3.2.1-234-ga1b2c3d-dirty", "v3.2.1"),
        ("1.4.0-dirty", "1.4.0"),
        ("2.0.0+cu121", "2.0.0"),
        ("v1.0.0-rc1", "v1.0.0-rc1"),
        ("a1b2c3d4e5f6", "unversioned"),
        (None, "unknown"),
        ("", "unknown"),
        ("weird version/with spaces", "weird_version_with_spaces"),
        ("x" * 100, "x" * 32),
    ],
)
def test_version_normalisation(raw: Any, expected: str) -> None:
    assert normalize_version(raw) == expected


def test_token_counting_accepts_lists_numpy_torch_and_encodings() -> None:
    import numpy as np

    assert count_tokens([1, 2, 3]) == 3
    assert count_tokens([[1, 2], [3]]) == 3
    assert count_tokens(np.zeros((2, 7), dtype=np.int64)) == 14
    assert count_tokens({"input_ids": [[1, 2, 3]], "attention_mask": [[1, 1, 0]]}) == 2
    assert count_tokens({"input_ids": np.ones((1, 4))}) == 4
    assert count_tokens(12) == 12
    torch = pytest.importorskip("torch")
    assert count_tokens(torch.ones(3, 5, dtype=torch.long)) == 15


@pytest.mark.parametrize("bad", ["some prompt text", b"bytes", -1, True, object(), {"x": 1}])
def test_token_counting_refuses_text_and_garbage(bad: Any) -> None:
    with pytest.raises(ConfigError):
        count_tokens(bad)


def test_real_torch_oom_text_maps_to_cuda_oom() -> None:
    reg = CollectorRegistry()

    class OutOfMemoryError(RuntimeError):  # torch's class name; torch itself not needed
        pass

    with (
        pytest.raises(OutOfMemoryError),
        inference(model="m", version="v3.2.1", registry=reg) as call,
    ):
        raise OutOfMemoryError(_torch_oom_text())
    assert call.error_code == "CUDA_OOM"
    with pytest.raises(RuntimeError), inference(model="m", version="v3.2.1", registry=reg):
        raise RuntimeError(_torch_oom_text())  # plain text match as well
    assert _value(reg, "model_inference_errors_total", model="m", error_code="CUDA_OOM") == 2
    assert _value(reg, "errors_total", error_code="CUDA_OOM") == 2
    assert _value(reg, "model_inference_time_seconds_count", **M) == 0
    assert _value(reg, "model_inferences_in_progress", model="m") == 0


def test_streaming_tokens_give_ttft_and_time_per_output_token() -> None:
    reg = CollectorRegistry()
    with inference(model="m", version="v3.2.1", input_tokens=8, registry=reg) as call:
        time.sleep(0.03)
        for _ in range(4):
            call.token()
            time.sleep(0.01)
    assert call.ttft is not None and call.wall_time is not None
    assert 0.03 <= call.ttft < call.wall_time
    assert call.output_token_count == 4
    assert call.time_per_output_token is not None and call.time_per_output_token >= 0.009
    assert _value(reg, "model_time_per_output_token_seconds_count", model="m") == 1


def test_async_context_and_decorators() -> None:
    reg = CollectorRegistry()

    @timed_inference(model="m", version="v3.2.1", registry=reg)
    def embed(input_ids: list[int]) -> list[int]:
        return [0] * 2

    @timed_inference(model="m", version="v3.2.1", registry=reg)
    async def aembed(input_ids: list[int]) -> dict[str, str]:
        await asyncio.sleep(0)
        return {"not": "ids"}

    @timed_inference(model="m", version="v3.2.1", registry=reg)
    def generate(input_ids: list[int]) -> Any:
        yield from ("a", "b", "c")

    @timed_inference(model="m", version="v3.2.1", registry=reg)
    async def agenerate(input_ids: list[int]) -> Any:
        for tok in ("a", "b"):
            yield tok

    async def run() -> None:
        assert await aembed([1, 2, 3]) == {"not": "ids"}
        assert [t async for t in agenerate(input_ids=[1])] == ["a", "b"]
        async with inference(model="m", version="v3.2.1", registry=reg) as call:
            call.output_ids([1])

    assert embed([1, 2, 3]) == [0, 0]
    assert list(generate([1, 2])) == ["a", "b", "c"]
    asyncio.run(run())
    assert _value(reg, "model_inference_time_seconds_count", **M) == 5
    assert _value(reg, "model_input_tokens_sum", model="m") == 3 + 3 + 2 + 1
    assert _value(reg, "model_output_tokens_sum", model="m") == 2 + 3 + 2 + 1


def test_abort_request_stops_a_generation_loop_at_the_next_token() -> None:
    reg = CollectorRegistry()
    seen: list[str] = []
    produced = 0
    ready = threading.Event()

    def worker() -> None:
        nonlocal produced
        token = REQUEST_ID.set("req-1")
        try:
            with inference(model="m", version="v3.2.1", registry=reg) as call:
                call.on_abort(seen.append)
                ready.set()
                for _ in range(1000):
                    call.token()
                    produced += 1
                    time.sleep(0.002)
        except InferenceAborted as exc:
            seen.append(f"raised:{exc.reason}")
        finally:
            REQUEST_ID.reset(token)

    thread = threading.Thread(target=worker)
    thread.start()
    assert ready.wait(5)
    time.sleep(0.02)
    assert "req-1" in active_requests()
    assert abort_request("req-1", "deadline") == 1
    thread.join(5)
    assert seen == ["deadline", "raised:deadline"]
    assert produced < 1000
    assert "req-1" not in active_requests()
    assert _value(reg, "model_aborts_total", model="m", reason="deadline") == 1
    assert _value(reg, "model_inferences_in_progress", model="m") == 0


def test_abort_before_the_call_starts_refuses_it() -> None:
    reg = CollectorRegistry()
    assert abort_request("req-early", "client_disconnect") == 0
    with (
        pytest.raises(InferenceAborted),
        inference(model="m", request_id="req-early", registry=reg),
    ):
        raise AssertionError("must not run")
    assert _value(reg, "model_aborts_total", model="m", reason="client_disconnect") == 1
    assert _value(reg, "model_inferences_in_progress", model="m") == 0


def test_failing_abort_callback_does_not_stop_the_others() -> None:
    reg = CollectorRegistry()
    seen: list[str] = []
    with inference(model="m", request_id="req-2", registry=reg) as call:
        call.on_abort(lambda reason: 1 / 0)
        call.on_abort(seen.append)
        assert abort_request("req-2", "timeout") == 1
        assert call.aborted
        assert not call.abort("again")
        late: list[str] = []
        call.on_abort(late.append)  # registered after the abort: runs at once
        assert late == ["timeout"]
    assert seen == ["timeout"]


def test_model_load_excludes_download_and_skips_failed_loads() -> None:
    reg = CollectorRegistry()
    t0 = time.perf_counter()
    with model_load(model="m", version="v2.0.0-1-gabcdef0", registry=reg) as load:
        with load.excluding():
            time.sleep(0.05)
        time.sleep(0.01)
    total = time.perf_counter() - t0
    # the download (>= 50 ms, however slow the machine) is left out
    assert load.seconds is not None and 0.01 <= load.seconds <= total - 0.05
    value = _value(reg, "model_load_time_seconds", model="m", model_version="v2.0.0")
    assert value == pytest.approx(load.seconds)
    with pytest.raises(OSError), model_load(model="other", registry=reg):
        raise OSError("weights missing")
    assert (
        reg.get_sample_value(
            "model_load_time_seconds", {"model": "other", "model_version": "unknown"}
        )
        is None
    )


def test_model_loads_are_counted_cold_or_warm() -> None:
    reg = CollectorRegistry()

    def loads(mode: str) -> float | None:
        labels = {"model": "m", "model_version": "v1.0.0", "mode": mode}
        return reg.get_sample_value("model_loads_total", labels)

    with model_load(model="m", version="v1.0.0", registry=reg):
        # both series exist from the first load on, so the first warm swap is an increase
        assert (loads("cold"), loads("warm")) == (0.0, 0.0)
    assert (loads("cold"), loads("warm")) == (1.0, 0.0)
    with model_load(model="m", version="v1.0.0", registry=reg, warm=True):
        pass
    assert (loads("cold"), loads("warm")) == (1.0, 1.0)
    with pytest.raises(OSError), model_load(model="m", version="v1.0.0", registry=reg, warm=True):
        raise OSError("weights missing")  # a failed load is no load
    assert (loads("cold"), loads("warm")) == (1.0, 1.0)
    with pytest.raises(ConfigError, match="warm must be a bool"):
        model_load(model="m", registry=reg, warm="yes")  # type: ignore[arg-type]


def test_kv_cache_hook_and_bad_input() -> None:
    reg = CollectorRegistry()
    record_kv_cache("m", hits=30, queries=100, registry=reg)
    with inference(model="m", registry=reg) as call:
        call.kv_cache(hits=10, queries=10)
    assert _value(reg, "kv_cache_hits_total", model="m") == 40
    assert _value(reg, "kv_cache_queries_total", model="m") == 110
    with pytest.raises(ConfigError, match="hits"):
        record_kv_cache("m", hits=5, queries=1, registry=reg)
    with pytest.raises(ConfigError, match="model"):
        inference(model="", registry=reg)


def test_import_does_not_load_torch_or_numpy() -> None:
    code = (
        "import sys, aivitals\n"
        "from aivitals.instrument import inference\n"
        "with aivitals.inference(model='m', input_ids=[1, 2]) as c: pass\n"
        "print('torch' in sys.modules, 'numpy' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_cuda_device_without_gpu_falls_back_to_wall_time() -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: benchmarks/gpu/inference_timing.py checks this path")
    reg = CollectorRegistry()
    with inference(model="m", device="cuda:0", input_ids=torch.ones(1, 3), registry=reg) as call:
        pass
    assert call.inference_time == call.wall_time
    assert (
        _value(
            reg,
            "model_inference_time_seconds_count",
            model="m",
            model_version="unknown",
            device="0",
        )
        == 1
    )


class _FakeEvent:
    """A CUDA event whose GPU clock the test controls (no GPU needed)."""

    clock = 0.0  # seconds of GPU work "done" so far, shared by all events

    def __init__(self, enable_timing: bool = False) -> None:
        self.at: float | None = None
        self.polls = 0

    def record(self, stream: object = None) -> None:
        _FakeEvent.clock += 0.25  # each block below enqueues 250 ms of kernels
        self.at = _FakeEvent.clock

    def query(self) -> bool:
        self.polls += 1
        return self.polls >= 3  # done on the third poll

    def synchronize(self) -> None:
        time.sleep(0.01)

    def elapsed_time(self, other: _FakeEvent) -> float:
        assert self.at is not None and other.at is not None
        return (other.at - self.at) * 1000.0  # milliseconds, as torch answers


def _fake_torch() -> Any:
    import types

    cuda = types.SimpleNamespace(
        is_available=lambda: True, current_stream=lambda index: f"stream{index}", Event=_FakeEvent
    )
    return types.SimpleNamespace(cuda=cuda)


def test_cuda_path_takes_gpu_time_from_events_and_measures_the_wait(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "torch", _fake_torch())
    reg = CollectorRegistry()
    with inference(model="m", version="v1.0.0", device="cuda:1", registry=reg) as call:
        pass  # the host returns at once; the "GPU" took 250 ms between the events
    assert call.inference_time == pytest.approx(0.25)
    assert call.stream_wait_time is not None and call.stream_wait_time >= 0.01
    assert call.wall_time is not None and call.wall_time < 0.25
    labels = {"model": "m", "model_version": "v1.0.0", "device": "1"}
    assert _value(reg, "model_inference_time_seconds_sum", **labels) == pytest.approx(0.25)
    assert _value(reg, "cuda_stream_wait_time_seconds_count", **labels) == 1

    async def run() -> InferenceCall:
        async with inference(model="m", version="v1.0.0", device="cuda:1", registry=reg) as c:
            pass
        return c

    async_call = asyncio.run(run())
    assert async_call.inference_time == pytest.approx(0.25)  # waited by polling, not blocking
    assert _value(reg, "model_inference_time_seconds_count", **labels) == 2


def test_decorator_input_position_and_output_mapping() -> None:
    reg = CollectorRegistry()

    class Model:
        @timed_inference(
            model="m", version="v1", inputs=1, outputs=lambda r: r["ids"], registry=reg
        )
        def generate(self, ids: list[int]) -> dict[str, list[int]]:
            return {"ids": ids[:2]}

    assert Model().generate([5, 6, 7]) == {"ids": [5, 6]}
    assert _value(reg, "model_input_tokens_sum", model="m") == 3
    assert _value(reg, "model_output_tokens_sum", model="m") == 2
