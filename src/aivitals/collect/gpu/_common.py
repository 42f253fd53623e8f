"""The one interface the three GPU backends share, and the collector around it."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Protocol, runtime_checkable

from ...signals import Sample
from .._event import Event
from .._health import BaseCollector
from .._pods import PodResolver

__all__ = ["CountError", "GpuBackend", "GpuCollector", "process_name"]

#: How a backend reports a partial failure (one field, one device) by reason.
CountError = Callable[[str], None]


@runtime_checkable
class GpuBackend(Protocol):
    """A source of gpu_* samples. ``read`` may raise when the whole source is down;
    a single field that fails is reported through ``count`` and left absent."""

    name: str

    def read(self, count: CountError) -> list[Sample]: ...

    def drain_events(self) -> list[Event]: ...

    def close(self) -> None: ...


class GpuCollector(BaseCollector):
    """Wraps a backend (``nvml``, ``smi``, ``sim``) as a collector named ``gpu``.

    With ``pods``, every per-process series (``gpu_process_memory_used_bytes``)
    of a process in a Kubernetes pod gets that pod's labels (see ``PodResolver``).

    **Usage**::

        collector = GpuCollector(SimBackend(SimGPU("/tmp/sim")), pods=PodResolver())
        samples = list(collector.collect())
    """

    name = "gpu"

    def __init__(self, backend: GpuBackend, *, pods: PodResolver | None = None) -> None:
        super().__init__()
        self.backend = backend
        self.pods = pods
        self._events: list[Event] = []
        self._events_lock = threading.Lock()

    def _collect(self) -> Iterable[Sample]:
        samples = self.backend.read(self.count_error)
        if self.pods is not None:
            samples = self.pods.annotate(samples, self.count_error)
        events = self.backend.drain_events()
        if events:
            with self._events_lock:
                self._events.extend(events)
                del self._events[:-1000]
        return samples

    def drain_events(self) -> list[Event]:
        """Events (Xids) seen since the last call."""
        with self._events_lock:
            out, self._events = self._events, []
        return out

    def close(self) -> None:
        self.backend.close()


def process_name(pid: int, proc: str = "/proc") -> str:
    """The command name of ``pid`` from ``/proc/<pid>/comm``, or ``""`` if gone."""
    try:
        return Path(proc, str(pid), "comm").read_text().strip()
    except OSError:
        return ""
