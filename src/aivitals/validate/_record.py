"""Recordings of validate scenarios: the scenario's window as a snapshot, with its label.

The diagnosis accuracy benchmark scores recordings the real stack made, not data
generated next to the signatures (issue #14, part 6). ``aivitals validate --record
DIR`` writes, per scenario:

- ``DIR/<name>.aivsnap``: every series of the agent's store over ``[start, end]``, in
  the ``aivitals snapshot`` format (``Store.save``; ``aivitals query --snapshot`` and
  ``aivitals diagnose --snapshot`` read it);
- ``DIR/<name>.json``: the label (what was injected, when, what the diagnosis must
  name) and what the snapshot cannot hold: the agent's events (kernel lines, GPU Xids)
  and the alert transitions, both of which ``Stack.diagnose`` hands the diagnosis.

**Usage**::

    path = save_recording(stack.agent.store, Path("recordings"), label, start=t0, end=t1,
                          events=stack.agent.events(start=t0, end=t1),
                          alerts=stack.engine.history(start=t0, end=t1))
    for rec in load_recordings(Path("recordings")):
        if rec.problems:                     # gaps, missing families: not to be scored
            print(rec.name, rec.problems)
            continue
        end, window = rec.diagnosis_window()
        d = diagnose(rec.store(), end=end, window=window, step=rec.tick,
                     events=rec.events, alerts=rec.alerts)

Loading refuses, with an ``AivitalsError`` naming the file, what cannot be a
recording: a label that is not JSON or lacks a field (``ConfigError``), a label
whose snapshot is missing, a snapshot without its label, a corrupt snapshot
(``StoreError``). A recording that loads but would mislead the benchmark is kept
and flagged in ``Recording.problems``: the agent's heartbeats (``up``,
``aivitals_collector_up``) missing for more than ``MAX_GAP_TICKS`` ticks, data that
starts after the diagnosis window needs it, or a metric family every demo stack
exports absent from the window.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np
import numpy.typing as npt

from .. import __version__, signals
from ..alerts import AlertEvent, AlertState
from ..diagnose import Event, EventLike
from ..errors import ConfigError, StoreError
from ..timescale import QUICK, SHIPPED
from ..tsdb import Store
from ._target import ValidateTarget

__all__ = [
    "HISTORY",
    "KINDS",
    "MAX_GAP_TICKS",
    "MIN_DIAGNOSIS_WINDOW",
    "QUICK_MIN_WINDOW",
    "RECORDING_FORMAT",
    "REQUIRED_FAMILIES",
    "SEVERITIES",
    "SNAPSHOT_SUFFIX",
    "Recording",
    "load_recording",
    "load_recordings",
    "save_recording",
]

#: Version of the ``<name>.json`` layout (the snapshot carries its own).
RECORDING_FORMAT = 1
#: The suffix ``Store.save`` snapshots carry in the docs and tests.
SNAPSHOT_SUFFIX = ".aivsnap"
KINDS = ("fault", "pair", "soak", "unknown")
SEVERITIES = ("threshold", "moderate", "severe", "single")
#: More ticks than this without a heartbeat sample is a gap: the agent stalled or the
#: store lost data, and a diagnosis of the window would judge a hole, not the fault.
#: Five, not one: on a loaded machine a scrape runs a tick or two late now and then.
MAX_GAP_TICKS = 5
#: validate diagnoses at least this many seconds (``_runner._safe_diagnose``), even
#: when its baseline is shorter, so the detector has points to learn from: full runs
#: (the shipped time scale's), and compressed ones recorded before their baseline grew
#: to 10 s (their label has no ``diagnosis``; they were judged over at least 30 s, with
#: the default rate window).
MIN_DIAGNOSIS_WINDOW = SHIPPED.diagnosis_window
#: A compressed run's least window since (the quick time scale's).
QUICK_MIN_WINDOW = QUICK.diagnosis_window
#: How much more history than its rates the recorded diagnosis gets: the signatures'
#: baselines and levels look back 5 minutes (``[5m]``, ``[5m:${rate}]`` subqueries,
#: ``offset 1m``), and a window cut shorter invents evidence (a counter that existed
#: all along reads as a series new in the last minute). Only their 10-minute counts of
#: rare events (``increase``/``changes``/``resets`` of kernel I/O errors, OOM kills,
#: restarts, model reloads) reach further; cut, they can only miss an event 5-10
#: minutes back, never invent one (``tests/validate/test_record.py`` checks that), and
#: 10 minutes would double a quick recording's size again (~0.9 KB/s of window). So do
#: gpu_memory_leak's minutes of growth in the last 15 and the floor it subtracts: a
#: shorter history lowers the count and raises the floor.
HISTORY = 330.0
#: Series written at every tick whatever the service does: one ``up`` per scrape
#: target (0 when the scrape fails) and one ``aivitals_collector_up`` per collector.
HEARTBEATS = ("up", "aivitals_collector_up")
#: Families every demo stack exports and the diagnosis's vital signs read (the
#: service's instrumentation, the process, host and GPU collectors, the scrape).
#: One absent from the window means a collector or the scrape was missing: the
#: diagnosis would report it unseen and score something else than the fault.
REQUIRED_FAMILIES = (
    "up",
    "http_request_duration_seconds",
    "queue_length",
    "worker_pool_active_workers",
    "worker_pool_max_workers",
    "model_inference_time_seconds",
    "service_process_resident_memory_bytes",
    "service_process_cpu_seconds_total",
    "host_cpu_seconds_total",
    "host_memory_available_bytes",
    "host_memory_total_bytes",
    "gpu_utilization_ratio",
    "gpu_memory_used_bytes",
    "gpu_memory_total_bytes",
)

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+@-]{0,199}$")
#: Label field -> (accepted types, may it be None).
_FIELDS: dict[str, tuple[tuple[type, ...], bool]] = {
    "name": ((str,), False),
    "kind": ((str,), False),
    "faults": ((list,), False),
    "expected": ((list,), False),
    "layer": ((str,), True),
    "severity": ((str,), True),
    "params": ((dict,), False),
    "t_baseline": ((int, float), False),
    "t_fault": ((int, float), True),
    "t_revert": ((int, float), True),
    "quick": ((bool,), False),
    "tick": ((int, float), False),
    "passed": ((bool,), True),
}
_MAX_PROBLEMS = 4


@dataclass(frozen=True)
class Recording:
    """One recorded scenario: its label, its snapshot's path, and what is wrong with it.

    ``problems`` is empty for a recording fit to score; otherwise each entry says
    what is missing (a gap, a family, the start of the diagnosis window) and the
    benchmark reports the recording and leaves it out.
    """

    name: str
    label: Mapping[str, Any]
    path: Path
    label_path: Path
    start: float
    end: float
    events: tuple[Event, ...] = ()
    alerts: tuple[AlertEvent, ...] = ()
    problems: tuple[str, ...] = ()
    meta: Mapping[str, Any] = field(default_factory=dict)

    @property
    def kind(self) -> str:
        return str(self.label["kind"])

    @property
    def tick(self) -> float:
        return float(self.label["tick"])

    @property
    def size_bytes(self) -> int:
        """Bytes on disk: the snapshot and the label file."""
        return self.path.stat().st_size + self.label_path.stat().st_size

    def store(self) -> Store:
        """A fresh embedded store holding the recorded window (read from the snapshot)."""
        return Store.load(self.path)

    def diagnosis_window(self) -> tuple[float, float]:
        """``(end, window)`` of the diagnosis validate judges, as ``Stack.diagnose`` takes it.

        ``end`` is the end of the fault phase (``t_revert``; the recording's end when
        there was none, e.g. a soak); ``window`` reaches back to the baseline's start,
        and at least the least window validate used (the label's ``diagnosis``;
        ``MIN_DIAGNOSIS_WINDOW`` for recordings made before it was written).
        """
        return _diagnosis_window(self.label, self.end)

    @property
    def polls(self) -> tuple[tuple[float, float], ...]:
        """``(end, window)`` of each diagnosis validate asked (its label's ``polls``: a
        soak's, and a fault case's since validate keeps them); else ().

        A soak is judged healthy at every poll and a fault named on every poll after the
        first, so a recording is judged at those same polls.
        """
        return tuple((float(e), float(w)) for e, w in _polls(self.label))

    @property
    def diagnosis_rate(self) -> float | None:
        """The ``rate`` (seconds) validate's diagnosis used; None: the diagnosis's default."""
        rate = _settings(self.label).get("rate_s")
        return None if rate is None else float(rate)

    @property
    def suspects(self) -> tuple[str, ...]:
        """For a fault the knowledge base does not know: the metrics that must rank top 3."""
        extra = self.label.get("suspects")
        names = extra if isinstance(extra, list) and extra else self.label["expected"]
        return tuple(str(n) for n in names)


def save_recording(
    store: Store,
    directory: Path,
    label: dict[str, Any],
    *,
    start: float,
    end: float,
    events: Iterable[EventLike] = (),
    alerts: Iterable[Any] = (),
) -> Path:
    """Write ``[start, end]`` of ``store`` and its label as ``directory/<label name>``.

    Returns the snapshot's path. ``label`` is checked first (``ConfigError`` naming
    the field, nothing written); ``events`` (``Agent.events``) and ``alerts``
    (``RuleEngine.history``) whose time falls in the saved window are kept beside it
    (pass them unfiltered: the window may be widened, see below), since the diagnosis
    reads them and a snapshot holds only series. ``start`` is moved earlier when the
    diagnosis validate judges (``Recording.diagnosis_window``) reads further back:
    its first rates, and ``HISTORY`` more for the signatures' 5-minute baselines.
    What the store lacks of its rates' reach is flagged at load time as a gap; of the
    history, it is not (a stack younger than that gave validate no more either).
    A recording of the same name is replaced (both files written under temporary
    names, then renamed).
    """
    if not (
        isinstance(start, int | float)
        and isinstance(end, int | float)
        and math.isfinite(start)
        and math.isfinite(end)
        and start < end
    ):
        raise ConfigError(f"recording window: expected finite start < end, got {start!r}..{end!r}")
    _check_label(label, f"recording {label.get('name')!r}")
    # never less than the recorded diagnosis reads: a quick run's 4 s baseline is
    # diagnosed over 30 s, and the first rates reach a rate window further back
    start = min(float(start), _needed_from(label, float(end)) - HISTORY)
    name = str(label["name"])
    directory = Path(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"cannot create the recordings directory {directory}: {exc}") from exc
    snap = directory / f"{name}{SNAPSHOT_SUFFIX}"
    label_path = directory / f"{name}.json"
    tmp_snap = snap.with_name(f".{snap.name}.tmp")
    tmp_label = label_path.with_name(f".{label_path.name}.tmp")
    try:
        samples = store.save(tmp_snap, start=start, end=end)
        doc = {
            "format": RECORDING_FORMAT,
            "snapshot": snap.name,
            "start": float(start),
            "end": float(end),
            "samples": samples,
            "series": _series_in(store, start, end),
            "snapshot_bytes": tmp_snap.stat().st_size,
            "aivitals_version": __version__,
            "git_commit": _git_commit(),
            "recorded_at": time.time(),
            "label": label,
            "events": [
                {"time": float(e.time), "kind": e.kind, "text": e.text, "fields": dict(e.fields)}
                for e in events
                if start <= float(e.time) <= end
            ],
            "alerts": [d for d in map(_alert_dict, alerts) if start <= _at(d) <= end],
        }
        tmp_label.write_text(json.dumps(doc, indent=1, sort_keys=True, default=_jsonable) + "\n")
        os.replace(tmp_snap, snap)
        os.replace(tmp_label, label_path)
    except OSError as exc:
        raise StoreError(f"cannot write recording {name!r} to {directory}: {exc}") from exc
    finally:
        for tmp in (tmp_snap, tmp_label):
            tmp.unlink(missing_ok=True)
    return snap


def save_stack_window(
    stack: ValidateTarget, directory: Path, label: dict[str, Any], *, start: float, end: float
) -> Path:
    """``save_recording`` of a running demo stack's agent store, with its events and
    alert history (the diagnosis reads both; a snapshot holds only series)."""
    return save_recording(
        stack.agent.store,
        directory,
        label,
        start=start,
        end=end,
        events=stack.agent.events(start=start, end=end),
        alerts=stack.engine.history(start=start, end=end),
    )


def load_recordings(directory: Path) -> list[Recording]:
    """Every recording in ``directory``, sorted by name (an empty list if there is none).

    Files other than ``*.json`` labels and ``*.aivsnap`` snapshots (a README, the
    held-out list) are ignored. Raises for the first file that cannot be a
    recording (see ``load_recording``) and for a snapshot without its label.
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise ConfigError(f"recordings directory {directory} does not exist or is not a folder")
    labels = sorted(p for p in directory.glob("*.json") if not p.name.startswith("."))
    named = {p.stem for p in labels}
    for snap in sorted(directory.glob(f"*{SNAPSHOT_SUFFIX}")):
        if not snap.name.startswith(".") and snap.stem not in named:
            raise StoreError(f"{snap}: a snapshot without its label {snap.stem}.json")
    return [load_recording(p) for p in labels]


def load_recording(label_path: Path) -> Recording:
    """One recording from its ``<name>.json``; its snapshot is read to check the data.

    ``ConfigError``: the label is not JSON, not of a known format, or lacks a field
    (or has one of the wrong type). ``StoreError``: the snapshot is missing or
    corrupt. Gaps and missing families do not raise: see ``Recording.problems``.
    """
    label_path = Path(label_path)
    try:
        doc = json.loads(label_path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{label_path}: not a readable recording label ({exc})") from exc
    if not isinstance(doc, dict):
        raise ConfigError(f"{label_path}: a recording label is a JSON object")
    if doc.get("format") != RECORDING_FORMAT:
        raise ConfigError(
            f"{label_path}: recording format {doc.get('format')!r} is not supported "
            f"(expected {RECORDING_FORMAT})"
        )
    for key, kinds in (("label", (dict,)), ("start", (int, float)), ("end", (int, float))):
        if key not in doc:
            raise ConfigError(f"{label_path}: missing field {key!r}")
        if not isinstance(doc[key], kinds) or isinstance(doc[key], bool):
            raise ConfigError(f"{label_path}: field {key!r} has the wrong type")
    label = doc["label"]
    _check_label(label, str(label_path))
    if label["name"] != label_path.stem:
        raise ConfigError(
            f"{label_path}: label name {label['name']!r} does not match the file name"
        )
    snap = label_path.with_name(str(doc.get("snapshot") or f"{label_path.stem}{SNAPSHOT_SUFFIX}"))
    if not snap.is_file():
        raise StoreError(f"{label_path}: its snapshot {snap.name} is missing")
    store = Store.load(snap)  # StoreError naming the file when it is corrupt
    start, end = float(doc["start"]), float(doc["end"])
    try:
        events = tuple(
            Event(float(e["time"]), str(e["kind"]), str(e["text"]), dict(e.get("fields") or {}))
            for e in doc.get("events") or ()
        )
        alerts = tuple(_alert_event(a) for a in doc.get("alerts") or ())
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ConfigError(f"{label_path}: malformed events or alerts ({exc!r})") from exc
    meta = {k: v for k, v in doc.items() if k not in ("label", "events", "alerts")}
    return Recording(
        name=str(label["name"]),
        label=label,
        path=snap,
        label_path=label_path,
        start=start,
        end=end,
        events=events,
        alerts=alerts,
        problems=tuple(check_recording(store, label, start, end)),
        meta=meta,
    )


def check_recording(store: Store, label: Mapping[str, Any], start: float, end: float) -> list[str]:
    """What makes the data unfit to score: gaps, a late start, missing families.

    The span checked runs from where the diagnosis's first rate reaches back to
    (``diagnosis_window`` minus its rate window) to the recording's end.
    """
    tick = float(label["tick"])
    d_end, window = _diagnosis_window(label, end)
    need = _needed_from(label, end)
    limit = MAX_GAP_TICKS * tick
    problems: list[str] = []
    if start > need + tick:
        problems.append(
            f"starts {start - need:.1f} s after the diagnosis window needs data "
            f"(its rates read from {need - float(label['t_baseline']):+.1f} s of the baseline)"
        )
    lo = max(start, need)
    # one copy of the window: every series' timestamps, for the gaps and the families
    labels, t_ms, _, off = store.fetch([("__name__", "=~", ".+")], _ms(lo), _ms(end))
    t = t_ms.astype(np.float64) / 1000.0
    names = [dict(lab).get("__name__", "") for lab in labels]
    # any sample at all: the agent was running (a failed scrape still writes up=0 and
    # stale markers); none for a while is a stall or lost data
    problems += _gaps("no sample at all", np.unique(t), lo, end, limit, edges=True)
    beats = [i for i, n in enumerate(names) if n in HEARTBEATS]
    if not beats:
        problems.append(
            "no heartbeat series (up, aivitals_collector_up) in the window: "
            "a scrape target or a collector that fell silent cannot be seen"
        )
    for i in beats:
        problems += _gaps(
            f"{_show(labels[i])} missing", t[off[i] : off[i + 1]], lo, end, limit, edges=False
        )
    in_window = (t >= d_end - window) & (t <= d_end)
    owner = np.repeat(np.arange(len(labels)), np.diff(off))
    present = {names[i] for i in np.unique(owner[in_window]).tolist()}
    missing = [
        fam for fam in REQUIRED_FAMILIES if not any(n in present for n in _sample_names(fam))
    ]
    if missing:
        problems.append(
            f"missing metric families in the diagnosis window: {', '.join(missing)} "
            "(every demo stack exports them; a collector or the scrape was absent)"
        )
    if len(problems) > _MAX_PROBLEMS:
        problems = [*problems[:_MAX_PROBLEMS], f"... and {len(problems) - _MAX_PROBLEMS} more"]
    return problems


# ----------------------------------------------------------------- helpers


def _settings(label: Mapping[str, Any]) -> Mapping[str, Any]:
    """The label's ``diagnosis`` settings (``min_window_s``, ``rate_s``), or {}."""
    got = label.get("diagnosis")
    return got if isinstance(got, Mapping) else {}


def _diagnosis_window(label: Mapping[str, Any], end: float) -> tuple[float, float]:
    t_end = label.get("t_revert")
    d_end = float(t_end) if t_end is not None else float(end)
    least = float(_settings(label).get("min_window_s", MIN_DIAGNOSIS_WINDOW))
    return d_end, max(least, d_end - float(label["t_baseline"]))


def _polls(label: Mapping[str, Any]) -> list[tuple[float, float]]:
    """The label's ``polls`` (``[end, window]`` pairs), malformed ones skipped."""
    got = label.get("polls")
    if not isinstance(got, list):
        return []
    return [
        (float(p[0]), float(p[1]))
        for p in got
        if isinstance(p, list | tuple)
        and len(p) == 2
        and all(isinstance(v, int | float) and not isinstance(v, bool) for v in p)
    ]


def _needed_from(label: Mapping[str, Any], end: float) -> float:
    """Where the recorded diagnosis starts reading: its window, less its first rate's.

    A soak's label lists the diagnoses it asked (``polls``): the earliest of those
    reads first. Otherwise the one diagnosis validate judges. The ``${rate}`` window
    is the label's, else aivitals.diagnose's rule: a minute, at most a quarter of the
    window, at least 4 steps.
    """
    asked = _polls(label) or [_diagnosis_window(label, end)]

    def reach(d_end: float, window: float) -> float:
        rate = _settings(label).get("rate_s")
        if rate is None:
            rate = max(4 * float(label["tick"]), min(60.0, window / 4))
        return d_end - window - float(rate)

    return min(reach(d_end, window) for d_end, window in asked)


def _check_label(label: Any, where: str) -> None:
    """``ConfigError`` naming every missing or ill-typed field, and the inconsistencies."""
    if not isinstance(label, dict):
        raise ConfigError(f"{where}: the label must be a JSON object / dict")
    missing = [k for k in _FIELDS if k not in label]
    if missing:
        raise ConfigError(f"{where}: label fields missing: {', '.join(missing)}")
    wrong = []
    for key, (kinds, nullable) in _FIELDS.items():
        value = label[key]
        if value is None and nullable:
            continue
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            wrong.append(key)
    if wrong:
        raise ConfigError(f"{where}: label fields of the wrong type: {', '.join(wrong)}")
    name = label["name"]
    if not _NAME.fullmatch(name):
        raise ConfigError(
            f"{where}: label name {name!r} is not a plain file name "
            "(letters, digits, . _ + @ -; no path)"
        )
    problems = []
    if label["kind"] not in KINDS:
        problems.append(f"kind {label['kind']!r} is not one of {', '.join(KINDS)}")
    if label["severity"] is not None and label["severity"] not in SEVERITIES:
        problems.append(f"severity {label['severity']!r} is not one of {', '.join(SEVERITIES)}")
    for key in ("faults", "expected"):
        if not all(isinstance(x, str) and x for x in label[key]):
            problems.append(f"{key} must be a list of names")
    times = [label[k] for k in ("t_baseline", "t_fault", "t_revert")]
    if not all(t is None or math.isfinite(t) for t in times) or not (
        math.isfinite(label["tick"]) and label["tick"] > 0
    ):
        problems.append("times must be finite and tick > 0")
    elif any(
        a is not None and b is not None and a > b
        for a, b in ((times[0], times[1]), (times[1], times[2]), (times[0], times[2]))
    ):
        problems.append("expected t_baseline <= t_fault <= t_revert")
    kind, faults, expected = label["kind"], label["faults"], label["expected"]
    if kind == "fault" and (len(faults) != 1 or len(expected) != 1 or label["t_fault"] is None):
        problems.append("a fault recording has one fault, one expected signature and t_fault")
    if kind == "pair" and (len(faults) != 2 or not expected or label["t_fault"] is None):
        problems.append("a pair recording has two faults, their signatures and t_fault")
    if kind == "soak" and (faults or expected):
        problems.append("a soak recording has no faults and nothing expected (healthy)")
    if kind == "unknown" and (
        len(faults) != 1 or label["layer"] is None or not (expected or label.get("suspects"))
    ):
        problems.append(
            "an unknown-fault recording has one fault, its expected layer and its suspects"
        )
    if problems:
        raise ConfigError(f"{where}: bad label: {'; '.join(problems)}")


def _gaps(
    what: str, t: npt.NDArray[np.float64], lo: float, hi: float, limit: float, *, edges: bool
) -> list[str]:
    """Stretches longer than ``limit`` without a sample (also at the edges when asked)."""
    if len(t) == 0:
        return [f"{what}: no sample at all"] if edges else []
    points = np.concatenate([[lo], t, [hi]]) if edges else t
    d = np.diff(points)
    found = np.flatnonzero(d > limit)
    return [f"{what} for {d[i]:.1f} s ({points[i]:.3f}..{points[i + 1]:.3f})" for i in found]


def _sample_names(family: str) -> tuple[str, ...]:
    spec = signals.family_of(family)
    return spec.series_names() if spec is not None else (family,)


def _series_in(store: Store, start: float, end: float) -> int:
    labels, _, _, _ = store.fetch([("__name__", "=~", ".+")], _ms(start), _ms(end))
    return len(labels)


def _ms(t: float) -> int:
    return round(t * 1000)


def _show(labels: Sequence[tuple[str, str]]) -> str:
    lab = dict(labels)
    name = lab.pop("__name__", "")
    return name + "{" + ",".join(f'{k}="{v}"' for k, v in sorted(lab.items())) + "}"


def _alert_dict(a: Any) -> dict[str, Any]:
    """The fields of an ``AlertEvent`` the diagnosis reads (``_alert_events``)."""
    return {
        "alertname": str(getattr(a, "alertname", "")),
        "labels": {str(k): str(v) for k, v in dict(getattr(a, "labels", {}) or {}).items()},
        "state": str(getattr(a, "state", "")),
        "active_at": float(a.active_at),
        "fired_at": _opt_float(getattr(a, "fired_at", None)),
        "resolved_at": _opt_float(getattr(a, "resolved_at", None)),
    }


def _alert_event(a: Mapping[str, Any]) -> AlertEvent:
    """A recorded alert transition as the engine's ``AlertEvent`` (the diagnosis reads
    its name, labels, state and times; annotations and value are not recorded)."""
    state = str(a["state"])
    if state not in ("pending", "firing", "resolved"):
        raise ValueError(f"alert state {state!r}")
    return AlertEvent(
        alertname=str(a["alertname"]),
        labels={str(k): str(v) for k, v in dict(a.get("labels") or {}).items()},
        annotations={},
        state=cast(AlertState, state),
        active_at=float(a["active_at"]),
        fired_at=_opt_float(a.get("fired_at")),
        resolved_at=_opt_float(a.get("resolved_at")),
        value=math.nan,
    )


def _at(alert: Mapping[str, Any]) -> float:
    """The time of the recorded transition (``AlertEvent.at``)."""
    return _alert_event(alert).at


def _opt_float(value: Any) -> float | None:
    return None if value is None else float(value)


def _jsonable(value: Any) -> Any:
    """Parameters that JSON has no type for (a Path, a tuple in a set) as text."""
    return str(value)


def _git_commit() -> str | None:
    """The checkout's commit when the package runs from one (a few ms); None otherwise."""
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=here,
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    commit = out.stdout.strip()
    return commit if out.returncode == 0 and re.fullmatch(r"[0-9a-f]{40}", commit) else None
