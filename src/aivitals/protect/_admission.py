"""Admission control: a bounded, deadline-aware priority queue in front of an adaptive limit.

Requests may queue; only ``limit`` of them execute at once (DOMAIN.md section
7: limit by concurrency, after the queue, not by QPS in front of it). A
request is refused at once, with 429 and a ``Retry-After`` computed from the
observed drain rate, when

* the queue is full (an interactive request first evicts the newest queued
  batch request, which is the one refused),
* its predicted wait plus the expected service time passes its deadline,
* its memory reservation does not fit (``memory_capacity`` bytes, the cost
  from ``memory_estimator(prompt_tokens, max_new_tokens)``).

A queued request whose deadline can no longer be met leaves the queue (429,
reason ``deadline``) instead of waiting past it.

**Usage**::

    controller = AdmissionController(AdmissionConfig(queue_size=32))
    async with controller.admit(priority="batch", timeout=5.0, cost=2 * 2**30):
        await run_model()
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import math
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from typing import cast

from prometheus_client import REGISTRY, CollectorRegistry

from aivitals.errors import AivitalsError, ConfigError
from aivitals.signals import ErrorCode

from ._deadline import parse_timeout
from ._limit import GradientLimit
from ._metrics import metrics_for

__all__ = [
    "AdmissionConfig",
    "AdmissionController",
    "AdmissionRefused",
    "Ticket",
    "default_memory_estimator",
    "kv_cache_estimator",
]


def kv_cache_estimator(
    *, layers: int, kv_heads: int, head_dim: int, dtype_bytes: int = 2
) -> Callable[[int, int], int]:
    """An estimator of the KV-cache bytes a request needs at its longest.

    ``2 (K and V) * layers * kv_heads * head_dim * dtype_bytes`` per token, for
    ``prompt_tokens + max_new_tokens`` tokens. Weights and activations are not
    counted: they are the same for every request and belong in the capacity.
    """
    per_token = 2 * layers * kv_heads * head_dim * dtype_bytes

    def estimate(prompt_tokens: int, max_new_tokens: int) -> int:
        return per_token * (max(0, prompt_tokens) + max(0, max_new_tokens))

    return estimate


#: The default: a Llama-3-8B-shaped model in fp16 (32 layers, 8 KV heads of 128),
#: 128 KiB per token.
default_memory_estimator = kv_cache_estimator(layers=32, kv_heads=8, head_dim=128)


@dataclass(frozen=True, kw_only=True, slots=True)
class AdmissionConfig:
    """Settings of an ``AdmissionController``; every field is validated by name.

    Limit: ``initial_limit``, ``min_limit``, ``max_limit``, ``tolerance`` (allowed
    latency over the no-contention baseline before the limit shrinks),
    ``adaptive`` (False keeps ``initial_limit`` fixed). Queue: ``queue_size``,
    ``priorities`` (highest first). Deadlines: ``default_timeout`` when the
    request names none, ``max_timeout`` the largest a client may ask for.
    Memory: ``memory_capacity`` bytes (or a callable giving the bytes available
    to requests now), ``None`` for no reservation; ``memory_estimator``.
    HTTP: header names and the JSON fields that carry ``max_new_tokens``.
    """

    initial_limit: int = 4
    min_limit: int = 1
    max_limit: int = 256
    tolerance: float = 1.5
    adaptive: bool = True
    queue_size: int = 64
    priorities: tuple[str, ...] = ("interactive", "batch")
    default_priority: str = "interactive"
    default_timeout: float = 30.0
    max_timeout: float = 600.0
    memory_capacity: int | Callable[[], int] | None = None
    memory_estimator: Callable[[int, int], int] = default_memory_estimator
    default_max_new_tokens: int = 256
    max_new_tokens_fields: tuple[str, ...] = ("max_new_tokens", "max_tokens")
    priority_header: str = "x-priority"
    timeout_header: str = "x-request-timeout"
    max_retry_after: int = 60
    paths: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        for key in ("initial_limit", "min_limit", "max_limit", "max_retry_after"):
            _check_int(key, getattr(self, key), minimum=1)
        _check_int("queue_size", self.queue_size, minimum=0)
        _check_int("default_max_new_tokens", self.default_max_new_tokens, minimum=0)
        if not self.min_limit <= self.initial_limit <= self.max_limit:
            raise ConfigError(
                f"AdmissionConfig: need min_limit <= initial_limit <= max_limit, got "
                f"{self.min_limit}, {self.initial_limit}, {self.max_limit}"
            )
        if not (isinstance(self.tolerance, int | float) and self.tolerance >= 1.0):
            raise ConfigError(f"AdmissionConfig: tolerance must be >= 1, got {self.tolerance!r}")
        for key in ("default_timeout", "max_timeout"):
            value = getattr(self, key)
            if not (isinstance(value, int | float) and 0 < value < math.inf):
                raise ConfigError(f"AdmissionConfig: {key} must be > 0 seconds, got {value!r}")
        if self.default_timeout > self.max_timeout:
            raise ConfigError(
                f"AdmissionConfig: default_timeout {self.default_timeout!r} is over "
                f"max_timeout {self.max_timeout!r}"
            )
        if not self.priorities or len(set(self.priorities)) != len(self.priorities):
            raise ConfigError(
                f"AdmissionConfig: priorities must be distinct names, got {self.priorities!r}"
            )
        if self.default_priority not in self.priorities:
            raise ConfigError(
                f"AdmissionConfig: default_priority {self.default_priority!r} is not one of "
                f"{self.priorities!r}"
            )
        capacity = self.memory_capacity
        if capacity is not None and not callable(capacity):
            _check_int("memory_capacity", capacity, minimum=1)
        if not callable(self.memory_estimator):
            raise ConfigError("AdmissionConfig: memory_estimator must be callable")


def _check_int(key: str, value: object, *, minimum: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ConfigError(f"AdmissionConfig: {key} must be an integer >= {minimum}, got {value!r}")


class AdmissionRefused(AivitalsError):
    """The controller refused a request: answer 429 with ``Retry-After``."""

    def __init__(self, reason: str, code: ErrorCode, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.reason = reason
        self.code = code
        self.retry_after = retry_after


@dataclass(slots=True)
class Ticket:
    """A granted admission: what the request reserved and how long it queued."""

    priority: str
    deadline: float
    cost: int
    queue_wait: float = 0.0
    started: float = 0.0


@dataclass(eq=False, slots=True)
class _Waiter:
    level: int
    deadline: float
    enqueued: float
    # an asyncio future on the event loop; a concurrent one for a blocking (WSGI) thread
    future: asyncio.Future[None] | concurrent.futures.Future[None] = field(repr=False)


_LATENCY_WINDOW = 256


class AdmissionController:
    """The queue, the limit and the memory ledger of one service.

    Used from one event loop (``admit``), or from the threads of a blocking
    server such as a WSGI worker (``admit_blocking``), not both at once.
    """

    def __init__(
        self,
        config: AdmissionConfig | None = None,
        *,
        registry: CollectorRegistry | None = REGISTRY,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = cfg = config if config is not None else AdmissionConfig()
        self.clock = clock
        self._limiter = GradientLimit(
            initial=cfg.initial_limit,
            floor=cfg.min_limit,
            ceiling=cfg.max_limit,
            tolerance=cfg.tolerance,
        )
        self._levels = {name: i for i, name in enumerate(cfg.priorities)}
        self._queues: list[deque[_Waiter]] = [deque() for _ in cfg.priorities]
        self._queued = 0
        self.in_flight = 0
        self.reserved = 0
        self._latencies: deque[float] = deque(maxlen=_LATENCY_WINDOW)
        self._mean_latency: float | None = None
        self._service_estimate = 0.0  # p99 of recent service times
        self._service_typical = 0.0  # their median
        self._waits: deque[float] = deque(maxlen=_LATENCY_WINDOW)
        self.queue_peak = 0
        #: held by the blocking (thread) side around every change of the state above
        self._thread_lock = threading.Lock()
        self._metrics = metrics_for(registry)
        self._metrics.queue_capacity.labels("admission").set(cfg.queue_size)
        self._publish()

    # --- what it exposes ------------------------------------------------------------

    @property
    def limit(self) -> int:
        """The concurrency allowed now (the adaptive limit, rounded down, at least 1)."""
        return max(1, int(self._limiter.limit))

    @property
    def queue_length(self) -> int:
        return self._queued

    def snapshot(self) -> dict[str, float | int | None]:
        """Queue length, capacity, wait p99, limit, in-flight: what /health/queue shows."""
        waits = sorted(self._waits)
        p99 = waits[min(len(waits) - 1, int(0.99 * len(waits)))] if waits else None
        return {
            "queue_length": self._queued,
            "queue_capacity": self.config.queue_size,
            "queue_wait_p99_seconds": p99,
            "limit": self.limit,
            "in_flight": self.in_flight,
            "memory_reserved_bytes": self.reserved,
            "drain_rate_per_second": self.drain_rate(),
        }

    def drain_rate(self) -> float | None:
        """Requests finished per second at the current limit (Little's law), once measured."""
        if not self._mean_latency:
            return None
        return self.limit / self._mean_latency

    # --- parsing client input -------------------------------------------------------

    def parse_priority(self, value: str | None) -> str:
        """The priority class named by ``value`` (None: the default); ConfigError if unknown."""
        if value is None or value == "":
            return self.config.default_priority
        name = value.strip().lower()
        if name not in self._levels:
            raise ConfigError(
                f"unknown priority {value[:40]!r}; use one of {', '.join(self.config.priorities)}"
            )
        return name

    def parse_timeout(self, value: str | None) -> float:
        """Seconds from a timeout header value (None: the default); ConfigError if absurd."""
        cfg = self.config
        return parse_timeout(
            value, header=cfg.timeout_header, default=cfg.default_timeout, maximum=cfg.max_timeout
        )

    # --- admission ------------------------------------------------------------------

    def check(self, *, priority: str, deadline: float, cost: int = 0) -> None:
        """Raise ``AdmissionRefused`` if the request would be refused now; cheap, no state."""
        try:
            self._refusal(self._levels[priority], deadline, cost, self.clock())
        except AdmissionRefused as refused:
            self._count_refusal(priority, refused)
            raise

    @asynccontextmanager
    async def admit(
        self,
        *,
        priority: str | None = None,
        deadline: float | None = None,
        timeout: float | None = None,
        cost: int = 0,
    ) -> AsyncIterator[Ticket]:
        """Wait for a slot; hold it (and ``cost`` bytes of memory) for the ``async with``.

        ``deadline`` is absolute, on this controller's clock (``time.monotonic``
        by default); ``timeout`` is relative. Raises ``AdmissionRefused`` (429)
        or ``ConfigError`` (unknown priority, absurd timeout).
        """
        name = self.parse_priority(priority)
        now = self.clock()
        if deadline is None:
            deadline = now + self.parse_timeout(None if timeout is None else str(timeout))
        ticket = Ticket(name, deadline, max(0, int(cost)))
        await self._acquire(ticket, now)
        try:
            yield ticket
        finally:
            self._release(ticket)

    async def _acquire(self, ticket: Ticket, now: float) -> None:
        level = self._levels[ticket.priority]
        try:
            self._refusal(level, ticket.deadline, ticket.cost, now)
        except AdmissionRefused as refused:
            self._count_refusal(ticket.priority, refused)
            raise
        self.reserved += ticket.cost
        if self._queued == 0 and self.in_flight < self.limit:
            self.in_flight += 1
            self._start(ticket, now)
            return
        if self._queued >= self.config.queue_size:
            self._evict_lower_than(level)
        waiter = _Waiter(level, ticket.deadline, now, asyncio.get_running_loop().create_future())
        self._queues[level].append(waiter)
        self._queued += 1
        self.queue_peak = max(self.queue_peak, self._queued)
        self._publish()
        try:
            await self._wait(waiter)
            self._still_in_time(ticket)
        except BaseException:
            self.reserved -= ticket.cost
            raise
        self._start(ticket, waiter.enqueued)

    # --- admission from threads (WSGI) --------------------------------------------------

    @contextmanager
    def admit_blocking(
        self,
        *,
        priority: str | None = None,
        deadline: float | None = None,
        timeout: float | None = None,
        cost: int = 0,
    ) -> Iterator[Ticket]:
        """``admit`` for a thread that may block (a WSGI worker thread): waits for a slot.

        Raises ``AdmissionRefused`` (429) or ``ConfigError`` as ``admit`` does.

        **Usage**::

            with controller.admit_blocking(priority="batch", timeout=5.0):
                run_model()
        """
        ticket = self.acquire_blocking(
            priority=priority, deadline=deadline, timeout=timeout, cost=cost
        )
        try:
            yield ticket
        finally:
            self.release_blocking(ticket)

    def check_blocking(self, *, priority: str, deadline: float, cost: int = 0) -> None:
        """``check``, safe from several threads."""
        with self._thread_lock:
            self.check(priority=priority, deadline=deadline, cost=cost)

    def acquire_blocking(
        self,
        *,
        priority: str | None = None,
        deadline: float | None = None,
        timeout: float | None = None,
        cost: int = 0,
    ) -> Ticket:
        """Wait in this thread for a slot; pair with ``release_blocking`` (a WSGI response
        holds its slot until the server closes it, past any ``with`` block)."""
        name = self.parse_priority(priority)
        now = self.clock()
        if deadline is None:
            deadline = now + self.parse_timeout(None if timeout is None else str(timeout))
        ticket = Ticket(name, deadline, max(0, int(cost)))
        level = self._levels[name]
        with self._thread_lock:
            try:
                self._refusal(level, ticket.deadline, ticket.cost, now)
            except AdmissionRefused as refused:
                self._count_refusal(name, refused)
                raise
            self.reserved += ticket.cost
            if self._queued == 0 and self.in_flight < self.limit:
                self.in_flight += 1
                self._start(ticket, now)
                return ticket
            if self._queued >= self.config.queue_size:
                self._evict_lower_than(level)
            future: concurrent.futures.Future[None] = concurrent.futures.Future()
            waiter = _Waiter(level, ticket.deadline, now, future)
            self._queues[level].append(waiter)
            self._queued += 1
            self.queue_peak = max(self.queue_peak, self._queued)
            self._publish()
            budget = ticket.deadline - self.clock() - self._service_estimate
        try:
            future.result(timeout=max(0.0, budget))
        except BaseException as exc:
            with self._thread_lock:
                self.reserved -= ticket.cost
                error = self._give_up(waiter, exc)
            if error is exc:
                raise
            raise error from None
        with self._thread_lock:
            try:
                self._still_in_time(ticket)
            except AdmissionRefused:
                self.reserved -= ticket.cost
                raise
            self._start(ticket, waiter.enqueued)
        return ticket

    def _give_up(self, waiter: _Waiter, exc: BaseException) -> BaseException:
        """A blocked thread stopped waiting (deadline, eviction, interrupt): the error to raise."""
        future = waiter.future
        if future.done() and not future.cancelled():
            if future.exception() is None:
                self.in_flight -= 1  # granted just as we gave up: hand it back
                self._dispatch()
        else:
            self._remove(waiter)
            future.cancel()
        priority = self.config.priorities[waiter.level]
        if isinstance(exc, TimeoutError):
            refused = self._refused("deadline", "deadline passes before a slot frees")
            self._count_refusal(priority, refused)
            return refused
        if isinstance(exc, AdmissionRefused):  # evicted by a higher priority
            self._count_refusal(priority, exc)
        return exc

    def release_blocking(self, ticket: Ticket) -> None:
        """Give back the slot and memory of ``acquire_blocking``'s ticket."""
        with self._thread_lock:
            self._release(ticket)

    def _still_in_time(self, ticket: Ticket) -> None:
        """At the grant, refuse (and hand the slot on) if the work can no longer fit.

        The service estimate may have grown while the request waited; a 429 now is
        better than a 504 after spending the slot.
        """
        left = ticket.deadline - self.clock()
        if left >= self._service_estimate:
            return
        self.in_flight -= 1
        self._dispatch()
        refused = self._refused(
            "deadline",
            f"{left:.3f} s left at the grant, service takes {self._service_estimate:.3f} s",
        )
        self._count_refusal(ticket.priority, refused)
        raise refused

    async def _wait(self, waiter: _Waiter) -> None:
        # Leave the queue while the deadline can still be told to the client: a request
        # that could not finish in time must not wait until it has passed.
        budget = waiter.deadline - self.clock() - self._service_estimate
        try:
            async with asyncio.timeout(max(0.0, budget)):
                await asyncio.shield(cast("asyncio.Future[None]", waiter.future))
        except BaseException as exc:
            if waiter.future.done() and not waiter.future.cancelled():
                if waiter.future.exception() is None:
                    self.in_flight -= 1  # granted just as we gave up: hand it back
                    self._dispatch()
            else:
                self._remove(waiter)
                waiter.future.cancel()
            priority = self.config.priorities[waiter.level]
            if isinstance(exc, TimeoutError):
                refused = self._refused("deadline", "deadline passes before a slot frees")
                self._count_refusal(priority, refused)
                raise refused from None
            if isinstance(exc, AdmissionRefused):  # evicted by a higher priority
                self._count_refusal(priority, exc)
            raise

    def _start(self, ticket: Ticket, enqueued: float) -> None:
        # The slot is already counted in in_flight (here or by _dispatch).
        now = self.clock()
        ticket.queue_wait = now - enqueued
        ticket.started = now
        self._waits.append(ticket.queue_wait)
        self._metrics.admission_queue_wait.labels(ticket.priority).observe(ticket.queue_wait)
        self._metrics.queue_wait.labels("admission").observe(ticket.queue_wait)
        self._publish()

    def _release(self, ticket: Ticket) -> None:
        now = self.clock()
        latency = now - ticket.started
        if self.config.adaptive:
            self._limiter.on_sample(latency, self.in_flight, now)
        self._observe_latency(latency)
        self.in_flight -= 1
        self.reserved -= ticket.cost
        self._dispatch()
        self._publish()

    def _observe_latency(self, latency: float) -> None:
        self._latencies.append(latency)
        mean = self._mean_latency
        self._mean_latency = latency if mean is None else mean + 0.1 * (latency - mean)
        if len(self._latencies) % 16 == 1 or len(self._latencies) < 16:
            ordered = sorted(self._latencies)
            # nearest rank: with few samples the p99 is the maximum, not an interpolation
            self._service_estimate = ordered[math.ceil(0.99 * len(ordered)) - 1]
            self._service_typical = ordered[math.ceil(0.5 * len(ordered)) - 1]

    def _dispatch(self) -> None:
        for queue in self._queues:
            while queue and self.in_flight < self.limit:
                waiter = queue.popleft()
                self._queued -= 1
                if waiter.future.done():
                    continue
                self.in_flight += 1
                waiter.future.set_result(None)
        self._publish()

    def _remove(self, waiter: _Waiter) -> None:
        try:
            self._queues[waiter.level].remove(waiter)
        except ValueError:
            return
        self._queued -= 1
        self._publish()

    def _evict_lower_than(self, level: int) -> None:
        for lower in range(len(self._queues) - 1, level, -1):
            if self._queues[lower]:
                victim = self._queues[lower].pop()
                self._queued -= 1
                refused = self._refused("queue_full", "evicted by a higher-priority request")
                victim.future.set_exception(refused)
                return

    # --- refusal ----------------------------------------------------------------------

    def _refusal(self, level: int, deadline: float, cost: int, now: float) -> None:
        cfg = self.config
        source = cfg.memory_capacity
        if cost and source is not None:
            capacity = source() if callable(source) else source
            if self.reserved + cost > capacity:
                raise self._refused(
                    "memory",
                    f"memory reservation of {cost} bytes does not fit "
                    f"({self.reserved} of {capacity} bytes reserved)",
                )
        must_queue = self._queued > 0 or self.in_flight >= self.limit
        if must_queue and self._queued >= cfg.queue_size and not any(self._queues[level + 1 :]):
            raise self._refused("queue_full", f"admission queue full ({cfg.queue_size})")
        if self.in_flight == 0 and self._queued == 0:
            # Idle: run it. Refusing on an estimate learnt under load would refuse
            # forever, since nothing admitted means no new latency to learn from.
            return
        # A request that would queue must fit its wait plus a pessimistic (p99) service
        # time; one that starts at once needs only a typical (median) one: refusing it
        # because of the tail would turn away work a free slot can still do in time.
        wait = self.predicted_wait(level) if must_queue else 0.0
        service = self._service_estimate if must_queue else self._service_typical
        if wait + service > deadline - now:
            raise self._refused(
                "deadline",
                f"predicted wait {wait:.3f} s + service {service:.3f} s "
                f"exceeds the deadline ({max(0.0, deadline - now):.3f} s left)",
            )

    def predicted_wait(self, level: int = 0) -> float:
        """Seconds a request of priority ``level`` would wait for a slot if it came now."""
        ahead = sum(len(q) for q in self._queues[: level + 1])
        free = self.limit - self.in_flight
        rate = self.drain_rate()
        if ahead < free or rate is None:
            return 0.0
        return (ahead - free + 1) / rate

    def _refused(self, reason: str, message: str) -> AdmissionRefused:
        code = {
            "queue_full": ErrorCode.QUEUE_FULL,
            "deadline": ErrorCode.DEADLINE_UNMEETABLE,
            "memory": ErrorCode.MEMORY_RESERVATION,
        }[reason]
        return AdmissionRefused(reason, code, message, self.retry_after())

    def retry_after(self) -> int:
        """Whole seconds until the queue ahead has drained at the observed rate (>= 1)."""
        rate = self.drain_rate()
        if rate is None:
            return 1
        seconds = math.ceil((self._queued + 1) / rate)
        return max(1, min(self.config.max_retry_after, seconds))

    def _count_refusal(self, priority: str, refused: AdmissionRefused) -> None:
        self._metrics.admission_rejections.labels(priority, refused.reason).inc()

    def _publish(self) -> None:
        m = self._metrics
        m.admission_limit.set(self.limit)
        m.admission_in_flight.set(self.in_flight)
        for name, queue in zip(self.config.priorities, self._queues, strict=True):
            m.admission_queue_length.labels(name).set(len(queue))
        m.queue_length.labels("admission").set(self._queued)
