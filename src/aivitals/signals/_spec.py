"""The data model of the catalogue: one ``MetricSpec`` per metric."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


class MetricType(StrEnum):
    COUNTER = "counter"
    GAUGE = "gauge"
    HISTOGRAM = "histogram"
    INFO = "info"


class Layer(StrEnum):
    """The four fault layers of the domain, plus the service's edge."""

    MODEL = "model"
    SERVICE = "service"
    INFRASTRUCTURE = "infrastructure"
    BUSINESS = "business"


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """One metric aivitals emits: its name, type, unit, help and labels.

    ``name`` is the family name as exposed (counters carry ``_total``;
    histograms expose ``_bucket``/``_sum``/``_count`` below it).
    """

    name: str
    type: MetricType
    unit: str
    help: str
    labels: tuple[str, ...] = ()
    layer: Layer = Layer.SERVICE
    buckets: tuple[float, ...] | None = None
    source: str = "instrument"

    def series_names(self) -> tuple[str, ...]:
        """The sample names this family produces in the text exposition."""
        if self.type is MetricType.HISTOGRAM:
            return (f"{self.name}_bucket", f"{self.name}_sum", f"{self.name}_count")
        if self.type is MetricType.INFO:
            return (f"{self.name}_info",) if not self.name.endswith("_info") else (self.name,)
        return (self.name,)


@dataclass(frozen=True, slots=True)
class Alias:
    """A foreign metric name (vLLM, TGI, Triton, DCGM, OpenTelemetry) mapped onto ours.

    ``scale`` converts the foreign unit to ours (Triton microseconds -> seconds,
    DCGM MiB -> bytes, percent -> ratio). ``add_labels`` are set on the mapped
    series, for instance ``queue="engine"``. ``suffixes`` maps histogram or
    counter sample suffixes when the foreign family is a histogram.
    """

    foreign: str
    ours: str
    source: str
    scale: float = 1.0
    add_labels: tuple[tuple[str, str], ...] = ()
    deprecated: bool = False
    note: str = ""
    histogram: bool = False
    extra: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Derived:
    """One of our series computed from several foreign ones, where no single name maps.

    dcgm-exporter exports framebuffer used and free but no total; node_exporter counts
    CPU time per core where we count it per host. ``expr`` is PromQL over foreign
    instant selectors written as bare names (each gets the query's label matchers),
    in the foreign unit; ``scale`` converts its result to ours. The agent's scrape
    path translates line by line and cannot apply these: they serve the recording
    rules and the diagnosis, which read a Prometheus.
    """

    ours: str
    source: str
    expr: str
    scale: float = 1.0
    note: str = ""
