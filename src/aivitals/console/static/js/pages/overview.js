// Overview: the golden signals, model timing, queues and workers, cache, GPU and host.
// `$W` in an expression is the rate window, chosen per request from the step.

import { el } from "../dom.js";
import { livePanels } from "../panels.js";

const q = (expr, name) => ({ expr, name });
const quantile = (p, metric, by = "") =>
  `histogram_quantile(${p}, sum by (le${by}) (rate(${metric}_bucket[$W])))`;
const ALL = "sum(rate(http_request_duration_seconds_count[$W]))";
// "or 0 * all": while requests are served, no 429 series means a share of 0, not "no data"
const share = (sel) => `sum(rate(http_request_duration_seconds_count{${sel}}[$W])) / ${ALL} or 0 * ${ALL}`;

export const SECTIONS = [
  ["Golden signals", [
    { id: "req_rate", title: "Request rate", unit: "", unitLabel: "req/s",
      queries: [q("sum by (route) (rate(http_request_duration_seconds_count[$W]))")] },
    { id: "errors", title: "Errors by code", unit: "", unitLabel: "req/s",
      queries: [q(`sum by (status) (rate(http_request_duration_seconds_count{status=~"4..|5.."}[$W])) or 0 * ${ALL}`, "")] },
    { id: "latency", title: "Request latency P50 / P95 / P99", unit: "seconds",
      queries: [q(quantile(0.5, "http_request_duration_seconds"), "P50"), q(quantile(0.95, "http_request_duration_seconds"), "P95"),
        q(quantile(0.99, "http_request_duration_seconds"), "P99")] },
    { id: "http_504_429", title: "429 and 504 share of requests", unit: "ratio", thresholds: "http_504_429",
      queries: [q(share('status="429"'), "429"), q(share('status="504"'), "504")] },
  ]],
  ["Model", [
    { id: "ttft", title: "Time to first token / per output token (P95)", unit: "seconds",
      queries: [q(quantile(0.95, "model_time_to_first_token_seconds"), "TTFT"), q(quantile(0.95, "model_time_per_output_token_seconds"), "TPOT")] },
    { id: "inference_p99", title: "Inference P99: GPU time vs wall time", unit: "seconds", thresholds: "inference_p99",
      queries: [q(quantile(0.99, "model_inference_time_seconds"), "GPU time"), q(quantile(0.99, "model_inference_wall_time_seconds"), "wall")] },
    { id: "tokens", title: "Tokens per second", unit: "", unitLabel: "tokens/s",
      queries: [q("sum by (model) (rate(model_output_tokens_sum[$W]))", "out"), q("sum by (model) (rate(model_input_tokens_sum[$W]))", "in")] },
    { id: "cache", title: "Cache hit ratio", unit: "ratio",
      queries: [q('sum by (cache) (rate(cache_requests_total{result="hit"}[$W])) / sum by (cache) (rate(cache_requests_total{result=~"hit|miss"}[$W]))')] },
  ]],
  ["Queues and workers", [
    { id: "queue_length", title: "Queue length", unit: "", unitLabel: "requests", thresholds: "queue_length",
      queries: [q("sum by (queue) (queue_length)")] },
    { id: "queue_wait", title: "Queue wait P99", unit: "seconds", thresholds: "queue_wait",
      queries: [q(quantile(0.99, "queue_wait_seconds", ", queue"))] },
    // the busy share over the window, as WorkerPoolSaturated reads it: an instant sample of a
    // small pool is often all busy in a healthy service and crossed the threshold line
    // while no alert could fire; pools without the busy-time counter fall back to the gauge
    { id: "workers_busy", title: "Workers busy (share of the window)", unit: "ratio", thresholds: "workers_busy",
      queries: [q("sum by (pool) (rate(worker_pool_busy_seconds_total[$W])) / sum by (pool) (worker_pool_max_workers)"
        + " or sum by (pool) (avg_over_time(worker_pool_active_workers[$W])) / sum by (pool) (avg_over_time(worker_pool_max_workers[$W]))")] },
    { id: "probe", title: "Probe latency (the callers' path)", unit: "seconds", thresholds: "probe",
      queries: [q("probe_duration_seconds")] },
  ]],
  ["GPU", [
    { id: "gpu_process_memory", title: "GPU memory per process", unit: "bytes", sim: true,
      queries: [q("gpu_process_memory_used_bytes")] },
    { id: "gpu_memory", title: "GPU memory used", unit: "ratio", sim: true, thresholds: "gpu_memory",
      queries: [q("gpu_memory_used_bytes / gpu_memory_total_bytes")] },
    { id: "gpu_util", title: "GPU utilization", unit: "ratio", sim: true, thresholds: "gpu_util",
      queries: [q("gpu_utilization_ratio")] },
  ]],
  ["Host", [
    { id: "host_cpu", title: "Host CPU busy", unit: "ratio", thresholds: "host_cpu",
      queries: [q('1 - sum(rate(host_cpu_seconds_total{mode=~"idle|iowait"}[$W])) / sum(rate(host_cpu_seconds_total{mode!~"guest|guest_nice"}[$W]))')] },
    { id: "host_memory", title: "Host memory used", unit: "ratio",
      queries: [q("1 - host_memory_available_bytes / host_memory_total_bytes")] },
    { id: "host_psi", title: "Pressure stall (PSI some)", unit: "ratio",
      queries: [q('rate(host_pressure_stalled_seconds_total{kind="some"}[$W])')] },
  ]],
];

export function withThresholds(spec, meta) {
  const key = spec.thresholds;
  return { ...spec, thresholds: key && meta.thresholds[key] ? meta.thresholds[key] : [] };
}

export function mount(main, ctx) {
  main.append(el("p", { class: "hint" },
    "Live, refreshed every scrape interval. Dashed lines are the rule pack's thresholds. " +
    "Drag across any chart to diagnose that window."));
  const groups = [];
  for (const [title, specs] of SECTIONS) {
    const grid = el("div", { class: "grid" });
    main.append(el("div", { class: "section" }, title), grid);
    groups.push(livePanels(grid, specs.map((s) => withThresholds(s, ctx.state.meta)), ctx));
  }
  return {
    stop() { for (const g of groups) g.stop(); },
    rangeChanged() { for (const g of groups) g.refresh(); },
  };
}
