"""The unit of data every source produces: one value of one series."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Sample:
    """One value of one series, as produced by a collector or a scrape.

    ``name`` is the sample name (``x_bucket``, not the family); ``timestamp``
    is seconds since the epoch, or None for "now, when stored".
    """

    name: str
    labels: Mapping[str, str]
    value: float
    timestamp: float | None = None
