"""The exposition path: the fast line parser agrees with prometheus_client's parser,
and generated metric families round-trip through text -> store -> query."""

from __future__ import annotations

import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from aivitals.tsdb import Store
from aivitals.tsdb._exposition import ExpositionParser, parse_reference

T = 1_700_000_000.0

names = st.from_regex(r"[a-zA-Z_][a-zA-Z0-9_]{0,12}", fullmatch=True).filter(
    lambda n: not n.startswith("__")
)
label_values = st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12
)
values = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(10**15), max_value=10**15).map(float),
)
families = st.dictionaries(
    names,
    st.lists(
        st.tuples(st.dictionaries(names, label_values, max_size=3), values),
        min_size=1,
        max_size=4,
    ),
    min_size=1,
    max_size=4,
)


class _Fixed(Collector):
    def __init__(self, fams: dict[str, list[tuple[dict[str, str], float]]]) -> None:
        self.fams = fams

    def collect(self):  # type: ignore[no-untyped-def]
        for name, samples in self.fams.items():
            keys = sorted({k for labels, _ in samples for k in labels})
            fam = GaugeMetricFamily(f"m_{name}", "generated", labels=keys)
            seen = set()
            for labels, value in samples:
                full = tuple(labels.get(k, "") for k in keys)
                if full in seen:
                    continue
                seen.add(full)
                fam.add_metric(list(full), value)
            yield fam


def _expose(fams: dict[str, list[tuple[dict[str, str], float]]]) -> str:
    registry = CollectorRegistry()
    registry.register(_Fixed(fams))
    return generate_latest(registry).decode()


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(families)
def test_fast_parser_agrees_with_prometheus_client(
    fams: dict[str, list[tuple[dict[str, str], float]]],
) -> None:
    text = _expose(fams)
    fast = ExpositionParser().parse(text)
    reference = parse_reference(text, openmetrics=False)
    assert [r[0] for r in fast] == [r[0] for r in reference]
    assert all(_same(a[1], b[1]) for a, b in zip(fast, reference, strict=True))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(families)
def test_roundtrip_text_store_query(fams: dict[str, list[tuple[dict[str, str], float]]]) -> None:
    text = _expose(fams)
    store = Store()
    stats = store.ingest_exposition(text, timestamp=T)
    assert stats.rejected_total == 0
    expected = {r[0]: r[1] for r in parse_reference(text, openmetrics=False)}
    got = store.query('{__name__=~"m_.+"}', T)
    assert {tuple(sorted(s.labels.items())): s.value for s in got.vector}.keys() == expected.keys()
    for s in got.vector:
        assert _same(s.value, expected[tuple(sorted(s.labels.items()))])


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=200))
def test_arbitrary_text_never_crashes_and_never_half_stores(text: str) -> None:
    store = Store()
    store.ingest_exposition("keep 1\n", timestamp=T)
    try:
        store.ingest_exposition(text, timestamp=T + 15)
    except Exception as exc:
        from aivitals.errors import ExpositionError

        assert isinstance(exc, ExpositionError)
        assert store.metric_names() == ["keep"]
    assert store.query("keep", T).values() == [1.0]


def test_escaped_label_values_survive() -> None:
    text = 'x{a="quote \\" back \\\\ nl \\n",b="}{"} 3\n'
    rows = ExpositionParser().parse(text)
    assert rows == parse_reference(text, openmetrics=False)
    assert dict(rows[0][0])["a"] == 'quote " back \\ nl \n'
    assert dict(rows[0][0])["b"] == "}{"


def test_parser_cache_reuses_entries() -> None:
    parser = ExpositionParser()
    first = parser.parse_entries("a 1\n")
    second = parser.parse_entries("a 2\n")
    assert first[0][0] is second[0][0]


line_parts = st.tuples(
    names,
    st.dictionaries(names, label_values, max_size=3),
    st.sampled_from([" ", "  ", "\t", " \t "]),
    values,
    st.one_of(st.none(), st.integers(min_value=0, max_value=2 * 10**12)),
)


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _render(parts: tuple[str, dict[str, str], str, float, int | None]) -> str:
    name, labels, gap, value, ts = parts
    body = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
    text = f"m_{name}{{{body}}}" if labels else f"m_{name}"
    text += f"{gap}{value!r}".replace("inf", "Inf").replace("nan", "NaN")
    return text + (f"{gap}{ts}" if ts is not None else "")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(line_parts, min_size=1, max_size=6))
def test_hand_written_lines_agree_warm_and_cold(
    lines: list[tuple[str, dict[str, str], str, float, int | None]],
) -> None:
    text = "\n".join(_render(p) for p in lines) + "\n"
    reference = parse_reference(text, openmetrics=False)
    parser = ExpositionParser()
    for _ in range(2):  # the second pass takes the warm key-cache path
        rows = parser.parse(text)
        assert [(r[0], r[2]) for r in rows] == [(r[0], r[2]) for r in reference]
        assert all(_same(a[1], b[1]) for a, b in zip(rows, reference, strict=True))
