"""What each dashboard shows: panels as data, queries generated from the catalogue.

Every query goes through :func:`series`, so it reads our metric name or any
alias of it; every panel that mirrors an alert names the alert, and its
threshold is read from the rule pack at build time. GPU queries keep every
series' own labels (no ``sum by (gpu)`` that would fold MIG slices of one
board, which DCGM labels ``GPU_I_ID``, into one line).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from ._query import series

__all__ = ["COMMON_VARIABLES", "DASHBOARDS", "DashboardSpec", "PanelSpec", "RowSpec", "Target"]

Kind = Literal["timeseries", "stat", "table", "heatmap", "text"]


@dataclass(frozen=True, slots=True)
class Target:
    """One query of a panel: PromQL with Grafana variables, its legend, its shape."""

    expr: str
    legend: str = ""
    instant: bool = False
    format: Literal["time_series", "table", "heatmap"] = "time_series"


@dataclass(frozen=True, slots=True)
class PanelSpec:
    title: str
    kind: Kind
    targets: tuple[Target, ...] = ()
    unit: str = "short"
    description: str = ""
    #: the alert of the rule pack whose threshold the panel draws
    alert: str | None = None
    width: int = 8
    height: int = 8
    #: markdown of a text panel
    content: str = ""
    stack: bool = False
    #: event counters that have no series until their first event (an error, a
    #: rejection, an Xid): the panel shows 0 through a fallback, and the "Not
    #: collected" panel leaves them out rather than call a healthy service broken
    lazy: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class RowSpec:
    title: str
    panels: tuple[PanelSpec, ...]


#: The template variables every dashboard has (besides the data source).
COMMON_VARIABLES = ("node", "instance", "model", "gpu")


@dataclass(frozen=True, slots=True)
class DashboardSpec:
    uid: str
    title: str
    description: str
    rows: tuple[RowSpec, ...]
    tags: tuple[str, ...] = field(default=("aivitals",))
    #: its template variables, in dropdown order (names of ``_build``'s variable table)
    variables: tuple[str, ...] = COMMON_VARIABLES


# --- query helpers ------------------------------------------------------------------------
RATE = "$__rate_interval"


def _sum_rate(sample: str, by: str, where: dict[str, str] | None = None) -> str:
    return f"sum by ({by}) ({series(sample, fn='rate', where=where)})"


def _quantile(q: float, family: str, by: str) -> str:
    return f"histogram_quantile({q}, sum by ({by}, le) ({series(family + '_bucket', fn='rate')}))"


def _share(sample: str, where: dict[str, str], by: str) -> str:
    """Share of ``sample``'s rate matching ``where``; 0 (not empty) when none match but
    there is traffic, empty when the metric itself is not collected."""
    total = _sum_rate(sample, by)
    part = _sum_rate(sample, by, where)
    return f"({part} or {total} * 0) / {total}"


def _q(*targets: tuple[str, str] | Target) -> tuple[Target, ...]:
    return tuple(t if isinstance(t, Target) else Target(t[0], t[1]) for t in targets)


HTTP_COUNT = "http_request_duration_seconds_count"

# --- overview -----------------------------------------------------------------------------
OVERVIEW = DashboardSpec(
    uid="aivitals-overview",
    title="aivitals / Overview",
    description="Golden signals of every served model endpoint: traffic, latency, errors, "
    "saturation.",
    rows=(
        RowSpec(
            "Traffic and latency",
            (
                PanelSpec(
                    "Requests per second",
                    "timeseries",
                    _q((_sum_rate(HTTP_COUNT, "job"), "{{job}}")),
                    unit="reqps",
                    description="QPS by job, over the selected nodes and instances.",
                ),
                PanelSpec(
                    "Request latency P50 / P95 / P99",
                    "timeseries",
                    _q(
                        (_quantile(0.5, "http_request_duration_seconds", "job"), "P50 {{job}}"),
                        (_quantile(0.95, "http_request_duration_seconds", "job"), "P95 {{job}}"),
                        (_quantile(0.99, "http_request_duration_seconds", "job"), "P99 {{job}}"),
                    ),
                    unit="s",
                    description="First byte in to last byte out, from the request histogram.",
                ),
                PanelSpec(
                    "P99 latency, slowest 10 instances",
                    "timeseries",
                    _q(
                        (
                            "topk(10, "
                            + _quantile(0.99, "http_request_duration_seconds", "node, instance")
                            + ")",
                            "{{node}} {{instance}}",
                        )
                    ),
                    unit="s",
                    description="One replica at 3x its peers stands out here before the average "
                    "moves.",
                ),
            ),
        ),
        RowSpec(
            "Errors",
            (
                PanelSpec(
                    "Error responses by status",
                    "timeseries",
                    _q(
                        (
                            _sum_rate(HTTP_COUNT, "job, status", {"status_class": "~4xx|5xx"})
                            + " or "
                            + _sum_rate(HTTP_COUNT, "job")
                            + " * 0",
                            "{{job}} {{status}}",
                        )
                    ),
                    unit="reqps",
                    description="4xx and 5xx per second by HTTP status (0 while there are none).",
                ),
                PanelSpec(
                    "429 share (load shed)",
                    "timeseries",
                    _q((_share(HTTP_COUNT, {"status": "429"}, "job"), "{{job}}")),
                    unit="percentunit",
                    alert="HTTP429RateHigh",
                ),
                PanelSpec(
                    "504 share (caller gave up)",
                    "timeseries",
                    _q((_share(HTTP_COUNT, {"status": "504"}, "job"), "{{job}}")),
                    unit="percentunit",
                    alert="HTTP504RateHigh",
                ),
                PanelSpec(
                    "Errors by error code",
                    "timeseries",
                    _q(
                        (
                            _sum_rate("errors_total", "job, error_code")
                            + " or "
                            + _sum_rate(HTTP_COUNT, "job")
                            + " * 0",
                            "{{job}} {{error_code}}",
                        )
                    ),
                    unit="ops",
                    description="aivitals' error-code table (CUDA_OOM, DEPENDENCY_TIMEOUT, ...).",
                    width=12,
                    lazy=("errors_total",),
                ),
                PanelSpec(
                    "Model errors by error code",
                    "timeseries",
                    _q(
                        (
                            _sum_rate("model_inference_errors_total", "job, model, error_code")
                            + " or "
                            + _sum_rate("model_inference_time_seconds_count", "job, model")
                            + " * 0",
                            "{{model}} {{error_code}}",
                        )
                    ),
                    unit="ops",
                    width=12,
                    lazy=("model_inference_errors_total",),
                ),
            ),
        ),
        RowSpec(
            "Saturation and health",
            (
                PanelSpec(
                    "In flight",
                    "timeseries",
                    _q((f"sum by (job) ({series('http_requests_in_flight')})", "{{job}}")),
                    unit="short",
                ),
                PanelSpec(
                    "Ready",
                    "stat",
                    _q(Target(series("service_ready"), "{{node}} {{instance}}", instant=True)),
                    alert="ServiceNotReady",
                    description="1 while /readyz answers 200.",
                ),
                PanelSpec(
                    "Targets up",
                    "stat",
                    _q(Target(series("up"), "{{job}} {{instance}}", instant=True)),
                    alert="TargetDown",
                ),
            ),
        ),
    ),
)

# --- model --------------------------------------------------------------------------------
MODEL = DashboardSpec(
    uid="aivitals-model",
    title="aivitals / Model",
    description="Time to first token, time per output token, GPU time against wall time, "
    "tokens, KV cache.",
    rows=(
        RowSpec(
            "Latency",
            (
                PanelSpec(
                    "Time to first token P50 / P99",
                    "timeseries",
                    _q(
                        (
                            _quantile(0.5, "model_time_to_first_token_seconds", "model"),
                            "P50 {{model}}",
                        ),
                        (
                            _quantile(0.99, "model_time_to_first_token_seconds", "model"),
                            "P99 {{model}}",
                        ),
                    ),
                    unit="s",
                ),
                PanelSpec(
                    "Time per output token P50 / P99",
                    "timeseries",
                    _q(
                        (
                            _quantile(0.5, "model_time_per_output_token_seconds", "model"),
                            "P50 {{model}}",
                        ),
                        (
                            _quantile(0.99, "model_time_per_output_token_seconds", "model"),
                            "P99 {{model}}",
                        ),
                    ),
                    unit="s",
                ),
                PanelSpec(
                    "GPU time vs wall time (P99)",
                    "timeseries",
                    _q(
                        (
                            _quantile(0.99, "model_inference_time_seconds", "model"),
                            "model time {{model}}",
                        ),
                        (
                            _quantile(0.99, "model_inference_wall_time_seconds", "model"),
                            "wall time {{model}}",
                        ),
                        (
                            _quantile(0.99, "cuda_stream_wait_time_seconds", "model"),
                            "stream wait {{model}}",
                        ),
                    ),
                    unit="s",
                    alert="InferenceLatencyHigh",
                    description="A wall time far above the model time is host overhead: the GIL, "
                    "a CPU-bound tokenizer, a synchronisation.",
                ),
            ),
        ),
        RowSpec(
            "Tokens",
            (
                PanelSpec(
                    "Tokens per second",
                    "timeseries",
                    _q(
                        (_sum_rate("model_input_tokens_sum", "model"), "input {{model}}"),
                        (_sum_rate("model_output_tokens_sum", "model"), "output {{model}}"),
                    ),
                    unit="short",
                ),
                PanelSpec(
                    "Input tokens per request",
                    "heatmap",
                    (
                        Target(
                            f"sum by (le) ({series('model_input_tokens_bucket', fn='rate')})",
                            "{{le}}",
                            format="heatmap",
                        ),
                    ),
                ),
                PanelSpec(
                    "Output tokens per request",
                    "heatmap",
                    (
                        Target(
                            f"sum by (le) ({series('model_output_tokens_bucket', fn='rate')})",
                            "{{le}}",
                            format="heatmap",
                        ),
                    ),
                ),
            ),
        ),
        RowSpec(
            "Engine",
            (
                PanelSpec(
                    "KV cache in use",
                    "timeseries",
                    _q((series("kv_cache_usage_ratio"), "{{node}} {{model}}")),
                    unit="percentunit",
                    alert="KVCacheHigh",
                    description="Exported by vLLM (vllm:kv_cache_usage_perc, a 0-1 ratio) or an "
                    "instrumented engine.",
                ),
                PanelSpec(
                    "Prefix cache hit ratio",
                    "timeseries",
                    _q(
                        (
                            f"{_sum_rate('kv_cache_hits_total', 'model')} / "
                            f"{_sum_rate('kv_cache_queries_total', 'model')}",
                            "{{model}}",
                        )
                    ),
                    unit="percentunit",
                ),
                PanelSpec(
                    "Inferences in progress, preemptions",
                    "timeseries",
                    _q(
                        (
                            f"sum by (model) ({series('model_inferences_in_progress')})",
                            "running {{model}}",
                        ),
                        (_sum_rate("model_preemptions_total", "model"), "preempted/s {{model}}"),
                    ),
                ),
            ),
        ),
    ),
)

# --- queue and workers --------------------------------------------------------------------
QUEUE = DashboardSpec(
    uid="aivitals-queue",
    title="aivitals / Queue and workers",
    description="Queues, worker pools and admission control: where requests wait before the model.",
    rows=(
        RowSpec(
            "Queues",
            (
                PanelSpec(
                    "Queue length",
                    "timeseries",
                    _q(
                        (series("queue_length"), "{{node}} {{queue}}"),
                        (series("queue_capacity"), "capacity {{node}} {{queue}}"),
                    ),
                    alert="QueueBacklog",
                ),
                PanelSpec(
                    "Queue wait P99",
                    "timeseries",
                    _q((_quantile(0.99, "queue_wait_seconds", "job, queue"), "{{job}} {{queue}}")),
                    unit="s",
                    alert="QueueWaitHigh",
                ),
                PanelSpec(
                    "Queue rejections",
                    "timeseries",
                    _q(
                        (
                            _sum_rate("queue_rejections_total", "queue, reason")
                            + " or sum by (queue) ("
                            + series("queue_capacity")
                            + ") * 0",
                            "{{queue}} {{reason}}",
                        )
                    ),
                    unit="ops",
                    lazy=("queue_rejections_total",),
                ),
            ),
        ),
        RowSpec(
            "Workers and admission",
            (
                PanelSpec(
                    "Worker pool busy share",
                    "timeseries",
                    # the busy-time counter's rate, as WorkerPoolSaturated reads it; the
                    # sampled gauge for pools that do not export the counter
                    _q(
                        (
                            f"{series('worker_pool_busy_seconds_total', fn='rate')} / "
                            f"{series('worker_pool_max_workers')} or "
                            f"{series('worker_pool_active_workers')} / "
                            f"{series('worker_pool_max_workers')}",
                            "{{node}} {{pool}}",
                        )
                    ),
                    unit="percentunit",
                    alert="WorkerPoolSaturated",
                ),
                PanelSpec(
                    "Admission: limit, in flight, queued",
                    "timeseries",
                    _q(
                        (series("admission_concurrency_limit"), "limit {{node}}"),
                        (series("admission_in_flight"), "in flight {{node}}"),
                        (
                            f"sum by (node, instance) ({series('admission_queue_length')})",
                            "queued {{node}}",
                        ),
                    ),
                ),
                PanelSpec(
                    "Admission rejections and timeouts",
                    "timeseries",
                    _q(
                        (
                            _sum_rate("admission_rejections_total", "reason")
                            + " or sum ("
                            + series("admission_in_flight")
                            + ") * 0",
                            "rejected {{reason}}",
                        ),
                        (
                            _sum_rate("request_timeouts_total", "reason")
                            + " or sum ("
                            + series("admission_in_flight")
                            + ") * 0",
                            "timed out {{reason}}",
                        ),
                    ),
                    unit="ops",
                    lazy=("admission_rejections_total", "request_timeouts_total"),
                ),
            ),
        ),
    ),
)

# --- GPU ----------------------------------------------------------------------------------
# GPU_I_ID: the MIG instance, as DCGM labels it (empty on a whole GPU)
GPU_LEGEND = "{{node}} gpu {{gpu}} {{GPU_I_ID}}"
PROCESS_MEMORY = "gpu_process_memory_used_bytes"


def _pod_memory(by: str, where: dict[str, str]) -> str:
    """Per-process GPU memory summed by ``by``: named pods (``pod`` set), pods known by
    UID only (no kubelet source), processes outside any pod (no ``pod_uid``)."""
    return f"sum by ({by}) ({series(PROCESS_MEMORY, where=where)})"


GPU = DashboardSpec(
    uid="aivitals-gpu",
    title="aivitals / GPU",
    description="Every GPU and every process on it: memory (per process and per Kubernetes "
    "pod), utilization, power, clocks, throttling, Xid, ECC. Series keep their own labels, "
    "so MIG instances stay separate.",
    variables=(*COMMON_VARIABLES, "namespace", "pod"),
    rows=(
        RowSpec(
            "Memory",
            (
                PanelSpec(
                    "Memory used share",
                    "timeseries",
                    _q(
                        (
                            # used / (used + free), not used / total: DCGM exports no total
                            f"{series('gpu_memory_used_bytes')} / "
                            f"({series('gpu_memory_used_bytes')}"
                            f" + {series('gpu_memory_free_bytes')})",
                            GPU_LEGEND,
                        )
                    ),
                    unit="percentunit",
                    alert="GPUMemoryHigh",
                ),
                PanelSpec(
                    "Memory used",
                    "timeseries",
                    _q((series("gpu_memory_used_bytes"), GPU_LEGEND)),
                    unit="bytes",
                ),
                PanelSpec(
                    "Memory per process",
                    "timeseries",
                    _q(
                        (
                            series(PROCESS_MEMORY),
                            "{{node}} gpu {{gpu}} {{process}} ({{pid}}) {{namespace}} {{pod}}",
                        )
                    ),
                    unit="bytes",
                    alert="GPUProcessMemoryGrowth",
                    description="Device memory of each compute process (needs the agent in the "
                    "host PID namespace: hostPID on Kubernetes), with its pod when it runs in "
                    "one. A leak is one line that only climbs.",
                ),
                PanelSpec(
                    "Memory per pod",
                    "timeseries",
                    _q(
                        (_pod_memory("namespace, pod", {"pod": "!"}), "{{namespace}}/{{pod}}"),
                        (
                            _pod_memory("pod_uid", {"pod": "", "pod_uid": "!"}),
                            "pod {{pod_uid}} (unnamed)",
                        ),
                        (_pod_memory("node", {"pod_uid": ""}), "{{node}}: outside any pod"),
                    ),
                    unit="bytes",
                    description="Device memory of each Kubernetes pod's compute processes, "
                    "summed over its processes and GPUs. Attributed through each process's "
                    "cgroup, so it splits time-sliced and MPS GPUs, which the kubelet's "
                    "pod-resources cannot. A pod is named when the agent reads the kubelet's "
                    "pods (--kubelet-pods); else it shows by UID (join pod_uid with "
                    "kube_pod_info's uid). Processes outside any pod: one line per node.",
                    width=24,
                ),
            ),
        ),
        RowSpec(
            "Load, power, clocks",
            (
                PanelSpec(
                    "Utilization",
                    "timeseries",
                    _q((series("gpu_utilization_ratio"), GPU_LEGEND)),
                    unit="percentunit",
                    alert="GPUUtilizationHigh",
                ),
                PanelSpec(
                    "Power draw and limit",
                    "timeseries",
                    _q(
                        (series("gpu_power_watts"), GPU_LEGEND),
                        (series("gpu_power_limit_watts"), "limit " + GPU_LEGEND),
                    ),
                    unit="watt",
                ),
                PanelSpec(
                    "SM clock",
                    "timeseries",
                    _q((series("gpu_sm_clock_hertz"), GPU_LEGEND)),
                    unit="hertz",
                ),
                PanelSpec(
                    "Temperature",
                    "timeseries",
                    _q((series("gpu_temperature_celsius"), GPU_LEGEND)),
                    unit="celsius",
                ),
                PanelSpec(
                    "Throttle (clock event) reasons active",
                    "timeseries",
                    _q((series("gpu_clock_event_active"), GPU_LEGEND + " {{reason}}")),
                    description="1 while the reason holds the clocks down (power cap, thermal, "
                    "idle, ...); 0 otherwise, so a healthy GPU shows flat lines, not no data.",
                ),
                PanelSpec(
                    "PCIe throughput",
                    "timeseries",
                    _q(
                        (series("gpu_pcie_tx_bytes_per_second"), "tx " + GPU_LEGEND),
                        (series("gpu_pcie_rx_bytes_per_second"), "rx " + GPU_LEGEND),
                    ),
                    unit="Bps",
                ),
            ),
        ),
        RowSpec(
            "Errors",
            (
                PanelSpec(
                    "Xid errors per code",
                    "timeseries",
                    _q(
                        (
                            "sum by (node, instance, gpu, xid, meaning) ("
                            + series("gpu_xid_errors_total", fn="increase")
                            + ") or sum by (node, instance, gpu) ("
                            + series("gpu_memory_used_bytes")
                            + ") * 0",
                            "{{node}} gpu {{gpu}} Xid {{xid}} {{meaning}}",
                        )
                    ),
                    alert="GPUXidError",
                    description="Increases of the Xid counter by code (79: fallen off the bus, "
                    "48: double-bit ECC, 13/31/43: application faults).",
                    lazy=("gpu_xid_errors_total",),
                ),
                PanelSpec(
                    "Last Xid code (DCGM semantics)",
                    "stat",
                    _q(Target(series("gpu_last_xid"), GPU_LEGEND, instant=True)),
                ),
                PanelSpec(
                    "ECC errors and remapped rows",
                    "timeseries",
                    _q(
                        (
                            series("gpu_ecc_errors_total", fn="increase"),
                            "ECC {{type}} " + GPU_LEGEND,
                        ),
                        (series("gpu_remapped_rows"), "remapped {{type}} " + GPU_LEGEND),
                    ),
                ),
                PanelSpec(
                    "Devices",
                    "table",
                    _q(Target(series("gpu_info"), "", instant=True, format="table")),
                    width=24,
                    height=6,
                ),
            ),
        ),
    ),
)

# --- host ---------------------------------------------------------------------------------
HOST = DashboardSpec(
    uid="aivitals-host",
    title="aivitals / Host",
    description="CPU, pressure, memory, disks, network and file descriptors of each node.",
    rows=(
        RowSpec(
            "CPU and pressure",
            (
                PanelSpec(
                    "CPU by mode (cores)",
                    "timeseries",
                    _q((_sum_rate("host_cpu_seconds_total", "node, mode"), "{{node}} {{mode}}")),
                    stack=True,
                ),
                PanelSpec(
                    "CPU busy share",
                    "timeseries",
                    _q(
                        (
                            "1 - "
                            + _sum_rate("host_cpu_seconds_total", "node", {"mode": "~idle|iowait"})
                            + " / "
                            + _sum_rate(
                                "host_cpu_seconds_total", "node", {"mode": "!~guest|guest_nice"}
                            ),
                            "{{node}}",
                        )
                    ),
                    unit="percentunit",
                    alert="HostCPUSaturated",
                ),
                PanelSpec(
                    "Pressure stall (PSI)",
                    "timeseries",
                    _q(
                        (
                            series("host_pressure_stalled_seconds_total", fn="rate"),
                            "{{node}} {{resource}} {{kind}}",
                        )
                    ),
                    unit="percentunit",
                    description="Share of time tasks stalled on CPU, memory or I/O.",
                ),
            ),
        ),
        RowSpec(
            "Memory and disks",
            (
                PanelSpec(
                    "Host memory used share",
                    "timeseries",
                    _q(
                        (
                            f"1 - {series('host_memory_available_bytes')} / "
                            f"{series('host_memory_total_bytes')}",
                            "{{node}}",
                        ),
                        (
                            f"{series('host_swap_used_bytes')} / "
                            f"({series('host_swap_total_bytes')} > 0)",
                            "swap {{node}}",
                        ),
                    ),
                    unit="percentunit",
                ),
                PanelSpec(
                    "Disk await",
                    "timeseries",
                    _q(
                        (
                            f"{series('host_disk_read_time_seconds_total', fn='rate')} / "
                            f"{series('host_disk_reads_completed_total', fn='rate')}",
                            "read {{node}} {{device}}",
                        ),
                        (
                            f"{series('host_disk_write_time_seconds_total', fn='rate')} / "
                            f"{series('host_disk_writes_completed_total', fn='rate')}",
                            "write {{node}} {{device}}",
                        ),
                    ),
                    unit="s",
                ),
                PanelSpec(
                    "Disk busy share",
                    "timeseries",
                    _q(
                        (
                            series("host_disk_io_time_seconds_total", fn="rate"),
                            "{{node}} {{device}}",
                        )
                    ),
                    unit="percentunit",
                    alert="DiskSaturated",
                ),
            ),
        ),
        RowSpec(
            "Network and processes",
            (
                PanelSpec(
                    "TCP retransmit share",
                    "timeseries",
                    _q(
                        (
                            f"{series('host_tcp_retransmitted_segments_total', fn='rate')} / "
                            f"{series('host_tcp_out_segments_total', fn='rate')}",
                            "{{node}} {{netns}}",
                        )
                    ),
                    unit="percentunit",
                    alert="TCPRetransmitsHigh",
                ),
                PanelSpec(
                    "Interface errors and drops",
                    "timeseries",
                    _q(
                        (
                            series("host_network_receive_errors_total", fn="rate"),
                            "rx errors {{node}} {{interface}}",
                        ),
                        (
                            series("host_network_transmit_errors_total", fn="rate"),
                            "tx errors {{node}} {{interface}}",
                        ),
                        (
                            series("host_network_receive_drops_total", fn="rate"),
                            "rx drops {{node}} {{interface}}",
                        ),
                    ),
                    unit="pps",
                    alert="NetworkInterfaceErrors",
                ),
                PanelSpec(
                    "Open file descriptors share",
                    "timeseries",
                    _q(
                        (
                            f"{series('service_process_open_fds')} / "
                            f"{series('service_process_max_fds')}",
                            "{{node}} {{process}} ({{pid}})",
                        )
                    ),
                    unit="percentunit",
                    alert="FdsNearLimit",
                ),
                PanelSpec(
                    "OOM kills",
                    "timeseries",
                    _q(
                        (series("host_oom_kills_total", fn="increase"), "host {{node}}"),
                        (
                            f"sum by (node) ({series('kernel_oom_kills_total', fn='increase')}) "
                            "or sum by (node) ("
                            f"{series('host_oom_kills_total', fn='increase')}) * 0",
                            "kernel log {{node}}",
                        ),
                    ),
                    alert="HostOOMKill",
                    lazy=("kernel_oom_kills_total",),
                ),
                PanelSpec(
                    "Collectors up",
                    "stat",
                    _q(
                        Target(
                            series("aivitals_collector_up"), "{{node}} {{collector}}", instant=True
                        )
                    ),
                    alert="CollectorDown",
                ),
            ),
        ),
    ),
)

# --- alerts -------------------------------------------------------------------------------
ALERTS_DASHBOARD = DashboardSpec(
    uid="aivitals-alerts",
    title="aivitals / Alerts",
    description="The rule pack's alerts as Prometheus evaluates them (the ALERTS series).",
    rows=(
        RowSpec(
            "Now",
            (
                PanelSpec(
                    "Firing alerts",
                    "table",
                    _q(
                        Target(
                            'ALERTS{alertstate="firing", node=~"$node"}',
                            "",
                            instant=True,
                            format="table",
                        )
                    ),
                    width=24,
                ),
                PanelSpec(
                    "Firing and pending by severity",
                    "timeseries",
                    _q(
                        (
                            'count by (alertstate, severity) (ALERTS{node=~"$node"})',
                            "{{severity}} {{alertstate}}",
                        )
                    ),
                    width=12,
                ),
                PanelSpec(
                    "Targets down",
                    "table",
                    _q(Target(f"{series('up')} == 0", "", instant=True, format="table")),
                    description="Targets Prometheus could not scrape: their alerts cannot fire.",
                    alert="TargetDown",
                    width=12,
                ),
                PanelSpec(
                    "Alerts by name",
                    "timeseries",
                    _q(
                        (
                            'count by (alertname) (ALERTS{alertstate="firing", node=~"$node"})',
                            "{{alertname}}",
                        )
                    ),
                    width=12,
                ),
            ),
        ),
    ),
)

DASHBOARDS: tuple[DashboardSpec, ...] = (OVERVIEW, MODEL, QUEUE, GPU, HOST, ALERTS_DASHBOARD)
