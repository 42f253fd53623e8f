from __future__ import annotations

import promql_parser
import pytest

from aivitals.dashboards import absent_all, alternatives, families_in, render_variables, series
from aivitals.errors import ConfigError

VALUES = {"node": ".*", "instance": ".*", "model": ".*", "gpu": ".*", "__rate_interval": "1m"}
VALUES |= {"namespace": ".*", "pod": ".*"}


def test_alternatives_follow_the_alias_table() -> None:
    names = [a.name for a in alternatives("kv_cache_usage_ratio")]
    # ours first; vLLM's current name and its pre-v1 name, so a rename never empties the
    # panel; then SGLang's
    assert names == [
        "kv_cache_usage_ratio",
        "vllm:kv_cache_usage_perc",
        "vllm:gpu_cache_usage_perc",
        "sglang:token_usage",
    ]
    bucket = [a.name for a in alternatives("model_time_to_first_token_seconds_bucket")]
    assert "vllm:time_to_first_token_seconds_bucket" in bucket
    # dotted OTel names are not classic PromQL names: only the underscore spelling is used
    assert all("." not in n for n in bucket)
    assert "gen_ai_server_time_to_first_token_seconds_bucket" in bucket


def test_scale_and_labels_are_applied() -> None:
    expr = series("gpu_memory_used_bytes")
    assert "DCGM_FI_DEV_FB_USED" in expr and "* 1048576" in expr
    triton = series("model_inference_time_seconds_sum", fn="rate")
    # the rate of a microsecond counter scaled after rate(), never inside it
    assert "rate(nv_inference_compute_infer_duration_us{" in triton
    assert "[$__rate_interval]) * 1e-06" in triton
    vllm = series("kv_cache_usage_ratio")
    assert 'model_name=~"$model"' in vllm
    assert "label_replace(vllm:kv_cache_usage_perc{" in vllm
    queue = series("queue_length")
    assert (
        'label_replace(vllm:num_requests_waiting{node=~"$node", instance=~"$instance"}, '
        '"queue", "engine"' in queue
    )


def test_variables_apply_only_to_families_with_the_label() -> None:
    assert "$gpu" not in series("http_request_duration_seconds_count")
    assert "$model" not in series("gpu_utilization_ratio")
    assert 'gpu=~"$gpu"' in series("gpu_utilization_ratio")
    assert 'node=~"$node"' in series("host_load1")
    # a GPU process's pod filters the per-process family only
    assert 'namespace=~"$namespace", pod=~"$pod"' in series("gpu_process_memory_used_bytes")
    assert "$pod" not in series("gpu_memory_used_bytes")


def test_a_where_excluding_an_alias_label_drops_the_alias() -> None:
    expr = series("queue_length", where={"queue": "admission"})
    assert "vllm:" not in expr and "tgi_" not in expr
    assert "vllm:num_requests_waiting" in series("queue_length", where={"queue": "engine"})


def test_every_generated_query_parses() -> None:
    for expr in (
        series("model_output_tokens_bucket", fn="rate"),
        series("model_input_tokens_sum", fn="increase", where={"model": "~m.*"}),
        absent_all("gpu_memory_used_bytes"),
        absent_all("http_request_duration_seconds"),
    ):
        assert promql_parser.parse(render_variables(expr, VALUES)) is not None  # raises if not


def test_unknown_names_and_variables_are_refused() -> None:
    with pytest.raises(ConfigError, match="not a sample"):
        series("gpu_memory_usedbytes")
    with pytest.raises(ConfigError, match="fn="):
        series("host_load1", fn="sum")
    with pytest.raises(ConfigError, match=r"\$cluster"):
        render_variables('up{cluster="$cluster"}', VALUES)
    # a capture group of label_replace is not a variable
    assert render_variables('label_replace(up, "a", "$1", "b", "(.+)")', {}) == (
        'label_replace(up, "a", "$1", "b", "(.+)")'
    )


def test_families_in_maps_aliases_to_their_family() -> None:
    assert families_in("vllm:kv_cache_usage_perc / DCGM_FI_DEV_FB_USED") == {
        "kv_cache_usage_ratio",
        "gpu_memory_used_bytes",
    }
    assert families_in('ALERTS{alertstate="firing"}') == set()
