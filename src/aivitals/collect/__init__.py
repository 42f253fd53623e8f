"""Collectors: GPU, host, process, kernel log and scrapes of other /metrics.

Every collector implements ``Collector`` (``collect()`` never raises) and
reports ``aivitals_collector_up``, ``_duration_seconds`` and ``_errors_total``.

**Usage**::

    from aivitals.collect import HostCollector
    for sample in HostCollector(ports=[8000]).collect():
        print(sample.name, sample.labels, sample.value)
"""

from __future__ import annotations

from ._base import Collector
from ._event import Event
from ._health import BaseCollector, RunResult, health_samples, reason_of
from ._host import HostCollector
from ._kernel import DmesgSource, KernelLogCollector, KernelRecord, KmsgSource, classify_line
from ._netns import check_netns
from ._probe import HTTPProbeCollector
from ._process import ProcessCollector, find_listener
from ._scrape import Scraper, ScrapeResult, translate_exposition
from ._xid import XID_MEANINGS, xid_meaning

__all__ = [
    "XID_MEANINGS",
    "BaseCollector",
    "Collector",
    "DmesgSource",
    "Event",
    "HTTPProbeCollector",
    "HostCollector",
    "KernelLogCollector",
    "KernelRecord",
    "KmsgSource",
    "ProcessCollector",
    "RunResult",
    "ScrapeResult",
    "Scraper",
    "check_netns",
    "classify_line",
    "find_listener",
    "health_samples",
    "reason_of",
    "translate_exposition",
    "xid_meaning",
]
