"""``mount(app)``: the chaos hook a service mounts so aivitals can break it from inside.

Some faults only exist inside the serving process: a handler that blocks the event
loop, memory kept per request, threads that never end, GPU memory a request never
frees. ``mount`` wraps any ASGI app and serves ``/_aivitals/chaos``, which
``aivitals chaos run`` and ``aivitals validate`` post to (``InProcessFault``).

The hook is off unless the service's process has ``AIVITALS_CHAOS_TOKEN`` set (8+
characters); off, its path answers 403 naming the variable. On, every call must
carry the token in ``X-Aivitals-Token``. The path never reaches the app either way.

Five faults run on any app, by the mount itself, on each request it passes on
(``event_loop_block``, ``slow_dependency``, ``thread_leak``, ``process_memory_leak``,
``gpu_leak``). Four need the app's own parts (its worker pool, its model, its
timeouts) and run only through a hook the app passes; without one they are
answered 409 "not supported", and GET lists what this service supports.
``mount_wsgi`` is the same hook for a WSGI app, where ``event_loop_block`` (there is
no loop) needs a hook too.

The registry is per process: under several worker processes (``uvicorn --workers``,
gunicorn) a POST reaches the one worker that accepted it.

Every fault has a bounded duration after which it reverts by itself; the
lifespan's shutdown (and ``faults.stop_all()``) reverts everything.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import math
import mmap
import os
import random
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, MutableMapping
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any, Protocol

from ..errors import ConfigError, FaultUnsupported

__all__ = [
    "CHAOS_ENV",
    "CHAOS_PATH",
    "IN_PROCESS_FAULTS",
    "MAX_DURATION",
    "ChaosMount",
    "ChaosMountWSGI",
    "FaultHook",
    "GpuLeakTarget",
    "InProcessFaultSpec",
    "InProcessFaults",
    "mount",
    "mount_wsgi",
]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
StartResponse = Callable[..., Any]
WSGIApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]

CHAOS_PATH = "/_aivitals/chaos"
#: The variable that turns the hook on, holding the token callers must send.
CHAOS_ENV = "AIVITALS_CHAOS_TOKEN"
MIN_TOKEN_CHARS = 8
#: Longest an in-process fault may stay on, seconds.
MAX_DURATION = 3600.0
#: Called with ``(True, params)`` when a fault starts and ``(False, params)`` when it
#: stops (asked, expired or at shutdown), on a worker thread, never on the event loop.
FaultHook = Callable[[bool, dict[str, float]], None]

_MIB = 2**20
_MAX_BODY = 64 * 1024
log = logging.getLogger("aivitals.chaos")


@dataclass(frozen=True, slots=True)
class InProcessFaultSpec:
    """One in-process fault: its wire name, what it does, its parameters' bounds and,
    where the mount can run it on any app, what it does there (``generic``)."""

    name: str
    help: str
    params: Mapping[str, tuple[float, float, float]] = field(default_factory=dict)
    """param -> (default, minimum, maximum)"""
    generic: str | None = None


IN_PROCESS_FAULTS: dict[str, InProcessFaultSpec] = {
    spec.name: spec
    for spec in (
        InProcessFaultSpec(
            "gpu_leak",
            "every request leaves `mib_per_request` MiB allocated on the GPU",
            # down to 0.01 MiB: the severity sweep's at-threshold leak (2e6 B/s) at a few
            # requests a second is under half a MiB per request
            {"mib_per_request": (256.0, 0.01, 65536.0)},
            generic="real torch CUDA tensors when this process has torch loaded with CUDA, "
            "else the simulated device (AIVITALS_SIM_GPU_DIR), labelled sim; freed at stop",
        ),
        InProcessFaultSpec(
            "slow_inference",
            "contention: every generated token takes `factor` times as long",
            {"factor": (4.0, 1.0, 100.0)},
        ),
        InProcessFaultSpec(
            "event_loop_block",
            "each request handler sleeps `seconds` synchronously on the event loop",
            {"seconds": (0.2, 0.001, 5.0)},
            generic="time.sleep on the event loop before each request reaches the app",
        ),
        InProcessFaultSpec(
            "worker_pool_stuck",
            "`workers` pool workers block until the fault stops",
            {"workers": (0.0, 0.0, 1024.0)},
        ),
        InProcessFaultSpec(
            "process_memory_leak",
            "every request keeps `mib_per_request` MiB of process memory",
            {"mib_per_request": (4.0, 0.01, 1024.0), "max_mib": (4096.0, 1.0, 65536.0)},
            generic="touched anonymous mappings kept per request up to max_mib; unmapped at stop",
        ),
        InProcessFaultSpec(
            "no_abort_timeouts",
            "a passed deadline cancels only the await; the generation keeps running",
        ),
        InProcessFaultSpec("cold_start", "drop the loaded models; the next request reloads them"),
        # faults the knowledge base has no signature for (the diagnosis's generic part)
        InProcessFaultSpec(
            "slow_dependency",
            "every model request first awaits a call to a dependency that answers in "
            "`seconds` (x 0.75-1.25); the event loop stays free",
            {"seconds": (0.2, 0.001, 10.0)},
            generic="an awaited sleep before each request reaches the app",
        ),
        InProcessFaultSpec(
            "thread_leak",
            "every request starts `per_request` threads that never end, until `max_threads` "
            "are alive; they end when the fault stops",
            {"per_request": (2.0, 1.0, 64.0), "max_threads": (400.0, 1.0, 4000.0)},
            generic="parked threads started per request; released and joined at stop",
        ),
    )
}

#: The faults the mount runs on any app by itself.
GENERIC = frozenset(n for n, s in IN_PROCESS_FAULTS.items() if s.generic)


class InProcessFaults:
    """The faults active in this process, each with its parameters and expiry.

    ``supported`` names the faults this service can run (all unless given); starting
    another raises ``FaultUnsupported``. ``on_change`` hooks are told of every start
    and stop.

    **Usage**::

        faults = InProcessFaults(on_change={"worker_pool_stuck": pool_hook})
        faults.start("worker_pool_stuck", {"workers": 2, "duration": 60})
        faults.param("worker_pool_stuck", "workers")   # 2.0, or None when inactive
        faults.stop("worker_pool_stuck")
    """

    def __init__(
        self,
        *,
        on_change: Mapping[str, FaultHook],
        supported: Collection[str] | None = None,
    ) -> None:
        for name in [*on_change, *(supported or ())]:
            _spec(name)
        self.supported = frozenset(IN_PROCESS_FAULTS if supported is None else supported)
        self._active: dict[str, tuple[dict[str, float], float, float]] = {}
        self._hooks = dict(on_change)
        self._lock = threading.Lock()
        self._timers: dict[str, threading.Timer] = {}

    def start(self, name: str, params: Mapping[str, Any] | None = None) -> dict[str, Any]:
        spec = _spec(name)
        if name not in self.supported:
            raise FaultUnsupported(name)
        values, duration = _validate(spec, dict(params or {}))
        self.stop(name)
        now = time.time()
        with self._lock:
            self._active[name] = (values, now, now + duration)
            timer = threading.Timer(duration, self.stop, args=(name,))
            timer.daemon = True
            self._timers[name] = timer
            timer.start()
        try:
            self._notify(name, True, values)
        except BaseException:
            # a hook that failed to start the fault leaves nothing on to revert later
            with self._lock:
                self._active.pop(name, None)
                self._timers.pop(name, timer).cancel()
            raise
        return self.describe(name) or {}

    def stop(self, name: str) -> bool:
        """Stop ``name``; False when it was not on (an unsupported fault never is)."""
        _spec(name)
        with self._lock:
            entry = self._active.pop(name, None)
            timer = self._timers.pop(name, None)
        if timer is not None and timer is not threading.current_thread():
            timer.cancel()
        if entry is None:
            return False
        self._notify(name, False, entry[0])
        return True

    def stop_all(self) -> list[str]:
        with self._lock:
            names = list(self._active)
        return [n for n in names if self.stop(n)]

    def active(self, name: str) -> bool:
        return name in self._active

    def param(self, name: str, key: str) -> float | None:
        entry = self._active.get(name)
        return None if entry is None else entry[0].get(key)

    def describe(self, name: str) -> dict[str, Any] | None:
        entry = self._active.get(name)
        if entry is None:
            return None
        values, started, until = entry
        return {"fault": name, "params": values, "started_at": started, "until": until}

    def listing(self) -> list[dict[str, Any]]:
        with self._lock:
            names = sorted(self._active)
        return [d for n in names if (d := self.describe(n)) is not None]

    def _notify(self, name: str, on: bool, values: dict[str, float]) -> None:
        hook = self._hooks.get(name)
        if hook is not None:
            hook(on, values)


def _spec(name: str) -> InProcessFaultSpec:
    spec = IN_PROCESS_FAULTS.get(name)
    if spec is None:
        known = ", ".join(sorted(IN_PROCESS_FAULTS))
        raise ConfigError(f"fault={name!r}: expected one of {known}")
    return spec


def _validate(spec: InProcessFaultSpec, params: dict[str, Any]) -> tuple[dict[str, float], float]:
    duration = params.pop("duration", 300.0)
    duration = _number(spec.name, "duration", duration, 0.001, MAX_DURATION)
    unknown = set(params) - set(spec.params)
    if unknown:
        allowed = ", ".join(sorted(spec.params)) or "none besides duration"
        raise ConfigError(
            f"fault {spec.name!r}: unknown params {', '.join(sorted(unknown))} (allowed: {allowed})"
        )
    values = {}
    for key, (default, low, high) in spec.params.items():
        values[key] = _number(spec.name, key, params.get(key, default), low, high)
    return values, duration


def _number(fault: str, key: str, raw: Any, low: float, high: float) -> float:
    if isinstance(raw, bool) or not isinstance(raw, int | float) or not math.isfinite(raw):
        raise ConfigError(f"fault {fault!r}: {key}={raw!r} is not a finite number")
    if not low <= float(raw) <= high:
        raise ConfigError(f"fault {fault!r}: {key}={raw!r} outside [{low:g}, {high:g}]")
    return float(raw)


# -- the GPU a leak goes on ----------------------------------------------------------------
class GpuLeakTarget(Protocol):
    """Where ``gpu_leak`` keeps its memory: ``leak`` allocates and holds ``nbytes``,
    ``clear_leak`` frees all of it and returns how much that was."""

    def leak(self, nbytes: int) -> None: ...

    def clear_leak(self) -> int: ...


class _CudaLeak:
    """Real device memory: torch tensors held until the fault stops."""

    def __init__(self, torch: Any, device: int) -> None:
        self._torch = torch
        self.device = f"cuda:{device}"
        self._held: list[Any] = []
        self._lock = threading.Lock()

    def leak(self, nbytes: int) -> None:
        tensor = self._torch.empty(nbytes, dtype=self._torch.uint8, device=self.device)
        with self._lock:
            self._held.append(tensor)

    def clear_leak(self) -> int:
        with self._lock:
            freed = sum(int(t.numel()) for t in self._held)
            self._held.clear()
        self._torch.cuda.empty_cache()  # hand the cached blocks back so NVML sees them go
        return freed


class _SimLeak:
    """The SIMULATED device (``aivitals.collect.gpu.SimGPU``), booked to this process."""

    def __init__(self, state_dir: str, gpu: int = 0) -> None:
        from ..collect.gpu import SimGPU

        self._sim = SimGPU(state_dir)
        self.device = f"sim:{gpu} ({state_dir})"
        self._gpu = gpu
        self._pid = os.getpid()
        self._held = 0
        self._lock = threading.Lock()

    def leak(self, nbytes: int) -> None:
        self._sim.allocate(self._pid, nbytes, gpu=self._gpu, tag="leak")
        with self._lock:
            self._held += nbytes

    def clear_leak(self) -> int:
        with self._lock:
            freed, self._held = self._held, 0
        if freed:
            self._sim.free(self._pid, freed, gpu=self._gpu)
        return freed


def default_gpu_target() -> GpuLeakTarget:
    """Real CUDA memory when the app has torch loaded and CUDA works; else the sim device.

    torch is looked up, never imported: a service that does not use it should not pay
    its import (seconds, hundreds of MiB) for a fault.
    """
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        return _CudaLeak(torch, int(torch.cuda.current_device()))
    from ..collect.gpu import default_sim_dir

    return _SimLeak(default_sim_dir())


# -- what the mount does by itself ---------------------------------------------------------
class _Generic:
    """The generic faults' per-request effects and their reverts, read from ``faults``."""

    def __init__(self, gpu: Callable[[], GpuLeakTarget | None] | None) -> None:
        self._gpu_source = gpu
        self._gpu: GpuLeakTarget | None = None
        self._lock = threading.Lock()
        self._memory: list[mmap.mmap] = []
        # thread_leak: the leaked threads park on this event; setting it ends them all
        self._threads: list[threading.Thread] = []
        self._release = threading.Event()
        self._rng = random.Random()

    def hooks(self) -> dict[str, FaultHook]:
        return {
            "gpu_leak": self._on_gpu_leak,
            "process_memory_leak": self._on_memory_leak,
            "thread_leak": self._on_thread_leak,
        }

    def details(self, name: str) -> dict[str, Any]:
        """What a start's answer adds for fault ``name`` (the GPU leak names its device)."""
        extra = {"gpu_leak": self._gpu_details}.get(name)
        return {} if extra is None else extra()

    def _gpu_details(self) -> dict[str, Any]:
        target = self._gpu
        name = None if target is None else getattr(target, "device", type(target).__name__)
        return {"device": None if name is None else str(name)}

    def before(self, faults: InProcessFaults, *, loop: bool) -> None:
        """The synchronous part, in the request's path (on the event loop when ``loop``)."""
        seconds = faults.param("event_loop_block", "seconds") if loop else None
        if seconds:
            time.sleep(seconds)  # the fault: sync work on the event loop
        mib = faults.param("process_memory_leak", "mib_per_request")
        if mib:
            self._grow_memory(mib, faults.param("process_memory_leak", "max_mib") or 0.0)
        gpu_mib = faults.param("gpu_leak", "mib_per_request")
        if gpu_mib:
            self._leak_gpu(int(gpu_mib * _MIB))
        threads = faults.param("thread_leak", "per_request")
        if threads:
            self._leak_threads(int(threads), int(faults.param("thread_leak", "max_threads") or 0))

    def dependency_delay(self, faults: InProcessFaults) -> float:
        """``slow_dependency``: how long this request's call to the slow upstream takes."""
        seconds = faults.param("slow_dependency", "seconds")
        return seconds * self._rng.uniform(0.75, 1.25) if seconds else 0.0

    def _grow_memory(self, mib: float, cap_mib: float) -> None:
        with self._lock:
            if sum(len(b) for b in self._memory) + mib * _MIB > cap_mib * _MIB:
                return
            # an anonymous mapping of its own, not a bytearray: malloc serves big blocks
            # from its heap once a process has freed one (its mmap threshold rises), and
            # a heap block freed at stop need not leave RSS; an unmapped one always does
            chunk = mmap.mmap(-1, max(1, int(mib * _MIB)))
            for offset in range(0, len(chunk), mmap.PAGESIZE):
                chunk[offset] = 1  # touch every page so RSS grows
            self._memory.append(chunk)

    def _on_memory_leak(self, on: bool, params: dict[str, float]) -> None:
        if not on:
            with self._lock:
                held, self._memory = self._memory, []
            for chunk in held:
                chunk.close()

    def _target(self) -> GpuLeakTarget | None:
        if self._gpu_source is not None:
            # the app's device, asked each time: it may exist only once the app started
            self._gpu = self._gpu_source()
        elif self._gpu is None:
            self._gpu = default_gpu_target()
        return self._gpu

    def _leak_gpu(self, nbytes: int) -> None:
        try:
            target = self._target()
            if target is not None:
                target.leak(nbytes)
        except Exception as exc:  # the leak filled the device: that is the fault's end state
            log.warning("gpu leak allocation failed: %s", exc)

    def _on_gpu_leak(self, on: bool, params: dict[str, float]) -> None:
        if on:
            self._target()  # resolved at start, so the answer can name the device
            return
        if self._gpu is not None:
            self._gpu.clear_leak()

    def _leak_threads(self, count: int, cap: int) -> None:
        with self._lock:
            self._threads = [t for t in self._threads if t.is_alive()]
            for _ in range(max(0, min(count, cap - len(self._threads)))):
                # the leak: a worker started per request that waits for a signal never
                # sent (bounded by the fault's cap; the revert sends it)
                t = threading.Thread(
                    target=self._release.wait,
                    args=(MAX_DURATION,),
                    name="aivitals-chaos-leaked",
                    daemon=True,
                )
                t.start()
                self._threads.append(t)

    def _on_thread_leak(self, on: bool, params: dict[str, float]) -> None:
        if on:
            self._release.clear()
            return
        self._release.set()
        with self._lock:
            threads, self._threads = self._threads, []
        for t in threads:
            t.join(timeout=1.0)


def _chain(first: FaultHook, second: FaultHook) -> FaultHook:
    def both(on: bool, params: dict[str, float]) -> None:
        first(on, params)
        second(on, params)

    return both


# -- the hook, apart from the server interface ----------------------------------------------
class _Hook:
    """What the ASGI and the WSGI hook share: the checks of ``mount``'s arguments, the
    registry, the gate and the answers, each a (status, JSON body) pair."""

    #: the generic faults this kind of server can have (WSGI has no event loop)
    generic: frozenset[str] = GENERIC

    def __init__(
        self,
        *,
        hooks: Mapping[str, FaultHook] | None,
        path: str,
        paths: Collection[str] | None,
        gpu: Callable[[], GpuLeakTarget | None] | None,
        environ: Mapping[str, str] | None,
    ) -> None:
        if not path.startswith("/") or path == "/":
            raise ConfigError(f"path={path!r}: expected an absolute path below /")
        hooks = dict(hooks or {})
        for name, hook in hooks.items():
            _spec(name)
            if not callable(hook):
                raise ConfigError(f"hooks[{name!r}]: expected a callable(on, params): {hook!r}")
        for p in paths or ():
            if not p.startswith("/"):
                raise ConfigError(f"paths: {p!r} is not an absolute path")
        self.path = path.rstrip("/")
        self._paths = None if paths is None else tuple(paths)
        self._generic = _Generic(gpu)
        on_change = {n: h for n, h in self._generic.hooks().items() if n in self.generic}
        for name, hook in hooks.items():
            on_change[name] = _chain(on_change[name], hook) if name in on_change else hook
        self.hooked = frozenset(hooks)
        self.faults = InProcessFaults(on_change=on_change, supported=self.generic | self.hooked)
        raw = (os.environ if environ is None else environ).get(CHAOS_ENV) or ""
        if raw and len(raw) < MIN_TOKEN_CHARS:
            raise ConfigError(f"{CHAOS_ENV}: expected at least {MIN_TOKEN_CHARS} characters")
        self._token = raw.encode() if raw else None

    @property
    def enabled(self) -> bool:
        return self._token is not None

    def supported(self) -> dict[str, str]:
        """Fault -> how this service runs it (``generic``, ``hook``, or both)."""
        out: dict[str, str] = {}
        for name in sorted(self.faults.supported):
            how = ("generic", name in self.generic), ("hook", name in self.hooked)
            out[name] = "+".join(word for word, yes in how if yes)
        return out

    def listing(self) -> dict[str, Any]:
        return {
            "active": self.faults.listing(),
            "available": {n: IN_PROCESS_FAULTS[n].help for n in sorted(self.faults.supported)},
            "supported": self.supported(),
            "unsupported": {
                n: f"this service does not support fault {n!r} (no hook)"
                for n in sorted(set(IN_PROCESS_FAULTS) - self.faults.supported)
            },
        }

    def _is_hook_path(self, path: str) -> bool:
        return path.rstrip("/") == self.path

    def _affects(self, path: str) -> bool:
        if self._paths is None:
            return True
        return any(path == p or (p.endswith("/") and path.startswith(p)) for p in self._paths)

    def _gate(self, method: str, given: bytes) -> tuple[int, dict[str, Any]] | None:
        """The refusal for this call, or None when it may go on."""
        if self._token is None:
            off = (
                f"the chaos hook is off: set {CHAOS_ENV} (a token of {MIN_TOKEN_CHARS}+ "
                "characters) in the service's environment to turn it on"
            )
            return 403, {"error": off, "env": CHAOS_ENV}
        if not hmac.compare_digest(given, self._token):
            return 403, {"error": "bad or missing X-Aivitals-Token"}
        if method not in ("GET", "POST"):
            return 405, {"error": f"{method} {self.path}: expected GET or POST"}
        return None

    def _act(self, raw: bytes | None) -> tuple[int, dict[str, Any]]:
        """A POST's answer; it runs the hooks, so never on an event loop."""
        if raw is None:
            return 413, {"error": f"body over {_MAX_BODY} bytes"}
        try:
            fault, action, params = _parse(raw)
        except ConfigError as exc:
            return 400, {"error": str(exc)}
        try:
            if action == "start":
                described = self.faults.start(fault, params)
                described.update(self._generic.details(fault))
                log.warning("chaos fault started", extra={"fault": fault})
                return 200, {"started": described}
            stopped = self.faults.stop(fault)
            log.warning("chaos fault stopped", extra={"fault": fault})
            return 200, {"stopped": stopped, "fault": fault}
        except FaultUnsupported as exc:
            return 409, {"error": str(exc), "unsupported": exc.fault}
        except ConfigError as exc:
            return 400, {"error": str(exc)}
        except Exception as exc:  # the app's hook failed: say so, and keep the service up
            log.exception("chaos hook failed", extra={"fault": fault})
            return 500, {"error": f"the hook for {fault!r} failed: {type(exc).__name__}: {exc}"}


class ChaosMount(_Hook):
    """An ASGI ``app`` behind the chaos hook; ``faults`` is the registry (also for tests
    and code that starts a fault without HTTP), ``enabled`` whether the path is on."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        hooks: Mapping[str, FaultHook] | None = None,
        path: str = CHAOS_PATH,
        paths: Collection[str] | None = None,
        gpu: Callable[[], GpuLeakTarget | None] | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(hooks=hooks, path=path, paths=paths, gpu=gpu, environ=environ)
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "lifespan":
            await self.app(scope, receive, self._lifespan_send(send))
            return
        if kind not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        path = str(scope.get("path", ""))
        if self._is_hook_path(path):
            if kind == "websocket":
                await send({"type": "websocket.close", "code": 1008})
            else:
                await self._endpoint(scope, receive, send)
            return
        if kind == "http" and self._affects(path):
            self._generic.before(self.faults, loop=True)
            if delay := self._generic.dependency_delay(self.faults):
                await asyncio.sleep(delay)  # awaited, as a real upstream call is: loop free
        await self.app(scope, receive, send)

    def _lifespan_send(self, send: Send) -> Send:
        async def wrapped(message: Message) -> None:
            if str(message.get("type", "")).startswith("lifespan.shutdown"):
                await asyncio.to_thread(self.faults.stop_all)
            await send(message)

        return wrapped

    async def _endpoint(self, scope: Scope, receive: Receive, send: Send) -> None:
        given = b""
        for key, value in scope.get("headers", ()):
            if key.lower() == b"x-aivitals-token":
                given = bytes(value)
        method = str(scope.get("method", "GET"))
        if (refusal := self._gate(method, given)) is not None:
            await _json(send, *refusal)
        elif method == "GET":
            await _json(send, 200, self.listing())
        else:
            raw = await _read_body(receive)
            await _json(send, *await asyncio.to_thread(self._act, raw))


class ChaosMountWSGI(_Hook):
    """A WSGI ``app`` (Flask, Django, gunicorn) behind the chaos hook.

    There is no event loop to block, so ``event_loop_block`` runs only through a
    hook; ``slow_dependency`` holds the request's worker thread, as a blocking
    client call to a slow upstream does.
    """

    generic = GENERIC - {"event_loop_block"}

    def __init__(
        self,
        app: WSGIApp,
        *,
        hooks: Mapping[str, FaultHook] | None = None,
        path: str = CHAOS_PATH,
        paths: Collection[str] | None = None,
        gpu: Callable[[], GpuLeakTarget | None] | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(hooks=hooks, path=path, paths=paths, gpu=gpu, environ=environ)
        self.app = app

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        path = str(environ.get("PATH_INFO", "")) or "/"
        if self._is_hook_path(path):
            return self._endpoint(environ, start_response)
        if self._affects(path):
            self._generic.before(self.faults, loop=False)
            if delay := self._generic.dependency_delay(self.faults):
                time.sleep(delay)
        return self.app(environ, start_response)

    def _endpoint(self, environ: dict[str, Any], start_response: StartResponse) -> list[bytes]:
        given = str(environ.get("HTTP_X_AIVITALS_TOKEN", "")).encode("latin-1")
        method = str(environ.get("REQUEST_METHOD", "GET"))
        if (refusal := self._gate(method, given)) is not None:
            status, body = refusal
        elif method == "GET":
            status, body = 200, self.listing()
        else:
            status, body = self._act(_read_wsgi_body(environ))
        data = json.dumps(body).encode()
        start_response(
            f"{status} {HTTPStatus(status).phrase}",
            [("Content-Type", "application/json"), ("Content-Length", str(len(data)))],
        )
        return [data]


def _parse(raw: bytes) -> tuple[str, str, dict[str, Any]]:
    """``{"fault": str, "action": "start"|"stop", "params": {...}}`` or ConfigError."""
    try:
        body = json.loads(raw or b"null")
    except ValueError as exc:
        raise ConfigError(f"body is not JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise ConfigError('body: expected {"fault": ..., "action": "start"|"stop", "params": {}}')
    fault, action, params = body.get("fault"), body.get("action"), body.get("params") or {}
    if not isinstance(fault, str):
        raise ConfigError(f"fault={fault!r}: expected a fault name")
    if action not in ("start", "stop"):
        raise ConfigError(f"action={action!r}: expected start or stop")
    if not isinstance(params, dict):
        raise ConfigError(f"params={params!r}: expected an object")
    return fault, action, params


def _read_wsgi_body(environ: dict[str, Any]) -> bytes | None:
    """The request body, or None past ``_MAX_BODY`` (read to Content-Length at most)."""
    try:
        length = int(environ.get("CONTENT_LENGTH") or 0)
    except ValueError:
        length = 0
    if length > _MAX_BODY:
        return None
    stream = environ.get("wsgi.input")
    return bytes(stream.read(length)) if stream is not None and length > 0 else b""


async def _read_body(receive: Receive) -> bytes | None:
    """The request body, or None past ``_MAX_BODY``."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b"".join(chunks)  # the client went away; nothing will be acted on
        chunk = bytes(message.get("body", b""))
        size += len(chunk)
        if size > _MAX_BODY:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


async def _json(send: Send, status: int, body: Mapping[str, Any]) -> None:
    data = json.dumps(body).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})


def mount(
    app: ASGIApp,
    *,
    hooks: Mapping[str, FaultHook] | None = None,
    path: str = CHAOS_PATH,
    paths: Collection[str] | None = None,
    gpu: Callable[[], GpuLeakTarget | None] | None = None,
    environ: Mapping[str, str] | None = None,
) -> ChaosMount:
    """``app`` with the chaos hook at ``path``, off unless ``AIVITALS_CHAOS_TOKEN`` is set.

    ``hooks`` maps a fault to a ``FaultHook`` that does it in the app (required for
    ``worker_pool_stuck``, ``slow_inference``, ``cold_start``, ``no_abort_timeouts``;
    beside the generic effect for the other five). ``paths`` limits the per-request
    faults to those request paths (an entry ending in ``/`` covers every path under
    it; every request but the hook's own unless given). ``gpu`` returns the device
    ``gpu_leak`` allocates on (the default: torch CUDA if loaded, else the sim
    device). ``environ`` is where the variable is read, once (``os.environ``).
    Mount it inside ``aivitals.protect`` and ``aivitals.instrument``, so the faults'
    delays count in the request's latency and deadline like the app's own work.

    **Usage**::

        from aivitals.chaos import mount
        app = mount(app, hooks={"cold_start": drop_models})
        app = aivitals.instrument(aivitals.protect.protect(app))
    """
    return ChaosMount(app, hooks=hooks, path=path, paths=paths, gpu=gpu, environ=environ)


def mount_wsgi(
    app: WSGIApp,
    *,
    hooks: Mapping[str, FaultHook] | None = None,
    path: str = CHAOS_PATH,
    paths: Collection[str] | None = None,
    gpu: Callable[[], GpuLeakTarget | None] | None = None,
    environ: Mapping[str, str] | None = None,
) -> ChaosMountWSGI:
    """``mount`` for a WSGI app: the same gate, protocol and arguments; ``event_loop_block``
    only through a hook (a WSGI worker has no event loop).

    **Usage**::

        from aivitals.chaos import mount_wsgi
        app.wsgi_app = mount_wsgi(app.wsgi_app, hooks={"cold_start": drop_models})
    """
    return ChaosMountWSGI(app, hooks=hooks, path=path, paths=paths, gpu=gpu, environ=environ)
