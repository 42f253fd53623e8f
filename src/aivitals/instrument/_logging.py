"""Structured JSON logs through the standard logging module, written off the event loop.

``configure_logging(path)`` puts a bounded buffer between every ``aivitals.*``
logger and the file: the caller's thread only captures the request context
and appends the record (a few microseconds); a background thread wakes every
few milliseconds, formats the JSON lines of everything buffered and writes
them in one call. A full buffer drops the record and counts it in
``aivitals_log_records_dropped_total`` rather than stall the event loop.

Every line carries ``request_id``, ``model_version``, ``input_token_count``,
``gpu_device_id`` and ``error_code`` (null when unknown) and any ``extra=``
fields; prompt text is redacted unless ``log_prompts=True``.
"""

from __future__ import annotations

import atexit
import collections
import json
import json.encoder
import logging
import logging.handlers
import math
import os
import threading
import time
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
    "RequestLines",
    "configure_logging",
    "fast_lane",
    "log_event",
]

#: The fields every JSON line carries, null when unknown.
CONTEXT_FIELDS = ("request_id", "model_version", "input_token_count", "gpu_device_id", "error_code")
#: ``extra=`` keys holding user text, redacted unless ``log_prompts=True``.
PROMPT_FIELDS = frozenset(
    {"prompt", "prompts", "input_text", "text", "messages", "completion", "output_text"}
)
_CAPTURED = "_aivitals_ctx"
_FIELDS = "_aivitals_fields"
_STANDARD = frozenset(logging.LogRecord("n", logging.INFO, "p", 0, "m", None, None).__dict__) | {
    "message",
    "asctime",
    "taskName",
    _CAPTURED,
    _FIELDS,
}

LIFECYCLE = logging.getLogger("aivitals.instrument")
_ENCODER = json.JSONEncoder(default=str, ensure_ascii=False)
_START = time.time()


def _record(logger: logging.Logger, event: str, fields: Mapping[str, Any]) -> logging.LogRecord:
    """A LogRecord built without ``LogRecord.__init__``'s process/thread-name lookups.

    It is a real LogRecord (any handler can take it); the event's fields ride
    in one attribute so the formatter need not scan the record's dict.
    """
    record = logging.LogRecord.__new__(logging.LogRecord)
    now = time.time()
    record.__dict__.update(
        name=logger.name,
        msg=event,
        args=(),
        levelname="INFO",
        levelno=logging.INFO,
        pathname="",
        filename="",
        module="",
        exc_info=None,
        exc_text=None,
        stack_info=None,
        lineno=0,
        funcName=None,
        created=now,
        msecs=(now - int(now)) * 1000.0,
        relativeCreated=(now - _START) * 1000.0,
        thread=threading.get_ident(),
        threadName=None,
        processName=None,
        process=None,
        **{_FIELDS: fields},
    )
    return record


def log_event(event: str, fields: Mapping[str, Any], logger: logging.Logger = LIFECYCLE) -> None:
    """Emit one lifecycle event (``received``, ``enqueued``, ...) as an INFO record.

    Builds the record directly (no caller lookup, no thread-name lookup): this
    runs on the event loop for every request. The fields appear in the JSON
    line as if passed with ``extra=``; the line may be rendered later by the
    writer, so do not change ``fields`` after the call.

    **Usage**::

        log_event("enqueued", {"queue": "generate", "queue_length": 3})
    """
    if not logger.isEnabledFor(logging.INFO):
        return
    lane = fast_lane(logger)
    if lane is not None:
        lane.emit_line(logger.name, event, fields)
    else:
        logger.handle(_record(logger, event, fields))


def fast_lane(logger: logging.Logger) -> _DroppingQueueHandler | None:
    """Our queue handler, when it is the only one the record would reach and nothing filters.

    Then the JSON line can be made at once, without a LogRecord: the same line,
    at half the cost. Any other handler or filter on the way gets the record.
    """
    found = None
    current: logging.Logger | None = logger
    while current is not None:
        if current.filters:
            return None
        for handler in current.handlers:
            if found is not None or not isinstance(handler, _DroppingQueueHandler):
                return None
            found = handler
        if not current.propagate:
            break
        current = current.parent
    if found is None or found.filters or found.level > logging.INFO or not found.lines_ok:
        return None
    return found


def _capture(record: logging.LogRecord) -> None:
    """Copy the request context onto the record in the emitting thread."""
    if _CAPTURED in record.__dict__:
        return
    record.__dict__[_CAPTURED] = _context()


def _context() -> tuple[Any, ...]:
    state = REQUEST_STATE.get()
    if state is None:
        return (REQUEST_ID.get(), None, None, None, None)
    return (
        state.request_id or REQUEST_ID.get(),
        state.model_version,
        state.input_token_count,
        state.gpu_device_id,
        state.error_code,
    )


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
        self._second = -1
        self._prefix = ""
        self._templates: dict[tuple[str, ...], tuple[str, str]] = {}

    def line(
        self,
        name: str,
        event: str,
        ctx: tuple[Any, ...],
        fields: Mapping[str, Any],
        created: float | None = None,
    ) -> str:
        """The JSON line of an INFO event, built without a LogRecord (``log_event``'s lane).

        The same object ``format`` writes. The common case (no static fields,
        nothing to redact) fills a cached %-template with the values rendered
        one by one, which costs about half of ``json.dumps`` of the whole dict;
        a second template has the four model fields as literal nulls, since
        outside a model call they are.
        """
        if self.static:
            return self._line_via_dict(name, event, ctx, fields, created)
        key = (name, event, *fields)
        pair = self._templates.get(key)
        if pair is None:
            pair = self._template(key)
        template, nulls = pair
        if not template:  # a prompt field to redact or a field overriding a fixed key
            return self._line_via_dict(name, event, ctx, fields, created)
        rid = ctx[0]
        values = [
            self._timestamp(created or time.time()),
            _encode_str(rid) if type(rid) is str else _scalar(rid),
        ]
        if ctx[1:] == _NULLS:
            template = nulls
        else:
            values += [_scalar(v) for v in ctx[1:]]
        for value in fields.values():
            # _scalar(), inlined for the common kinds
            kind = type(value)
            if kind is str:
                values.append(_encode_str(value))
            elif kind is int:
                values.append(int.__repr__(value))
            elif kind is float and math.isfinite(value):
                values.append(float.__repr__(value))
            else:
                values.append(_scalar(value))
        return template % tuple(values)

    def _template(self, key: tuple[str, ...]) -> tuple[str, str]:
        name, event, *names = key
        pair = ("", "")
        if len(self._templates) >= 1000:
            return pair  # not kept: more distinct field sets than templates are worth
        if all(isinstance(k, str) and k not in _RESERVED for k in names):
            head = f'{{"ts": "%s", "level": "info", "logger": {_quoted(name)}, '
            head += f'"event": {_quoted(event)}, "request_id": %s'
            tail = "".join(f", {_quoted(k)}: %s" for k in names) + "}"
            model = "".join(f', "{k}": %s' for k in CONTEXT_FIELDS[1:])
            nulls = "".join(f', "{k}": null' for k in CONTEXT_FIELDS[1:])
            pair = (head + model + tail, head + nulls + tail)
        self._templates[key] = pair
        return pair

    def _line_via_dict(
        self,
        name: str,
        event: str,
        ctx: tuple[Any, ...],
        fields: Mapping[str, Any],
        created: float | None,
    ) -> str:
        out: dict[str, Any] = {
            "ts": self._timestamp(created or time.time()),
            "level": "info",
            "logger": name,
            "event": event,
        }
        out.update(zip(CONTEXT_FIELDS, ctx, strict=True))
        out.update(self.static)
        for key, value in fields.items():
            out[key] = self._value(key, value)
        return _ENCODER.encode(out)

    def format(self, record: logging.LogRecord) -> str:
        _capture(record)
        out: dict[str, Any] = {
            "ts": self._timestamp(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": record.getMessage(),
        }
        out.update(zip(CONTEXT_FIELDS, record.__dict__[_CAPTURED], strict=True))
        out.update(self.static)
        fields = record.__dict__.get(_FIELDS)
        items = fields.items() if fields is not None else record.__dict__.items()
        for key, value in items:
            if key not in _STANDARD:
                out[key] = self._value(key, value)
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            out["exc_type"] = type(exc).__name__
            out["traceback"] = self.formatException(record.exc_info)
            if out.get("error_code") is None:
                out["error_code"] = str(signals.classify_exception(exc))
        return _ENCODER.encode(out)

    def _value(self, key: str, value: Any) -> Any:
        if key in PROMPT_FIELDS and not self.log_prompts and value is not None:
            return f"<redacted {len(str(value))} chars>"
        return value

    def _timestamp(self, created: float) -> str:
        second = int(created)
        if second != self._second:  # one strftime per second, not per line
            self._second = second
            self._prefix = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        return self._prefix + _MILLIS[int((created - second) * 1000)]


#: ".000Z" .. ".999Z": the millisecond suffix looked up, not formatted, per line
_MILLIS = tuple(f".{ms:03d}Z" for ms in range(1000))
_NULLS = (None, None, None, None)
_FIXED_KEYS = frozenset({"ts", "level", "logger", "event", *CONTEXT_FIELDS})
#: field names a template cannot take: fixed keys (the dict's override
#: semantics) and prompt fields (redacted on the dict path)
_RESERVED = _FIXED_KEYS | PROMPT_FIELDS
_encode_str = json.encoder.encode_basestring  # what ensure_ascii=False writes, in C


def _quoted(text: str) -> str:
    """A JSON string literal, safe inside a %-template."""
    return _encode_str(text).replace("%", "%%")


def _scalar(value: Any) -> str:
    """One JSON value, exactly as ``_ENCODER`` writes it."""
    if value is None:
        return "null"
    kind = type(value)
    if kind is str:
        return _encode_str(value)
    if kind is int:
        return int.__repr__(value)
    if kind is float and math.isfinite(value):
        return float.__repr__(value)
    if kind is bool:
        return "true" if value else "false"
    return _ENCODER.encode(value)


def _float(value: float) -> str:
    # a finite float is its repr in JSON; inf and nan take the encoder's spelling
    if type(value) is float and value - value == 0.0:
        return float.__repr__(value)
    return _scalar(value)


class RequestLines:
    """The ``received`` and ``responded`` lines of one (method, route), made fast.

    The middleware's two lines per request have the same keys every time and
    the method and route fixed per route, so everything but the varying values
    is rendered once here. The writer gets a compact tuple
    (``(lines, kind, ctx, created, *values)``) and renders it with ``render``;
    ``event`` turns it back into the ordinary ``log_event`` form for any
    other handler or formatter. Either way the line is byte for byte the one
    ``log_event`` would write.
    """

    RECEIVED = 0
    RESPONDED = 1

    def __init__(self, logger: str, method: str, route: str) -> None:
        self.logger = logger
        self.method = method
        self.route = route
        self._received_head, self._responded_head = (
            f'", "level": "info", "logger": {_encode_str(logger)}, "event": "{kind}", '
            f'"request_id": '
            for kind in ("received", "responded")
        )
        self._received_keys = (
            f', "method": {_encode_str(method)}, "route": {_encode_str(route)}, "body_size_bytes": '
        )
        self._responded_keys = f', "route": {_encode_str(route)}, "status": '

    def render(self, formatter: JsonFormatter, item: tuple[Any, ...]) -> str:
        """The JSON line of a buffered ``(self, kind, ctx, created, *values)`` tuple."""
        if formatter.static:
            return formatter.line(*self.event(item))
        ctx = item[2]
        rid = ctx[0]
        if ctx[1:] == _NULLS:
            model = _NULL_MODEL
        else:
            pairs = zip(_MODEL_KEYS, ctx[1:], strict=True)
            model = "".join([f', "{k}": {_scalar(v)}' for k, v in pairs])
        head = (
            f'{{"ts": "{formatter._timestamp(item[3])}'
            f"{self._received_head if item[1] == self.RECEIVED else self._responded_head}"
            f"{_encode_str(rid) if type(rid) is str else _scalar(rid)}{model}"
        )
        # the values' common kinds inline (ints are ints, floats finite); else _scalar
        if item[1] == self.RECEIVED:
            n = item[4]
            line = f"{head}{self._received_keys}{int.__repr__(n) if type(n) is int else _scalar(n)}"
            return line + "}" if item[5] else line + ', "body_complete": false}'
        status, total, gpu, size = item[4:8]
        line = (
            f"{head}{self._responded_keys}"
            f"{int.__repr__(status) if type(status) is int else _scalar(status)}"
            f', "total_time_ms": {_float(total)}, "gpu_time_ms": {_float(gpu)}'
            f', "response_size_bytes": {int.__repr__(size) if type(size) is int else _scalar(size)}'
        )
        return line + ', "client_disconnected": true}' if item[8] else line + "}"

    def event(self, item: tuple[Any, ...]) -> _Event:
        """The buffered tuple as ``(logger, event, ctx, fields, created)``, as log_event queues."""
        ctx, created = item[2], item[3]
        fields: dict[str, Any]
        if item[1] == self.RECEIVED:
            fields = {"method": self.method, "route": self.route, "body_size_bytes": item[4]}
            if not item[5]:
                fields["body_complete"] = False
            return (self.logger, "received", ctx, fields, created)
        status, total_ms, gpu_ms, size, disconnected = item[4:9]
        fields = {
            "route": self.route,
            "status": status,
            "total_time_ms": total_ms,
            "gpu_time_ms": gpu_ms,
            "response_size_bytes": size,
        }
        if disconnected:
            fields["client_disconnected"] = True
        return (self.logger, "responded", ctx, fields, created)


_MODEL_KEYS = CONTEXT_FIELDS[1:]
_NULL_MODEL = "".join(f', "{k}": null' for k in _MODEL_KEYS)


#: what log_event's lane buffers: (logger name, event, context, fields, created)
_Event = tuple[str, str, tuple[Any, ...], Mapping[str, Any], float]


class _Buffer:
    """A bounded buffer with ``put_nowait``: a deque append, no lock, no wake-up."""

    def __init__(self, maxsize: int) -> None:
        self.maxsize = maxsize
        # LogRecords, or (logger, event, context, fields, created) from log_event's lane
        self.items: collections.deque[logging.LogRecord | tuple[Any, ...]] = collections.deque()

    def put_nowait(self, record: logging.LogRecord | tuple[Any, ...]) -> bool:
        if len(self.items) >= self.maxsize:
            return False
        self.items.append(record)
        return True


class _DroppingQueueHandler(logging.handlers.QueueHandler):
    """Enqueue without blocking; a full buffer drops the record and counts it."""

    def __init__(self, buffer: _Buffer, dropped: Any, target: logging.Handler) -> None:
        super().__init__(buffer)  # type: ignore[arg-type]
        self.buffer = buffer
        self._dropped_metric = dropped
        self.dropped = 0
        formatter = target.formatter
        # lines can be made here only for a stream/file target with our formatter
        self.lines_ok = type(target) in _BATCHABLE and isinstance(formatter, JsonFormatter)
        self._json = formatter if isinstance(formatter, JsonFormatter) else JsonFormatter()

    def emit_line(self, name: str, event: str, fields: Mapping[str, Any]) -> None:
        # only the context is taken here; the writer renders the line, in a batch
        self.push((name, event, _context(), fields, time.time()))

    def push(self, item: tuple[Any, ...]) -> None:
        """Buffer a line's tuple (``RequestLines``' or log_event's); dropped when full."""
        buffer = self.buffer
        if len(buffer.items) < buffer.maxsize:
            buffer.items.append(item)
        else:
            self._drop()

    def _drop(self) -> None:
        self.dropped += 1
        self._dropped_metric.inc()

    def handle(self, record: logging.LogRecord) -> bool:
        # no handler lock: the deque append is atomic, and the lock costs a syscall pair
        if self.filters and not self.filter(record):
            return False
        self.emit(record)
        return True

    def emit(self, record: logging.LogRecord) -> None:
        _capture(record)  # formatting happens in the writer; only the context is taken here
        if not self.buffer.put_nowait(record):
            self._drop()


def _as_event(item: tuple[Any, ...]) -> _Event:
    first = item[0]
    if type(first) is RequestLines:
        return first.event(item)
    return item  # log_event's own (name, event, ctx, fields, created)


def _as_record(item: tuple[Any, ...]) -> logging.LogRecord:
    name, kind, ctx, fields, created = _as_event(item)
    record = _record(logging.getLogger(name), kind, fields)
    record.created = created
    record.__dict__[_CAPTURED] = ctx
    return record


class _Writer(threading.Thread):
    """Drains the buffer every ``interval`` seconds and writes the batch at once."""

    def __init__(self, buffer: _Buffer, handler: logging.Handler, interval: float) -> None:
        super().__init__(name="aivitals-log-writer", daemon=True)
        self.buffer = buffer
        self.handler = handler
        self.interval = interval
        self.stopping = threading.Event()
        self._drain_lock = threading.Lock()  # flush() from another thread must not reorder lines

    def run(self) -> None:
        while not self.stopping.wait(self.interval):
            self.drain()
        self.drain()

    def drain(self) -> None:
        with self._drain_lock:
            self._drain()

    def _drain(self) -> None:
        items = self.buffer.items
        batch = []
        while items:
            batch.append(items.popleft())
        if not batch:
            return
        handler = self.handler
        stream = getattr(handler, "stream", None) if type(handler) in _BATCHABLE else None
        if stream is None:
            for record in batch:
                handler.handle(
                    record if isinstance(record, logging.LogRecord) else _as_record(record)
                )
            return
        formatter = handler.formatter
        json_formatter = formatter if isinstance(formatter, JsonFormatter) else None
        lines = []
        for record in batch:
            try:
                if isinstance(record, logging.LogRecord):
                    lines.append(handler.format(record))
                elif json_formatter is None:
                    lines.append(handler.format(_as_record(record)))
                elif type(first := record[0]) is RequestLines:
                    lines.append(first.render(json_formatter, record))
                else:  # an _Event is (name, event, ctx, fields, created): line()'s arguments
                    lines.append(json_formatter.line(*record))
            except Exception:
                handler.handleError(
                    record if isinstance(record, logging.LogRecord) else _as_record(record)
                )
        with handler.lock:  # type: ignore[union-attr]
            try:
                stream.write("\n".join(lines) + "\n")
                stream.flush()
            except Exception:
                last = batch[-1]
                handler.handleError(
                    last
                    if isinstance(last, logging.LogRecord)
                    else _record(LIFECYCLE, "log_write_failed", {})
                )


_BATCHABLE = (logging.StreamHandler, logging.FileHandler)


class LogWriter:
    """The running background writer returned by ``configure_logging``; ``stop()`` drains it."""

    def __init__(
        self,
        handler: logging.Handler,
        queue_handler: _DroppingQueueHandler,
        writer: _Writer,
        loggers: list[tuple[logging.Logger, int, bool]],
    ) -> None:
        self.handler = handler
        self._queue_handler = queue_handler
        self._writer = writer
        self._loggers = loggers
        self._stopped = False
        self._lock = threading.Lock()

    @property
    def dropped(self) -> int:
        """Records dropped because the buffer was full."""
        return self._queue_handler.dropped

    def flush(self) -> None:
        """Write out everything buffered now (normally the writer does it every few ms)."""
        self._writer.drain()

    def stop(self) -> None:
        """Detach from the loggers, write out everything buffered, close the file. Idempotent."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
        atexit.unregister(self.stop)
        for logger, level, propagate in self._loggers:
            logger.removeHandler(self._queue_handler)
            logger.setLevel(level)
            logger.propagate = propagate
        self._writer.stopping.set()
        self._writer.join(30)
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
    flush_interval: float = 0.05,
    log_prompts: bool = False,
    static_fields: Mapping[str, Any] | None = None,
    propagate: bool = False,
    registry: CollectorRegistry | None = REGISTRY,
) -> LogWriter:
    """Write JSON lines from the ``aivitals`` loggers (and ``loggers``) to ``target``.

    ``target`` is a file path (appended), a text stream, or a ``logging.Handler``.
    ``queue_size`` bounds the records waiting for the writer (excess dropped
    and counted); ``flush_interval`` is how often the writer wakes (seconds).

    **Usage**::

        writer = aivitals.instrument.configure_logging("/var/log/svc.jsonl")
        logging.getLogger("aivitals.protect").info("shed", extra={"reason": "queue_full"})
        writer.stop()   # at shutdown; also registered with atexit
    """
    if isinstance(queue_size, bool) or not isinstance(queue_size, int) or queue_size < 1:
        raise ConfigError(f"queue_size must be a positive int, got {queue_size!r}")
    if not isinstance(flush_interval, int | float) or not 0.001 <= flush_interval <= 10:
        raise ConfigError(f"flush_interval must be 0.001..10 seconds, got {flush_interval!r}")
    numeric = logging.getLevelName(level.upper()) if isinstance(level, str) else level
    if not isinstance(numeric, int):
        raise ConfigError(f"level must be a logging level, got {level!r}")
    handler = _handler_for(target)
    handler.setFormatter(JsonFormatter(log_prompts=log_prompts, static=static_fields))
    buffer = _Buffer(queue_size)
    queue_handler = _DroppingQueueHandler(
        buffer, family("aivitals_log_records_dropped_total", registry), handler
    )
    writer_thread = _Writer(buffer, handler, float(flush_interval))
    attached = []
    for name in loggers:
        logger = logging.getLogger(name)
        attached.append((logger, logger.level, logger.propagate))
        logger.addHandler(queue_handler)
        logger.setLevel(numeric)
        logger.propagate = propagate
    writer_thread.start()
    writer = LogWriter(handler, queue_handler, writer_thread, attached)
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
