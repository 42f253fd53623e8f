"""The demo service's work, apart from HTTP: models, cache, pool, GPU accounting, faults."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from prometheus_client import REGISTRY, CollectorRegistry

from ..errors import ServiceError
from ..instrument import InstrumentedExecutor, PoolSaturated, inference, model_load
from ._cache import ResponseCache, make_cache
from ._config import LM_MODEL_ID, DemoConfig
from ._gpu import GpuAccount, make_gpu_account
from ._models import EMBED_MODEL_NAME, DemoModels, GenerationResult

if TYPE_CHECKING:
    from ..chaos import FaultHook, InProcessFaults

__all__ = ["DemoService", "QueueFullError", "WorkHandle"]

T = TypeVar("T")
log = logging.getLogger("aivitals.demo")


class QueueFullError(ServiceError):
    """The bounded model queue is full; the request is refused (429)."""


@dataclass(slots=True)
class WorkHandle:
    """One generation in flight: the abort hook and what the worker produced."""

    abort: threading.Event
    future: concurrent.futures.Future[GenerationResult]


class DemoService:
    """Everything the routes call. Models load once; ``start``/``close`` bracket its life.

    **Usage**::

        service = DemoService(DemoConfig())
        service.start()                      # loads models (unless given), warms up
        vectors = await service.embed(["hello"])
        service.close()
    """

    def __init__(self, config: DemoConfig, *, models: DemoModels | None = None) -> None:
        self.config = config
        self._models = models
        self._models_lock = threading.Lock()
        self._reload_lock = threading.Lock()
        #: where every metric of this service goes (prometheus_client's default unless set)
        self.registry: CollectorRegistry = config.registry or REGISTRY
        self.cache: ResponseCache = make_cache(
            config.redis_url if config.cache_enabled else None,
            ttl=config.cache_ttl,
            jitter=config.cache_jitter,
            registry=self.registry,
        )
        self.gpu: GpuAccount | None = None
        self._pool: InstrumentedExecutor | None = None
        self._embed_pool: InstrumentedExecutor | None = None
        self._stuck = threading.Event()
        self._stuck.set()
        # what the app-specific faults set through their chaos hooks (``chaos_hooks``)
        self._slow_factor = 1.0
        self._aborts_on_timeout = True
        #: the chaos hook's registry (``aivitals.chaos.mount``), set by ``create_app``
        self.faults: InProcessFaults | None = None
        self.ready = False
        self.warmup_seconds: float | None = None

    # --- life -----------------------------------------------------------------------------
    def start(self) -> None:
        # Built here, after create_app wired the protection layer: both share the
        # queue_* families of the registry, and protect's must exist first.
        self._pool = InstrumentedExecutor(
            concurrent.futures.ThreadPoolExecutor(
                max_workers=self.config.workers, thread_name_prefix="aivitals-demo-worker"
            ),
            name="model",
            max_queue=self.config.queue_size,
            registry=self.registry,
        )
        # the embeddings' own lane: a 10 ms embedding behind two running generations
        # would wait their whole length (separate queues, as serving stacks keep them)
        self._embed_pool = InstrumentedExecutor(
            concurrent.futures.ThreadPoolExecutor(
                max_workers=self.config.embedding_workers,
                thread_name_prefix="aivitals-demo-embed",
            ),
            name="embeddings",
            max_queue=self.config.queue_size,
            registry=self.registry,
        )
        models = self.models()
        self.gpu = make_gpu_account(
            models.device,
            self.config.sim_gpu_dir,
            gpu=self.config.sim_gpu_index,
            memory_total=self.config.sim_gpu_memory_total,
            weights=self.config.sim_weights_bytes,
        )
        self.warmup_seconds = models.warm_up()
        self.ready = True

    def close(self) -> None:
        self.ready = False
        if self.faults is not None:
            self.faults.stop_all()
        self._stuck.set()
        for pool in (self._pool, self._embed_pool):
            if pool is not None:
                pool.shutdown(wait=False, cancel_futures=True)
        if self.gpu is not None:
            self.gpu.close()
        self.cache.close()

    def models(self) -> DemoModels:
        """The loaded models; reloads them after a cold start (under a lock, once)."""
        models = self._models
        if models is not None:
            return models
        with self._models_lock:
            if self._models is None:
                log.info("loading models")
                with model_load(
                    model=EMBED_MODEL_NAME,
                    version=self.config.model_version,
                    registry=self.registry,
                ):
                    self._models = DemoModels.load(self.config)
                self._models.warm_up()
                self.ready = True
            return self._models

    def reload_models(self) -> float:
        """A planned reload done as serving stacks do it: load and warm new models beside
        the old ones, then swap. Requests go on being served by the old models meanwhile,
        so nobody pays the load (unlike ``cold_start``, the fault). Returns seconds."""
        t0 = time.perf_counter()
        with self._reload_lock:  # one reload at a time; requests never wait on this lock
            log.info("reloading models (warm swap)")
            with model_load(
                model=EMBED_MODEL_NAME,
                version=self.config.model_version,
                registry=self.registry,
                warm=True,
            ):
                fresh = DemoModels.load(self.config)
            fresh.warm_up()
            with self._models_lock:
                self._models = fresh
                self.ready = True
        return time.perf_counter() - t0

    @property
    def models_loaded(self) -> bool:
        return self._models is not None

    def count_tokens(self, text: str) -> int:
        """Tokens of ``text`` under the served tokenizer (the input guard's callback)."""
        return self.models().count_tokens(text)

    async def probe(self) -> None:
        """The readiness probe: a one-text embedding through the worker pool.

        Going through the pool is the point: stuck workers fail readiness.
        """
        models = self._models
        if models is None:
            raise ServiceError("models are not loaded")
        await self.run(lambda: models.embed(["ping"]))

    def gpu_memory(self) -> tuple[int, int] | None:
        gpu = self.gpu
        return None if gpu is None else gpu.memory()

    def dependencies(self) -> dict[str, Callable[[], Any]]:
        if self.cache.backend.name == "redis":
            return {"redis": self.cache.ping}
        return {}

    # --- the pool -------------------------------------------------------------------------
    @property
    def pool(self) -> InstrumentedExecutor:
        if self._pool is None:
            raise ServiceError("the demo service was not started")
        return self._pool

    @property
    def queue_length(self) -> int:
        return self.pool.waiting

    @property
    def active_workers(self) -> int:
        return self.pool.active

    async def run(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on a model worker; refuse at once when the bounded queue is full."""
        future = self.submit(fn)
        return await asyncio.wrap_future(future)

    async def run_embedding(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` in the embeddings' own pool (same refusal rule)."""
        if self._embed_pool is None:
            raise ServiceError("the demo service was not started")
        return await asyncio.wrap_future(self.submit(fn, self._embed_pool))

    def submit(
        self, fn: Callable[[], T], pool: InstrumentedExecutor | None = None
    ) -> concurrent.futures.Future[T]:
        # the copied context carries the request id and state into the worker's logs
        ctx = contextvars.copy_context()
        try:
            return (pool or self.pool).submit(ctx.run, fn)
        except PoolSaturated as exc:
            raise QueueFullError(str(exc)) from None
        except RuntimeError:
            raise ServiceError("the demo service is shutting down") from None

    # --- model work (runs on a worker) --------------------------------------------------
    def embed_sync(self, texts: list[str]) -> tuple[list[list[float]], int, float]:
        models = self.models()
        tokens = sum(models.count_tokens(t) for t in texts)
        nbytes = max(1, tokens) * self.config.sim_kv_bytes_per_token // 4
        gpu = self._gpu()
        with inference(
            model=EMBED_MODEL_NAME,
            version=self.config.model_version,
            device=models.device,
            input_tokens=tokens,
            registry=self.registry,
        ):
            gpu.reserve(nbytes)
            started = time.perf_counter()
            try:
                vectors = models.embed(texts)
            finally:
                spent = time.perf_counter() - started
                gpu.busy(spent / self.config.sim_gpu_speedup)
                gpu.release(nbytes)
        return vectors, tokens, spent

    def generate_sync(
        self,
        prompt_ids: list[int],
        max_tokens: int,
        *,
        seed: int,
        on_token: Callable[[int, str], None],
        abort: threading.Event,
    ) -> GenerationResult:
        models = self.models()
        with inference(
            model=LM_MODEL_ID,
            version=self.config.model_version,
            device=models.device,
            input_tokens=len(prompt_ids),
            max_new_tokens=max_tokens,
            registry=self.registry,
        ) as call:
            # the abort hook: a deadline or a disconnect stops the loop at the next token,
            # unless the no_abort_timeouts fault is on (then only the await is cancelled)
            call.on_abort(lambda reason: abort.set() if self.aborts_on_timeout else None)

            def counted(token: int, piece: str) -> None:
                if not call.aborted:
                    call.token()
                on_token(token, piece)

            result = self._generate(models, prompt_ids, max_tokens, seed, counted, abort)
            if result.aborted:
                call.check()  # counts the abort (model_aborts_total) and raises
            return result

    def _generate(
        self,
        models: DemoModels,
        prompt_ids: list[int],
        max_tokens: int,
        seed: int,
        on_token: Callable[[int, str], None],
        abort: threading.Event,
    ) -> GenerationResult:
        gpu = self._gpu()
        nbytes = (len(prompt_ids) + max_tokens) * self.config.sim_kv_bytes_per_token
        gpu.reserve(nbytes)  # the KV cache this request will need, as an engine reserves it
        busy_pending = [0.0]

        def delay(spent: float) -> float:
            busy_pending[0] += spent
            if busy_pending[0] > 0.05:  # book busy time in slices so utilization follows
                gpu.busy(busy_pending[0] / self.config.sim_gpu_speedup)
                busy_pending[0] = 0.0
            factor = max(self._slow_factor, gpu.slowdown())
            return spent * (factor - 1.0)

        try:
            return models.generate(
                prompt_ids,
                max_tokens,
                seed=seed,
                on_token=on_token,
                should_stop=abort.is_set,
                per_token_delay=delay,
            )
        finally:
            gpu.busy(busy_pending[0] / self.config.sim_gpu_speedup)
            gpu.release(nbytes)

    def _gpu(self) -> GpuAccount:
        if self.gpu is None:
            raise ServiceError("the demo service was not started")
        return self.gpu

    @property
    def aborts_on_timeout(self) -> bool:
        return self._aborts_on_timeout

    # --- fault hooks -------------------------------------------------------------------------
    def chaos_hooks(self) -> dict[str, FaultHook]:
        """The faults only the demo's own parts can do, for ``aivitals.chaos.mount``; the
        mount does the generic ones (loop block, slow dependency, leaks) by itself."""
        return {
            "worker_pool_stuck": self._on_pool_stuck,
            "cold_start": self._on_cold_start,
            "slow_inference": self._on_slow,
            "no_abort_timeouts": self._on_no_abort,
        }

    def _on_pool_stuck(self, on: bool, params: dict[str, float]) -> None:
        if not on:
            self._stuck.set()
            return
        self._stuck.clear()
        count = int(params.get("workers") or 0) or self.config.workers
        for _ in range(count):
            try:
                self.pool.submit(self._block_worker)
            except PoolSaturated:
                break  # the pool is already full: stuck enough

    def _block_worker(self) -> None:
        self._stuck.wait(timeout=3600)

    def _on_cold_start(self, on: bool, params: dict[str, float]) -> None:
        if on:
            with self._models_lock:
                self._models = None
                self.ready = False
            os.sched_yield()

    def _on_slow(self, on: bool, params: dict[str, float]) -> None:
        self._slow_factor = params["factor"] if on else 1.0
        if self.gpu is not None:
            self.gpu.set_slowdown(self._slow_factor)

    def _on_no_abort(self, on: bool, params: dict[str, float]) -> None:
        # a passed deadline still cancels the await; the model loop is no longer told
        self._aborts_on_timeout = not on
