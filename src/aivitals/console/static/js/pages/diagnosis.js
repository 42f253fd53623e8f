// Diagnosis: the verdict (shape), ranked findings with layer and confidence, evidence
// with values, the first-deviation timeline drawn over the charts of the series
// involved, next commands and stop-loss actions. With ?start=&end= (a range selected
// on any chart) it diagnoses that window instead: a read-only GET.

import { getJSON, Poller } from "../api.js";
import { el, clear, fill, fmtDateTime, fmtTime, fmtValue } from "../dom.js";
import { livePanels } from "../panels.js";

const SHAPE_TEXT = {
  healthy: "Healthy", unavailable: "Unavailable", widespread_timeouts: "Widespread timeouts",
  intermittent_spikes: "Intermittent spikes", semantic_anomalies: "Semantic anomalies",
};

function confidence(c) {
  return el("span", { title: `confidence ${(c * 100).toFixed(0)}%` },
    el("span", { class: "conf" }, el("i", { style: `width:${Math.round(Math.max(0, Math.min(1, c)) * 100)}%` })),
    ` ${(c * 100).toFixed(0)}%`);
}

function evidenceList(f) {
  return el("table", { class: "list" },
    el("thead", {}, el("tr", {}, ["", "evidence", "values", "since"].map((h) => el("th", {}, h)))),
    el("tbody", {}, f.evidence.map((e) => el("tr", {},
      el("td", { class: e.held ? "held" : "notheld" }, e.held ? "held" : e.seen ? "not held" : "not collected"),
      el("td", {}, e.says, el("div", { class: "hint mono" }, `${e.role}: ${e.expr}`)),
      el("td", { class: "mono" }, (e.values || []).slice(0, 4).map(([labels, v]) =>
        el("div", {}, `${Object.entries(labels).filter(([k]) => k !== "__name__").map(([k, x]) => `${k}=${x}`).join(", ")} ${fmtValue(v, "")}`))),
      el("td", {}, e.since ? fmtTime(e.since) : "-")))));
}

function finding(f, i) {
  // numbered: the same numbers mark these moments on the charts below
  const tl = (f.timeline || []).map(([t, text], n) => el("li", {}, el("span", { class: "t" }, `${n + 1}. ${fmtDateTime(t)}`), text));
  return el("div", { class: `finding${i === 0 ? " top" : ""}`, "data-testid": `finding-${f.signature}` },
    el("div", { class: "verdict" },
      el("span", { class: "title" }, `${i + 1}. ${f.title}`),
      el("span", { class: "badge info" }, f.layer), el("span", { class: "hint mono" }, f.signature), confidence(f.confidence)),
    f.summary ? el("p", {}, f.summary) : null,
    f.first_deviation ? el("p", { class: "hint" }, `first deviation ${fmtDateTime(f.first_deviation)}`) : null,
    tl.length ? el("div", {}, el("h3", {}, "Timeline"), el("ul", { class: "tl", "data-testid": "timeline" }, tl)) : null,
    el("h3", {}, "Evidence"), evidenceList(f),
    f.commands && f.commands.length ? el("div", {}, el("h3", {}, "Next commands"), f.commands.map((c) => el("pre", { class: "cmd" }, c))) : null,
    f.stop_loss && f.stop_loss.length ? el("div", {}, el("h3", {}, "Stop-loss"), el("ul", {}, f.stop_loss.map((s) => el("li", {}, s)))) : null);
}

function unitOf(expr) {
  if (/^(deriv|delta|rate|irate|increase)\(/.test(expr)) return "";
  if (/_bytes/.test(expr) && !/\//.test(expr)) return "bytes";
  if (/_seconds_bucket|latency/.test(expr)) return "seconds";
  if (/ratio|\//.test(expr)) return "ratio";
  return "";
}

/** The series a finding involves: the evidence that held (its expressions, as charts). */
function chartsFor(d) {
  const top = d.findings[0];
  if (!top) return [];
  const held = top.evidence.filter((e) => e.held && e.chart).slice(0, 4);
  return held.map((e, i) => ({ id: `evidence_${i}`, title: e.says, unit: unitOf(e.chart.expr), queries: [{ expr: e.chart.expr, name: "" }],
    thresholds: e.chart.threshold ? [{ alert: "evidence", severity: "P1", ...e.chart.threshold }] : [] }));
}

export function mount(main, ctx) {
  const start = Number(ctx.state.params.get("start")), end = Number(ctx.state.params.get("end"));
  const windowed = Number.isFinite(start) && Number.isFinite(end) && end > start && ctx.state.params.has("start");
  const head = el("div");
  const body = el("div", { "data-testid": "diagnosis" }, el("p", { class: "hint" }, windowed ? "diagnosing the window…" : "loading the latest diagnosis…"));
  const grid = el("div", { class: "grid" });
  // the top finding, then the charts of its series (with its timeline), then the other hypotheses
  const section = el("div", { class: "section", hidden: true }, "The top finding's series, with its numbered timeline");
  const rest = el("div");
  main.append(head, body, section, grid, rest);
  head.append(el("h2", {}, windowed ? `Diagnosis of ${fmtDateTime(start)} – ${fmtDateTime(end)}` : "Latest diagnosis"),
    windowed ? el("p", { class: "hint" }, el("a", { href: "#/diagnosis" }, "back to the latest diagnosis")) :
      el("p", { class: "hint" }, "Drag across a chart (here or on the overview) to diagnose just that window."));
  let charts = null, chartKey = "";
  let diag = null;
  const markers = () => {
    if (!diag || !diag.findings[0]) return [];
    const f = diag.findings[0];
    const out = (f.timeline || []).map(([t], n) => ({ t, text: String(n + 1), color: "#c98bff" }));
    if (f.first_deviation) out.unshift({ t: f.first_deviation, text: "first deviation", color: "#ef5b5b" });
    return out;
  };
  const poller = new Poller((signal) => getJSON("/console/api/diagnosis", windowed ? [["start", String(start)], ["end", String(end)]] : [], signal), {
    interval: windowed ? () => 3600000 : () => Math.max(5000, ctx.tick()),
    onData: (d) => {
      diag = d;
      const shape = el("span", { class: `shape ${d.shape === "healthy" ? "held" : "red"}`, "data-testid": "shape" }, SHAPE_TEXT[d.shape] || d.shape);
      fill(body,
        el("div", { class: "verdict" }, shape,
          el("span", { class: "hint" }, `window ${fmtDateTime(d.start)} – ${fmtDateTime(d.end)} · step ${d.step} s · computed in ${(d.elapsed_s * 1000).toFixed(0)} ms`)),
        d.findings.length ? finding(d.findings[0], 0) : el("p", {}, "No finding: nothing left its baseline in this window."));
      fill(rest,
        d.findings.length > 1 ? el("div", { class: "section" }, "Other hypotheses") : null,
        d.findings.slice(1, 5).map((f, i) => finding(f, i + 1)),
        d.unseen && d.unseen.length ? el("details", {}, el("summary", { class: "hint" }, `${d.unseen.length} things could not be seen (not collected)`),
          el("ul", {}, d.unseen.map((u) => el("li", {}, `${u.what}: ${u.why}`)))) : null);
      const specs = chartsFor(d);
      const key = specs.map((s) => s.queries[0].expr).join("\n");
      if (key !== chartKey) {
        if (charts) charts.stop();
        for (const it of charts ? charts.items : []) it.panel.destroy();
        clear(grid);
        chartKey = key;
        section.hidden = !specs.length;
        charts = specs.length ? livePanels(grid, specs, ctx, { window: () => [diag.start, diag.end], markers, live: !windowed }) : null;
      } else if (charts) {
        for (const it of charts.items) it.panel.setMarkers(markers());
      }
    },
    onError: (e, wait) => {
      fill(rest);
      fill(body, el("div", { class: "banner" }, `Diagnosis unavailable: ${e.message}.` + (windowed ? "" : ` Retrying in ${Math.round(wait / 1000)} s.`)));
    },
  });
  poller.start();
  return { stop() { poller.stop(); if (charts) charts.stop(); } };
}
