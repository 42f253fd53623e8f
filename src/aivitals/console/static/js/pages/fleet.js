// Fleet: every node the backend holds, each with its scrape targets and its GPUs,
// coloured by health, the outlier first (down or named by the diagnosis, then
// alerting, then furthest from the fleet's median GPU memory and utilization).
//
// A node is the series' `node` label (the diagnosis' location label), else the
// host of its `instance`: one agent and the service it scrapes on one host are one
// node. Health comes from what the backend says, never from a guess here: a target
// that is down, a P0/P1 alert, or the latest diagnosis naming the node (its
// per-node verdict) or the GPU (a finding whose `where` holds that gpu) is red; over
// the GPU memory threshold or any other alert is yellow.

import { getJSON, Poller } from "../api.js";
import { el, clear, fill, fmtValue } from "../dom.js";

const QUERIES = [
  "up",
  "gpu_memory_used_bytes / gpu_memory_total_bytes",
  "gpu_utilization_ratio",
];
const RANK = { bad: 0, warn: 1, ok: 2 };

function median(xs) {
  const s = xs.filter(Number.isFinite).sort((a, b) => a - b);
  return s.length ? s[Math.floor(s.length / 2)] : NaN;
}

function alertsOn(alerts, labels) {
  return alerts.filter((a) => a.state === "firing" && Object.entries(labels).every(([k, v]) => !(k in a.labels) || a.labels[k] === v));
}

/** The node a series belongs to: its location label, else its instance's host. */
function nodeOf(metric, location) {
  if (metric[location]) return metric[location];
  const inst = metric.instance || "";
  // "host:port", "[v6]:port" or a bare host; no instance at all: the backend itself
  const m = /^(\[[^\]]*\]|[^:]*)(:\d+)?$/.exec(inst);
  return (m ? m[1] : inst) || "";
}

function worst(healths) {
  return healths.reduce((w, h) => (RANK[h] < RANK[w] ? h : w), "ok");
}

/**
 * The grid's model: nodes (worst first), each with its targets and GPUs (worst first).
 * `diagnosis` is the latest verdict (or null when it could not be had).
 */
export function build(results, alerts, meta, diagnosis) {
  const [up, mem, util] = results.map((r) => r.series || []);
  const memLimit = ((meta.thresholds.gpu_memory || [])[0] || {}).value;
  const location = (diagnosis && diagnosis.location) || "node";
  const verdicts = (diagnosis && diagnosis.nodes) || {};
  const findings = (diagnosis && diagnosis.findings) || [];
  const nodes = new Map();
  const node = (name) => {
    if (!nodes.has(name)) nodes.set(name, { name, targets: [], gpus: [], firing: [], verdict: verdicts[name] });
    return nodes.get(name);
  };
  for (const name of Object.keys(verdicts)) node(name);
  for (const s of up) {
    const labels = { job: s.metric.job || "", instance: s.metric.instance || "" };
    const firing = alertsOn(alerts, labels).filter((a) => !("gpu" in a.labels));
    const down = s.value === 0;
    node(nodeOf(s.metric, location)).targets.push({ job: labels.job, instance: labels.instance, down, firing,
      health: down || firing.some((a) => a.severity === "P0") ? "bad" : firing.length ? "warn" : "ok" });
  }
  const byGpu = new Map();
  const key = (m) => `${nodeOf(m, location)}|${m.instance || ""}|${m.gpu}`;
  for (const s of mem) byGpu.set(key(s.metric), { metric: s.metric, mem: s.value });
  for (const s of util) byGpu.set(key(s.metric), { ...(byGpu.get(key(s.metric)) || { metric: s.metric }), util: s.value });
  const gpus = [...byGpu.values()];
  const mMed = median(gpus.map((g) => g.mem)), uMed = median(gpus.map((g) => g.util));
  for (const g of gpus) {
    const where = nodeOf(g.metric, location);
    const labels = { gpu: g.metric.gpu };
    if (g.metric.instance) labels.instance = g.metric.instance;
    const firing = alertsOn(alerts, labels).filter((a) => "gpu" in a.labels);
    // a finding naming this GPU: on this node over a fleet, or the one machine's
    const named = findings.filter((f) => f.where && f.where.gpu === g.metric.gpu
      && (f.where[location] === undefined ? f.scope === "local" : f.where[location] === where));
    const high = memLimit != null && g.mem > memLimit;
    const bad = named.length || firing.some((a) => a.severity === "P0" || a.severity === "P1");
    node(where).gpus.push({ gpu: g.metric.gpu, sim: g.metric.backend === "sim", mem: g.mem, util: g.util, firing, named,
      health: bad ? "bad" : high || firing.length ? "warn" : "ok",
      score: Math.abs((g.mem ?? mMed) - mMed) + Math.abs((g.util ?? uMed) - uMed) });
  }
  const order = (a, b) => RANK[a.health] - RANK[b.health]
    || (b.named || []).length - (a.named || []).length || b.firing.length - a.firing.length || b.score - a.score;
  // series without a node or instance (an agent's own GPUs) are on the backend's own
  // machine: the one host its targets run on when there is one, else a node of their own
  const own = nodes.get("");
  if (own) {
    nodes.delete("");
    const hosts = [...nodes.values()];
    const into = hosts.length === 1 ? hosts[0] : node("this instance");
    into.targets.push(...own.targets);
    into.gpus.push(...own.gpus);
  }
  const out = [...nodes.values()];
  for (const n of out) {
    n.gpus.sort(order);
    n.firing = [...n.targets, ...n.gpus].flatMap((x) => x.firing);
    n.sim = n.gpus.some((g) => g.sim);
    n.score = Math.max(0, ...n.gpus.map((g) => g.score));
    // the diagnosis' per-node verdict: anything but "healthy" is a fault found there
    const judged = n.verdict && n.verdict !== "healthy" ? "bad" : "ok";
    n.health = worst([judged, ...n.targets.map((t) => t.health), ...n.gpus.map((g) => g.health)]);
    n.named = n.gpus.flatMap((g) => g.named);
  }
  out.sort((a, b) => order(a, b) || a.name.localeCompare(b.name, undefined, { numeric: true }));
  return out;
}

function gpuCell(g) {
  const title = g.named.length ? g.named.map((f) => f.title).join("; ") : `GPU ${g.gpu}`;
  return el("div", { class: `gpu h-${g.health}`, "data-testid": "gpu", title },
    el("div", { class: "name" }, `GPU ${g.gpu}`, g.sim ? el("span", { class: "badge sim" }, "sim") : null),
    el("div", { class: "kv" }, `mem ${fmtValue(g.mem, "ratio")}`),
    el("div", { class: "kv" }, `util ${fmtValue(g.util, "ratio")}`),
    g.named.map((f) => el("div", { class: "why" }, f.signature.replaceAll("_", " "))),
    g.firing.map((a) => el("div", {}, el("span", { class: `badge ${a.severity}` }, a.severity), " ", a.alertname)));
}

function nodeCard(n) {
  const up = n.targets.filter((t) => !t.down).length;
  return el("div", { class: `node h-${n.health}`, "data-testid": "node" },
    el("div", { class: "name" }, n.name, " ", n.sim ? el("span", { class: "badge sim" }, "sim") : null, " ",
      el("span", { class: `badge ${n.health}` }, n.health === "ok" ? "healthy" : n.health === "warn" ? "warning" : "unhealthy")),
    n.verdict ? el("div", { class: "kv" }, `diagnosis: ${n.verdict}`) : null,
    n.targets.length ? el("div", { class: "kv" }, `targets up ${up}/${n.targets.length}`,
      n.targets.filter((t) => t.down).map((t) => el("span", { class: "badge bad" }, `${t.job} ${t.instance} down`))) : null,
    n.targets.flatMap((t) => t.firing).map((a) => el("div", {}, el("span", { class: `badge ${a.severity}` }, a.severity), " ", a.alertname)),
    n.gpus.length ? el("div", { class: "gpus" }, n.gpus.map(gpuCell)) : null);
}

export function mount(main, ctx) {
  const note = el("div");
  const grid = el("div", { class: "nodes", "data-testid": "fleet" }, el("p", { class: "hint" }, "loading"));
  main.append(el("h2", {}, "Fleet"), note, grid);
  const poller = new Poller(async (signal) => {
    const params = QUERIES.map((x) => ["q", x]);
    const [inst, al, diag] = await Promise.all([getJSON("/console/api/instant", params, signal),
      getJSON("/console/api/alerts", [], signal).catch(() => ({ alerts: [] })),
      // the grid stands without the verdict: a failed diagnosis is said, not fatal
      getJSON("/console/api/diagnosis", [], signal).catch((e) => ({ error: e.message }))]);
    const diagnosis = diag && !diag.error ? diag : null;
    return { nodes: build(inst.results, al.alerts, ctx.state.meta, diagnosis), diagError: diag && diag.error };
  }, {
    interval: ctx.tick,
    onData: ({ nodes, diagError }) => {
      clear(note);
      const gpus = nodes.reduce((s, n) => s + n.gpus.length, 0);
      const bad = nodes.filter((n) => n.health === "bad").map((n) => n.name);
      note.append(el("p", { class: "hint", "data-testid": "fleet-summary" },
        `${nodes.length} node${nodes.length === 1 ? "" : "s"}, ${gpus} GPU${gpus === 1 ? "" : "s"}`,
        nodes.some((n) => n.sim) ? " (sim: simulated devices)" : "",
        bad.length ? ` · unhealthy: ${bad.join(", ")}` : " · all healthy"));
      if (diagError) note.append(el("div", { class: "banner" }, `Diagnosis unavailable (${diagError}): health from targets and alerts only.`));
      if (nodes.length <= 1) note.append(el("p", { class: "hint" }, "This backend holds one instance; the grid is most useful over a Prometheus with several."));
      fill(grid, nodes.length ? nodes.map(nodeCard) : el("p", { class: "hint" }, "No targets or GPUs: not collected."));
    },
    onError: (e, wait) => fill(note, el("div", { class: "banner" }, `Fleet unavailable: ${e.message}. Retrying in ${Math.round(wait / 1000)} s.`)),
  });
  poller.start();
  return { stop: () => poller.stop() };
}
