"""The SIMULATED fleet's live exposition (``aivitals.fleet._expose``): what a real
Prometheus or vmagent scrapes in ``benchmarks/fleet.py --scrape``."""

from __future__ import annotations

import asyncio
import itertools
import json
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from aivitals.errors import ConfigError
from aivitals.fleet._expose import (
    AGENT_HOST_SERIES,
    AGENT_SERIES_PER_GPU,
    JOBS,
    SERVICE_SERIES,
    LiveFleet,
    serve,
    write_file_sd,
)
from aivitals.fleet._synth import RecordedShapes, SynthFleet
from aivitals.signals import family_of
from aivitals.tsdb._exposition import ExpositionParser

RECORDING = Path(__file__).resolve().parents[1] / "fixtures" / "gpu" / "h200" / "scenarios.csv"
START = 1_800_000_000.0


@pytest.fixture(scope="module")
def shapes() -> RecordedShapes:
    return RecordedShapes.load(RECORDING)


def live(shapes: RecordedShapes, *, nodes: int = 5, warmup: float | None = 60.0) -> LiveFleet:
    fleet = SynthFleet(shapes, nodes=nodes, gpus=4, faulty_node=3, faulty_gpu=1, seed=2)
    return LiveFleet(fleet, start=START, warmup=warmup)


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def test_pages_parse_with_both_parsers(shapes: RecordedShapes) -> None:
    lf = live(shapes)
    t = START + 30.0
    agent, service = lf.agent_text(2, t), lf.service_text(2, t)
    assert len(samples(agent)) == 4 * AGENT_SERIES_PER_GPU + AGENT_HOST_SERIES
    assert len(samples(service)) == SERVICE_SERIES
    for text in (agent, service):
        rows = ExpositionParser().parse(text)
        assert len(rows) == len(samples(text))
    # simulated, and said so on every GPU series and every family's help
    assert all(dict(k[1])["backend"] == "sim" for k in samples(agent) if k[0].startswith("gpu_"))
    for text in (agent, service):
        helps = [line for line in text.splitlines() if line.startswith("# HELP")]
        assert helps and all("SIMULATED" in line for line in helps)


def test_the_agent_page_has_the_families_a_real_agent_exports(shapes: RecordedShapes) -> None:
    """Beside the GPU: the host, the server process, the kernel log and the collectors,
    each under its catalogue name with exactly its catalogue labels, so the rule pack's
    host rules read them (HostMetricsAbsent does not fire on a simulated node)."""
    page = samples(live(shapes).agent_text(1, START + 30.0))
    families = {name for name, _ in page}
    for name, labels in page:
        spec = family_of(name)
        assert spec is not None, name
        if not name.startswith("gpu_"):
            assert {k for k, _ in labels} == set(spec.labels), name
    for family in (
        "host_cpu_seconds_total",
        "host_memory_available_bytes",
        "host_filesystem_available_bytes",
        "host_disk_io_time_seconds_total",
        "host_network_receive_bytes_total",
        "host_tcp_retransmitted_segments_total",
        "service_process_resident_memory_bytes",
        "kernel_oom_kills_total",
        "aivitals_collector_up",
    ):
        assert family in families, family
    # a steady host: a third or so of its CPUs busy, and far from any alert level
    modes = {dict(k)["mode"]: v for (n, k), v in page.items() if n == "host_cpu_seconds_total"}
    assert 0.1 <= 1 - modes["idle"] / sum(modes.values()) <= 0.6


def test_each_node_has_its_own_values(shapes: RecordedShapes) -> None:
    lf = live(shapes)
    t = START + 200.0
    agents = [samples(lf.agent_text(i, t)) for i in range(1, 6)]
    services = [samples(lf.service_text(i, t)) for i in range(1, 6)]
    for pages in (agents, services):
        values = [tuple(p.values()) for p in pages]
        assert len(set(values)) == len(values)


def test_counters_only_grow(shapes: RecordedShapes) -> None:
    lf = live(shapes)
    for page in (lf.service_text, lf.agent_text):
        before = samples(page(4, START + 100.0))
        after = samples(page(4, START + 115.0))
        for key, value in before.items():
            if key[0].endswith(("_total", "_count", "_bucket", "_sum")):
                assert after[key] >= value, key


def process_memory(lf: LiveFleet, node: int, gpu: int, t: float) -> float:
    return float(lf.gpu_values(node, t)["server_proc_mem"][gpu])


def test_the_leak_node_gpu_grows_after_the_warmup(shapes: RecordedShapes) -> None:
    lf = live(shapes, warmup=60.0)
    leak = [process_memory(lf, 3, 1, START + 60.0 + 15.0 * k) for k in range(10)]
    assert all(b > a + 5e8 for a, b in itertools.pairwise(leak)), leak
    # before the warm-up ends, and on its neighbours, memory stays within the noise
    early = [process_memory(lf, 3, 1, START + 15.0 * k) for k in range(4)]
    other = [process_memory(lf, 3, 0, START + 60.0 + 15.0 * k) for k in range(10)]
    for flat in (early, other):
        assert max(flat) < 1.2 * min(flat)


def test_no_warmup_means_no_fault(shapes: RecordedShapes) -> None:
    lf = live(shapes, warmup=None)
    leak = [process_memory(lf, 3, 1, START + 15.0 * k) for k in range(20)]
    assert max(leak) < 1.2 * min(leak)


def test_same_step_same_values_for_every_scraper(shapes: RecordedShapes) -> None:
    lf = live(shapes)
    assert lf.agent_text(1, START + 31.0) == lf.agent_text(1, START + 44.0)
    assert lf.agent_text(1, START + 31.0) != lf.agent_text(1, START + 46.0)


def test_file_sd_lists_every_node(shapes: RecordedShapes, tmp_path: Path) -> None:
    lf = live(shapes, nodes=7)
    paths = write_file_sd(lf, "127.0.0.1:9100", tmp_path)
    assert set(paths) == set(JOBS)
    for job, path in paths.items():
        groups = json.loads(path.read_text())
        assert [g["labels"]["node"] for g in groups] == [f"sim-node-{i}" for i in range(1, 8)]
        assert all(g["targets"] == ["127.0.0.1:9100"] for g in groups)
        for g in groups:
            assert lf.page(g["labels"]["__metrics_path__"], START) is not None, job


def test_bad_input(shapes: RecordedShapes) -> None:
    lf = live(shapes)
    assert lf.page("/node/6/agent/metrics", START) is None  # no such node
    assert lf.page("/node/0/agent/metrics", START) is None
    assert lf.page("/metrics", START) is None
    with pytest.raises(ConfigError, match=r"nodes 1\.\.5"):
        lf.agent_text(9, START)
    with pytest.raises(ConfigError, match="job"):
        lf.file_sd("node-exporter", "127.0.0.1:1")
    with pytest.raises(ConfigError, match="warmup"):
        live(shapes, warmup=-1.0)


def test_served_over_http(shapes: RecordedShapes) -> None:
    lf = live(shapes)

    async def scenario() -> tuple[int, str, int]:
        ready: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        server = asyncio.create_task(serve(lf, "127.0.0.1", 0, ready))
        port = await ready
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            ok = await client.get("/node/2/service/metrics")
            again = await client.get("/node/2/agent/metrics")  # same keep-alive connection
            missing = await client.get("/node/99/agent/metrics")
        server.cancel()
        return ok.status_code, again.text, missing.status_code

    status, text, missing = asyncio.run(scenario())
    assert status == 200 and missing == 404
    assert len(samples(text)) == 4 * AGENT_SERIES_PER_GPU + AGENT_HOST_SERIES
