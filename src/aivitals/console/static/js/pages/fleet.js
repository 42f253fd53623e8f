// Fleet: every scrape target and every GPU the backend holds, coloured by health,
// the outlier first (down, then alerting, then furthest from the fleet's median).

import { getJSON, Poller } from "../api.js";
import { el, clear, fill, fmtValue } from "../dom.js";

const QUERIES = [
  "up",
  "gpu_memory_used_bytes / gpu_memory_total_bytes",
  "gpu_utilization_ratio",
];

function median(xs) {
  const s = xs.filter(Number.isFinite).sort((a, b) => a - b);
  return s.length ? s[Math.floor(s.length / 2)] : NaN;
}

function alertsOn(alerts, labels) {
  return alerts.filter((a) => a.state === "firing" && Object.entries(labels).every(([k, v]) => !(k in a.labels) || a.labels[k] === v));
}

export function build(results, alerts, meta) {
  const [up, mem, util] = results.map((r) => r.series || []);
  const memLimit = ((meta.thresholds.gpu_memory || [])[0] || {}).value;
  const nodes = [];
  for (const s of up) {
    const labels = { job: s.metric.job || "", instance: s.metric.instance || "" };
    const firing = alertsOn(alerts, labels);
    const down = s.value === 0;
    nodes.push({ kind: "target", name: `${labels.job} ${labels.instance}`, sim: false, firing,
      health: down ? "bad" : firing.some((a) => a.severity === "P0") ? "bad" : firing.length ? "warn" : "ok",
      facts: [`up ${s.value}`], score: 0 });
  }
  const byGpu = new Map();
  for (const s of mem) byGpu.set(`${s.metric.instance || ""}|${s.metric.gpu}`, { metric: s.metric, mem: s.value });
  for (const s of util) {
    const k = `${s.metric.instance || ""}|${s.metric.gpu}`;
    byGpu.set(k, { ...(byGpu.get(k) || { metric: s.metric }), util: s.value });
  }
  const gpus = [...byGpu.values()];
  const mMed = median(gpus.map((g) => g.mem)), uMed = median(gpus.map((g) => g.util));
  for (const g of gpus) {
    const labels = { gpu: g.metric.gpu };
    if (g.metric.instance) labels.instance = g.metric.instance;
    const firing = alertsOn(alerts, labels).filter((a) => "gpu" in a.labels);
    const sim = g.metric.backend === "sim";
    const high = memLimit != null && g.mem > memLimit;
    nodes.push({ kind: "gpu", name: `${g.metric.instance ? g.metric.instance + " " : ""}GPU ${g.metric.gpu}`, sim, firing,
      health: firing.some((a) => a.severity === "P0" || a.severity === "P1") ? "bad" : high || firing.length ? "warn" : "ok",
      facts: [`memory ${fmtValue(g.mem, "ratio")}`, `utilization ${fmtValue(g.util, "ratio")}`],
      score: Math.abs((g.mem ?? mMed) - mMed) + Math.abs((g.util ?? uMed) - uMed) });
  }
  const rank = { bad: 0, warn: 1, ok: 2 };
  nodes.sort((a, b) => rank[a.health] - rank[b.health] || b.firing.length - a.firing.length || b.score - a.score);
  return nodes;
}

export function mount(main, ctx) {
  const note = el("div");
  const grid = el("div", { class: "nodes", "data-testid": "fleet" });
  main.append(el("h2", {}, "Fleet"), note, grid);
  const poller = new Poller(async (signal) => {
    const params = QUERIES.map((x) => ["q", x]);
    const [inst, al] = await Promise.all([getJSON("/console/api/instant", params, signal),
      getJSON("/console/api/alerts", [], signal).catch(() => ({ alerts: [] }))]);
    return build(inst.results, al.alerts, ctx.state.meta);
  }, {
    interval: ctx.tick,
    onData: (nodes) => {
      clear(note);
      if (nodes.length <= 2) note.append(el("p", { class: "hint" }, "This backend holds one instance; the grid is most useful over a Prometheus with several."));
      fill(grid, nodes.length ? nodes.map((n) => el("div", { class: `node h-${n.health}`, "data-testid": "node" },
        el("div", { class: "name" }, n.name, " ", n.sim ? el("span", { class: "badge sim" }, "sim") : null),
        el("div", { class: "kv" }, n.kind === "gpu" ? "GPU" : "scrape target"),
        n.facts.map((f) => el("div", { class: "kv" }, f)),
        n.firing.map((a) => el("div", {}, el("span", { class: `badge ${a.severity}` }, a.severity), " ", a.alertname))))
        : el("p", { class: "hint" }, "No targets or GPUs: not collected."));
    },
    onError: (e, wait) => fill(note, el("div", { class: "banner" }, `Fleet unavailable: ${e.message}. Retrying in ${Math.round(wait / 1000)} s.`)),
  });
  poller.start();
  return { stop: () => poller.stop() };
}
