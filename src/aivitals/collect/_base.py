"""The ``Collector`` protocol every signal source implements."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol, runtime_checkable

from ..signals import Sample


@runtime_checkable
class Collector(Protocol):
    """A source of samples. ``collect`` never raises: a failing source reports
    ``aivitals_collector_up{collector=name} 0`` and counts the error instead."""

    name: str

    def collect(self) -> Iterable[Sample]: ...
