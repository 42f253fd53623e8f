"""Every metric aivitals emits, in one table.

The instrumentation, the protection layer, the collectors, the rule pack and
the diagnosis knowledge base all take their names from here, so a rename is one
edit and a test (``promtool check metrics``) guards the conventions.
"""

from __future__ import annotations

from collections.abc import Iterator

from ._spec import Layer, MetricSpec, MetricType

C, G, H, INFO = MetricType.COUNTER, MetricType.GAUGE, MetricType.HISTOGRAM, MetricType.INFO
MODEL, SERVICE, INFRA, BUSINESS = Layer.MODEL, Layer.SERVICE, Layer.INFRASTRUCTURE, Layer.BUSINESS

#: Latency buckets: from a 5 ms cache hit to a 60 s generation.
LATENCY_BUCKETS = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.5,
    0.75,
    1.0,
    1.5,
    2.0,
    3.0,
    5.0,
    10.0,
    20.0,
    30.0,
    60.0,
)
#: Per-token latency buckets (time per output token, queue waits of a fast engine).
FAST_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.2, 0.5, 1.0, 2.5)
#: Token-count buckets, powers of two up to a 128k context.
TOKEN_BUCKETS = tuple(float(2**i) for i in range(4, 18))
#: Body size buckets in bytes, 100 B to 10 MB.
SIZE_BUCKETS = (100.0, 1e3, 1e4, 1e5, 2.5e5, 1e6, 1e7)

HTTP = ("method", "route")
MODEL_L = ("model", "model_version", "device")
GPU = ("gpu", "backend")
#: Set by the GPU collector on a process that runs in a Kubernetes pod; absent otherwise.
POD = ("namespace", "pod", "container", "pod_uid")
#: A mounted filesystem, labelled as node_exporter labels it.
FS = ("mountpoint", "device", "fstype")

# name, type, unit, layer, labels, help  (buckets filled in below by unit/name)
_TABLE: tuple[tuple[str, MetricType, str, Layer, tuple[str, ...], str], ...] = (
    # --- HTTP, from the ASGI middleware ---------------------------------------------
    (
        "http_request_duration_seconds",
        H,
        "seconds",
        SERVICE,
        (*HTTP, "status_class", "status"),
        "Time from the first byte received to the last byte sent, by route template.",
    ),
    (
        "http_time_to_first_byte_seconds",
        H,
        "seconds",
        SERVICE,
        HTTP,
        "Time from the request's arrival to the response's first body byte (streaming).",
    ),
    ("http_requests_in_flight", G, "requests", SERVICE, HTTP, "Requests being served right now."),
    (
        "http_request_body_size_bytes",
        H,
        "bytes",
        BUSINESS,
        HTTP,
        "Request body bytes actually received (not Content-Length).",
    ),
    ("http_response_body_size_bytes", H, "bytes", SERVICE, HTTP, "Response body bytes sent."),
    (
        "http_client_disconnects_total",
        C,
        "requests",
        SERVICE,
        HTTP,
        "Requests whose client went away before the response finished.",
    ),
    (
        "http_server_errors_total",
        C,
        "requests",
        SERVICE,
        (*HTTP, "exception"),
        "Unhandled exceptions raised by the application (answered 500).",
    ),
    (
        "http_unmatched_requests_total",
        C,
        "requests",
        SERVICE,
        ("method",),
        'Requests for paths no route matched (folded into route="<unmatched>").',
    ),
    # --- the model call: the seven golden metrics -----------------------------------
    (
        "model_inference_time_seconds",
        H,
        "seconds",
        MODEL,
        MODEL_L,
        "Time of forward()/generate() measured inside the call; on GPU with CUDA events.",
    ),
    (
        "model_inference_wall_time_seconds",
        H,
        "seconds",
        MODEL,
        MODEL_L,
        "Wall time of the inference block as seen by the caller, including host overhead.",
    ),
    (
        "cuda_stream_wait_time_seconds",
        H,
        "seconds",
        MODEL,
        MODEL_L,
        "Time the host waited for the CUDA stream to finish the inference's work.",
    ),
    (
        "model_input_tokens",
        H,
        "tokens",
        BUSINESS,
        ("model",),
        "Input tokens per request, counted on the input_ids the model received.",
    ),
    (
        "model_output_tokens",
        H,
        "tokens",
        MODEL,
        ("model",),
        "Output tokens per request, counted on what the model produced.",
    ),
    (
        "model_time_to_first_token_seconds",
        H,
        "seconds",
        MODEL,
        ("model",),
        "Time from the start of generation to the first output token.",
    ),
    (
        "model_time_per_output_token_seconds",
        H,
        "seconds",
        MODEL,
        ("model",),
        "Mean time between output tokens after the first, per request.",
    ),
    (
        "model_inference_errors_total",
        C,
        "errors",
        MODEL,
        ("model", "error_code"),
        "Inference calls that failed, by catalogue error code.",
    ),
    (
        "model_inferences_in_progress",
        G,
        "requests",
        MODEL,
        ("model",),
        "Inference calls running now.",
    ),
    # --- engine-side phases and counts, read through the aliases (vLLM) ---------------
    (
        "model_prefill_time_seconds",
        H,
        "seconds",
        MODEL,
        ("model",),
        "Time a request spent in prefill, from its scheduling to its first token.",
    ),
    (
        "model_decode_time_seconds",
        H,
        "seconds",
        MODEL,
        ("model",),
        "Time a request spent in decode, from its first token to its last.",
    ),
    (
        "model_requests_finished_total",
        C,
        "requests",
        MODEL,
        ("model", "reason"),
        "Requests the engine finished, by finish reason (stop, length, abort).",
    ),
    (
        "model_iteration_tokens",
        H,
        "tokens",
        MODEL,
        ("model",),
        "Tokens processed per engine step, prefill and decode together.",
    ),
    (
        "model_aborts_total",
        C,
        "requests",
        MODEL,
        ("model", "reason"),
        "Inference work aborted through its abort hook (deadline, client disconnect).",
    ),
    (
        "model_load_time_seconds",
        G,
        "seconds",
        MODEL,
        ("model", "model_version"),
        "Time the last model load took, local load only (no download).",
    ),
    (
        "model_loads_total",
        C,
        "loads",
        MODEL,
        ("model", "model_version", "mode"),
        "Model loads that finished, by mode: cold (nothing served the model meanwhile: "
        "a start, a reload requests wait for) or warm (loaded beside the serving copy, "
        "then swapped in).",
    ),
    (
        "model_info",
        INFO,
        "",
        MODEL,
        ("model", "model_version", "device"),
        "The model being served, with its normalised version.",
    ),
    (
        "kv_cache_hits_total",
        C,
        "tokens",
        MODEL,
        ("model",),
        "KV-cache (prefix cache) hits, in tokens or blocks as the engine counts them.",
    ),
    (
        "kv_cache_queries_total",
        C,
        "tokens",
        MODEL,
        ("model",),
        "KV-cache (prefix cache) lookups, in the same unit as the hits.",
    ),
    ("kv_cache_usage_ratio", G, "ratio", MODEL, ("model",), "Share of the KV cache in use (0-1)."),
    (
        "model_preemptions_total",
        C,
        "requests",
        MODEL,
        ("model",),
        "Requests preempted by the engine for lack of KV-cache space.",
    ),
    # --- queues and worker pools ------------------------------------------------------
    ("queue_length", G, "requests", SERVICE, ("queue",), "Requests waiting in the queue."),
    ("queue_capacity", G, "requests", SERVICE, ("queue",), "The queue's bound."),
    (
        "queue_wait_seconds",
        H,
        "seconds",
        SERVICE,
        ("queue",),
        "Time from enqueue to the start of execution.",
    ),
    (
        "queue_rejections_total",
        C,
        "requests",
        SERVICE,
        ("queue", "reason"),
        "Submissions refused by the queue (full, deadline).",
    ),
    (
        "worker_pool_active_workers",
        G,
        "workers",
        SERVICE,
        ("pool",),
        "Workers executing a task now.",
    ),
    ("worker_pool_max_workers", G, "workers", SERVICE, ("pool",), "The pool's worker limit."),
    (
        "worker_pool_busy_seconds_total",
        C,
        "seconds",
        SERVICE,
        ("pool",),
        "Worker-seconds spent executing tasks, running ones included: its rate over the "
        "worker limit is the pool's busy share, where the active-workers gauge is a sample.",
    ),
    ("worker_pool_rejections_total", C, "tasks", SERVICE, ("pool",), "Tasks refused by the pool."),
    # --- protection -----------------------------------------------------------------------
    (
        "input_rejections_total",
        C,
        "requests",
        BUSINESS,
        ("route", "reason"),
        "Requests refused by the input guard, by reason (error code).",
    ),
    (
        "admission_concurrency_limit",
        G,
        "requests",
        SERVICE,
        (),
        "The adaptive concurrency limit in force.",
    ),
    ("admission_in_flight", G, "requests", SERVICE, (), "Requests admitted and executing."),
    (
        "admission_queue_length",
        G,
        "requests",
        SERVICE,
        ("priority",),
        "Requests waiting for admission, by priority class.",
    ),
    (
        "admission_queue_wait_seconds",
        H,
        "seconds",
        SERVICE,
        ("priority",),
        "Time a request waited for admission.",
    ),
    (
        "admission_rejections_total",
        C,
        "requests",
        SERVICE,
        ("priority", "reason"),
        "Requests refused with 429, by reason (queue_full, deadline, memory).",
    ),
    (
        "request_timeouts_total",
        C,
        "requests",
        SERVICE,
        ("route", "reason"),
        "Requests whose deadline passed or whose client left, with the work aborted.",
    ),
    (
        "health_check_up",
        G,
        "",
        SERVICE,
        ("check",),
        "1 when the named readiness check passed at its last run, 0 otherwise.",
    ),
    ("service_ready", G, "", SERVICE, (), "1 when /readyz answers 200."),
    (
        "errors_total",
        C,
        "errors",
        SERVICE,
        ("error_code",),
        "Errors by catalogue error code, as logged.",
    ),
    # --- cache (demo service) ---------------------------------------------------------
    (
        "cache_requests_total",
        C,
        "requests",
        SERVICE,
        ("cache", "result"),
        "Cache lookups by result (hit, miss, error).",
    ),
    # --- GPU, from the collectors ---------------------------------------------------------
    (
        "gpu_info",
        INFO,
        "",
        MODEL,
        ("gpu", "uuid", "name", "driver", "backend"),
        "One series per GPU; backend is nvml, smi or sim (simulated).",
    ),
    ("gpu_memory_used_bytes", G, "bytes", MODEL, GPU, "Device memory in use."),
    ("gpu_memory_total_bytes", G, "bytes", MODEL, GPU, "Device memory in total."),
    ("gpu_memory_free_bytes", G, "bytes", MODEL, GPU, "Device memory free."),
    (
        "gpu_utilization_ratio",
        G,
        "ratio",
        MODEL,
        GPU,
        "Share of the last sample period in which a kernel ran (0-1).",
    ),
    (
        "gpu_memory_utilization_ratio",
        G,
        "ratio",
        MODEL,
        GPU,
        "Share of the last sample period in which device memory was read or written (0-1).",
    ),
    ("gpu_temperature_celsius", G, "celsius", MODEL, GPU, "GPU core temperature."),
    ("gpu_power_watts", G, "watts", MODEL, GPU, "Power draw."),
    ("gpu_power_limit_watts", G, "watts", MODEL, GPU, "Enforced power limit."),
    ("gpu_sm_clock_hertz", G, "hertz", MODEL, GPU, "SM clock."),
    ("gpu_memory_clock_hertz", G, "hertz", MODEL, GPU, "Memory clock."),
    (
        "gpu_clock_event_active",
        G,
        "",
        MODEL,
        (*GPU, "reason"),
        "1 while the clock-event (throttle) reason is active.",
    ),
    ("gpu_pcie_tx_bytes_per_second", G, "bytes", MODEL, GPU, "PCIe transmit throughput."),
    ("gpu_pcie_rx_bytes_per_second", G, "bytes", MODEL, GPU, "PCIe receive throughput."),
    (
        "gpu_ecc_errors_total",
        C,
        "errors",
        MODEL,
        (*GPU, "type"),
        "ECC errors since the driver loaded (corrected, uncorrected).",
    ),
    (
        "gpu_remapped_rows",
        G,
        "rows",
        MODEL,
        (*GPU, "type"),
        "Remapped memory rows (correctable, uncorrectable, pending, failure).",
    ),
    (
        "gpu_process_memory_used_bytes",
        G,
        "bytes",
        MODEL,
        (*GPU, "pid", "process", *POD),
        "Device memory used by one compute process; the pod labels only on a process in a "
        "Kubernetes pod (pod_uid always there, the names when the kubelet's pods are read).",
    ),
    (
        "gpu_last_xid",
        G,
        "",
        MODEL,
        GPU,
        "Code of the last Xid seen (DCGM's semantics, kept for its alias; prefer the counter).",
    ),
    (
        "gpu_xid_errors_total",
        C,
        "errors",
        MODEL,
        (*GPU, "xid", "meaning"),
        "Xid errors reported by the driver (NVML events or the kernel log).",
    ),
    # --- host -----------------------------------------------------------------------
    ("host_cpu_seconds_total", C, "seconds", INFRA, ("mode",), "CPU time by mode, all cores."),
    ("host_cpus", G, "cpus", INFRA, (), "Logical CPUs."),
    ("host_load1", G, "", INFRA, (), "1-minute load average."),
    ("host_load5", G, "", INFRA, (), "5-minute load average."),
    ("host_load15", G, "", INFRA, (), "15-minute load average."),
    (
        "host_pressure_stalled_seconds_total",
        C,
        "seconds",
        INFRA,
        ("resource", "kind"),
        "Pressure stall time from /proc/pressure (kind some or full).",
    ),
    ("host_memory_total_bytes", G, "bytes", INFRA, (), "Physical memory."),
    ("host_memory_available_bytes", G, "bytes", INFRA, (), "Memory available without swapping."),
    ("host_swap_total_bytes", G, "bytes", INFRA, (), "Swap space."),
    ("host_swap_used_bytes", G, "bytes", INFRA, (), "Swap in use."),
    ("host_swap_in_pages_total", C, "pages", INFRA, (), "Pages swapped in (vmstat pswpin)."),
    ("host_swap_out_pages_total", C, "pages", INFRA, (), "Pages swapped out (vmstat pswpout)."),
    ("host_oom_kills_total", C, "kills", INFRA, (), "Kernel OOM kills (vmstat oom_kill)."),
    (
        "host_disk_io_time_seconds_total",
        C,
        "seconds",
        INFRA,
        ("device",),
        "Time the device was busy (rate = utilization).",
    ),
    (
        "host_disk_io_time_weighted_seconds_total",
        C,
        "seconds",
        INFRA,
        ("device",),
        "Requests' time in flight summed (rate = average queue depth; never below the "
        "utilization where the kernel's accounting holds).",
    ),
    (
        "host_disk_read_time_seconds_total",
        C,
        "seconds",
        INFRA,
        ("device",),
        "Time spent on reads (divide by reads for await).",
    ),
    (
        "host_disk_write_time_seconds_total",
        C,
        "seconds",
        INFRA,
        ("device",),
        "Time spent on writes (divide by writes for await).",
    ),
    ("host_disk_reads_completed_total", C, "operations", INFRA, ("device",), "Reads completed."),
    ("host_disk_writes_completed_total", C, "operations", INFRA, ("device",), "Writes completed."),
    # --- filesystems (node_exporter's node_filesystem_*, same labels) -------------------
    ("host_filesystem_size_bytes", G, "bytes", INFRA, FS, "Size of the filesystem."),
    (
        "host_filesystem_free_bytes",
        G,
        "bytes",
        INFRA,
        FS,
        "Free space, the blocks reserved for root included.",
    ),
    (
        "host_filesystem_available_bytes",
        G,
        "bytes",
        INFRA,
        FS,
        "Space a non-root process can still write (free minus the root reserve): what "
        "runs out first for a service.",
    ),
    ("host_filesystem_files", G, "inodes", INFRA, FS, "Inodes of the filesystem."),
    ("host_filesystem_files_free", G, "inodes", INFRA, FS, "Free inodes."),
    ("host_filesystem_readonly", G, "", INFRA, FS, "1 when the filesystem is mounted read-only."),
    (
        "host_filesystem_device_error",
        G,
        "",
        INFRA,
        FS,
        "1 when statvfs of the mount failed or hung this scrape (its space is then not reported).",
    ),
    ("host_network_receive_bytes_total", C, "bytes", INFRA, ("interface",), "Bytes received."),
    ("host_network_transmit_bytes_total", C, "bytes", INFRA, ("interface",), "Bytes sent."),
    (
        "host_network_receive_packets_total",
        C,
        "packets",
        INFRA,
        ("interface",),
        "Packets received.",
    ),
    (
        "host_network_transmit_packets_total",
        C,
        "packets",
        INFRA,
        ("interface",),
        "Packets sent (on lo: the loopback share of TCP's segments, left out of the "
        "retransmit ratio).",
    ),
    ("host_network_receive_errors_total", C, "errors", INFRA, ("interface",), "Receive errors."),
    ("host_network_transmit_errors_total", C, "errors", INFRA, ("interface",), "Transmit errors."),
    ("host_network_receive_drops_total", C, "packets", INFRA, ("interface",), "Receive drops."),
    ("host_network_transmit_drops_total", C, "packets", INFRA, ("interface",), "Transmit drops."),
    (
        "host_tcp_out_segments_total",
        C,
        "segments",
        INFRA,
        (),
        "TCP segments sent (labelled netns: in that network namespace, read with --netns).",
    ),
    (
        "host_tcp_retransmitted_segments_total",
        C,
        "segments",
        INFRA,
        (),
        "TCP segments retransmitted (/proc/net/snmp RetransSegs; labelled netns: in that "
        "network namespace).",
    ),
    (
        "probe_success",
        G,
        "",
        INFRA,
        ("target",),
        "1 when the last blackbox probe of the target got a 2xx/3xx answer in time "
        "(blackbox_exporter's name).",
    ),
    (
        "probe_duration_seconds",
        G,
        "seconds",
        INFRA,
        ("target",),
        "How long the last probe took end to end, as a caller sees it (at most the timeout).",
    ),
    (
        "probe_http_status_code",
        G,
        "",
        INFRA,
        ("target",),
        "The HTTP status of the last probe that got an answer.",
    ),
    (
        "host_tcp_connections",
        G,
        "connections",
        INFRA,
        ("port", "state"),
        "TCP connections by local listening port of interest and state.",
    ),
    (
        "host_cgroup_memory_limit_bytes",
        G,
        "bytes",
        INFRA,
        ("cgroup",),
        "Memory limit of the cgroup (absent when unlimited).",
    ),
    (
        "host_cgroup_memory_usage_bytes",
        G,
        "bytes",
        INFRA,
        ("cgroup",),
        "Memory used by the cgroup.",
    ),
    # --- the served process ---------------------------------------------------------
    (
        "service_process_resident_memory_bytes",
        G,
        "bytes",
        SERVICE,
        ("pid", "process", "role"),
        "RSS of the served process.",
    ),
    (
        "service_process_open_fds",
        G,
        "fds",
        SERVICE,
        ("pid", "process", "role"),
        "Open file descriptors.",
    ),
    (
        "service_process_max_fds",
        G,
        "fds",
        SERVICE,
        ("pid", "process", "role"),
        "File descriptor limit.",
    ),
    ("service_process_threads", G, "threads", SERVICE, ("pid", "process", "role"), "OS threads."),
    (
        "service_process_cpu_seconds_total",
        C,
        "seconds",
        SERVICE,
        ("pid", "process", "role"),
        "CPU time used, user plus system.",
    ),
    (
        "service_process_connections",
        G,
        "connections",
        SERVICE,
        ("pid", "process", "role", "state"),
        "TCP connections of the process by state.",
    ),
    (
        "service_listen_queue_length",
        G,
        "connections",
        SERVICE,
        ("port",),
        "Connections waiting in the listening socket's accept queue (found by port).",
    ),
    (
        "service_listen_queue_limit",
        G,
        "connections",
        SERVICE,
        ("port",),
        "The listening socket's accept backlog limit.",
    ),
    # --- kernel log -------------------------------------------------------------------
    (
        "kernel_oom_kills_total",
        C,
        "kills",
        INFRA,
        ("process",),
        "OOM-killer kills read from the kernel log.",
    ),
    ("kernel_hung_tasks_total", C, "events", INFRA, (), "Hung-task reports in the kernel log."),
    ("kernel_io_errors_total", C, "errors", INFRA, ("device",), "I/O errors in the kernel log."),
    (
        "kernel_log_lines_total",
        C,
        "lines",
        INFRA,
        ("kind",),
        "Kernel log lines read, by kind (xid, oom, hung_task, io_error, other).",
    ),
    # --- aivitals itself --------------------------------------------------------------
    (
        "aivitals_collector_up",
        G,
        "",
        SERVICE,
        ("collector",),
        "1 when the collector's last run succeeded, 0 when it failed.",
    ),
    (
        "aivitals_collector_duration_seconds",
        G,
        "seconds",
        SERVICE,
        ("collector",),
        "Time the collector's last run took.",
    ),
    (
        "aivitals_collector_errors_total",
        C,
        "errors",
        SERVICE,
        ("collector", "reason"),
        "Collector failures by reason.",
    ),
    (
        "up",
        G,
        "",
        SERVICE,
        ("job", "instance"),
        "1 when the last scrape of the target succeeded (Prometheus convention).",
    ),
    (
        "aivitals_scrape_duration_seconds",
        G,
        "seconds",
        SERVICE,
        ("job", "instance"),
        "Time the last scrape took.",
    ),
    (
        "aivitals_scrape_samples",
        G,
        "samples",
        SERVICE,
        ("job", "instance"),
        "Samples in the last scrape.",
    ),
    (
        "aivitals_scrape_errors_total",
        C,
        "errors",
        SERVICE,
        ("job", "instance", "reason"),
        "Failed scrapes by reason (timeout, refused, too_large, parse).",
    ),
    (
        "aivitals_service_sla_seconds",
        G,
        "seconds",
        SERVICE,
        ("bound",),
        "The request-time SLA of a scraped service (aivitals agent --sla), per target; bound is "
        "the http_request_duration_seconds bound it is measured at. The SLO burn-rate alerts "
        "measure only services that have it.",
    ),
    (
        "aivitals_gpu_backend_info",
        INFO,
        "",
        SERVICE,
        ("backend",),
        "The GPU backend the agent runs: nvml, smi, sim (simulated), unreadable (NVIDIA "
        "hardware no backend could read), or none (no GPU: GPUMetricsAbsent stays quiet "
        "for it).",
    ),
    ("aivitals_tsdb_series", G, "series", SERVICE, (), "Series in the embedded store."),
    (
        "aivitals_tsdb_samples_appended_total",
        C,
        "samples",
        SERVICE,
        (),
        "Samples stored in the embedded store.",
    ),
    (
        "aivitals_tsdb_samples_rejected_total",
        C,
        "samples",
        SERVICE,
        ("reason",),
        "Samples refused by the embedded store by reason.",
    ),
    (
        "aivitals_cardinality_folded_total",
        C,
        "series",
        SERVICE,
        ("metric",),
        'Label values folded into "<other>" by the cardinality guard.',
    ),
    (
        "aivitals_log_records_dropped_total",
        C,
        "records",
        SERVICE,
        (),
        "Log records dropped because the background writer's queue was full.",
    ),
    (
        "aivitals_otel_export_dropped_total",
        C,
        "items",
        SERVICE,
        ("signal",),
        "Spans and metric points the OTLP exporter could not deliver (endpoint down, refused).",
    ),
    (
        "aivitals_alerts_firing",
        G,
        "alerts",
        SERVICE,
        ("alertname", "severity", "layer"),
        "Alerts firing in the embedded engine.",
    ),
    (
        "aivitals_rule_evaluation_seconds",
        G,
        "seconds",
        SERVICE,
        ("group",),
        "Time the last evaluation of the rule group took.",
    ),
    (
        "aivitals_notifications_total",
        C,
        "notifications",
        SERVICE,
        ("receiver", "result"),
        "Notifications by result (sent, retried, failed, dropped).",
    ),
)


def _buckets(name: str, unit: str, kind: MetricType) -> tuple[float, ...] | None:
    if kind is not MetricType.HISTOGRAM:
        return None
    if unit == "tokens":
        return TOKEN_BUCKETS
    if unit == "bytes":
        return SIZE_BUCKETS
    if "per_output_token" in name or "cuda_stream" in name:
        return FAST_BUCKETS
    return LATENCY_BUCKETS


def _source(name: str) -> str:
    prefix = name.split("_", 1)[0]
    return {
        "gpu": "collect.gpu",
        "host": "collect.host",
        "service": "collect.process",
        "kernel": "collect.kernel",
        "aivitals": "aivitals",
        "up": "collect.scrape",
        "input": "protect",
        "admission": "protect",
        "request": "protect",
        "health": "protect",
    }.get(prefix, "instrument")


METRICS: dict[str, MetricSpec] = {
    name: MetricSpec(
        name=name,
        type=kind,
        unit=unit,
        help=help_,
        labels=labels,
        layer=layer,
        buckets=_buckets(name, unit, kind),
        source=_source(name),
    )
    for name, kind, unit, layer, labels, help_ in _TABLE
}


def get(name: str) -> MetricSpec:
    """The spec of one metric family; ``KeyError`` names the missing metric."""
    try:
        return METRICS[name]
    except KeyError:
        raise KeyError(f"{name!r} is not in the aivitals signal catalogue") from None


def iter_metrics() -> Iterator[MetricSpec]:
    return iter(METRICS.values())


def family_of(sample_name: str) -> MetricSpec | None:
    """The family a sample name belongs to (``x_bucket`` -> ``x``), or None."""
    spec = METRICS.get(sample_name)
    if spec is not None:
        return spec
    for suffix in ("_bucket", "_sum", "_count", "_info"):
        if sample_name.endswith(suffix):
            spec = METRICS.get(sample_name[: -len(suffix)])
            if spec is not None:
                return spec
    return None
