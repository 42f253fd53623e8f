"""Collectors: GPU, host, process, kernel log and scrapes of other /metrics."""

from __future__ import annotations

from ._base import Collector

__all__ = ["Collector"]
