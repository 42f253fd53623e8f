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
from ._pods import (
    POD_LABELS,
    CgroupPod,
    KubeletPodsFile,
    KubeletPodsURL,
    PodLogDirs,
    PodNames,
    PodResolver,
    PodSource,
    parse_pod_cgroup,
    parse_pod_list,
    pod_source,
)
from ._probe import HTTPProbeCollector
from ._process import ProcessCollector, find_listener
from ._scrape import Scraper, ScrapeResult, translate_exposition
from ._xid import XID_MEANINGS, xid_meaning

__all__ = [
    "POD_LABELS",
    "XID_MEANINGS",
    "BaseCollector",
    "CgroupPod",
    "Collector",
    "DmesgSource",
    "Event",
    "HTTPProbeCollector",
    "HostCollector",
    "KernelLogCollector",
    "KernelRecord",
    "KmsgSource",
    "KubeletPodsFile",
    "KubeletPodsURL",
    "PodLogDirs",
    "PodNames",
    "PodResolver",
    "PodSource",
    "ProcessCollector",
    "RunResult",
    "ScrapeResult",
    "Scraper",
    "check_netns",
    "classify_line",
    "find_listener",
    "health_samples",
    "parse_pod_cgroup",
    "parse_pod_list",
    "pod_source",
    "reason_of",
    "translate_exposition",
    "xid_meaning",
]
