"""Structured JSON logs through the standard logging module, written off the event loop.

``configure_logging(path)`` puts a bounded queue between every ``aivitals.*``
logger and the file: the caller's thread only captures the request context
and enqueues the record (a few microseconds); a background thread formats the
JSON line and writes it. A full queue drops the record and counts it in
``aivitals_log_records_dropped_total`` rather than stall the event loop.

Every line carries ``request_id``, ``model_version``, ``input_token_count``,
``gpu_device_id`` and ``error_code`` (null when unknown) and any ``extra=``
fields; prompt text is redacted unless ``log_prompts=True``.
"""

from __future__ import annotations

import atexit
import datetime as _dt
import json
import logging
import logging.handlers
import os
import queue
import threading
from collections.abc import Iterable, Mapping
from typing import IO, Any

from prometheus_client import REGISTRY, CollectorRegistry

from .. import signals
from ..errors import ConfigError
from ._context import REQUEST_ID, REQUEST_STATE
from ._metrics import family

__all__ = [
    "CONTEXT_FIELDS",
    "PROMPT_FIELDS",
    "JsonFormatter",
    "LogWriter",
    "configure_logging",
    "log_event",
]

#: The fields every JSON line carries, null when unknown.
CONTEXT_FIELDS = ("request_id", "model_version", "input_token_count", "gpu_device_id", "error_code")
#: ``extra=`` keys holding user text, redacted unless ``log_prompts=True``.
PROMPT_FIELDS = frozenset(
    {"prompt", "prompts", "input_text", "text", "messages", "completion", "output_text"}
)
_CAPTURED = "_aivitals_ctx"
_STANDARD = frozenset(logging.LogRecord("n", logging.INFO, "p", 0, "m", None, None).__dict__) | {
    "message",
    "asctime",
    "taskName",
    _CAPTURED,
}

LIFECYCLE = logging.getLogger("aivitals.instrument")


def log_event(event: str, fields: Mapping[str, Any], logger: logging.Logger = LIFECYCLE) -> None:
    """Emit one lifecycle event (``received``, ``enqueued``, ...) as an INFO record.

    Builds the record directly (no caller lookup): this runs once or twice per
    request on the event loop, and ``logger.info`` would walk the stack.
    """
    if not logger.isEnabledFor(logging.INFO):
        return
    record = logger.makeRecord(logger.name, logging.INFO, "", 0, event, (), None, None, fields)
    logger.handle(record)


def _capture(record: logging.LogRecord) -> None:
    """Copy the request context onto the record in the emitting thread."""
    if hasattr(record, _CAPTURED):
        return
    state = REQUEST_STATE.get()
    if state is None:
        ctx: tuple[Any, ...] = (REQUEST_ID.get(), None, None, None, None)
    else:
        ctx = (
            REQUEST_ID.get() or state.request_id,
            state.model_version,
            state.input_token_count,
            state.gpu_device_id,
            state.error_code,
        )
    setattr(record, _CAPTURED, ctx)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, event, the five context fields, extras.

    **Usage**::

        handler = logging.StreamHandler()
        handler.setFormatter(JsonFormatter())
        logging.getLogger("aivitals").addHandler(handler)
    """

    def __init__(self, *, log_prompts: bool = False, static: Mapping[str, Any] | None = None):
        super().__init__()
        self.log_prompts = log_prompts
        self.static = dict(static or {})

    def format(self, record: logging.LogRecord) -> str:
        _capture(record)
        out: dict[str, Any] = {
            "ts": _timestamp(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": record.getMessage(),
        }
        out.update(zip(CONTEXT_FIELDS, getattr(record, _CAPTURED), strict=True))
        out.update(self.static)
        for key, value in record.__dict__.items():
            if key not in _STANDARD:
                out[key] = self._value(key, value)
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            out["exc_type"] = type(exc).__name__
            out["traceback"] = self.formatException(record.exc_info)
            if out.get("error_code") is None:
                out["error_code"] = str(signals.classify_exception(exc))
        return json.dumps(out, default=str, ensure_ascii=False)

    def _value(self, key: str, value: Any) -> Any:
        if key in PROMPT_FIELDS and not self.log_prompts and value is not None:
            return f"<redacted {len(str(value))} chars>"
        return value


def _timestamp(created: float) -> str:
    moment = _dt.datetime.fromtimestamp(created, tz=_dt.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


class _DroppingQueueHandler(logging.handlers.QueueHandler):
    """Enqueue without blocking; a full queue drops the record and counts it."""

    def __init__(self, q: queue.Queue[Any], dropped: Any) -> None:
        super().__init__(q)
        self._dropped_metric = dropped
        self.dropped = 0

    def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        # Formatting happens in the writer thread; here only the context is captured.
        _capture(record)
        return record

    def enqueue(self, record: logging.LogRecord) -> None:
        try:
            self.queue.put_nowait(record)
        except queue.Full:
            self.dropped += 1
            self._dropped_metric.inc()


class _Listener(logging.handlers.QueueListener):
    def enqueue_sentinel(self) -> None:
        # the stock one uses put_nowait, which fails on a full bounded queue
        self.queue.put(self._sentinel, timeout=30)  # type: ignore[attr-defined]


class LogWriter:
    """The running background writer returned by ``configure_logging``; ``stop()`` drains it."""

    def __init__(
        self,
        handler: logging.Handler,
        queue_handler: _DroppingQueueHandler,
        listener: _Listener,
        loggers: list[tuple[logging.Logger, int, bool]],
    ) -> None:
        self.handler = handler
        self._queue_handler = queue_handler
        self._listener = listener
        self._loggers = loggers
        self._stopped = False
        self._lock = threading.Lock()

    @property
    def dropped(self) -> int:
        """Records dropped because the queue was full."""
        return self._queue_handler.dropped

    def stop(self) -> None:
        """Detach from the loggers, write out everything queued, close the file. Idempotent."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
        atexit.unregister(self.stop)
        for logger, level, propagate in self._loggers:
            logger.removeHandler(self._queue_handler)
            logger.setLevel(level)
            logger.propagate = propagate
        self._listener.stop()
        self.handler.flush()
        self.handler.close()

    def __enter__(self) -> LogWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def configure_logging(
    target: str | os.PathLike[str] | IO[str] | logging.Handler,
    *,
    level: int | str = logging.INFO,
    loggers: Iterable[str] = ("aivitals",),
    queue_size: int = 10_000,
    log_prompts: bool = False,
    static_fields: Mapping[str, Any] | None = None,
    propagate: bool = False,
    registry: CollectorRegistry | None = REGISTRY,
) -> LogWriter:
    """Write JSON lines from the ``aivitals`` loggers (and ``loggers``) to ``target``.

    ``target`` is a file path (appended), a text stream, or a ``logging.Handler``.

    **Usage**::

        writer = aivitals.instrument.configure_logging("/var/log/svc.jsonl")
        logging.getLogger("aivitals.protect").info("shed", extra={"reason": "queue_full"})
        writer.stop()   # at shutdown; also registered with atexit
    """
    if isinstance(queue_size, bool) or not isinstance(queue_size, int) or queue_size < 1:
        raise ConfigError(f"queue_size must be a positive int, got {queue_size!r}")
    numeric = logging.getLevelName(level.upper()) if isinstance(level, str) else level
    if not isinstance(numeric, int):
        raise ConfigError(f"level must be a logging level, got {level!r}")
    handler = _handler_for(target)
    handler.setFormatter(JsonFormatter(log_prompts=log_prompts, static=static_fields))
    q: queue.Queue[Any] = queue.Queue(maxsize=queue_size)
    queue_handler = _DroppingQueueHandler(q, family("aivitals_log_records_dropped_total", registry))
    listener = _Listener(q, handler)
    attached = []
    for name in loggers:
        logger = logging.getLogger(name)
        attached.append((logger, logger.level, logger.propagate))
        logger.addHandler(queue_handler)
        logger.setLevel(numeric)
        logger.propagate = propagate
    listener.start()
    writer = LogWriter(handler, queue_handler, listener, attached)
    atexit.register(writer.stop)
    return writer


def _handler_for(target: Any) -> logging.Handler:
    if isinstance(target, logging.Handler):
        return target
    if isinstance(target, str | os.PathLike):
        try:
            return logging.FileHandler(os.fspath(target), encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"log target {os.fspath(target)!r} cannot be opened: {exc}") from exc
    if hasattr(target, "write"):
        return logging.StreamHandler(target)
    raise ConfigError(f"log target must be a path, a text stream or a Handler, got {target!r}")
