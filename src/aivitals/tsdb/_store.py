"""The embedded store: series index, label postings, ingestion, retention, queries.

One lock guards the index and every series, so collector threads may append
while queries run; a query copies the sample windows it needs under the lock
and computes outside it.
"""

from __future__ import annotations

import contextlib
import math
import re
import threading
import time
from array import array
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from ..errors import CardinalityLimitError, ConfigError, SampleRejected
from ._exposition import EntryRow, ExpositionParser, Row
from ._series import STALE_NAN, Labels, Series, is_stale, label_key, seek
from ._types import QueryResult

if TYPE_CHECKING:
    from ..signals import Sample

__all__ = ["AppendStats", "Matcher", "Store"]

#: ``(label, op, value)`` with op one of ``= != =~ !~``.
Matcher = tuple[str, str, str]

_GC_EVERY = 50_000
_MAX_PARSERS = 10_000


@dataclass
class AppendStats:
    """What one batch append did: stored samples, refusals by reason, new series.

    ``rejected`` maps a reason (``out_of_order``, ``duplicate``,
    ``cardinality_limit``) to its count; nothing is raised per sample.
    """

    appended: int = 0
    rejected: dict[str, int] = field(default_factory=dict)
    series_created: int = 0
    stale_markers: int = 0

    @property
    def rejected_total(self) -> int:
        return sum(self.rejected.values())

    def _reject(self, reason: str) -> None:
        self.rejected[reason] = self.rejected.get(reason, 0) + 1


def _compile(value: str) -> re.Pattern[str]:
    try:
        return re.compile(f"(?:{value})", re.DOTALL)
    except re.error as exc:
        from ..errors import QueryError

        raise QueryError(f"invalid regular expression {value!r}: {exc}") from exc


def _matches(op: str, want: str, got: str, rx: re.Pattern[str] | None) -> bool:
    if op == "=":
        return got == want
    if op == "!=":
        return got != want
    assert rx is not None
    found = rx.fullmatch(got) is not None
    return found if op == "=~" else not found


class Store:
    """An in-memory, thread-safe time-series store that answers PromQL.

    ::

        store = Store(retention=3600)
        store.append("up", {"job": "api"}, 1.0, time.time())
        store.query('up{job="api"}').values()   # [1.0]

    ``retention`` is in seconds, counted back from the newest sample stored;
    ``max_series`` caps the number of series (new ones past it are refused).
    """

    def __init__(self, *, retention: float = 3600.0, max_series: int = 1_000_000) -> None:
        if not (isinstance(retention, int | float) and math.isfinite(retention) and retention > 0):
            raise ConfigError(f"retention must be a positive number of seconds, got {retention!r}")
        if not isinstance(max_series, int) or isinstance(max_series, bool) or max_series < 1:
            raise ConfigError(f"max_series must be a positive integer, got {max_series!r}")
        self.retention = float(retention)
        self.max_series = max_series
        self._lock = threading.RLock()
        self._series: dict[Labels, Series] = {}
        self._postings: dict[str, dict[str, set[Series]]] = {}
        self._next_id = 0
        self._newest_ms = -(2**62)
        self._since_gc = 0
        self._parsers: dict[tuple[str | None, Labels], ExpositionParser] = {}
        self._targets: dict[str, set[Series]] = {}
        self._regex_cache: dict[str, re.Pattern[str]] = {}
        self._counts: dict[str, int] = {
            "appended": 0,
            "series_created": 0,
            "series_removed": 0,
            "samples_expired": 0,
            "stale_markers": 0,
        }
        self._rejected: dict[str, int] = {}
        self._memo = threading.local()

    # ----------------------------------------------------------------- writing

    def append(self, name: str, labels: Mapping[str, str], value: float, timestamp: float) -> None:
        """Store one sample; raises ``SampleRejected`` or ``CardinalityLimitError``."""
        key = label_key({**labels, "__name__": name})
        if not math.isfinite(timestamp):
            with self._lock:
                self._count_reject("bad_timestamp")
            raise SampleRejected("bad_timestamp", _show(key), 0)
        t_ms = _to_ms(timestamp)
        with self._lock:
            series = self._get_or_create(key)
            if series is None:
                self._count_reject("cardinality_limit")
                raise CardinalityLimitError(name, self.max_series)
            reason = series.append(t_ms, float(value))
            if reason is not None:
                self._count_reject(reason)
                raise SampleRejected(reason, _show(key), t_ms)
            self._stored(t_ms, 1)

    def append_samples(
        self, samples: Iterable[Sample], *, default_timestamp: float, target: str | None = None
    ) -> AppendStats:
        """Store many samples; refusals are counted by reason, never raised.

        With ``target`` (one collector's name), series that were in that target's
        previous batch and are missing from this one get a staleness marker at
        ``default_timestamp``, as a scrape's do: a GPU process that exited stops
        answering queries now, not after the 5-minute look-back.

        ::

            stats = store.append_samples(collector.collect(), default_timestamp=time.time())
        """
        default_ms = _to_ms(default_timestamp)
        rows: list[Row] = []
        bad: dict[str, int] = {}
        for s in samples:
            ts = s.timestamp
            if ts is not None and not math.isfinite(ts):
                bad["bad_timestamp"] = bad.get("bad_timestamp", 0) + 1
                continue
            try:
                value = float(s.value)
                labels = label_key({**s.labels, "__name__": s.name})
            except (TypeError, ValueError):  # a collector bug must not lose the batch
                bad["bad_sample"] = bad.get("bad_sample", 0) + 1
                continue
            rows.append((labels, value, default_ms if ts is None else round(ts * 1000)))
        stats = self._append_rows(rows, default_ms, target)
        for reason, n in bad.items():
            stats.rejected[reason] = n
            with self._lock:
                self._count_reject(reason, n)
        return stats

    def ingest_exposition(
        self,
        text: str,
        *,
        timestamp: float,
        extra_labels: Mapping[str, str] | None = None,
        target: str | None = None,
    ) -> AppendStats:
        """Parse one scrape (Prometheus text or OpenMetrics) and store it.

        Malformed text raises ``ExpositionError`` and stores nothing. With
        ``target``, series that were in that target's previous scrape and are
        missing now get a staleness marker, as Prometheus does.
        ``extra_labels`` (e.g. ``job``, ``instance``) are attached to every
        series; an exposed label of the same name is kept as ``exported_<name>``.

        ::

            store.ingest_exposition(text, timestamp=time.time(), target="api:8000")
        """
        t_ms = _to_ms(timestamp)
        extra = label_key(dict(extra_labels)) if extra_labels else ()
        with self._lock:
            parser = self._parsers.get((target, extra))
            if parser is None:
                if len(self._parsers) >= _MAX_PARSERS:  # caches only; they refill
                    self._parsers.clear()
                parser = self._parsers[(target, extra)] = ExpositionParser(extra)
        entries = parser.parse_entries(text)
        with self._lock:
            stats, seen = self._append_entries(entries, t_ms)
            if target is not None:
                self._mark_stale(target, seen, t_ms, stats)
        return stats

    def _append_entries(
        self, entries: Sequence[EntryRow], default_ms: int
    ) -> tuple[AppendStats, set[Series]]:
        stats = AppendStats()
        seen: set[Series] = set()
        add_seen = seen.add
        created = self._counts["series_created"]
        newest = default_ms
        appended = 0
        for entry, value, t_ms in entries:
            series = entry.series
            if series is None or series.dead:
                series = entry.series = self._get_or_create(entry.labels)
                if series is None:
                    stats._reject("cardinality_limit")
                    continue
            add_seen(series)
            t = default_ms if t_ms is None else t_ms
            ts = series.ts
            if len(ts) > series.start and t <= ts[-1]:
                stats._reject("duplicate" if t == ts[-1] else "out_of_order")
                continue
            ts.append(t)
            series.vals.append(value)
            appended += 1
            if t > newest:
                newest = t
        stats.appended = appended
        stats.series_created = self._counts["series_created"] - created
        for reason, n in stats.rejected.items():
            self._count_reject(reason, n)
        self._stored(newest, stats.appended)
        return stats, seen

    def _append_rows(
        self, rows: Sequence[Row], default_ms: int, target: str | None = None
    ) -> AppendStats:
        stats = AppendStats()
        newest = default_ms
        seen: set[Series] = set()
        with self._lock:
            series_map = self._series
            for labels, value, t_ms in rows:
                t = default_ms if t_ms is None else t_ms
                series = series_map.get(labels)
                if series is None:
                    series = self._get_or_create(labels)
                    if series is None:
                        stats._reject("cardinality_limit")
                        continue
                    stats.series_created += 1
                seen.add(series)
                reason = series.append(t, value)
                if reason is not None:
                    stats._reject(reason)
                    continue
                stats.appended += 1
                if t > newest:
                    newest = t
            for reason, n in stats.rejected.items():
                self._rejected[reason] = self._rejected.get(reason, 0) + n
            if target is not None:
                self._mark_stale(target, seen, default_ms, stats)
            self._stored(newest, stats.appended)
        return stats

    def _mark_stale(self, target: str, seen: set[Series], t_ms: int, stats: AppendStats) -> None:
        previous = self._targets.get(target, set())
        for series in previous - seen:
            if not series.dead and series.append(t_ms, STALE_NAN) is None:
                stats.stale_markers += 1
        self._counts["stale_markers"] += stats.stale_markers
        self._targets[target] = seen

    def _get_or_create(self, labels: Labels) -> Series | None:
        series = self._series.get(labels)
        if series is not None:
            return series
        if len(self._series) >= self.max_series:
            return None
        series = Series(self._next_id, labels)
        self._next_id += 1
        self._series[labels] = series
        for k, v in labels:
            self._postings.setdefault(k, {}).setdefault(v, set()).add(series)
        self._counts["series_created"] += 1
        return series

    def _count_reject(self, reason: str, n: int = 1) -> None:
        self._rejected[reason] = self._rejected.get(reason, 0) + n

    def _stored(self, t_ms: int, n: int) -> None:
        self._counts["appended"] += n
        if t_ms > self._newest_ms:
            self._newest_ms = t_ms
        self._since_gc += n
        # Expiry walks every series, so it runs at most once per series-count appends.
        if self._since_gc >= max(_GC_EVERY, len(self._series)):
            self.expire()

    def expire(self) -> int:
        """Drop samples older than the retention window; returns how many were dropped.

        Runs by itself every so many appends; call it to trim right away.
        """
        with self._lock:
            self._since_gc = 0
            min_t = self._newest_ms - int(self.retention * 1000)
            dropped = 0
            for labels, series in list(self._series.items()):
                dropped += series.trim_before(min_t)
                if len(series) == 0:
                    self._remove(labels)
            self._counts["samples_expired"] += dropped
            return dropped

    def _remove(self, labels: Labels) -> None:
        series = self._series.pop(labels)
        series.dead = True
        for k, v in labels:
            values = self._postings[k]
            values[v].discard(series)
            if not values[v]:
                del values[v]
                if not values:
                    del self._postings[k]
        self._counts["series_removed"] += 1

    # ----------------------------------------------------------------- reading

    def _select(self, matchers: Sequence[Matcher]) -> Iterator[Series]:
        candidates: set[Series] | None = None
        rest: list[tuple[str, str, str, re.Pattern[str] | None]] = []
        for name, op, value in matchers:
            if op == "=" and value != "":
                found = self._postings.get(name, {}).get(value, set())
                candidates = found if candidates is None else candidates & found
            else:
                rx = self._regex(value) if op in ("=~", "!~") else None
                rest.append((name, op, value, rx))
        pool: Iterable[Series] = self._series.values() if candidates is None else candidates
        if not rest:
            yield from pool
            return
        for series in pool:
            lab = dict(series.labels)
            if all(_matches(op, v, lab.get(n, ""), rx) for n, op, v, rx in rest):
                yield series

    def _regex(self, value: str) -> re.Pattern[str]:
        rx = self._regex_cache.get(value)
        if rx is None:
            rx = _compile(value)
            if len(self._regex_cache) > 10_000:
                self._regex_cache.clear()
            self._regex_cache[value] = rx
        return rx

    def fetch(
        self, matchers: Sequence[Matcher], mint: int, maxt: int
    ) -> tuple[list[Labels], npt.NDArray[np.int64], npt.NDArray[np.float64], npt.NDArray[np.int64]]:
        """Matching series' samples in ``[mint, maxt]`` ms, concatenated.

        Returns ``labels, t, v, off``: series i owns ``t[off[i]:off[i + 1]]``.
        Series without samples in the window are left out.
        """
        labels: list[Labels] = []
        t_parts: list[array[int]] = []
        v_parts: list[array[float]] = []
        counts: list[int] = []
        with self._lock:
            for s in sorted(self._select(matchers), key=_by_id):
                ts = s.ts
                lo = seek(ts, mint, s.start)
                hi = len(ts) if ts and ts[-1] <= maxt else seek(ts, maxt, lo, right=True)
                if hi > lo:
                    labels.append(s.labels)
                    t_parts.append(ts[lo:hi])  # array slices: C copies, no Python per sample
                    v_parts.append(s.vals[lo:hi])
                    counts.append(hi - lo)
        t = np.frombuffer(b"".join(t_parts), dtype=np.int64)
        v = np.frombuffer(b"".join(v_parts), dtype=np.float64)
        off = np.zeros(len(counts) + 1, dtype=np.int64)
        np.cumsum(counts, out=off[1:])
        return labels, t, v, off

    def latest(
        self, matchers: Sequence[Matcher], times: Sequence[int], lookback: int
    ) -> tuple[list[Labels], list[float], list[int], list[bool]]:
        """Per series and time, the newest sample in ``[time - lookback, time]``.

        The instant-selector path for few steps: a seek per series and step
        instead of copying windows. Returns ``labels`` and, row-major over
        (series, time), ``values, timestamps, present``; staleness markers
        count as absent; series never present are left out.
        """
        out_l: list[Labels] = []
        out_v: list[float] = []
        out_t: list[int] = []
        out_m: list[bool] = []
        with self._lock:
            for s in sorted(self._select(matchers), key=_by_id):
                ts, vals, start = s.ts, s.vals, s.start
                last = len(ts) - 1
                if last < start:
                    continue
                row_v, row_t, row_m = [], [], []
                for t in times:
                    # The newest sample is usually the one wanted: skip the search.
                    i = last if ts[last] <= t else seek(ts, t, start, right=True) - 1
                    if i >= start and ts[i] >= t - lookback:
                        v = vals[i]
                        if v == v or not is_stale(v):
                            row_v.append(v)
                            row_t.append(ts[i])
                            row_m.append(True)
                            continue
                    row_v.append(0.0)
                    row_t.append(0)
                    row_m.append(False)
                if True in row_m:
                    out_l.append(s.labels)
                    out_v += row_v
                    out_t += row_t
                    out_m += row_m
        return out_l, out_v, out_t, out_m

    def query(self, expr: str, at: float | None = None) -> QueryResult:
        """Evaluate PromQL at one instant (``at`` None means now).

        ::

            store.query("sum by (job) (rate(http_requests_total[5m]))", at=t)
        """
        from ._engine import instant_query

        return instant_query(self, expr, time.time() if at is None else at)

    def query_range(self, expr: str, start: float, end: float, step: float) -> QueryResult:
        """Evaluate PromQL at ``start, start+step, ... <= end``; returns a matrix."""
        from ._engine import range_query

        return range_query(self, expr, start, end, step)

    @contextlib.contextmanager
    def reusing_results(self) -> Iterator[None]:
        """Within the block, this thread's queries compute each aggregation once.

        An aggregation (``sum by (le) (rate(x_bucket[1m]))``) met again at the same
        steps, in the same query or a later one, is answered from the first result,
        so the answers read the samples as they were then: meant for a burst of
        related queries (one diagnosis asks the same histogram's sum for its median,
        its P99 and two ratios). Other threads' queries are not affected; the
        results are dropped when the block ends. ::

            buckets = "sum by (le) (rate(x_bucket[1m]))"
            with store.reusing_results():  # the sum computed once
                p50 = store.query_range(f"histogram_quantile(0.5, {buckets})", a, b, 1)
                p99 = store.query_range(f"histogram_quantile(0.99, {buckets})", a, b, 1)
        """
        outer = getattr(self._memo, "results", None)
        if outer is None:
            self._memo.results = {}
        try:
            yield
        finally:
            if outer is None:  # the outermost block owns the results
                self._memo.results = None

    def _reused(self) -> dict[Any, Any] | None:
        """This thread's shared results inside ``reusing_results``; else None."""
        results: dict[Any, Any] | None = getattr(self._memo, "results", None)
        return results

    @property
    def series_count(self) -> int:
        with self._lock:
            return len(self._series)

    def metric_names(self) -> list[str]:
        """Every metric name stored, sorted."""
        return self.label_values("__name__")

    def label_values(self, label: str, metric: str | None = None) -> list[str]:
        """The values ``label`` takes, over all series or those of one metric."""
        with self._lock:
            if metric is None:
                return sorted(self._postings.get(label, {}))
            names = self._postings.get("__name__", {}).get(metric, set())
            values = (dict(s.labels).get(label) for s in names)
            return sorted({v for v in values if v is not None})

    def stats(self) -> dict[str, Any]:
        """Counters and sizes: series, samples, bytes, appends, refusals by reason."""
        with self._lock:
            samples = sum(len(s) for s in self._series.values())
            nbytes = sum(s.nbytes() for s in self._series.values())
            return {
                "series": len(self._series),
                "samples": samples,
                "bytes": nbytes,
                "retention_seconds": self.retention,
                "max_series": self.max_series,
                "newest_timestamp": (self._newest_ms / 1000 if self._series else None),
                "rejected": dict(self._rejected),
                **self._counts,
            }

    # --------------------------------------------------------------- snapshots

    def save(
        self, path: str | Path, *, start: float | None = None, end: float | None = None
    ) -> int:
        """Write a versioned, compressed snapshot; returns the number of samples saved.

        ::

            store.save("incident.aivsnap", start=t0, end=t1)
            again = Store.load("incident.aivsnap")
        """
        from ._snapshot import save_snapshot

        return save_snapshot(self, Path(path), start=start, end=end)

    @classmethod
    def load(cls, path: str | Path) -> Store:
        """Read a snapshot written by ``save``; ``StoreError`` if it is not one."""
        from ._snapshot import load_snapshot

        return load_snapshot(cls, Path(path))

    def _all_series(self) -> list[Series]:
        with self._lock:
            return sorted(self._series.values(), key=lambda s: s.labels)


def _by_id(series: Series) -> int:
    return series.id


def _to_ms(timestamp: float) -> int:
    if not math.isfinite(timestamp):
        raise SampleRejected("bad_timestamp", "?", 0)
    return round(timestamp * 1000)


def _show(labels: Labels) -> str:
    lab = dict(labels)
    name = lab.pop("__name__", "")
    inner = ",".join(f'{k}="{v}"' for k, v in lab.items())
    return f"{name}{{{inner}}}"
