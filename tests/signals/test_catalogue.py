from __future__ import annotations

import re

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from aivitals import signals
from aivitals.signals import MetricType
from tests._servers import promtool

NAME_RE = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
LABEL_RE = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


def test_every_name_and_label_is_valid_prometheus() -> None:
    for spec in signals.iter_metrics():
        assert NAME_RE.match(spec.name), spec.name
        for label in spec.labels:
            assert LABEL_RE.match(label) and not label.startswith("__"), (spec.name, label)
        assert spec.help.strip(), spec.name


def test_naming_conventions() -> None:
    for spec in signals.iter_metrics():
        if spec.type is MetricType.COUNTER:
            assert spec.name.endswith("_total"), spec.name
        else:
            assert not spec.name.endswith("_total"), spec.name
        if spec.unit in {"seconds", "bytes"} and spec.type is not MetricType.COUNTER:
            assert spec.unit in spec.name, spec.name
        if spec.type is MetricType.HISTOGRAM:
            assert spec.buckets and list(spec.buckets) == sorted(spec.buckets), spec.name


def test_golden_metrics_and_core_indicators_are_catalogued() -> None:
    for name in (
        "model_inference_time_seconds",
        "gpu_memory_used_bytes",
        "gpu_process_memory_used_bytes",
        "model_input_tokens",
        "model_output_tokens",
        "cuda_stream_wait_time_seconds",
        "kv_cache_hits_total",
        "kv_cache_queries_total",
        "http_request_body_size_bytes",
        "model_load_time_seconds",
        "queue_length",
        "queue_wait_seconds",
        "gpu_utilization_ratio",
        "worker_pool_active_workers",
        "worker_pool_max_workers",
    ):
        assert signals.get(name).name == name


def test_unknown_metric_is_a_clear_key_error() -> None:
    with pytest.raises(KeyError, match="not in the aivitals signal catalogue"):
        signals.get("no_such_metric")


def test_family_of_histogram_samples() -> None:
    spec = signals.family_of("http_request_duration_seconds_bucket")
    assert spec is not None and spec.name == "http_request_duration_seconds"
    assert signals.family_of("nope_bucket") is None


@pytest.mark.parametrize(
    ("foreign", "ours", "scale", "labels"),
    [
        ("vllm:num_requests_waiting", "queue_length", 1.0, (("queue", "engine"),)),
        ("vllm:gpu_cache_usage_perc", "kv_cache_usage_ratio", 1.0, ()),
        ("vllm:kv_cache_usage_perc", "kv_cache_usage_ratio", 1.0, ()),
        (
            "vllm:time_to_first_token_seconds_bucket",
            "model_time_to_first_token_seconds_bucket",
            1.0,
            (),
        ),
        (
            "vllm:time_per_output_token_seconds_count",
            "model_time_per_output_token_seconds_count",
            1.0,
            (),
        ),
        ("tgi_queue_size", "queue_length", 1.0, (("queue", "engine"),)),
        ("nv_inference_queue_duration_us", "queue_wait_seconds_sum", 1e-6, (("queue", "engine"),)),
        ("DCGM_FI_DEV_FB_USED", "gpu_memory_used_bytes", 1024.0 * 1024.0, ()),
        ("DCGM_FI_DEV_GPU_UTIL", "gpu_utilization_ratio", 0.01, ()),
        ("node_filesystem_avail_bytes", "host_filesystem_available_bytes", 1.0, ()),
        ("node_filesystem_size_bytes", "host_filesystem_size_bytes", 1.0, ()),
        (
            "gen_ai_server_time_to_first_token_seconds_sum",
            "model_time_to_first_token_seconds_sum",
            1.0,
            (),
        ),
    ],
)
def test_aliases(
    foreign: str, ours: str, scale: float, labels: tuple[tuple[str, str], ...]
) -> None:
    assert signals.translate(foreign) == (ours, scale, labels)


def test_aliases_point_at_catalogued_families() -> None:
    for alias in signals.ALIASES:
        target = alias.ours
        assert signals.family_of(target) is not None, alias


def test_unknown_foreign_name_is_not_translated() -> None:
    assert signals.translate("vllm:something_new") is None
    # A non-histogram alias must not swallow suffixed names.
    assert signals.translate("tgi_queue_size_bucket") is None


def test_error_codes_table_is_complete() -> None:
    assert set(signals.ERROR_CODES) == set(signals.ErrorCode)
    for info in signals.ERROR_CODES.values():
        assert 400 <= info.http_status < 600


def test_classify_real_torch_oom_text() -> None:
    from tests._paths import H200

    text = (H200 / "leak-stdout.txt").read_text()
    line = next(ln for ln in text.splitlines() if "out of memory" in ln.lower())

    class OutOfMemoryError(RuntimeError):
        pass

    assert signals.classify_exception(OutOfMemoryError(line)) is signals.ErrorCode.CUDA_OOM
    assert signals.classify_exception(RuntimeError(line)) is signals.ErrorCode.CUDA_OOM
    assert (
        signals.classify_exception(RuntimeError("CUDA error: an illegal memory access"))
        is signals.ErrorCode.CUDA_ERROR
    )
    assert signals.classify_exception(UnicodeDecodeError("utf-8", b"\xff", 0, 1, "bad")) is (
        signals.ErrorCode.TOKENIZER_ERROR
    )
    assert signals.classify_exception(ValueError("x")) is signals.ErrorCode.MODEL_ERROR


def _exposition_of_whole_catalogue() -> str:
    registry = CollectorRegistry()
    for spec in signals.iter_metrics():
        m = signals.metric(spec.name, registry=registry)
        values = dict.fromkeys(spec.labels, "x")
        child = m.labels(**values) if spec.labels else m
        if spec.type is MetricType.COUNTER:
            child.inc()  # type: ignore[attr-defined]
        elif spec.type is MetricType.GAUGE:
            child.set(1)  # type: ignore[attr-defined]
        elif spec.type is MetricType.HISTOGRAM:
            child.observe(0.5)  # type: ignore[attr-defined]
        else:
            m.info({"version": "1"}) if not spec.labels else child.info({"v": "1"})  # type: ignore[attr-defined]
    return generate_latest(registry).decode()


def test_metric_factory_builds_every_family() -> None:
    text = _exposition_of_whole_catalogue()
    for spec in signals.iter_metrics():
        assert f"# TYPE {spec.name.removesuffix('_total')}" in text or spec.name in text


@pytest.mark.integration
def test_promtool_check_metrics_accepts_the_catalogue() -> None:
    result = promtool("check", "metrics", input_text=_exposition_of_whole_catalogue())
    assert result.returncode == 0, result.stdout + result.stderr
