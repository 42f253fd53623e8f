"""Foreign metric names mapped onto the catalogue.

Engines rename their metrics between releases (vLLM's ``gpu_cache_usage_perc``
became ``kv_cache_usage_perc``); the scrape path applies this table so a rule
written against our names keeps working whatever the engine calls them.
Sources: vLLM v1 metrics, SGLang, TGI, Triton, DCGM exporter, node_exporter
(its filesystem collector too), OpenTelemetry GenAI semantic conventions (dots
as emitted by OTel, underscores as the Prometheus exporter writes them).

A Prometheus that scrapes the engines directly never sees that path: the
recording rules of ``aivitals rules export`` and the diagnosis's query
fallback are generated from the same tables (``ALIASES``, ``DERIVED`` for
series no single name maps to, ``FOREIGN_LABELS`` for labels spelt
differently), so one edit here reaches all of them.
"""

from __future__ import annotations

from ._spec import Alias, Derived

_MIB = 1024.0 * 1024.0

ALIASES: tuple[Alias, ...] = (
    # --- OpenTelemetry GenAI semantic conventions ------------------------------------
    Alias(
        "gen_ai.server.request.duration", "http_request_duration_seconds", "otel", histogram=True
    ),
    Alias(
        "gen_ai_server_request_duration_seconds",
        "http_request_duration_seconds",
        "otel",
        histogram=True,
    ),
    Alias(
        "gen_ai.server.time_to_first_token",
        "model_time_to_first_token_seconds",
        "otel",
        histogram=True,
    ),
    Alias(
        "gen_ai_server_time_to_first_token_seconds",
        "model_time_to_first_token_seconds",
        "otel",
        histogram=True,
    ),
    Alias(
        "gen_ai.server.time_per_output_token",
        "model_time_per_output_token_seconds",
        "otel",
        histogram=True,
    ),
    Alias(
        "gen_ai_server_time_per_output_token_seconds",
        "model_time_per_output_token_seconds",
        "otel",
        histogram=True,
    ),
    Alias(
        "gen_ai.client.token.usage",
        "model_input_tokens",
        "otel",
        histogram=True,
        note="token type input; output tokens go to model_output_tokens",
        extra={"gen_ai.token.type=output": "model_output_tokens"},
    ),
    Alias(
        "gen_ai_client_token_usage",
        "model_input_tokens",
        "otel",
        histogram=True,
        extra={"gen_ai_token_type=output": "model_output_tokens"},
    ),
    # --- vLLM (v1 engine) -------------------------------------------------------------
    Alias("vllm:num_requests_waiting", "queue_length", "vllm", add_labels=(("queue", "engine"),)),
    Alias("vllm:num_requests_running", "model_inferences_in_progress", "vllm"),
    Alias(
        "vllm:kv_cache_usage_perc",
        "kv_cache_usage_ratio",
        "vllm",
        note="a 0-1 fraction despite the name",
    ),
    Alias(
        "vllm:gpu_cache_usage_perc",
        "kv_cache_usage_ratio",
        "vllm",
        deprecated=True,
        note="renamed to vllm:kv_cache_usage_perc in v1",
    ),
    Alias(
        "vllm:time_to_first_token_seconds",
        "model_time_to_first_token_seconds",
        "vllm",
        histogram=True,
    ),
    Alias(
        "vllm:inter_token_latency_seconds",
        "model_time_per_output_token_seconds",
        "vllm",
        histogram=True,
    ),
    Alias(
        "vllm:time_per_output_token_seconds",
        "model_time_per_output_token_seconds",
        "vllm",
        histogram=True,
        deprecated=True,
        note="renamed to vllm:inter_token_latency_seconds",
    ),
    Alias(
        "vllm:e2e_request_latency_seconds", "http_request_duration_seconds", "vllm", histogram=True
    ),
    Alias(
        "vllm:request_queue_time_seconds",
        "queue_wait_seconds",
        "vllm",
        histogram=True,
        add_labels=(("queue", "engine"),),
    ),
    Alias(
        "vllm:request_inference_time_seconds",
        "model_inference_time_seconds",
        "vllm",
        histogram=True,
    ),
    Alias("vllm:prefix_cache_queries", "kv_cache_queries_total", "vllm"),
    Alias("vllm:prefix_cache_queries_total", "kv_cache_queries_total", "vllm"),
    Alias("vllm:prefix_cache_hits", "kv_cache_hits_total", "vllm"),
    Alias("vllm:prefix_cache_hits_total", "kv_cache_hits_total", "vllm"),
    Alias("vllm:num_preemptions", "model_preemptions_total", "vllm"),
    Alias("vllm:num_preemptions_total", "model_preemptions_total", "vllm"),
    Alias(
        "vllm:prompt_tokens_total",
        "model_input_tokens_sum",
        "vllm",
        note="counter of prompt tokens; maps onto the histogram's sum",
    ),
    Alias(
        "vllm:generation_tokens_total",
        "model_output_tokens_sum",
        "vllm",
        note="counter of generated tokens; maps onto the histogram's sum",
    ),
    Alias("vllm:request_prompt_tokens", "model_input_tokens", "vllm", histogram=True),
    Alias("vllm:request_generation_tokens", "model_output_tokens", "vllm", histogram=True),
    # --- vLLM: request phases, finish reason, engine steps ----------------------------
    # names from vllm/v1/metrics/loggers.py and docs/design/metrics.md
    Alias(
        "vllm:request_prefill_time_seconds", "model_prefill_time_seconds", "vllm", histogram=True
    ),
    Alias("vllm:request_decode_time_seconds", "model_decode_time_seconds", "vllm", histogram=True),
    Alias(
        "vllm:request_success_total",
        "model_requests_finished_total",
        "vllm",
        note="by finished_reason (stop, length, abort): our reason label",
    ),
    Alias(
        "vllm:iteration_tokens_total",
        "model_iteration_tokens",
        "vllm",
        histogram=True,
        note="a histogram despite the _total suffix: tokens per engine step",
    ),
    # --- SGLang (docs/references/production_metrics.md) ---------------------------------
    Alias("sglang:num_queue_reqs", "queue_length", "sglang", add_labels=(("queue", "engine"),)),
    Alias("sglang:num_running_reqs", "model_inferences_in_progress", "sglang"),
    Alias(
        "sglang:token_usage",
        "kv_cache_usage_ratio",
        "sglang",
        note="used KV-cache token slots over the pool's size, a 0-1 fraction",
    ),
    Alias(
        "sglang:time_to_first_token_seconds",
        "model_time_to_first_token_seconds",
        "sglang",
        histogram=True,
    ),
    Alias(
        "sglang:time_per_output_token_seconds",
        "model_time_per_output_token_seconds",
        "sglang",
        histogram=True,
    ),
    Alias(
        "sglang:e2e_request_latency_seconds",
        "http_request_duration_seconds",
        "sglang",
        histogram=True,
    ),
    Alias("sglang:prompt_tokens_total", "model_input_tokens_sum", "sglang"),
    Alias("sglang:generation_tokens_total", "model_output_tokens_sum", "sglang"),
    # --- Hugging Face TGI -------------------------------------------------------------
    Alias("tgi_queue_size", "queue_length", "tgi", add_labels=(("queue", "engine"),)),
    Alias(
        "tgi_request_queue_duration",
        "queue_wait_seconds",
        "tgi",
        histogram=True,
        add_labels=(("queue", "engine"),),
    ),
    Alias("tgi_request_inference_duration", "model_inference_time_seconds", "tgi", histogram=True),
    Alias("tgi_request_duration", "http_request_duration_seconds", "tgi", histogram=True),
    Alias(
        "tgi_request_mean_time_per_token_duration",
        "model_time_per_output_token_seconds",
        "tgi",
        histogram=True,
    ),
    Alias("tgi_request_input_length", "model_input_tokens", "tgi", histogram=True),
    Alias("tgi_request_generated_tokens", "model_output_tokens", "tgi", histogram=True),
    Alias("tgi_batch_current_size", "model_inferences_in_progress", "tgi"),
    # --- NVIDIA Triton ------------------------------------------------------------------
    Alias(
        "nv_inference_queue_duration_us",
        "queue_wait_seconds_sum",
        "triton",
        scale=1e-6,
        add_labels=(("queue", "engine"),),
        note="cumulative microseconds",
    ),
    Alias(
        "nv_inference_compute_infer_duration_us",
        "model_inference_time_seconds_sum",
        "triton",
        scale=1e-6,
        note="cumulative microseconds",
    ),
    Alias(
        "nv_inference_request_duration_us",
        "http_request_duration_seconds_sum",
        "triton",
        scale=1e-6,
        note="cumulative microseconds",
    ),
    Alias("nv_inference_count", "model_inference_time_seconds_count", "triton"),
    Alias(
        "nv_inference_pending_request_count",
        "queue_length",
        "triton",
        add_labels=(("queue", "engine"),),
    ),
    Alias(
        "nv_inference_request_failure",
        "model_inference_errors_total",
        "triton",
        add_labels=(("error_code", "UNKNOWN"),),
    ),
    Alias("nv_gpu_memory_used_bytes", "gpu_memory_used_bytes", "triton"),
    Alias("nv_gpu_memory_total_bytes", "gpu_memory_total_bytes", "triton"),
    Alias("nv_gpu_utilization", "gpu_utilization_ratio", "triton", note="already 0-1"),
    Alias("nv_gpu_power_usage", "gpu_power_watts", "triton"),
    Alias("nv_gpu_power_limit", "gpu_power_limit_watts", "triton"),
    # --- DCGM exporter ------------------------------------------------------------------
    Alias("DCGM_FI_DEV_FB_USED", "gpu_memory_used_bytes", "dcgm", scale=_MIB),
    Alias("DCGM_FI_DEV_FB_FREE", "gpu_memory_free_bytes", "dcgm", scale=_MIB),
    Alias("DCGM_FI_DEV_GPU_UTIL", "gpu_utilization_ratio", "dcgm", scale=0.01),
    Alias("DCGM_FI_DEV_MEM_COPY_UTIL", "gpu_memory_utilization_ratio", "dcgm", scale=0.01),
    Alias("DCGM_FI_DEV_GPU_TEMP", "gpu_temperature_celsius", "dcgm"),
    Alias("DCGM_FI_DEV_POWER_USAGE", "gpu_power_watts", "dcgm"),
    Alias("DCGM_FI_DEV_SM_CLOCK", "gpu_sm_clock_hertz", "dcgm", scale=1e6),
    Alias("DCGM_FI_DEV_MEM_CLOCK", "gpu_memory_clock_hertz", "dcgm", scale=1e6),
    Alias(
        "DCGM_FI_DEV_XID_ERRORS",
        "gpu_last_xid",
        "dcgm",
        note="holds only the last Xid code, never resets; kept as a gauge of that code",
    ),
    Alias("DCGM_FI_DEV_PCIE_TX_THROUGHPUT", "gpu_pcie_tx_bytes_per_second", "dcgm", scale=1024.0),
    Alias("DCGM_FI_DEV_PCIE_RX_THROUGHPUT", "gpu_pcie_rx_bytes_per_second", "dcgm", scale=1024.0),
    # --- node_exporter: memory, load, disk, network (not the per-core CPU: DERIVED) -----
    # names as in node_exporter's collector/fixtures/e2e-output.txt
    Alias("node_memory_MemTotal_bytes", "host_memory_total_bytes", "node"),
    Alias("node_memory_MemAvailable_bytes", "host_memory_available_bytes", "node"),
    Alias("node_memory_SwapTotal_bytes", "host_swap_total_bytes", "node"),
    Alias("node_vmstat_pswpin", "host_swap_in_pages_total", "node"),
    Alias("node_vmstat_pswpout", "host_swap_out_pages_total", "node"),
    Alias("node_vmstat_oom_kill", "host_oom_kills_total", "node"),
    Alias("node_load1", "host_load1", "node"),
    Alias("node_load5", "host_load5", "node"),
    Alias("node_load15", "host_load15", "node"),
    Alias("node_disk_io_time_seconds_total", "host_disk_io_time_seconds_total", "node"),
    Alias(
        "node_disk_io_time_weighted_seconds_total",
        "host_disk_io_time_weighted_seconds_total",
        "node",
    ),
    Alias("node_disk_read_time_seconds_total", "host_disk_read_time_seconds_total", "node"),
    Alias("node_disk_write_time_seconds_total", "host_disk_write_time_seconds_total", "node"),
    Alias("node_disk_reads_completed_total", "host_disk_reads_completed_total", "node"),
    Alias("node_disk_writes_completed_total", "host_disk_writes_completed_total", "node"),
    Alias("node_network_receive_bytes_total", "host_network_receive_bytes_total", "node"),
    Alias("node_network_transmit_bytes_total", "host_network_transmit_bytes_total", "node"),
    Alias("node_network_receive_packets_total", "host_network_receive_packets_total", "node"),
    Alias("node_network_transmit_packets_total", "host_network_transmit_packets_total", "node"),
    Alias("node_network_receive_errs_total", "host_network_receive_errors_total", "node"),
    Alias("node_network_transmit_errs_total", "host_network_transmit_errors_total", "node"),
    Alias("node_network_receive_drop_total", "host_network_receive_drops_total", "node"),
    Alias("node_network_transmit_drop_total", "host_network_transmit_drops_total", "node"),
    Alias("node_netstat_Tcp_OutSegs", "host_tcp_out_segments_total", "node"),
    Alias("node_netstat_Tcp_RetransSegs", "host_tcp_retransmitted_segments_total", "node"),
    # --- node_exporter filesystem collector (same labels: mountpoint, device, fstype) --
    Alias("node_filesystem_size_bytes", "host_filesystem_size_bytes", "node"),
    Alias("node_filesystem_free_bytes", "host_filesystem_free_bytes", "node"),
    Alias(
        "node_filesystem_avail_bytes",
        "host_filesystem_available_bytes",
        "node",
        note="space available to non-root users",
    ),
    Alias("node_filesystem_files", "host_filesystem_files", "node"),
    Alias("node_filesystem_files_free", "host_filesystem_files_free", "node"),
    Alias("node_filesystem_readonly", "host_filesystem_readonly", "node"),
    Alias("node_filesystem_device_error", "host_filesystem_device_error", "node"),
)

#: Our series that no single foreign name maps to, computed by a PromQL expression.
DERIVED: tuple[Derived, ...] = (
    # dcgm-exporter's default counters carry no total: used + free + reserved (reserved
    # joined its default-counters.csv in 4.3.1-4.4.0; older configs lack it, hence the or)
    Derived(
        "gpu_memory_total_bytes",
        "dcgm",
        "DCGM_FI_DEV_FB_USED + DCGM_FI_DEV_FB_FREE + DCGM_FI_DEV_FB_RESERVED"
        " or DCGM_FI_DEV_FB_USED + DCGM_FI_DEV_FB_FREE",
        scale=_MIB,
    ),
    # node_exporter counts per core; our rules read the host's busy share (a sum over
    # cores), so a single busy core must not read as a saturated host
    Derived("host_cpu_seconds_total", "node", "sum without (cpu) (node_cpu_seconds_total)"),
    Derived(
        "host_swap_used_bytes",
        "node",
        "node_memory_SwapTotal_bytes - node_memory_SwapFree_bytes",
    ),
)

#: Labels an engine spells differently: source -> our label -> its candidates, in order.
#: A series that already carries our label keeps it (a target label set by the scrape
#: config wins over an exporter's own idea of the host name). dcgm-exporter spells the
#: host ``Hostname`` in its releases and ``hostname`` since its main branch renamed it.
FOREIGN_LABELS: dict[str, dict[str, tuple[str, ...]]] = {
    "vllm": {"model": ("model_name",), "reason": ("finished_reason",)},
    "sglang": {"model": ("model_name",)},
    "dcgm": {"node": ("Hostname", "hostname")},
    "node": {"interface": ("device",)},
}

_BY_FOREIGN: dict[str, Alias] = {a.foreign: a for a in ALIASES}


def alias_for(foreign_name: str) -> Alias | None:
    """The alias for a foreign family or sample name, or None.

    Histogram samples are looked up through their family (``x_bucket`` -> ``x``).
    """
    found = _BY_FOREIGN.get(foreign_name)
    if found is not None:
        return found
    for suffix in ("_bucket", "_sum", "_count"):
        if foreign_name.endswith(suffix):
            family = _BY_FOREIGN.get(foreign_name[: -len(suffix)])
            if family is not None and family.histogram:
                return family
    return None


def translate(foreign_name: str) -> tuple[str, float, tuple[tuple[str, str], ...]] | None:
    """Our sample name, the scale to apply and the labels to add; None if unknown.

    ``translate("vllm:time_to_first_token_seconds_bucket")`` gives
    ``("model_time_to_first_token_seconds_bucket", 1.0, ())``.
    """
    alias = alias_for(foreign_name)
    if alias is None:
        return None
    if foreign_name == alias.foreign:
        return alias.ours, alias.scale, alias.add_labels
    suffix = foreign_name[len(alias.foreign) :]
    # Bucket boundaries (le) are in the foreign unit; only histograms whose
    # scale is 1 are aliased as histograms, so the suffix maps straight across.
    return alias.ours + suffix, alias.scale, alias.add_labels
