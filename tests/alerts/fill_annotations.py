"""Developer tool: write ``exp_annotations`` into the shipped promtool unit tests.

promtool compares annotations exactly, so every expected alert in the shipped
tests needs its rendered annotations. This tool renders them with the embedded
engine over the embedded store; ``promtool test rules`` (run by the test suite)
then checks them against Prometheus' own rendering, so an engine that renders
differently from Prometheus fails there. Labels and times stay hand-written.

    .venv/bin/python tests/alerts/fill_annotations.py
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import yaml

from aivitals.alerts import default_pack
from aivitals.alerts._params import parse_duration
from aivitals.alerts._promtest import run_engine_on_test, shipped_test_files
from aivitals.tsdb import Store

_CASE = re.compile(r"eval_time:\s*([0-9a-z]+)")
_NAME = re.compile(r"alertname:\s*([A-Za-z0-9_]+)")
_LABELS = re.compile(r"^(\s*)- exp_labels: (\{.*\})\s*$")


def fill(path: Path) -> int:
    doc: dict[str, Any] = yaml.safe_load(path.read_text())
    groups = default_pack().groups
    interval = parse_duration(str(doc.get("evaluation_interval", "1m")))
    results = [
        run_engine_on_test(
            t,
            groups,
            evaluation_interval=interval,
            backend_factory=lambda: Store(retention=1e9),
        )
        for t in doc["tests"]
    ]
    lines = [ln for ln in path.read_text().splitlines() if "exp_annotations:" not in ln]
    out: list[str] = []
    test = -1
    eval_time = 0.0
    name = ""
    missing = 0
    for line in lines:
        out.append(line)
        if re.match(r"^  - name:", line):
            test += 1
        if m := _CASE.search(line):
            eval_time = parse_duration(m.group(1))
        if m := _NAME.search(line):
            name = m.group(1)
        if m := _LABELS.match(line):
            want = {k: str(v) for k, v in yaml.safe_load(m.group(2)).items()}
            got = [a for a in results[test].get((eval_time, name), []) if a.labels == want]
            if not got:
                print(f"{path.name}: engine has no {name} {want} at {eval_time}s", file=sys.stderr)
                missing += 1
                continue
            ann = json.dumps(got[0].annotations, ensure_ascii=False, sort_keys=True)
            out.append(f"{m.group(1)}  exp_annotations: {ann}")
    path.write_text("\n".join(out) + "\n")
    return missing


if __name__ == "__main__":
    root = Path(__file__).resolve().parents[2] / "src/aivitals/alerts/rules/tests"
    files = [root / f.name for f in shipped_test_files()]
    sys.exit(1 if sum(fill(f) for f in files) else 0)
