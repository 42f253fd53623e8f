from __future__ import annotations

import numpy as np
import pytest

from aivitals.diagnose import load_signatures
from tests._paths import H200 as H200_DIR
from tests.diagnose import _corpus as corpus

H200 = H200_DIR / "scenarios.csv"


def test_every_fault_maps_to_a_signature_of_the_knowledge_base() -> None:
    ids = {s.id for s in load_signatures()}
    assert {expected for _, expected in corpus.FAULTS.values()} <= ids
    assert len(corpus.FAULTS) >= 25


def test_scenarios_are_reproducible_and_labelled_synthetic() -> None:
    a = corpus.scenario("traffic_surge", seed=3, duration=300.0, after=60.0)
    b = corpus.scenario("traffic_surge", seed=3, duration=300.0, after=60.0)
    assert a.source == "synthetic" and a.fault == "traffic_surge"
    assert a.fault_start == a.start + 240
    assert np.array_equal(a.state.rps, b.state.rps)


def test_partial_scenarios_drop_families_but_never_the_faults_own() -> None:
    sc = corpus.scenario("connection_flood", seed=2, duration=300.0, partial=True)
    assert len(sc.missing) == 3
    assert "host_tcp_connections" not in sc.missing
    names = {name for name, _, _, _ in corpus.samples(sc)}
    assert not any(n.startswith(sc.missing) for n in names)


def test_unknown_fault_is_refused() -> None:
    with pytest.raises(KeyError, match="unknown fault"):
        corpus.scenario("gremlins")


def test_a_restart_resets_the_service_counters() -> None:
    sc = corpus.scenario("cold_start", seed=1, duration=300.0, after=60.0)
    series = {(n, tuple(sorted(lab.items()))): v for n, lab, _, v in corpus.samples(sc)}
    counts = [v for (n, _), v in series.items() if n == "http_request_duration_seconds_count"]
    assert any((np.diff(v) < 0).any() for v in counts)


def test_openmetrics_groups_each_family_and_ends_with_eof() -> None:
    text = corpus.to_openmetrics(corpus.scenario("gpu_oom", seed=1, duration=120.0, after=30))
    assert text.endswith("# EOF\n")
    families = [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")]
    assert len(families) == len(set(families))


def test_h200_scenarios_come_from_the_real_recording() -> None:
    scs = corpus.h200_scenarios(H200)
    assert [s.fault for s in scs] == [
        "gpu_memory_leak",
        "gpu_cotenant",
        "gpu_contention",
        "gpu_oom",
    ]
    leak = scs[0]
    assert leak.source == "h200-recording"
    mem = leak.state.proc_mem["4242"]
    assert mem[-1] > 30 * 2**30 > mem[0]  # the recorded leak reaches tens of GiB
