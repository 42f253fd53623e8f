"""PrometheusBackend: error mapping at the boundary, and a real VictoriaMetrics."""

from __future__ import annotations

import socket

import httpx
import pytest

from aivitals.errors import BackendError, BackendTimeout, ConfigError, QueryError
from aivitals.tsdb import Backend, PrometheusBackend, Store
from tests._servers import free_port, victoria_metrics

T = 1_700_000_000


def test_is_a_backend() -> None:
    with PrometheusBackend("http://127.0.0.1:1") as prom:
        assert isinstance(prom, Backend)


@pytest.mark.parametrize(
    ("url", "timeout"), [("127.0.0.1:9090", 1.0), ("http://x", 0.0), ("http://x", float("nan"))]
)
def test_bad_arguments(url: str, timeout: float) -> None:
    with pytest.raises(ConfigError):
        PrometheusBackend(url, timeout=timeout)


def test_connection_refused_is_backend_error() -> None:
    with (
        PrometheusBackend(f"http://127.0.0.1:{free_port()}", timeout=2) as prom,
        pytest.raises(BackendError) as info,
    ):
        prom.query("up", T)
    assert not isinstance(info.value, BackendTimeout)


def test_silent_server_is_backend_timeout() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)  # accepts the connection in the kernel, never answers
        port = listener.getsockname()[1]
        with (
            PrometheusBackend(f"http://127.0.0.1:{port}", timeout=0.3) as prom,
            pytest.raises(BackendTimeout),
        ):
            prom.query("up", T)


def _answer(status: int, body: object) -> PrometheusBackend:
    prom = PrometheusBackend("http://prom.test")
    transport = httpx.MockTransport(lambda request: httpx.Response(status, json=body))
    prom._client = httpx.Client(transport=transport)
    return prom


def test_bad_data_is_query_error() -> None:
    body = {"status": "error", "errorType": "bad_data", "error": "parse error at char 5"}
    with _answer(400, body) as prom, pytest.raises(QueryError, match="parse error"):
        prom.query("sum(", T)


def test_server_error_is_backend_error() -> None:
    body = {"status": "error", "errorType": "internal", "error": "boom"}
    with _answer(500, body) as prom, pytest.raises(BackendError, match="boom"):
        prom.query("up", T)


def test_non_json_is_backend_error() -> None:
    prom = PrometheusBackend("http://prom.test")
    prom._client = httpx.Client(
        transport=httpx.MockTransport(lambda r: httpx.Response(502, text="<html>bad gateway"))
    )
    with prom, pytest.raises(BackendError, match="502"):
        prom.query("up", T)


def test_result_shapes_are_decoded() -> None:
    body = {
        "status": "success",
        "data": {"resultType": "vector", "result": [{"metric": {"a": "1"}, "value": [T, "NaN"]}]},
    }
    with _answer(200, body) as prom:
        (sample,) = prom.query("x", T).vector
        assert sample.labels == {"a": "1"} and sample.value != sample.value


@pytest.mark.integration
def test_against_real_victoria_metrics() -> None:
    store = Store()
    lines = []
    for i in range(120):
        t = T + 15 * i
        for pod, speed in (("a", 2.0), ("b", 3.0)):
            store.append("vm_requests_total", {"pod": pod}, speed * i, t)
            lines.append(f'vm_requests_total{{pod="{pod}"}} {speed * i} {t * 1000}')
    with victoria_metrics() as vm:
        r = httpx.post(f"{vm.url}/api/v1/import/prometheus", content="\n".join(lines) + "\n")
        assert r.status_code == 204, r.text
        httpx.get(f"{vm.url}/internal/force_flush")
        at = T + 15 * 119
        with PrometheusBackend(vm.url) as prom:
            for _ in range(50):
                if prom.query("vm_requests_total", at).vector:
                    break
                import time

                time.sleep(0.1)
            for expr in ("vm_requests_total", 'sum(vm_requests_total{pod=~"a|b"})'):
                ours = {
                    tuple(sorted(s.labels.items())): s.value for s in store.query(expr, at).vector
                }
                theirs = {
                    tuple(sorted(s.labels.items())): s.value for s in prom.query(expr, at).vector
                }
                assert ours == theirs
            ranged = prom.query_range("sum(vm_requests_total)", at - 300, at, 60)
            assert ranged.type == "matrix" and len(ranged.matrix[0].points) == 6
            with pytest.raises(QueryError):
                prom.query("sum(", at)
