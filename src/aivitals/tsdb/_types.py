"""The value types every part of aivitals exchanges: samples in, query results out.

Results follow the Prometheus HTTP API's shapes (vector, matrix, scalar,
string) so the embedded store and a remote Prometheus are interchangeable.
Times are float seconds since the epoch, as in the Prometheus API.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

ResultType = Literal["vector", "matrix", "scalar", "string"]


@dataclass(frozen=True, slots=True)
class InstantSample:
    """One element of an instant vector."""

    labels: Mapping[str, str]
    value: float
    timestamp: float


@dataclass(frozen=True, slots=True)
class RangeSeries:
    """One series of a range result: its labels and ``(timestamp, value)`` points."""

    labels: Mapping[str, str]
    points: Sequence[tuple[float, float]]


@dataclass(frozen=True, slots=True)
class QueryResult:
    """A PromQL answer. Exactly one of the payload fields is meaningful, per ``type``.

    ``warnings`` are the server's own (a partial answer from Thanos, Mimir or
    VictoriaMetrics, a dropped series): the data is still used, the caller says so.
    """

    type: ResultType
    vector: Sequence[InstantSample] = field(default_factory=tuple)
    matrix: Sequence[RangeSeries] = field(default_factory=tuple)
    scalar: tuple[float, float] | None = None
    string: tuple[float, str] | None = None
    warnings: Sequence[str] = ()

    def values(self) -> list[float]:
        """The values of a vector or scalar result, for quick checks."""
        if self.type == "scalar" and self.scalar is not None:
            return [self.scalar[1]]
        return [s.value for s in self.vector]


@runtime_checkable
class Backend(Protocol):
    """Anything that answers PromQL: the embedded store or a Prometheus-compatible server.

    ``query`` evaluates at one instant (``at`` None means now); ``query_range``
    evaluates at ``start, start+step, ... <= end`` and returns a matrix.
    Errors are ``QueryError`` (bad expression) or ``BackendError`` (the store
    or server failed).
    """

    def query(self, expr: str, at: float | None = None) -> QueryResult: ...

    def query_range(self, expr: str, start: float, end: float, step: float) -> QueryResult: ...
