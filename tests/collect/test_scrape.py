from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from aivitals.collect import Scraper, translate_exposition
from aivitals.errors import ConfigError
from tests._servers import free_port

VLLM = """# HELP vllm:num_requests_waiting Number of requests waiting.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="m"} 3.0
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="m"} 0.5
# TYPE DCGM_FI_DEV_FB_USED gauge
DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-x"} 1024 1700000000000
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{le="0.1"} 4
vllm:time_to_first_token_seconds_bucket{le="+Inf"} 5
vllm:time_to_first_token_seconds_sum 0.9
vllm:time_to_first_token_seconds_count 5
my_own_metric{a="b"} 7
"""
MB = 1024 * 1024


class _Handler(BaseHTTPRequestHandler):
    sent: dict[str, int] = {}

    def log_message(self, *args: object) -> None:
        pass

    def _body(self, body: bytes, status: int = 200, length: int | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body) if length is None else length))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        path = self.path
        if path == "/ok":
            self._body(VLLM.encode())
        elif path == "/garbage":
            self._body(b"this is {{ not an exposition\n\x00\x01")
        elif path == "/notutf8":
            self._body(b"metric 1\n\xff\xfe\n")
        elif path == "/truncated":
            self._body(b"metric_a 1\nmetric_b{x=", length=1000)
        elif path == "/status500":
            self._body(b"boom", status=500)
        elif path == "/trickle":
            self.send_response(200)
            self.end_headers()
            try:
                for i in range(40):  # a line every 0.2 s: 8 s in all
                    self.wfile.write(b"slow_metric %d\n" % i)
                    self.wfile.flush()
                    time.sleep(0.2)
            except OSError:
                pass
            self.close_connection = True
        elif path == "/hang":
            time.sleep(5)  # never answers within the scrape timeout
        elif path == "/huge-declared":
            self.send_response(200)
            self.send_header("Content-Length", str(100 * MB))
            self.end_headers()
            self.wfile.write(b"# a 100 MB body that is never read\n")
        elif path == "/huge-stream":
            self.send_response(200)
            self.end_headers()  # no length: read until the server closes
            line = b'big_metric{i="%d"} 1\n'
            chunk = b"".join(line % i for i in range(40_000))
            sent = 0
            try:
                while sent < 100 * MB:
                    self.wfile.write(chunk)
                    sent += len(chunk)
            except OSError:
                pass  # the scraper hung up: what we want
            _Handler.sent["huge"] = sent
            self.close_connection = True


@contextmanager
def server() -> Iterator[str]:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    srv.daemon_threads = True
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


def test_translate_exposition_applies_aliases() -> None:
    text, samples = translate_exposition(VLLM)
    assert samples == 8
    lines = text.splitlines()
    assert 'queue_length{model_name="m",queue="engine"} 3.0' in lines
    assert "# TYPE queue_length gauge" in lines
    assert 'kv_cache_usage_ratio{model_name="m"} 0.5' in lines
    # DCGM reports MiB; ours is bytes. The timestamp stays.
    assert 'gpu_memory_used_bytes{gpu="0",UUID="GPU-x"} 1073741824.0 1700000000000' in lines
    assert 'model_time_to_first_token_seconds_bucket{le="0.1"} 4' in lines
    assert "model_time_to_first_token_seconds_count 5" in lines
    assert 'my_own_metric{a="b"} 7' in lines


def test_translate_leaves_plain_text_alone() -> None:
    text = 'a_metric{x="1"} 2\n# HELP a_metric help\n'
    assert translate_exposition(text) == (text, 1)


def test_scrape_ok_is_translated() -> None:
    with server() as base:
        scraper = Scraper(base + "/ok", job="vllm")
        result = scraper.fetch()
    assert result.ok and result.reason == "" and result.samples == 8
    assert result.text is not None and "queue_length{" in result.text
    health = {s.name: s for s in scraper.health_samples(result, {})}
    assert health["up"].value == 1 and health["up"].labels == {
        "job": "vllm",
        "instance": base.removeprefix("http://"),
    }
    assert health["aivitals_scrape_samples"].value == 8


@pytest.mark.parametrize(
    ("path", "reason"),
    [
        ("/status500", "http_status"),
        ("/truncated", "parse"),
        ("/notutf8", "parse"),
        ("/huge-declared", "too_large"),
    ],
)
def test_bad_targets_fail_with_a_reason(path: str, reason: str) -> None:
    with server() as base:
        result = Scraper(base + path, timeout=3.0, max_bytes=10 * MB).fetch()
    assert not result.ok and result.reason == reason


def test_huge_stream_is_refused_without_reading_it_all() -> None:
    with server() as base:
        result = Scraper(base + "/huge-stream", timeout=10.0, max_bytes=4 * MB).fetch()
        deadline = time.monotonic() + 10
        while "huge" not in _Handler.sent and time.monotonic() < deadline:
            time.sleep(0.05)
    assert result.reason == "too_large"
    assert result.nbytes <= 4 * MB + 64 * 1024
    assert _Handler.sent["huge"] < 100 * MB  # the server was cut off long before 100 MB


def test_target_that_never_answers_times_out() -> None:
    with server() as base:
        start = time.monotonic()
        result = Scraper(base + "/hang", timeout=0.5).fetch()
        assert time.monotonic() - start < 3
    assert result.reason == "timeout"


def test_trickling_target_cannot_stretch_the_timeout() -> None:
    with server() as base:
        start = time.monotonic()
        result = Scraper(base + "/trickle", timeout=1.0).fetch()
        took = time.monotonic() - start
    assert result.reason == "timeout"
    assert took < 1.5, took


def test_refused() -> None:
    result = Scraper(f"http://127.0.0.1:{free_port()}/metrics", timeout=2.0).fetch()
    assert result.reason == "refused"


def test_garbage_is_fetched_and_left_to_the_parser() -> None:
    # The scraper passes text on; the store's parser refuses it (see the agent tests).
    with server() as base:
        result = Scraper(base + "/garbage").fetch()
    assert result.ok


@pytest.mark.parametrize(
    ("kwargs", "word"),
    [
        ({"url": "ftp://x/metrics"}, "url"),
        ({"url": "http:///metrics"}, "url"),
        ({"url": "http://x/metrics", "timeout": 0}, "timeout"),
        ({"url": "http://x/metrics", "max_bytes": 0}, "max_bytes"),
    ],
)
def test_bad_config(kwargs: dict[str, object], word: str) -> None:
    url = kwargs.pop("url")
    with pytest.raises(ConfigError, match=word):
        Scraper(str(url), **kwargs)  # type: ignore[arg-type]


def test_a_prometheus_client_target_answers_the_text_format() -> None:
    """prometheus_client answers OpenMetrics whenever the Accept header names it, and
    OpenMetrics goes to the store's slow reference parser (~100x the fast path's time)."""
    from prometheus_client import CollectorRegistry, Counter, start_http_server

    registry = CollectorRegistry()
    Counter("demo_requests", "requests", ["route"], registry=registry).labels("/v1").inc()
    port = free_port()
    srv, thread = start_http_server(port, addr="127.0.0.1", registry=registry)
    try:
        result = Scraper(f"http://127.0.0.1:{port}/metrics", job="demo").fetch()
    finally:
        srv.shutdown()
        thread.join(5)
    assert result.ok, result.reason
    assert result.text is not None and 'demo_requests_total{route="/v1"} 1.0' in result.text
    assert "# EOF" not in result.text


class _OpenMetricsOnly(BaseHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        body = b'# TYPE om_only counter\nom_only_total{a="b"} 3.0\n# EOF\n'
        self.send_response(200)
        self.send_header("Content-Type", "application/openmetrics-text; version=1.0.0")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def test_a_target_that_speaks_only_openmetrics_is_still_stored() -> None:
    from aivitals.tsdb import Store

    srv = ThreadingHTTPServer(("127.0.0.1", 0), _OpenMetricsOnly)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        result = Scraper(f"http://127.0.0.1:{srv.server_address[1]}/m", job="om").fetch()
    finally:
        srv.shutdown()
        srv.server_close()
    assert result.ok and result.text is not None
    store = Store(retention=1e9)
    store.ingest_exposition(result.text, timestamp=1000.0)
    assert store.query("om_only_total", 1000.0).vector[0].value == 3.0


def test_a_scraped_node_exporter_reads_under_our_filesystem_names() -> None:
    body = (
        "# HELP node_filesystem_avail_bytes Filesystem space available to non-root users.\n"
        "# TYPE node_filesystem_avail_bytes gauge\n"
        'node_filesystem_avail_bytes{device="/dev/sda1",fstype="ext4",mountpoint="/"} 5e+09\n'
        'node_filesystem_files_free{device="/dev/sda1",fstype="ext4",mountpoint="/"} 9000\n'
        'node_filesystem_files{device="/dev/sda1",fstype="ext4",mountpoint="/"} 10000\n'
        'node_cpu_seconds_total{cpu="0",mode="idle"} 12\n'
    )
    lines = translate_exposition(body)[0].splitlines()
    assert "# TYPE host_filesystem_available_bytes gauge" in lines
    lab = '{device="/dev/sda1",fstype="ext4",mountpoint="/"}'
    assert f"host_filesystem_available_bytes{lab} 5e+09" in lines  # unscaled: as sent
    # one name a prefix of another: each maps to its own family
    assert f"host_filesystem_files_free{lab} 9000" in lines
    assert f"host_filesystem_files{lab} 10000" in lines
    assert 'node_cpu_seconds_total{cpu="0",mode="idle"} 12' in lines  # no alias: kept
