"""aivitals.diagnose: from a P99 creep to "model layer, GPU memory leak in pid 4242".

Baseline-deviation detection, a knowledge base of fault signatures in YAML
(evidence in PromQL), an engine that ranks hypotheses by evidence,
specificity and temporal precedence, and reports in four formats.

**Usage**::

    from aivitals.diagnose import diagnose
    d = diagnose(store, window=1800)
    d.shape, d.findings[0].signature, d.findings[0].commands
    print(d.to_markdown())
"""

from __future__ import annotations

from ._attach import attach
from ._detector import DetectionResult, DetectorConfig, StreamingDetector, detect
from ._engine import HIGH_CONFIDENCE, VITALS, diagnose
from ._memory import HOLD_RATE_WINDOWS, FindingMemory, hold_for, look_back
from ._model import (
    Diagnosis,
    Event,
    EventLike,
    EvidenceResult,
    Finding,
    Shape,
    SignalDeviation,
    Unseen,
)
from ._rank import Change, ChangeRanking, rank_changes
from ._report import DAY, daily_report
from ._signatures import EventEvidence, Evidence, Signature, load_signatures, parse_signatures

__all__ = [
    "DAY",
    "HIGH_CONFIDENCE",
    "HOLD_RATE_WINDOWS",
    "VITALS",
    "Change",
    "ChangeRanking",
    "DetectionResult",
    "DetectorConfig",
    "Diagnosis",
    "Event",
    "EventEvidence",
    "EventLike",
    "Evidence",
    "EvidenceResult",
    "Finding",
    "FindingMemory",
    "Shape",
    "SignalDeviation",
    "Signature",
    "StreamingDetector",
    "Unseen",
    "attach",
    "daily_report",
    "detect",
    "diagnose",
    "hold_for",
    "load_signatures",
    "look_back",
    "parse_signatures",
    "rank_changes",
]
