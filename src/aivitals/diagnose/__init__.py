"""aivitals.diagnose: from a P99 creep to "model layer, GPU memory leak in pid 4242".

Baseline-deviation detection, a knowledge base of fault signatures in YAML
(evidence in PromQL), an engine that ranks hypotheses by evidence,
specificity and temporal precedence, and reports in four formats.
"""

from __future__ import annotations

from ._detector import DetectionResult, DetectorConfig, StreamingDetector, detect

__all__ = ["DetectionResult", "DetectorConfig", "StreamingDetector", "detect"]
