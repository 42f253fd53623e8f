"""OpenTelemetry: GenAI semantic-convention metrics, a span per request, OTLP export.

For services that export OTLP. The ``otel`` extra (``opentelemetry-api``,
``opentelemetry-sdk``, ``opentelemetry-exporter-otlp-proto-http``) is imported
only when ``enable_otel()`` is called. The names follow the GenAI semantic
conventions, matching the aliases the collector applies the other way
(``signals._aliases``); the model call's own duration has no GenAI convention
and keeps an ``aivitals.`` name.

Histograms carry the conventions' recommended bucket boundaries as the
instrument's advice, since the SDK's default boundaries (0, 5, 10, 25 ... 10000)
were made for milliseconds and put almost every TTFT and TPOT in seconds into
the first bucket.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, MutableMapping, Sequence
from typing import Any
from urllib.parse import urlsplit

from prometheus_client import REGISTRY, CollectorRegistry

from ..errors import ConfigError
from . import _sinks
from ._context import TRACERS
from ._metrics import family

__all__ = ["GENAI_BUCKETS", "OTEL_NAMES", "OTelView", "enable_otel"]

_log = logging.getLogger("aivitals.instrument")

#: our metric -> (OpenTelemetry instrument name, unit, attributes it adds)
OTEL_NAMES: dict[str, tuple[str, str, dict[str, str]]] = {
    "http_request_duration_seconds": ("gen_ai.server.request.duration", "s", {}),
    "model_time_to_first_token_seconds": ("gen_ai.server.time_to_first_token", "s", {}),
    "model_time_per_output_token_seconds": ("gen_ai.server.time_per_output_token", "s", {}),
    "model_input_tokens": ("gen_ai.client.token.usage", "{token}", {"gen_ai.token.type": "input"}),
    "model_output_tokens": (
        "gen_ai.client.token.usage",
        "{token}",
        {"gen_ai.token.type": "output"},
    ),
    "model_inference_time_seconds": ("aivitals.model.inference.duration", "s", {}),
}

# The boundaries the GenAI semantic conventions recommend (ExplicitBucketBoundaries
# in docs/gen-ai/gen-ai-metrics.md of open-telemetry/semantic-conventions).
_OPERATION_DURATION = (
    *(0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48),
    *(40.96, 81.92),
)
_TTFT = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
_TPOT = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
_TOKENS = tuple(float(4**i) for i in range(14))  # 1, 4, 16 ... 67108864

#: instrument name -> explicit bucket boundaries (the model call's own duration,
#: which has no convention, takes the operation duration's)
GENAI_BUCKETS: dict[str, tuple[float, ...]] = {
    "gen_ai.server.request.duration": _OPERATION_DURATION,
    "gen_ai.server.time_to_first_token": _TTFT,
    "gen_ai.server.time_per_output_token": _TPOT,
    "gen_ai.client.token.usage": _TOKENS,
    "aivitals.model.inference.duration": _OPERATION_DURATION,
}

_DROPPED = "aivitals_otel_export_dropped_total"


class OTelView:
    """Records every finished model call and request into OpenTelemetry instruments.

    Attributes: ``gen_ai.request.model``, ``gen_ai.operation.name``,
    ``gen_ai.provider.name``, ``aivitals.model_version``, ``error.type`` (our
    error code) on failures; requests carry ``http.request.method``,
    ``http.route``, ``http.response.status_code``.

    With a tracer, every instrumented request is a server span (the
    middleware opens it) and every model call a child span of it.
    """

    def __init__(
        self,
        meter: Any,
        *,
        operation: str,
        provider: str,
        tracer: Any = None,
        owned: Sequence[Any] = (),
    ) -> None:
        self.operation = operation
        self.provider = provider
        self.tracer = tracer
        #: the meter and tracer providers enable_otel built (flushed and shut at close)
        self.owned = tuple(owned)
        self._instruments: dict[str, Any] = {}
        for ours, (name, unit, _) in OTEL_NAMES.items():
            if name not in self._instruments:
                self._instruments[name] = meter.create_histogram(
                    name,
                    unit=unit,
                    description=f"aivitals {ours}",
                    explicit_bucket_boundaries_advisory=GENAI_BUCKETS[name],
                )
        self._tracing = _Tracing(tracer) if tracer is not None else None
        _sinks.INFERENCE_SINKS.append(self._on_call)
        _sinks.REQUEST_SINKS.append(self._on_request)
        if self._tracing is not None:
            TRACERS.insert(0, self._tracing)

    def force_flush(self, timeout_s: float = 10.0) -> None:
        """Export what is buffered now (spans and metrics), rather than at the next interval."""
        for owned in self.owned:
            owned.force_flush(int(timeout_s * 1000))

    def close(self) -> None:
        """Stop mirroring; providers enable_otel built are flushed and shut down."""
        for sinks, fn in (
            (_sinks.INFERENCE_SINKS, self._on_call),
            (_sinks.REQUEST_SINKS, self._on_request),
            (TRACERS, self._tracing),
        ):
            try:
                sinks.remove(fn)  # type: ignore[arg-type]
            except ValueError:
                pass
        for owned in self.owned:
            owned.shutdown()
        self.owned = ()

    def _record(self, ours: str, value: float | None, attrs: dict[str, Any]) -> None:
        if value is None:
            return
        name, _, extra = OTEL_NAMES[ours]
        self._instruments[name].record(value, {**attrs, **extra})

    def _on_call(self, call: Any) -> None:
        attrs: dict[str, Any] = {
            "gen_ai.request.model": call.model,
            "gen_ai.operation.name": self.operation,
            "gen_ai.provider.name": self.provider,
            "aivitals.model_version": call.version,
        }
        if call.error_code is not None:
            attrs["error.type"] = call.error_code
        self._record("model_inference_time_seconds", call.inference_time, attrs)
        self._record("model_time_to_first_token_seconds", call.ttft, attrs)
        self._record("model_time_per_output_token_seconds", call.time_per_output_token, attrs)
        self._record("model_input_tokens", call.input_token_count, attrs)
        self._record("model_output_tokens", call.output_token_count, attrs)
        if self._tracing is not None:
            self._tracing.model_span(call, attrs)

    def _on_request(self, info: dict[str, Any]) -> None:
        attrs = {
            "http.request.method": info["method"],
            "http.route": info["route"],
            "http.response.status_code": info["status"],
            "gen_ai.operation.name": self.operation,
            "gen_ai.provider.name": self.provider,
        }
        self._record("http_request_duration_seconds", info["seconds"], attrs)


class _Tracing:
    """Server spans for the middleware, child spans for model calls (W3C trace context).

    The middleware calls ``start`` before the app and ``end`` after it, only
    while a view with a tracer is enabled: without one a request pays nothing.
    """

    def __init__(self, tracer: Any) -> None:
        from opentelemetry import context, propagate, trace

        self.tracer = tracer
        self._context = context
        self._propagate = propagate
        self._trace = trace
        self._server = trace.SpanKind.SERVER
        self._internal = trace.SpanKind.INTERNAL
        self._error = trace.StatusCode.ERROR

    def start(self, scope: Mapping[str, Any], ex: Any, method: str, route: str) -> None:
        """Open the request's span (continuing an incoming ``traceparent``) and make it current.

        Never raises: a tracing failure leaves the request untraced, not failed.
        """
        try:
            self._start(scope, ex, method, route)
        except Exception:
            _log.exception("otel_span_start_failed")

    def _start(self, scope: Mapping[str, Any], ex: Any, method: str, route: str) -> None:
        carrier: dict[str, str] = {}
        for name, value in scope["headers"]:
            if name in (b"traceparent", b"tracestate", b"baggage"):
                carrier[name.decode("latin-1")] = value.decode("latin-1")
        parent = self._propagate.extract(carrier) if carrier else None
        attributes: dict[str, Any] = {
            "http.request.method": method,
            "http.route": route,
            "url.path": scope.get("path", ""),
            "url.scheme": scope.get("scheme", "http"),
        }
        client = scope.get("client")
        if client:
            attributes["client.address"] = client[0]
        span = self.tracer.start_span(
            f"{method} {route}", context=parent, kind=self._server, attributes=attributes
        )
        ex.span = span
        ex.otel_token = self._context.attach(self._trace.set_span_in_context(span, parent))
        sc = span.get_span_context()
        if sc.is_valid:
            ex.trace_id = format(sc.trace_id, "032x")
            ex.traceparent = (
                b"traceparent",
                f"00-{ex.trace_id}-{sc.span_id:016x}-{int(sc.trace_flags):02x}".encode("ascii"),
            )

    def end(self, ex: Any, status: int, duration: Any = None, seconds: float = 0.0) -> None:
        """Close the request's span with its status, and restore the context.

        ``duration``: the request's ``http_request_duration_seconds`` child; a
        lean one (single-process mode) keeps ``seconds`` as its bucket's
        exemplar, so an OpenMetrics scrape links the latency bucket to this trace.
        """
        span = ex.span
        if span is None:
            return
        mark = getattr(duration, "exemplar", None)
        if mark is not None and ex.trace_id is not None:
            mark(seconds, {"trace_id": ex.trace_id})
        try:
            span.set_attribute("http.response.status_code", status)
            if ex.error_code:
                span.set_attribute("aivitals.error_code", ex.error_code)
            if status >= 500:
                span.set_attribute("error.type", str(status))
                span.set_status(self._error)
            span.end()
        except Exception:
            _log.exception("otel_span_end_failed")
        finally:
            if ex.otel_token is not None:
                self._context.detach(ex.otel_token)

    def model_span(self, call: Any, attrs: Mapping[str, Any]) -> None:
        """A child span of the current request for a model call that just ended.

        The sink runs when the call ends, so the span is written after the
        fact: it starts ``inference_time`` before now and ends now.
        """
        import time

        end = time.time_ns()
        seconds = call.inference_time or 0.0
        attributes = dict(attrs)
        if call.input_token_count is not None:
            attributes["gen_ai.usage.input_tokens"] = call.input_token_count
        if call.output_token_count is not None:
            attributes["gen_ai.usage.output_tokens"] = call.output_token_count
        if call.ttft is not None:
            attributes["aivitals.time_to_first_token_s"] = call.ttft
        span = self.tracer.start_span(
            f"{attrs['gen_ai.operation.name']} {attrs['gen_ai.request.model']}",
            kind=self._internal,
            attributes=attributes,
            start_time=end - int(seconds * 1e9),
        )
        if call.error_code is not None:
            span.set_status(self._error, call.error_code)
        span.end(end_time=end)


class _CountingExporter:
    """Wraps an OTLP exporter: what it fails to deliver is counted, never raised.

    The SDK's batch processor and periodic reader call ``export`` from their
    own thread, so a collector that is down costs requests nothing; this
    makes the loss visible in ``aivitals_otel_export_dropped_total{signal}``.
    """

    def __init__(self, inner: Any, signal: str, counter: Any) -> None:
        self._inner = inner
        self._signal = signal
        self._dropped = counter.labels(signal)

    def __getattr__(self, name: str) -> Any:
        # the metric reader reads the exporter's preferred temporality and aggregation
        return getattr(self._inner, name)

    def export(self, batch: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            result = self._inner.export(batch, *args, **kwargs)
        except Exception:
            _log.warning("otlp_export_failed", extra={"signal": self._signal}, exc_info=True)
            result = None
        if result is None or getattr(result, "name", "") != "SUCCESS":
            self._dropped.inc(_items(batch, self._signal))
        return result if result is not None else _failure(self._signal)

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return bool(self._inner.force_flush(timeout_millis))

    def shutdown(self, *args: Any, **kwargs: Any) -> None:
        self._inner.shutdown(*args, **kwargs)


def _items(batch: Any, signal: str) -> int:
    """Spans in a span batch; data points in a metrics export."""
    if signal == "traces":
        return len(batch)
    return sum(
        len(metric.data.data_points)
        for resource in batch.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
    )


def _failure(signal: str) -> Any:
    if signal == "traces":
        from opentelemetry.sdk.trace.export import SpanExportResult

        return SpanExportResult.FAILURE
    from opentelemetry.sdk.metrics.export import MetricExportResult

    return MetricExportResult.FAILURE


def _base_url(endpoint: str) -> str:
    parts = urlsplit(endpoint)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(
            f"otlp endpoint must be an http(s) URL such as http://collector:4318, got {endpoint!r}"
        )
    try:
        parts.port  # noqa: B018 -- raises on a port that is not a number
    except ValueError as exc:
        raise ConfigError(f"otlp endpoint has a bad port: {endpoint!r}") from exc
    return endpoint.rstrip("/")


def _positive_seconds(key: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 3600:
        raise ConfigError(f"{key} must be seconds in (0, 3600], got {value!r}")
    return float(value)


def _otlp_providers(
    endpoint: str,
    *,
    headers: Mapping[str, str] | None,
    service_name: str | None,
    export_interval_s: float,
    export_timeout_s: float,
    traces: bool,
    registry: CollectorRegistry | None,
) -> tuple[Any, Any]:
    """A MeterProvider and a TracerProvider exporting OTLP/HTTP (protobuf) to ``endpoint``."""
    try:
        # the ignores: the exporter is an optional extra, absent where mypy may run
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import (  # type: ignore[import-not-found,unused-ignore]
            OTLPMetricExporter,
        )
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # type: ignore[import-not-found,unused-ignore]
            OTLPSpanExporter,
        )
    except ImportError as exc:
        raise ConfigError(
            "OTLP export needs the otel extra (opentelemetry-exporter-otlp-proto-http): "
            "pip install 'aivitals[otel]'"
        ) from exc
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    base = _base_url(endpoint)
    counter = family(_DROPPED, registry)
    resource = Resource.create({"service.name": service_name} if service_name else {})
    metric_exporter = OTLPMetricExporter(
        endpoint=f"{base}/v1/metrics", headers=dict(headers or {}), timeout=export_timeout_s
    )
    reader = PeriodicExportingMetricReader(
        _CountingExporter(metric_exporter, "metrics", counter),  # type: ignore[arg-type]
        export_interval_millis=export_interval_s * 1000,
        export_timeout_millis=export_timeout_s * 1000,
    )
    meters = MeterProvider(metric_readers=[reader], resource=resource)
    tracers = None
    if traces:
        tracers = TracerProvider(resource=resource)
        span_exporter = OTLPSpanExporter(
            endpoint=f"{base}/v1/traces", headers=dict(headers or {}), timeout=export_timeout_s
        )
        tracers.add_span_processor(
            BatchSpanProcessor(
                _CountingExporter(span_exporter, "traces", counter),  # type: ignore[arg-type]
                export_timeout_millis=export_timeout_s * 1000,
            )
        )
    return meters, tracers


def enable_otel(
    meter_provider: Any = None,
    *,
    tracer_provider: Any = None,
    endpoint: str | None = None,
    headers: Mapping[str, str] | None = None,
    service_name: str | None = None,
    traces: bool = True,
    export_interval_s: float = 15.0,
    export_timeout_s: float = 10.0,
    operation: str = "text_completion",
    provider: str = "aivitals",
    registry: CollectorRegistry | None = REGISTRY,
    environ: MutableMapping[str, str] | None = None,
) -> OTelView:
    """Export aivitals' measurements and a span per request with OpenTelemetry.

    ``endpoint`` (or ``OTEL_EXPORTER_OTLP_ENDPOINT`` when no provider is
    passed): an OTLP/HTTP collector such as ``http://collector:4318``; aivitals
    then builds its own meter and tracer providers exporting protobuf to
    ``/v1/metrics`` and ``/v1/traces`` in the background (batched: a collector
    that is down delays no request, and what is lost is counted in
    ``aivitals_otel_export_dropped_total{signal}``). Without an endpoint,
    ``meter_provider`` and ``tracer_provider`` default to the global ones.
    ``traces=False`` records metrics only. Requires the ``otel`` extra.

    **Usage**::

        view = aivitals.instrument.enable_otel(endpoint="http://collector:4318")
        app = aivitals.instrument(app)   # requests are spans; traceparent honoured
        ...
        view.close()                     # flushes and shuts the exporters
    """
    try:
        from opentelemetry import metrics, trace
    except ImportError as exc:
        raise ConfigError("enable_otel needs the otel extra: pip install 'aivitals[otel]'") from exc
    env = os.environ if environ is None else environ
    interval = _positive_seconds("export_interval_s", export_interval_s)
    timeout = _positive_seconds("export_timeout_s", export_timeout_s)
    if endpoint is None and meter_provider is None and tracer_provider is None:
        endpoint = env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or None
    owned: list[Any] = []
    if endpoint is not None:
        if meter_provider is not None or tracer_provider is not None:
            raise ConfigError("enable_otel: pass endpoint= or providers, not both")
        meter_provider, tracer_provider = _otlp_providers(
            endpoint,
            headers=headers,
            service_name=service_name,
            export_interval_s=interval,
            export_timeout_s=timeout,
            traces=traces,
            registry=registry,
        )
        owned = [p for p in (tracer_provider, meter_provider) if p is not None]
    meters = meter_provider if meter_provider is not None else metrics.get_meter_provider()
    tracer = None
    if traces:
        tracers = tracer_provider if tracer_provider is not None else trace.get_tracer_provider()
        # the global provider before anyone set one: spans would be no-ops at a cost per request
        if not isinstance(tracers, trace.ProxyTracerProvider | trace.NoOpTracerProvider):
            tracer = tracers.get_tracer("aivitals")
    return OTelView(
        meters.get_meter("aivitals"),
        operation=operation,
        provider=provider,
        tracer=tracer,
        owned=owned,
    )
