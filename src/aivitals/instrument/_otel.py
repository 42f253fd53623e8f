"""An OpenTelemetry view: our measurements as GenAI semantic-convention instruments.

For services that export OTLP. The ``otel`` extra (``opentelemetry-api``,
``opentelemetry-sdk``) is imported only when ``enable_otel()`` is called. The
names follow the GenAI semantic conventions, matching the aliases the
collector applies the other way (``signals._aliases``); the model call's own
duration has no GenAI convention and keeps an ``aivitals.`` name.
"""

from __future__ import annotations

from typing import Any

from ..errors import ConfigError
from . import _sinks

__all__ = ["OTEL_NAMES", "OTelView", "enable_otel"]

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


class OTelView:
    """Records every finished model call and request into OpenTelemetry instruments.

    Attributes: ``gen_ai.request.model``, ``gen_ai.operation.name``,
    ``gen_ai.provider.name``, ``aivitals.model_version``, ``error.type`` (our
    error code) on failures; requests carry ``http.request.method``,
    ``http.route``, ``http.response.status_code``.
    """

    def __init__(self, meter: Any, *, operation: str, provider: str) -> None:
        self.operation = operation
        self.provider = provider
        self._instruments: dict[str, Any] = {}
        for ours, (name, unit, _) in OTEL_NAMES.items():
            if name not in self._instruments:
                self._instruments[name] = meter.create_histogram(
                    name, unit=unit, description=f"aivitals {ours}"
                )
        _sinks.INFERENCE_SINKS.append(self._on_call)
        _sinks.REQUEST_SINKS.append(self._on_request)

    def close(self) -> None:
        """Stop mirroring (the instruments stay with their meter provider)."""
        for sinks, fn in (
            (_sinks.INFERENCE_SINKS, self._on_call),
            (_sinks.REQUEST_SINKS, self._on_request),
        ):
            try:
                sinks.remove(fn)
            except ValueError:
                pass

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

    def _on_request(self, info: dict[str, Any]) -> None:
        attrs = {
            "http.request.method": info["method"],
            "http.route": info["route"],
            "http.response.status_code": info["status"],
        }
        self._record("http_request_duration_seconds", info["seconds"], attrs)


def enable_otel(
    meter_provider: Any = None, *, operation: str = "text_completion", provider: str = "aivitals"
) -> OTelView:
    """Mirror aivitals' measurements into OpenTelemetry (GenAI semantic conventions).

    ``meter_provider`` defaults to the global one. Requires the ``otel`` extra.

    **Usage**::

        from opentelemetry.sdk.metrics import MeterProvider
        view = aivitals.instrument.enable_otel(MeterProvider(metric_readers=[reader]))
        ...
        view.close()
    """
    try:
        from opentelemetry import metrics
    except ImportError as exc:
        raise ConfigError("enable_otel needs the otel extra: pip install 'aivitals[otel]'") from exc
    provider_obj = meter_provider if meter_provider is not None else metrics.get_meter_provider()
    meter = provider_obj.get_meter("aivitals")
    return OTelView(meter, operation=operation, provider=provider)
