"""Timing the model call itself: GPU time, tokens, streaming, errors, aborts.

On a CUDA device the time is taken with CUDA events recorded on the current
stream around the block, and the host's wait for the stream is measured
separately: the wrapper's wall time alone would count the host's queueing and
miss kernels still running. On CPU the block's wall time is the inference time.
torch is never imported here unless it is already loaded or a CUDA device is
named.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import Any, TypeVar

from prometheus_client import REGISTRY, CollectorRegistry

from .. import signals
from ..errors import ConfigError
from . import _abort
from ._abort import InferenceAborted
from ._context import REQUEST_STATE, current_request_id
from ._labels import CardinalityGuard, normalize_version
from ._logging import log_event
from ._metrics import family
from ._sinks import INFERENCE_SINKS, notify
from ._tokens import count_tokens

__all__ = [
    "InferenceCall",
    "ModelLoad",
    "inference",
    "model_load",
    "record_kv_cache",
    "timed_inference",
]

F = TypeVar("F", bound=Callable[..., Any])

_ABORT_CODES = {"client_disconnect": "CLIENT_DISCONNECT"}


class _ModelChildren:
    """The labelled children of one (model, version, device), looked up once."""

    __slots__ = (
        "aborts",
        "errors",
        "in_progress",
        "inference",
        "input_tokens",
        "model",
        "output_tokens",
        "registry",
        "stream_wait",
        "tpot",
        "ttft",
        "wall",
    )

    def __init__(self, registry: CollectorRegistry | None, labels: tuple[str, str, str]) -> None:
        model = labels[0]
        self.model = model
        self.registry = registry
        self.inference = family("model_inference_time_seconds", registry).labels(*labels)
        self.wall = family("model_inference_wall_time_seconds", registry).labels(*labels)
        self.stream_wait = family("cuda_stream_wait_time_seconds", registry).labels(*labels)
        self.input_tokens = family("model_input_tokens", registry).labels(model)
        self.output_tokens = family("model_output_tokens", registry).labels(model)
        self.ttft = family("model_time_to_first_token_seconds", registry).labels(model)
        self.tpot = family("model_time_per_output_token_seconds", registry).labels(model)
        self.in_progress = family("model_inferences_in_progress", registry).labels(model)
        self.errors = family("model_inference_errors_total", registry)
        self.aborts = family("model_aborts_total", registry)
        info = family("model_info", registry).labels(*labels)
        if hasattr(info, "info"):
            info.info({})
        else:
            info.set(1)


class _PerRegistry:
    def __init__(self, registry: CollectorRegistry | None) -> None:
        self.registry = registry
        self.children: dict[tuple[str, str, str], _ModelChildren] = {}
        self.guard = CardinalityGuard(max_values=64, registry=registry)
        self.lock = threading.Lock()

    def get(self, model: str, version: str, device: str) -> _ModelChildren:
        key = (model, version, device)
        children = self.children.get(key)
        if children is None:
            with self.lock:
                name = "model_inference_time_seconds"
                labels = (
                    self.guard.fold(name, "model", model),
                    self.guard.fold(name, "model_version", version),
                    self.guard.fold(name, "device", device),
                )
                children = self.children.get(labels) or _ModelChildren(self.registry, labels)
                self.children[labels] = self.children[key] = children
        return children


_REGISTRIES: weakref.WeakKeyDictionary[CollectorRegistry, _PerRegistry] = (
    weakref.WeakKeyDictionary()
)
_UNREGISTERED = _PerRegistry(None)
_REG_LOCK = threading.Lock()


def _forget() -> None:
    """Drop every cached model family (a forked worker switching to multiprocess files)."""
    global _UNREGISTERED, _REG_LOCK
    _REGISTRIES.clear()
    _UNREGISTERED = _PerRegistry(None)
    _REG_LOCK = threading.Lock()  # the parent's other threads may have held it at the fork


def _per_registry(registry: CollectorRegistry | None) -> _PerRegistry:
    if registry is None:
        return _UNREGISTERED
    with _REG_LOCK:
        per = _REGISTRIES.get(registry)
        if per is None:
            per = _REGISTRIES[registry] = _PerRegistry(registry)
        return per


class _CudaTimer:
    """CUDA events around the block on the device's current stream."""

    def __init__(self, torch: Any, index: int) -> None:
        self.torch = torch
        self.stream = torch.cuda.current_stream(index)
        self.start = torch.cuda.Event(enable_timing=True)
        self.end = torch.cuda.Event(enable_timing=True)
        self.start.record(self.stream)

    def stop(self) -> tuple[float, float]:
        """(GPU seconds between the events, seconds the host waited for the stream)."""
        self.end.record(self.stream)
        t0 = time.perf_counter()
        self.end.synchronize()
        return self._elapsed(), time.perf_counter() - t0

    async def stop_async(self) -> tuple[float, float]:
        # poll instead of synchronize(): a blocking wait would stall the event loop
        self.end.record(self.stream)
        t0 = time.perf_counter()
        delay = 0.0002
        while not self.end.query():
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.005)
        return self._elapsed(), time.perf_counter() - t0

    def _elapsed(self) -> float:
        return float(self.start.elapsed_time(self.end)) / 1000.0


def _cuda_index(device: Any, inputs: Any) -> int | None:
    """The CUDA device index the call runs on, or None for CPU (no torch import for CPU)."""
    text = str(device) if device is not None else ""
    if isinstance(device, int) and not isinstance(device, bool):
        return device if "torch" in sys.modules else None
    if text.startswith("cuda"):
        return int(text.split(":", 1)[1]) if ":" in text else 0
    if device is None and inputs is not None and getattr(inputs, "is_cuda", False):
        index = getattr(getattr(inputs, "device", None), "index", None)
        return int(index) if index is not None else 0
    return None


def _device_label(device: Any, cuda: int | None) -> str:
    if cuda is not None:
        return str(cuda)
    if device is None:
        return "cpu"
    text = str(device)
    return text if len(text) <= 16 else text[:16]


class InferenceCall:
    """One timed model call: use through ``aivitals.inference(...)``.

    **Usage**::

        with aivitals.inference(model="m", version="v3.2.1-4-gabc1234", input_ids=ids) as call:
            out = model.generate(ids)
            call.output_ids(out[:, ids.shape[1]:])

        async with aivitals.inference(model="m", input_ids=ids) as call:
            async for tok in stream(ids):
                call.token()          # TTFT, time per output token; raises if aborted
    """

    def __init__(
        self,
        *,
        model: str,
        version: object = None,
        device: Any = None,
        input_ids: Any = None,
        input_tokens: int | None = None,
        max_new_tokens: int | None = None,
        request_id: str | None = None,
        registry: CollectorRegistry | None = REGISTRY,
        cuda_timing: bool = True,
    ) -> None:
        if not isinstance(model, str) or not model:
            raise ConfigError(f"model must be a non-empty str, got {model!r}")
        self.model = model
        self.version = normalize_version(version)
        self.device = device
        self.max_new_tokens = max_new_tokens
        self.request_id = request_id
        self.input_token_count = count_tokens(input_ids) if input_ids is not None else input_tokens
        self.output_token_count: int | None = None
        self.inference_time: float | None = None
        self.wall_time: float | None = None
        self.stream_wait_time: float | None = None
        self.ttft: float | None = None
        self.time_per_output_token: float | None = None
        self.error_code: str | None = None
        self.abort_reason: str | None = None
        self._registry = registry
        self._inputs = input_ids
        self._cuda_timing = cuda_timing
        self._callbacks: list[Callable[[str], object]] = []
        self._streamed = 0
        self._first_n = 0
        self._first = 0.0
        self._last = 0.0
        self._start = 0.0
        self._timer: _CudaTimer | None = None
        self._children: _ModelChildren | None = None
        self._lock = threading.Lock()

    # ---- what the user tells the call ----------------------------------------------------
    def input_ids(self, ids: Any) -> None:
        """Set the input token count from the ids the model actually received."""
        self.input_token_count = count_tokens(ids)

    def output_ids(self, ids: Any) -> None:
        """Set the output token count from the ids the model produced (new tokens only)."""
        self.output_token_count = count_tokens(ids)

    def token(self, n: int = 1) -> None:
        """Mark ``n`` output tokens produced now (streaming).

        Raises ``InferenceAborted`` once the call was aborted, so a generation
        loop stops at the next token.
        """
        if self.abort_reason is not None:
            raise InferenceAborted(self.abort_reason, self.request_id)
        now = time.perf_counter()
        if not self._streamed:
            self._first = now
            self._first_n = n
        self._last = now
        self._streamed += n

    def kv_cache(self, *, hits: float, queries: float) -> None:
        """Report KV-cache (prefix cache) hits and lookups of this call."""
        record_kv_cache(self.model, hits=hits, queries=queries, registry=self._registry)

    # ---- aborts -------------------------------------------------------------------------
    @property
    def aborted(self) -> bool:
        return self.abort_reason is not None

    def on_abort(self, fn: Callable[[str], object]) -> None:
        """Run ``fn(reason)`` when this call is aborted (at once if it already was)."""
        with self._lock:
            reason = self.abort_reason
            if reason is None:
                self._callbacks.append(fn)
                return
        _abort.run_callbacks([fn], reason)

    def abort(self, reason: str = "timeout") -> bool:
        """Flag the call aborted and run its callbacks; False if it already was."""
        with self._lock:
            if self.abort_reason is not None:
                return False
            self.abort_reason = reason
            callbacks, self._callbacks = self._callbacks, []
        _abort.run_callbacks(callbacks, reason)
        return True

    def check(self) -> None:
        """Raise ``InferenceAborted`` if the call was aborted (for loops without tokens)."""
        if self.abort_reason is not None:
            raise InferenceAborted(self.abort_reason, self.request_id)

    # ---- the block ----------------------------------------------------------------------
    def __enter__(self) -> InferenceCall:
        self._begin()
        return self

    def __exit__(
        self, et: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        timer = self._timer
        gpu = timer.stop() if timer is not None and exc is None else None
        self._end(exc, gpu)

    async def __aenter__(self) -> InferenceCall:
        self._begin()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        timer = self._timer
        gpu = await timer.stop_async() if timer is not None and exc is None else None
        self._end(exc, gpu)

    def _begin(self) -> None:
        if self.request_id is None:
            self.request_id = current_request_id()
        cuda = _cuda_index(self.device, self._inputs)
        children = _per_registry(self._registry).get(
            self.model, self.version, _device_label(self.device, cuda)
        )
        pending = _abort.register(self.request_id, self) if self.request_id else None
        if pending is not None:
            # aborted before it started (deadline passed while queued): never start it
            _abort.unregister(self.request_id or "", self)
            self.abort_reason = pending
            self._record_error(children, InferenceAborted(pending, self.request_id))
            raise InferenceAborted(pending, self.request_id)
        self._children = children
        children.in_progress.inc()
        state = REQUEST_STATE.get()
        if state is not None:
            state.model_version = self.version
            state.input_token_count = self.input_token_count
            state.max_new_tokens = self.max_new_tokens
            state.gpu_device_id = _device_label(self.device, cuda)
        log_event(
            "started",
            {
                "model": self.model,
                "input_tokens": self.input_token_count,
                "max_new_tokens": self.max_new_tokens,
            },
        )
        self._start = time.perf_counter()
        if cuda is not None and self._cuda_timing:
            self._timer = _start_cuda(cuda)

    def _end(self, exc: BaseException | None, gpu: tuple[float, float] | None) -> None:
        end = time.perf_counter()
        children = self._children
        assert children is not None, "the inference block was not entered"
        try:
            self._record(children, exc, end, gpu)
        finally:
            children.in_progress.dec()
            if self.request_id:
                _abort.unregister(self.request_id, self)
        if INFERENCE_SINKS:
            notify(INFERENCE_SINKS, self)

    def _record(
        self,
        children: _ModelChildren,
        exc: BaseException | None,
        end: float,
        gpu: tuple[float, float] | None,
    ) -> None:
        self.wall_time = end - self._start
        if self._streamed:
            self.ttft = self._first - self._start
            if self.output_token_count is None:
                self.output_token_count = self._streamed
        if exc is not None:
            self._record_error(children, exc)
            return
        self.inference_time, self.stream_wait_time = gpu if gpu else (self.wall_time, None)
        children.inference.observe(self.inference_time)
        children.wall.observe(self.wall_time)
        if self.stream_wait_time is not None:
            children.stream_wait.observe(self.stream_wait_time)
        if self.input_token_count is not None:
            children.input_tokens.observe(self.input_token_count)
        if self.output_token_count is not None:
            children.output_tokens.observe(self.output_token_count)
        if self.ttft is not None:
            children.ttft.observe(self.ttft)
            if self._streamed > self._first_n:
                gap = (self._last - self._first) / (self._streamed - self._first_n)
                self.time_per_output_token = gap
                children.tpot.observe(gap)
        state = REQUEST_STATE.get()
        if state is not None:
            state.gpu_time += self.inference_time

    def _record_error(self, children: _ModelChildren, exc: BaseException) -> None:
        model = children.model
        # an aborted call ends as the abort itself, or as its task's cancellation, or
        # (a WSGI body closed by the server when the client left) its generator's close
        stopped = isinstance(exc, asyncio.CancelledError | GeneratorExit)
        if isinstance(exc, InferenceAborted) or (self.abort_reason is not None and stopped):
            reason = str(self.abort_reason or getattr(exc, "reason", "timeout"))
            children.aborts.labels(model, reason).inc()
            self.error_code = _ABORT_CODES.get(reason, "TIMEOUT")
        elif isinstance(exc, asyncio.CancelledError | GeneratorExit):
            return  # the caller went away; not the model's error
        else:
            self.error_code = str(signals.classify_exception(exc))
            children.errors.labels(model, self.error_code).inc()
        family("errors_total", children.registry).labels(self.error_code).inc()
        state = REQUEST_STATE.get()
        if state is not None:
            state.error_code = self.error_code


def _start_cuda(index: int) -> _CudaTimer | None:
    torch: Any = sys.modules.get("torch")
    if torch is None:
        import torch  # a CUDA device was named: torch is what runs it
    if not torch.cuda.is_available():
        return None
    return _CudaTimer(torch, index)


def inference(
    *,
    model: str,
    version: object = None,
    device: Any = None,
    input_ids: Any = None,
    input_tokens: int | None = None,
    max_new_tokens: int | None = None,
    request_id: str | None = None,
    registry: CollectorRegistry | None = REGISTRY,
    cuda_timing: bool = True,
) -> InferenceCall:
    """Time one model call; a context manager usable with ``with`` and ``async with``.

    ``version`` is normalised (``v3.2.1-234-ga1b2c3d`` -> ``v3.2.1``). ``device``
    is ``"cuda:0"``, an int index, a ``torch.device`` or None (taken from
    ``input_ids`` when it is a CUDA tensor, else CPU).

    **Usage**::

        with aivitals.inference(model="minilm", version=VERSION, input_ids=batch) as call:
            out = model(batch)
            call.output_ids(out)
    """
    return InferenceCall(
        model=model,
        version=version,
        device=device,
        input_ids=input_ids,
        input_tokens=input_tokens,
        max_new_tokens=max_new_tokens,
        request_id=request_id,
        registry=registry,
        cuda_timing=cuda_timing,
    )


def timed_inference(
    *,
    model: str,
    version: object = None,
    device: Any = None,
    inputs: str | int | None = "input_ids",
    outputs: Callable[[Any], Any] | None = None,
    registry: CollectorRegistry | None = REGISTRY,
) -> Callable[[F], F]:
    """Decorator form of ``inference`` for sync and async functions and generators.

    ``inputs`` names the keyword (or gives the position) of the token ids; by
    default the ``input_ids`` keyword, else the first positional argument.
    ``outputs`` maps the return value to output ids (default: the value itself
    when it is ids). A generator's every yielded item is one output token.

    **Usage**::

        @aivitals.timed_inference(model="m", version="v1.2.0")
        def embed(input_ids): ...
    """

    def make(args: tuple[Any, ...], kwargs: dict[str, Any]) -> InferenceCall:
        return inference(
            model=model,
            version=version,
            device=device,
            input_ids=_pick_inputs(inputs, args, kwargs),
            registry=registry,
        )

    def decorate(fn: F) -> F:
        if inspect.isasyncgenfunction(fn):
            return _wrap_async_gen(fn, make)  # type: ignore[return-value]
        if inspect.isgeneratorfunction(fn):
            return _wrap_gen(fn, make)  # type: ignore[return-value]
        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def run_async(*args: Any, **kwargs: Any) -> Any:
                async with make(args, kwargs) as call:
                    result = await fn(*args, **kwargs)
                    _set_outputs(call, outputs, result)
                    return result

            return run_async  # type: ignore[return-value]

        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            with make(args, kwargs) as call:
                result = fn(*args, **kwargs)
                _set_outputs(call, outputs, result)
                return result

        return run  # type: ignore[return-value]

    return decorate


def _wrap_gen(fn: Callable[..., Any], make: Callable[..., InferenceCall]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Iterator[Any]:
        with make(args, kwargs) as call:
            for item in fn(*args, **kwargs):
                call.token()
                yield item

    return run


def _wrap_async_gen(
    fn: Callable[..., Any], make: Callable[..., InferenceCall]
) -> Callable[..., Any]:
    @functools.wraps(fn)
    async def run(*args: Any, **kwargs: Any) -> Any:
        async with make(args, kwargs) as call:
            async for item in fn(*args, **kwargs):
                call.token()
                yield item

    return run


def _pick_inputs(spec: str | int | None, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if spec is None:
        return None
    if isinstance(spec, int):
        return args[spec] if spec < len(args) else None
    if spec in kwargs:
        return kwargs[spec]
    first = next((a for a in args if not _is_self(a)), None)
    return first if _countable(first) else None


def _is_self(value: Any) -> bool:
    return (
        hasattr(value, "__dict__") and not hasattr(value, "numel") and not hasattr(value, "shape")
    )


def _countable(value: Any) -> bool:
    try:
        count_tokens(value)
    except ConfigError:
        return False
    return value is not None


def _set_outputs(call: InferenceCall, outputs: Callable[[Any], Any] | None, result: Any) -> None:
    if outputs is not None:
        call.output_ids(outputs(result))
    elif not isinstance(result, bool | int) and _countable(result):
        call.output_ids(result)


def record_kv_cache(
    model: str, *, hits: float, queries: float, registry: CollectorRegistry | None = REGISTRY
) -> None:
    """Add KV-cache hits and lookups for ``model`` (hit rate = hits / queries).

    **Usage**::

        record_kv_cache("m", hits=cached_tokens, queries=prompt_tokens)
    """
    if hits < 0 or queries < 0 or hits > queries:
        raise ConfigError(f"kv cache: need 0 <= hits <= queries, got hits={hits} queries={queries}")
    family("kv_cache_hits_total", registry).labels(model).inc(hits)
    family("kv_cache_queries_total", registry).labels(model).inc(queries)


class ModelLoad:
    """Times a local model load into ``model_load_time_seconds``; see ``model_load``."""

    def __init__(
        self, model: str, version: object, registry: CollectorRegistry | None, warm: bool = False
    ) -> None:
        self.model = model
        self.version = normalize_version(version)
        self.registry = registry
        self.warm = warm
        self.seconds: float | None = None
        self._start = 0.0
        self._excluded = 0.0
        self._loads: Any = None

    @contextmanager
    def excluding(self) -> Iterator[None]:
        """Leave the enclosed time (a download) out of the load time."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self._excluded += time.perf_counter() - t0

    def __enter__(self) -> ModelLoad:
        # Both modes' series exist (at 0) from the first load on: a counter's first
        # sample is no increase, so a warm swap that created its series would not count.
        self._loads = family("model_loads_total", self.registry)
        for mode in ("cold", "warm"):
            self._loads.labels(self.model, self.version, mode)
        self._start = time.perf_counter()
        return self

    def __exit__(self, et: object, exc: BaseException | None, tb: object) -> None:
        if exc is not None:
            return  # a failed load has no load time
        self.seconds = time.perf_counter() - self._start - self._excluded
        gauge = family("model_load_time_seconds", self.registry)
        gauge.labels(self.model, self.version).set(self.seconds)
        # Counted by mode because the load alone cannot say whether anyone waited for it:
        # a warm swap (new weights loaded beside the serving copy) is a deployment, a cold
        # load on the request path is the cold start the diagnosis names.
        self._loads.labels(self.model, self.version, "warm" if self.warm else "cold").inc()


def model_load(
    *,
    model: str,
    version: object = None,
    registry: CollectorRegistry | None = REGISTRY,
    warm: bool = False,
) -> ModelLoad:
    """Time a local model load (download excluded with ``load.excluding()``).

    ``warm=True`` says the load runs beside a copy that keeps serving (a blue/green swap:
    load, warm up, then switch), so no request waits for it; the default is a cold load
    (a start, or a reload requests queue behind). ``model_loads_total`` counts both by
    ``mode``; the diagnosis names a cold start only for a cold one.

    **Usage**::

        with aivitals.model_load(model="minilm", version="v1.0.0") as load:
            with load.excluding():
                path = download(...)
            model = load_weights(path)
    """
    if not isinstance(model, str) or not model:
        raise ConfigError(f"model must be a non-empty str, got {model!r}")
    if not isinstance(warm, bool):
        raise ConfigError(f"warm must be a bool, got {warm!r}")
    return ModelLoad(model, version, registry, warm)
