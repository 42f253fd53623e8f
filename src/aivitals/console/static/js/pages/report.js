// The daily report (`aivitals report daily`) with the day's charts beside it.

import { getJSON, Poller } from "../api.js";
import { el, clear, fill, fmtDateTime } from "../dom.js";
import { livePanels } from "../panels.js";

const CHARTS = [
  { id: "day_queue", title: "Queue length (sum)", unit: "", unitLabel: "requests", queries: [{ expr: "sum(queue_length)", name: "queue" }] },
  { id: "day_504", title: "504 answers by route", unit: "", unitLabel: "per s",
    queries: [{ expr: 'sum by (route) (rate(http_request_duration_seconds_count{status="504"}[$W]))', name: "" }] },
  { id: "day_gpu_util", title: "GPU utilization", unit: "ratio", sim: true, queries: [{ expr: "gpu_utilization_ratio", name: "" }] },
];

function kpi(label, value, cls, testid) {
  return el("div", { class: "kpi", "data-testid": testid }, el("div", { class: `v ${cls || ""}` }, value), el("div", { class: "k" }, label));
}

export function mount(main, ctx) {
  const head = el("div", { "data-testid": "report" }, el("p", { class: "hint" }, "computing the report…"));
  const grid = el("div", { class: "grid" });
  main.append(el("h2", {}, "Daily health report (last 24 h)"), head, el("div", { class: "section" }, "The day"), grid);
  const day = () => { const end = Date.now() / 1000; return [end - 86400, end]; };
  const charts = livePanels(grid, CHARTS, ctx, { window: day, live: true });
  const poller = new Poller((signal) => getJSON("/console/api/report", [], signal), {
    interval: () => 60000,
    onData: (r) => {
      const util = Object.entries(r.gpu_util_stddev);
      fill(head,
        el("p", { class: "hint" }, `${fmtDateTime(r.start)} – ${fmtDateTime(r.end)}`),
        el("div", { class: "kpis" },
          kpi(`peak queue length (red above ${r.queue_red_above})`, r.peak_queue == null ? "not collected" : String(r.peak_queue), r.peak_queue_red ? "red" : "", "kpi-queue"),
          kpi("top endpoints by 504 count", r.top_504.length ? r.top_504.map(([route, n]) => `${route}: ${n}`).join(", ") : "none", "", "kpi-504"),
          kpi(`GPU utilization std dev, points (yellow above ${r.stddev_yellow_above})`,
            util.length ? util.map(([g, sd]) => `GPU ${g}: ${sd.toFixed(1)}`).join(", ") : "not collected",
            r.gpu_util_yellow.length ? "yellow" : "", "kpi-gpu")),
        el("h3", {}, "Alerts of the day"),
        r.alerts.length ? el("ul", {}, r.alerts.map((a) => el("li", {}, `${a.alertname} `,
          el("span", { class: "hint" }, `${Object.entries(a.labels || {}).filter(([k]) => k !== "alertname").map(([k, v]) => `${k}=${v}`).join(", ")} · since ${typeof a.since === "number" ? fmtDateTime(a.since) : a.since}`))))
          : el("p", { class: "hint" }, "none"),
        r.unseen.length ? el("details", {}, el("summary", { class: "hint" }, `${r.unseen.length} things not collected`),
          el("ul", {}, r.unseen.map((u) => el("li", {}, `${u.what}: ${u.why}`)))) : null);
    },
    onError: (e, wait) => fill(head, el("div", { class: "banner" }, `Report unavailable: ${e.message}. Retrying in ${Math.round(wait / 1000)} s.`)),
  });
  poller.start();
  return { stop() { poller.stop(); charts.stop(); } };
}
