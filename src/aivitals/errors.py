"""The one exception hierarchy of aivitals.

Every error a user can cause or meet is an ``AivitalsError``; the CLI catches it
at the top and prints ``Type: message`` with exit code 1. Third-party errors are
mapped onto this tree at the boundary (``raise X from exc``) so callers never
have to know which library sat underneath.

::

    AivitalsError
    ├── ConfigError                 a setting, argument or header value is invalid
│   └── WebConfigError          the agent's --web-config (TLS, basic auth) does not load
    ├── ParseError                  text that should follow a format does not
    │   ├── ExpositionError         Prometheus text / OpenMetrics exposition
    │   └── QueryError              PromQL that does not parse or cannot be evaluated
    │       └── UnsupportedQueryError   valid PromQL that aivitals does not evaluate
    ├── StoreError                  the embedded time-series store refused something
    │   ├── SampleRejected          out-of-order, duplicate or non-finite sample
    │   └── CardinalityLimitError   a new series would pass the series limit
    ├── BackendError                a remote Prometheus / VictoriaMetrics failed
    │   ├── BackendTimeout
    │   └── BackendAuthError        credentials refused (401, 403) or the TLS handshake failed
    ├── CollectorError              a signal source failed (collectors report it, never raise it)
    ├── RuleError                   an alert or recording rule is invalid
    ├── SignatureError              a diagnosis signature is invalid
    ├── NotifyError                 a webhook or Alertmanager could not be reached
    ├── FaultError                  a fault could not be started or reverted
    │   ├── FaultRefused            a fault or load that would leave this machine, or too long
    │   └── FaultUnsupported        the service's chaos hook has no way to run this fault
    ├── AlreadyRunning              a second exclusive run (validate, demo) was started
    └── ServiceError                the demo service or a component it starts failed
"""

from __future__ import annotations

__all__ = [
    "AivitalsError",
    "AlreadyRunning",
    "BackendAuthError",
    "BackendError",
    "BackendTimeout",
    "CardinalityLimitError",
    "CollectorError",
    "ConfigError",
    "ExpositionError",
    "FaultError",
    "FaultRefused",
    "FaultUnsupported",
    "NotifyError",
    "ParseError",
    "QueryError",
    "RuleError",
    "SampleRejected",
    "ServiceError",
    "SignatureError",
    "StoreError",
    "UnsupportedQueryError",
    "WebConfigError",
]


class AivitalsError(Exception):
    """Base of every error aivitals raises on purpose."""


class ConfigError(AivitalsError):
    """A setting, argument or header value is invalid; the message names it."""


class WebConfigError(ConfigError):
    """The agent's web-config file (TLS, basic auth) is missing, unreadable, not valid YAML,
    asks for what the agent does not implement, or names a certificate or key that does
    not load; the message names the file and the key."""


class ParseError(AivitalsError):
    """Text that should follow a known format does not."""


class ExpositionError(ParseError):
    """Prometheus text or OpenMetrics exposition that cannot be parsed."""


class QueryError(ParseError):
    """PromQL that does not parse, or cannot be evaluated on the data."""

    def __init__(self, message: str, *, expr: str | None = None) -> None:
        self.expr = expr
        super().__init__(f"{message} (in {expr!r})" if expr else message)


class UnsupportedQueryError(QueryError):
    """Valid PromQL naming a construct the embedded store does not evaluate.

    Raised instead of returning an answer that could be wrong.
    """

    def __init__(self, construct: str, *, expr: str | None = None) -> None:
        self.construct = construct
        super().__init__(f"unsupported PromQL construct: {construct}", expr=expr)


class StoreError(AivitalsError):
    """The embedded time-series store refused an operation."""


class SampleRejected(StoreError):
    """A sample was refused (out of order, duplicate, not finite where required)."""

    def __init__(self, reason: str, series: str, timestamp_ms: int) -> None:
        self.reason = reason
        self.series = series
        self.timestamp_ms = timestamp_ms
        super().__init__(f"sample rejected ({reason}): {series} @ {timestamp_ms}")


class CardinalityLimitError(StoreError):
    """Creating a new series would pass the configured series limit."""

    def __init__(self, metric: str, limit: int) -> None:
        self.metric = metric
        self.limit = limit
        super().__init__(f"series limit {limit} reached; new series of {metric!r} refused")


class BackendError(AivitalsError):
    """A remote query backend (Prometheus, VictoriaMetrics) answered with an error."""


class BackendTimeout(BackendError):
    """A remote query backend did not answer in time."""


class BackendAuthError(BackendError):
    """A remote backend refused the credentials (401, 403), the TLS handshake with it
    failed, or a secret file could not be read mid-run. Never retried: every other
    request would meet the same; the message names the URL or peer and the file."""


class CollectorError(AivitalsError):
    """A signal source failed. Collectors turn this into ``aivitals_collector_up 0``."""


class RuleError(AivitalsError):
    """An alert or recording rule is invalid; the message names the rule."""

    def __init__(self, rule: str, problem: str) -> None:
        self.rule = rule
        self.problem = problem
        super().__init__(f"rule {rule!r}: {problem}")


class SignatureError(AivitalsError):
    """A diagnosis signature is invalid; the message names its id."""

    def __init__(self, signature: str, problem: str) -> None:
        self.signature = signature
        self.problem = problem
        super().__init__(f"signature {signature!r}: {problem}")


class NotifyError(AivitalsError):
    """A notification target (webhook, Alertmanager) could not be reached."""


class FaultError(AivitalsError):
    """A fault could not be started or reverted."""


class FaultRefused(FaultError):
    """A fault or load refused before it started (target off this machine, bad duration)."""


class FaultUnsupported(FaultError):
    """The service's chaos hook (``aivitals.chaos.mount``) cannot run this fault: the
    mount has no generic implementation of it and the service passed no hook for it."""

    def __init__(self, fault: str, message: str | None = None) -> None:
        self.fault = fault
        super().__init__(
            message
            or f"this service does not support fault {fault!r} (no hook): the app passes "
            f"none to aivitals.chaos.mount(app, hooks={{{fault!r}: ...}})"
        )


class AlreadyRunning(AivitalsError):
    """An exclusive run (``validate``, ``demo``) is already in progress."""


class ServiceError(AivitalsError):
    """The demo service, or a component it starts (Redis, uvicorn), failed."""
