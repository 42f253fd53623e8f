"""Notifiers: a webhook in Alertmanager's format, and a pusher to Alertmanager's v2 API.

Both hand their payloads to a background thread through a bounded queue, so
``notify`` returns at once whatever the receiver does: a receiver that is down
or slow gets retries with exponential backoff on that thread; when the queue is
full new payloads are dropped and counted. Every outcome is counted in
``aivitals_notifications_total{receiver, result}`` with result ``sent``,
``retried``, ``failed`` (retries exhausted or refused) or ``dropped``.
"""

from __future__ import annotations

import hashlib
import logging
import queue
import threading
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import httpx
from prometheus_client import REGISTRY, CollectorRegistry

from .. import signals
from ..errors import ConfigError
from ._engine import AlertEvent

__all__ = ["AlertmanagerNotifier", "WebhookNotifier", "rfc3339", "webhook_payload"]

log = logging.getLogger("aivitals.alerts.notify")

#: Alertmanager's webhook reports a still-firing alert with this zero endsAt.
ZERO_TIME = "0001-01-01T00:00:00Z"


def rfc3339(ts: float | None) -> str:
    """Epoch seconds as RFC 3339 UTC with milliseconds (Alertmanager's format)."""
    if ts is None:
        return ZERO_TIME
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def _fingerprint(labels: Mapping[str, str]) -> str:
    text = "\xff".join(f"{k}\xfe{v}" for k, v in sorted(labels.items()))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _status(e: AlertEvent) -> str:
    return "resolved" if e.state == "resolved" else "firing"


def _common(maps: Sequence[Mapping[str, str]]) -> dict[str, str]:
    if not maps:
        return {}
    first = dict(maps[0])
    return {k: v for k, v in first.items() if all(m.get(k) == v for m in maps[1:])}


def webhook_payload(
    alerts: Sequence[AlertEvent], *, receiver: str, external_url: str = ""
) -> dict[str, Any]:
    """Alertmanager's webhook body (version 4) for ``alerts``."""
    items = [
        {
            "status": _status(e),
            "labels": dict(e.labels),
            "annotations": dict(e.annotations),
            "startsAt": rfc3339(e.fired_at or e.active_at),
            "endsAt": rfc3339(e.resolved_at) if e.state == "resolved" else ZERO_TIME,
            "generatorURL": external_url,
            "fingerprint": _fingerprint(e.labels),
        }
        for e in alerts
    ]
    return {
        "version": "4",
        "groupKey": f'{{}}:{{receiver="{receiver}"}}',
        "truncatedAlerts": 0,
        "status": "firing" if any(i["status"] == "firing" for i in items) else "resolved",
        "receiver": receiver,
        "groupLabels": {},
        "commonLabels": _common([e.labels for e in alerts]),
        "commonAnnotations": _common([e.annotations for e in alerts]),
        "externalURL": external_url,
        "alerts": items,
    }


class _Sender:
    """A bounded queue of payloads and one thread that POSTs them with retries."""

    def __init__(
        self,
        url: str,
        *,
        receiver: str,
        queue_size: int,
        max_retries: int,
        backoff: float,
        max_backoff: float,
        timeout: float,
        registry: CollectorRegistry | None,
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise ConfigError(f"url={url!r} must be an http:// or https:// URL")
        for key, value in (("queue_size", queue_size), ("max_retries", max_retries)):
            if not isinstance(value, int) or value < (1 if key == "queue_size" else 0):
                raise ConfigError(f"{key}={value!r} must be a positive integer")
        for key, fvalue in (
            ("backoff", backoff),
            ("max_backoff", max_backoff),
            ("timeout", timeout),
        ):
            if not isinstance(fvalue, int | float) or fvalue <= 0:
                raise ConfigError(f"{key}={fvalue!r} must be a positive number of seconds")
        self.url = url
        self.receiver = receiver
        self.max_retries = max_retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.timeout = timeout
        self.counts: Counter[str] = Counter()
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=queue_size)
        self._stop = threading.Event()
        self._idle = threading.Condition()
        self._busy = 0
        self._metric = signals.metric("aivitals_notifications_total", registry=registry)
        self._thread = threading.Thread(target=self._run, name=f"notify-{receiver}", daemon=True)
        self._thread.start()

    def _count(self, result: str, n: int = 1) -> None:
        self.counts[result] += n
        self._metric.labels(receiver=self.receiver, result=result).inc(n)  # type: ignore[attr-defined]

    def _enqueue(self, payload: Any) -> bool:
        if self._stop.is_set():
            self._count("dropped")
            return False
        try:
            with self._idle:
                self._queue.put_nowait(payload)
                self._busy += 1
        except queue.Full:
            self._count("dropped")
            log.warning("%s: notification queue full, payload dropped", self.receiver)
            return False
        return True

    def _run(self) -> None:
        with httpx.Client(timeout=self.timeout) as client:
            while not self._stop.is_set():
                try:
                    payload = self._queue.get(timeout=0.1)
                except queue.Empty:
                    continue
                try:
                    self._deliver(client, payload)
                finally:
                    with self._idle:
                        self._busy -= 1
                        self._idle.notify_all()

    def _deliver(self, client: httpx.Client, payload: Any) -> None:
        for attempt in range(self.max_retries + 1):
            if self._stop.is_set():
                self._count("dropped")
                return
            try:
                response = client.post(self.url, json=payload)
                if response.status_code < 300:
                    self._count("sent")
                    return
                # A 4xx other than 429 will not get better by retrying.
                if 400 <= response.status_code < 500 and response.status_code != 429:
                    log.warning(
                        "%s refused a notification: HTTP %s", self.url, response.status_code
                    )
                    self._count("failed")
                    return
                problem = f"HTTP {response.status_code}"
            except httpx.HTTPError as exc:
                problem = f"{type(exc).__name__}: {exc}"
            if attempt < self.max_retries:
                self._count("retried")
                self._stop.wait(min(self.max_backoff, self.backoff * 2**attempt))
        log.warning("%s: notification failed after %d tries (%s)", self.url, attempt + 1, problem)
        self._count("failed")

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until every queued payload is delivered or given up; False on timeout."""
        deadline = time.monotonic() + timeout
        with self._idle:
            while self._busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(left)
        return True

    def close(self, timeout: float = 5.0) -> None:
        """Stop the thread; payloads still queued are counted as dropped."""
        self._stop.set()
        self._thread.join(timeout)
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
            self._count("dropped")

    @property
    def queued(self) -> int:
        return self._queue.qsize()


class WebhookNotifier(_Sender):
    """POSTs alerts to a webhook in Alertmanager's webhook format (version 4).

    **Usage**::

        hook = WebhookNotifier("http://127.0.0.1:5001/alerts")
        engine = RuleEngine(store, pack, notifiers=[hook])

    A firing alert is sent when it starts firing and then every
    ``repeat_interval`` seconds; a resolution once. Receivers that are down or
    slow are retried with exponential backoff (``backoff`` doubling up to
    ``max_backoff``, ``max_retries`` times) off the evaluation thread.
    """

    def __init__(
        self,
        url: str,
        *,
        receiver: str = "webhook",
        repeat_interval: float = 4 * 3600.0,
        external_url: str = "",
        queue_size: int = 100,
        max_retries: int = 5,
        backoff: float = 0.5,
        max_backoff: float = 30.0,
        timeout: float = 5.0,
        registry: CollectorRegistry | None = REGISTRY,
    ) -> None:
        if not isinstance(repeat_interval, int | float) or repeat_interval <= 0:
            raise ConfigError(f"repeat_interval={repeat_interval!r} must be positive seconds")
        super().__init__(
            url,
            receiver=receiver,
            queue_size=queue_size,
            max_retries=max_retries,
            backoff=backoff,
            max_backoff=max_backoff,
            timeout=timeout,
            registry=registry,
        )
        self.repeat_interval = repeat_interval
        self.external_url = external_url
        self._sent: dict[str, tuple[str, float]] = {}

    def notify(self, alerts: Sequence[AlertEvent]) -> None:
        now = time.time()
        due = []
        for e in alerts:
            key, status = e.fingerprint, _status(e)
            last = self._sent.get(key)
            if last is None and status == "resolved":
                continue  # never announced, nothing to resolve
            if last is None or last[0] != status or now - last[1] >= self.repeat_interval:
                due.append(e)
                self._sent[key] = (status, now)
        for e in due:
            if e.state == "resolved":
                self._sent.pop(e.fingerprint, None)
        if due:
            self._enqueue(
                webhook_payload(due, receiver=self.receiver, external_url=self.external_url)
            )


class AlertmanagerNotifier(_Sender):
    """Pushes alerts to a real Alertmanager (``POST /api/v2/alerts``), as Prometheus does.

    **Usage**::

        am = AlertmanagerNotifier("http://127.0.0.1:9093")
        engine = RuleEngine(store, pack, notifiers=[am])

    The engine re-sends firing alerts every ``resend_delay`` with ``endsAt`` four
    periods ahead, so Alertmanager expires them if aivitals stops; resolved alerts
    carry their resolution time. Routing, grouping, inhibition and silences are
    Alertmanager's.
    """

    def __init__(
        self,
        url: str,
        *,
        receiver: str = "alertmanager",
        external_url: str = "",
        queue_size: int = 100,
        max_retries: int = 5,
        backoff: float = 0.5,
        max_backoff: float = 30.0,
        timeout: float = 5.0,
        registry: CollectorRegistry | None = REGISTRY,
    ) -> None:
        super().__init__(
            url.rstrip("/") + "/api/v2/alerts",
            receiver=receiver,
            queue_size=queue_size,
            max_retries=max_retries,
            backoff=backoff,
            max_backoff=max_backoff,
            timeout=timeout,
            registry=registry,
        )
        self.external_url = external_url

    def notify(self, alerts: Sequence[AlertEvent]) -> None:
        body = [
            {
                "labels": dict(e.labels),
                "annotations": dict(e.annotations),
                "startsAt": rfc3339(e.fired_at or e.active_at),
                "endsAt": rfc3339(e.resolved_at if e.state == "resolved" else e.valid_until),
                "generatorURL": self.external_url,
            }
            for e in alerts
            if e.state != "pending"
        ]
        if body:
            self._enqueue(body)
