"""Health checks that cannot lie: liveness, deep readiness, queue state.

* ``/healthz`` (liveness) depends on nothing but the event loop: it answers
  200 unless the loop's lag measured over the last ``lag_window`` seconds
  passed ``liveness_budget`` (503). A loop blocked for good cannot answer at
  all, which a probe with a timeout also reads as failure.
* ``/readyz`` (readiness) is 200 only when every check passed: the model is
  loaded, the warm-up (a dummy inference) finished, a minimal probe
  inference finished within ``probe_timeout`` within the last
  ``probe_max_age`` seconds, GPU memory headroom is at least
  ``min_gpu_free_ratio`` where a GPU is present, and every registered
  dependency answered its ping within ``dependency_timeout``.
  The probe and the pings run on a background schedule every
  ``probe_interval`` seconds, so a hung inference worker turns ``/readyz``
  503 within two probe periods while ``/healthz`` stays 200.
* ``/health/queue``: queue length, capacity, wait p99, limit, in-flight.

Every body names each check, whether it passed and why.

**Usage**::

    health = Health(HealthConfig(probe=lambda: model.embed(["ping"]),
                                 dependencies={"redis": redis_client.ping}))
    app = HealthMiddleware(app, health)
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import math
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry

from aivitals.errors import ConfigError

from ._admission import AdmissionController
from ._asgi import ASGIApp, Message, Receive, Scope, Send, log, send_json
from ._metrics import metrics_for

__all__ = ["CheckResult", "Health", "HealthConfig", "HealthMiddleware"]

Check = Callable[[], Any]


@dataclass(frozen=True, kw_only=True, slots=True)
class HealthConfig:
    """What readiness means for this service; every callable may be sync or async.

    ``probe``: a minimal inference (``None``: no probe check). ``warmup``: the
    dummy inference run before ready (``None``: the probe, when there is one).
    ``model_loaded``: returns truthy once the model is in memory. ``gpu_memory``:
    returns ``(used_bytes, total_bytes)``, or ``None`` where no GPU is present.
    ``dependencies``: name -> ping; a ping fails by raising, returning ``False``
    or taking longer than ``dependency_timeout``.
    """

    probe: Check | None = None
    warmup: Check | None = None
    model_loaded: Check | None = None
    gpu_memory: Check | None = None
    dependencies: Mapping[str, Check] = field(default_factory=dict)
    probe_interval: float = 5.0
    probe_timeout: float = 0.5
    probe_max_age: float | None = None
    warmup_timeout: float = 120.0
    min_gpu_free_ratio: float = 0.1
    dependency_timeout: float = 0.5
    liveness_budget: float = 5.0
    lag_window: float = 30.0
    healthz_path: str = "/healthz"
    readyz_path: str = "/readyz"
    queue_path: str = "/health/queue"

    def __post_init__(self) -> None:
        for key in (
            "probe_interval",
            "probe_timeout",
            "warmup_timeout",
            "dependency_timeout",
            "liveness_budget",
            "lag_window",
        ):
            value = getattr(self, key)
            if not (isinstance(value, int | float) and 0 < value < math.inf):
                raise ConfigError(f"HealthConfig: {key} must be > 0 seconds, got {value!r}")
        if self.probe_max_age is not None and not self.probe_max_age > 0:
            raise ConfigError(
                f"HealthConfig: probe_max_age must be > 0, got {self.probe_max_age!r}"
            )
        if not 0 <= self.min_gpu_free_ratio < 1:
            raise ConfigError(
                "HealthConfig: min_gpu_free_ratio must be in [0, 1), "
                f"got {self.min_gpu_free_ratio!r}"
            )
        for key in ("probe", "warmup", "model_loaded", "gpu_memory"):
            value = getattr(self, key)
            if value is not None and not callable(value):
                raise ConfigError(f"HealthConfig: {key} must be callable, got {value!r}")
        for name, ping in self.dependencies.items():
            if not callable(ping):
                raise ConfigError(f"HealthConfig: dependencies[{name!r}] is not callable")

    @property
    def max_age(self) -> float:
        """How old the last good probe may be: ``probe_max_age`` or two probe periods."""
        return self.probe_max_age if self.probe_max_age is not None else 2 * self.probe_interval


@dataclass(frozen=True, slots=True)
class CheckResult:
    """One check's verdict: passed or not, why, and when it ran."""

    ok: bool
    detail: str
    at: float
    seconds: float | None = None

    def to_json(self, now: float) -> dict[str, Any]:
        out: dict[str, Any] = {"ok": self.ok, "detail": self.detail}
        out["age_seconds"] = round(now - self.at, 3)
        if self.seconds is not None:
            out["seconds"] = round(self.seconds, 4)
        return out


async def _call(fn: Check, timeout: float, done: Callable[[], object]) -> Any:
    """Run a sync or async check under ``timeout``; call ``done`` when the work really ends.

    A sync check runs on a thread, which a timeout cannot stop: ``done`` waits for the
    thread, so a hung check is not started again (and does not eat another thread).
    """
    if inspect.iscoroutinefunction(fn):
        try:
            return await asyncio.wait_for(fn(), timeout)
        finally:
            done()

    # The thread says when the work ended, not the loop: a loop blocked by other work (a
    # synchronous call in a handler) hears it late, and a round started meanwhile read the
    # check as "previous run still going", reporting a healthy dependency down. The same
    # for the timeout: the thread's clock decides whether the answer came in time.
    # A thread of its own, not the loop's shared executor: queued behind the
    # application's work (asyncio.to_thread calls) the ping would time out before it
    # ever ran, and DependencyDown would page for the service's own load. One thread per
    # check at most: a hung one is "previous run still going", never started again.
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()
    outcome: list[tuple[float, bool, Any]] = []  # (seconds it took, raised, value)

    def settle(raised: bool, value: Any) -> None:
        if future.done():
            return
        if raised:
            future.set_exception(value)
        else:
            future.set_result(value)

    def run() -> None:
        began = time.monotonic()
        try:
            value = fn()
        except BaseException as exc:  # handed to the loop, which re-raises it
            item = (time.monotonic() - began, True, exc)
        else:
            item = (time.monotonic() - began, False, value)
        outcome.append(item)
        done()
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nobody waits
            loop.call_soon_threadsafe(settle, item[1], item[2])

    def finished(f: asyncio.Future[Any]) -> None:
        if not f.cancelled():
            f.exception()  # retrieved: a late failure is not "never retrieved"

    future.add_done_callback(finished)
    threading.Thread(target=run, name="aivitals-health-check", daemon=True).start()
    try:
        result = await asyncio.wait_for(asyncio.shield(future), timeout)
    except TimeoutError:
        if not outcome or outcome[0][0] > timeout:
            raise  # no answer in time by the thread's own clock: a real timeout
        _, raised, result = outcome[0]
        if raised:
            raise result from None
    if inspect.isawaitable(result):
        return await asyncio.wait_for(_await(result), timeout)
    return result


async def _await(value: Awaitable[Any]) -> Any:
    return await value


class Health:
    """The checks and their background schedule; answer with ``liveness()``/``readiness()``."""

    def __init__(
        self,
        config: HealthConfig | None = None,
        *,
        controller: AdmissionController | None = None,
        registry: CollectorRegistry | None = REGISTRY,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config if config is not None else HealthConfig()
        self.controller = controller
        self.clock = clock
        self.warmed = self.config.probe is None and self.config.warmup is None
        self.results: dict[str, CheckResult] = {}
        self._lags: list[tuple[float, float]] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._running: dict[str, float] = {}
        self._metrics = metrics_for(registry)

    # --- schedule ---------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return any(not t.done() for t in self._tasks)

    def start(self) -> None:
        """Start warm-up, the probe schedule and the loop-lag monitor on the running loop."""
        if self.running:
            return
        self._tasks = [
            asyncio.ensure_future(self._schedule()),
            asyncio.ensure_future(self._watch_lag()),
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []

    async def _schedule(self) -> None:
        cfg = self.config
        while True:
            began = self.clock()
            if not self.warmed:
                await self.run_warmup()
            else:
                await self.run_checks()
            spent = self.clock() - began
            await asyncio.sleep(max(0.0, cfg.probe_interval - spent))

    async def run_warmup(self) -> None:
        """Run the dummy inference once; ready is impossible until it has passed."""
        fn = self.config.warmup or self.config.probe
        if fn is None:
            self.warmed = True
            return
        result = await self._timed("warmup", fn, self.config.warmup_timeout)
        self.warmed = result.ok
        if result.ok:
            log.info("warm-up finished in %.3f s", result.seconds or 0.0)
            await self.run_checks()

    async def run_checks(self) -> None:
        """Run the probe and every dependency ping now, concurrently."""
        cfg = self.config
        jobs: list[Awaitable[object]] = []
        if cfg.probe is not None:
            jobs.append(self._guarded("probe", cfg.probe, cfg.probe_timeout))
        jobs += [
            self._guarded(f"dependency:{name}", ping, cfg.dependency_timeout)
            for name, ping in cfg.dependencies.items()
        ]
        await asyncio.gather(*jobs)

    async def _guarded(self, name: str, fn: Check, timeout: float) -> None:
        started = self._running.get(name)
        if started is not None:
            # Still stuck in the previous run (a hung worker): that is the answer.
            stuck = self.clock() - started
            detail = f"previous run still going ({stuck:.1f} s)"
            self._record(name, CheckResult(False, detail, self.clock()))
            return
        self._running[name] = self.clock()
        await self._timed(name, fn, timeout)

    async def _timed(self, name: str, fn: Check, timeout: float) -> CheckResult:
        began = self.clock()
        try:
            value = await _call(fn, timeout, lambda: self._running.pop(name, None))
        except TimeoutError:
            result = CheckResult(False, f"no answer within {timeout:g} s", self.clock(), timeout)
        except Exception as exc:
            result = CheckResult(False, f"{type(exc).__name__}: {exc}"[:200], self.clock())
        else:
            spent = self.clock() - began
            ok = value is not False
            result = CheckResult(ok, "ok" if ok else "returned False", self.clock(), spent)
        self._record(name, result)
        return result

    def _record(self, name: str, result: CheckResult) -> None:
        if not result.ok and self.results.get(name, result).ok:
            log.warning(
                "health check %s failed: %s",
                name,
                result.detail,
                extra={
                    "check": name,
                    "error_code": "DEPENDENCY_DOWN" if "dependency" in name else "MODEL_ERROR",
                },
            )
        self.results[name] = result
        self._metrics.health_check_up.labels(name).set(1 if result.ok else 0)

    async def _watch_lag(self) -> None:
        tick = 0.1
        while True:
            began = self.clock()
            await asyncio.sleep(tick)
            now = self.clock()
            self._lags.append((now, max(0.0, now - began - tick)))
            cutoff = now - self.config.lag_window
            while self._lags and self._lags[0][0] < cutoff:
                self._lags.pop(0)

    # --- verdicts ---------------------------------------------------------------------

    def liveness(self) -> tuple[bool, dict[str, Any]]:
        """Whether the event loop kept its budget; no dependency is consulted."""
        lag = max((v for _, v in self._lags), default=0.0)
        ok = lag <= self.config.liveness_budget
        detail = f"max event-loop lag {lag:.3f} s over the last {self.config.lag_window:g} s"
        return ok, {
            "status": "ok" if ok else "fail",
            "checks": {"event_loop": {"ok": ok, "detail": detail}},
        }

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        """Every readiness check with its verdict; ready only if all passed."""
        now = self.clock()
        checks = dict(self._checks(now))
        ok = all(c["ok"] for c in checks.values())
        self._metrics.service_ready.set(1 if ok else 0)
        return ok, {"status": "ok" if ok else "fail", "checks": checks}

    def _checks(self, now: float) -> list[tuple[str, dict[str, Any]]]:
        cfg = self.config
        out: list[tuple[str, dict[str, Any]]] = []
        if cfg.model_loaded is not None:
            out.append(("model_loaded", self._model_loaded()))
        warm = {
            "ok": self.warmed,
            "detail": "warm-up done" if self.warmed else "warm-up not finished",
        }
        if not self.warmed and "warmup" in self.results:
            warm["detail"] = f"warm-up failed: {self.results['warmup'].detail}"
        out.append(("warmup", warm))
        if cfg.probe is not None:
            out.append(("probe", self._fresh("probe", now, cfg.max_age)))
        for name in cfg.dependencies:
            out.append((f"dependency:{name}", self._fresh(f"dependency:{name}", now, cfg.max_age)))
        if cfg.gpu_memory is not None:
            out.append(("gpu_memory", self._gpu_headroom()))
        return out

    def _fresh(self, name: str, now: float, max_age: float) -> dict[str, Any]:
        result = self.results.get(name)
        if result is None:
            return {"ok": False, "detail": "has not run yet"}
        body = result.to_json(now)
        if result.ok and now - result.at > max_age:
            body["ok"] = False
            body["detail"] = f"last success {now - result.at:.1f} s ago, over {max_age:g} s"
        started = self._running.get(name)
        if started is not None and now - started > self.config.probe_timeout:
            limit = self.config.probe_timeout
            body["ok"] = False
            body["detail"] = f"running for {now - started:.1f} s, over {limit:g} s"
        if not body["ok"]:
            # the verdict can fail before the check's own timeout is recorded (an overrun
            # seen at request time, a stale success): the gauge says what /readyz says
            self._metrics.health_check_up.labels(name).set(0)
        return body

    def _model_loaded(self) -> dict[str, Any]:
        assert self.config.model_loaded is not None
        try:
            loaded = bool(self.config.model_loaded())
        except Exception as exc:
            return {"ok": False, "detail": f"{type(exc).__name__}: {exc}"[:200]}
        return {"ok": loaded, "detail": "model loaded" if loaded else "model not loaded"}

    def _gpu_headroom(self) -> dict[str, Any]:
        assert self.config.gpu_memory is not None
        try:
            reading = self.config.gpu_memory()
        except Exception as exc:
            return {
                "ok": False,
                "detail": f"GPU memory unreadable: {type(exc).__name__}: {exc}"[:200],
            }
        if reading is None:
            return {"ok": True, "detail": "no GPU present"}
        used, total = reading
        free = 1.0 - used / total if total > 0 else 0.0
        ok = free >= self.config.min_gpu_free_ratio
        need = self.config.min_gpu_free_ratio
        detail = f"{free:.1%} free ({used} of {total} bytes used), need {need:.0%}"
        return {"ok": ok, "detail": detail, "free_ratio": round(free, 4)}

    def queue(self) -> dict[str, Any]:
        """The admission queue's state for ``/health/queue``."""
        if self.controller is None:
            return {"status": "ok", "queue": None, "detail": "no admission controller"}
        return {"status": "ok", "queue": self.controller.snapshot()}


class HealthMiddleware:
    """Serve the health paths in front of ``app``; start the schedule with the app.

    The schedule starts on the ASGI lifespan startup (or on the first request when
    the server runs without lifespan) and stops on shutdown.
    """

    def __init__(self, app: ASGIApp, health: Health) -> None:
        self.app = app
        self.health = health
        cfg = health.config
        self._routes: dict[str, Callable[[], tuple[bool, dict[str, Any]]]] = {
            cfg.healthz_path: health.liveness,
            cfg.readyz_path: health.readiness,
            cfg.queue_path: lambda: (True, health.queue()),
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, receive, self._lifespan_send(send))
            return
        if scope["type"] == "http":
            if not self.health.running:
                self.health.start()
            answer = self._routes.get(scope.get("path", ""))
            if answer is not None and scope.get("method") in ("GET", "HEAD"):
                ok, body = answer()
                await send_json(
                    send, 200 if ok else 503, body, headers=[(b"cache-control", b"no-store")]
                )
                return
        await self.app(scope, receive, send)

    def _lifespan_send(self, send: Send) -> Send:
        async def wrapped(message: Message) -> None:
            if message["type"] == "lifespan.startup.complete":
                self.health.start()
            elif message["type"] == "lifespan.shutdown.complete":
                await self.health.stop()
            await send(message)

        return wrapped
