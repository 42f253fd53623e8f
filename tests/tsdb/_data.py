"""Generated series for the conformance test: counters with resets, gauges with gaps,
classic histograms, info metrics. Deterministic (seeded)."""

from __future__ import annotations

import math
import random
from collections.abc import Iterator

T0 = 1_700_000_000  # a fixed start, years back: Prometheus backfills it as old blocks
STEP = 15
HOURS = 3
END = T0 + HOURS * 3600
BUCKETS = ("0.05", "0.1", "0.25", "0.5", "1", "2.5", "+Inf")

Row = tuple[str, dict[str, str], float, int]


def _times(*, gap: tuple[int, int] | None = None, stop: int | None = None) -> Iterator[int]:
    for t in range(T0, END + 1, STEP):
        if gap and gap[0] <= t < gap[1]:
            continue
        if stop is not None and t >= stop:
            return
        yield t


def _counters(rng: random.Random) -> Iterator[Row]:
    for job in ("api", "worker"):
        for inst in ("a", "b", "c"):
            for code in ("200", "500"):
                labels = {"job": job, "instance": inst, "code": code}
                value = rng.uniform(0, 50)
                speed = rng.uniform(0.5, 20) if code == "200" else rng.uniform(0.01, 1)
                for t in _times(gap=(T0 + 4000, T0 + 4900) if inst == "b" else None):
                    if rng.random() < 0.004:
                        value = rng.uniform(0, 3)  # a restart resets the counter
                    value += round(rng.uniform(0, 2 * speed * STEP), 3)
                    yield "conf_requests_total", labels, value, t


def _gauges(rng: random.Random) -> Iterator[Row]:
    for inst in ("a", "b", "c"):
        for zone in ("0", "1"):
            labels = {"instance": inst, "zone": zone}
            gap = (T0 + 5000, T0 + 5720) if (inst, zone) == ("c", "1") else None
            stop = END - 1800 if (inst, zone) == ("b", "0") else None
            temp = rng.uniform(20, 30)
            for t in _times(gap=gap, stop=stop):
                temp += rng.gauss(0, 0.3)
                yield "conf_temperature_celsius", labels, round(temp, 4), t
        depth = 3
        for t in _times():
            if rng.random() < 0.2:
                depth = max(0, depth + rng.choice((-2, -1, 1, 2)))
            yield "conf_queue_depth", {"instance": inst}, float(depth), t
        for job in ("api", "worker"):
            up_labels = {"instance": inst, "job": job}
            for t in _times():
                down = inst == "c" and job == "api" and T0 + 6000 <= t < T0 + 6600
                yield "conf_up", up_labels, 0.0 if down else 1.0, t
        for t in _times():
            yield "conf_info", {"instance": inst, "version": f"1.{ord(inst) - 96}"}, 1.0, t


def _odd_values(rng: random.Random) -> Iterator[Row]:
    """A gauge that is sometimes NaN or infinite, and a constant non-representable one."""
    for inst in ("a", "b", "c", "d"):
        for t in _times():
            roll = rng.random()
            if roll < 0.08:
                value = math.nan
            elif roll < 0.12:
                value = math.inf if inst != "d" else -math.inf
            else:
                value = round(rng.uniform(-5, 5), 3)
            yield "conf_ratio", {"instance": inst}, value, t
            yield "conf_const", {"instance": inst}, 0.1, t
    for t in _times():
        yield "conf_note", {"text": "first\nsecond", "quote": 'say "hi" \\ bye'}, 1.0, t


def _histograms(rng: random.Random) -> Iterator[Row]:
    bounds = [float(b) for b in BUCKETS]
    for inst in ("a", "b", "c"):
        counts = [0.0] * len(bounds)
        total = 0.0
        scale = rng.uniform(0.05, 0.6)
        for t in _times():
            if t == T0 + 7200 and inst == "a":
                counts, total = [0.0] * len(bounds), 0.0  # reset
            for _ in range(rng.randint(0, 40)):
                obs = rng.expovariate(1 / scale)
                total += obs
                for i, ub in enumerate(bounds):
                    if obs <= ub:
                        counts[i] += 1
            for le, c in zip(BUCKETS, counts, strict=True):
                yield "conf_latency_seconds_bucket", {"instance": inst, "le": le}, c, t
            yield "conf_latency_seconds_count", {"instance": inst}, counts[-1], t
            yield "conf_latency_seconds_sum", {"instance": inst}, round(total, 6), t


def generate(seed: int = 7) -> list[Row]:
    rng = random.Random(seed)
    return [*_counters(rng), *_gauges(rng), *_histograms(rng), *_odd_values(rng)]


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _fmt_labels(labels: dict[str, str]) -> str:
    return ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items()))


def _fmt_value(v: float) -> str:
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(v)


def openmetrics(rows: list[Row]) -> str:
    """The rows as OpenMetrics, grouped by family then series, for promtool backfill."""
    families: dict[str, dict[str, list[tuple[float, int]]]] = {}
    for name, labels, value, t in rows:
        key = _fmt_labels(labels)
        families.setdefault(name, {}).setdefault(key, []).append((value, t))
    out: list[str] = []
    for name, series in families.items():
        out.append(f"# TYPE {name} gauge")
        for key, points in series.items():
            out.extend(f"{name}{{{key}}} {_fmt_value(v)} {t}" for v, t in points)
    out.append("# EOF")
    return "\n".join(out) + "\n"
