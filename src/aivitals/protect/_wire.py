"""``protect(app, ...)``: every protection in the right order, in one line.

From the outside in::

    HealthMiddleware           /healthz, /readyz, /health/queue answered here, never queued
    AdmissionMiddleware(pre)   bad headers -> 400; queue full / deadline unmeetable -> 429,
                               before a byte of the body is read
    InputGuard                 size (while streaming), body read timeout, UTF-8, control
                               characters, JSON, full-width, tokens
    AdmissionMiddleware        memory reservation (from the guard's token count), queue,
                               concurrency slot held while the handler runs
    DeadlineMiddleware         deadline / client disconnect -> abort hooks, cancel, 504
    app

A client stalling mid-body is cut off by the guard and never held a slot.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry

from aivitals.errors import ConfigError
from aivitals.instrument import AivitalsMiddleware

from ._admission import AdmissionConfig, AdmissionController
from ._asgi import ASGIApp, Receive, Scope, Send
from ._deadline import DeadlineMiddleware
from ._guard import GuardConfig, InputGuard
from ._health import Health, HealthConfig, HealthMiddleware
from ._middleware import AdmissionMiddleware

__all__ = ["Protected", "protect"]


class Protected:
    """The wrapped ASGI app, with handles on its parts (``controller``, ``health``)."""

    def __init__(
        self, app: ASGIApp, *, controller: AdmissionController | None, health: Health | None
    ) -> None:
        self.app = app
        self.controller = controller
        self.health = health

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app(scope, receive, send)


def protect(
    app: ASGIApp,
    *,
    guard: GuardConfig | None = None,
    guard_routes: Mapping[str, GuardConfig | None] | None = None,
    admission: AdmissionConfig | None = None,
    health: HealthConfig | None = None,
    registry: CollectorRegistry | None = REGISTRY,
) -> Protected:
    """Wrap ``app`` with the input guard, admission control, deadlines and health checks.

    Each part is on with its default config when its argument is omitted;
    health paths are never guarded or queued. Instrument the result, not ``app``
    (``aivitals.instrument(protect(app))``): an app instrumented already is refused
    with ``ConfigError``, since protection outside the instrumentation would leave
    its refusals uncounted and put ``/metrics`` behind admission control.

    **Usage**::

        from aivitals.protect import AdmissionConfig, GuardConfig, HealthConfig, protect

        app = protect(
            app,
            guard=GuardConfig(max_body_bytes=100_000, fullwidth="normalize"),
            admission=AdmissionConfig(queue_size=32, default_timeout=10.0),
            health=HealthConfig(probe=run_tiny_inference),
        )
    """
    if _instrumented(app):
        raise ConfigError(
            "protect(app): app is instrumented already, so protection would sit outside "
            "the instrumentation (429s uncounted, /metrics queued and refused under load); "
            "instrument the protected app instead: aivitals.instrument(protect(app, ...))"
        )
    admission = admission if admission is not None else AdmissionConfig()
    controller = AdmissionController(admission, registry=registry)
    inner: ASGIApp = DeadlineMiddleware(
        app,
        default_timeout=admission.default_timeout,
        max_timeout=admission.max_timeout,
        timeout_header=admission.timeout_header,
        registry=registry,
    )
    inner = AdmissionMiddleware(inner, controller)
    inner = InputGuard(inner, config=guard, routes=guard_routes, registry=registry)
    inner = AdmissionMiddleware(inner, controller, precheck_only=True)
    checks = Health(health, controller=controller, registry=registry)
    inner = HealthMiddleware(inner, checks)
    return Protected(inner, controller=controller, health=checks)


def _instrumented(app: Any) -> bool:
    """Whether aivitals' instrumentation middleware already wraps ``app`` (or is in its stack)."""
    if isinstance(app, AivitalsMiddleware):
        return True
    stack = getattr(app, "user_middleware", None)  # Starlette/FastAPI: added, not yet built
    return isinstance(stack, list) and any(
        getattr(entry, "cls", None) is AivitalsMiddleware for entry in stack
    )
