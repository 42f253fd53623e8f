// Alerts: firing and pending now, then the recent transitions; severity, layer, the
// value against the rule's threshold and the runbook line.

import { getJSON, Poller } from "../api.js";
import { el, clear, fill, fmtDateTime, fmtAgo, fmtValue } from "../dom.js";

function unitOf(a) {
  const n = a.alertname;
  if (/Memory|Bytes/.test(n) && Math.abs(a.value || 0) > 1e5) return "bytes";
  if (a.threshold && a.threshold.value <= 1 && /Ratio|Share|Utilization|Memory|Rate|Saturat|Drop|Fds|CPU/.test(n)) return "ratio";
  if (/Latency|Wait/.test(n)) return "seconds";
  return "";
}

function against(a) {
  const unit = unitOf(a);
  const v = fmtValue(a.value, unit);
  if (!a.threshold) return v;
  return `${v} (${a.threshold.op} ${fmtValue(a.threshold.value, unit)})`;
}

function row(a) {
  const ann = a.annotations || {};
  const who = Object.entries(a.labels).filter(([k]) => !["alertname", "severity", "layer"].includes(k))
    .map(([k, v]) => `${k}=${v}`).join(", ");
  return el("tr", { "data-testid": `alert-${a.alertname}`, class: `state-${a.state}` },
    el("td", {}, el("span", { class: `badge ${a.state === "firing" ? "bad" : a.state === "pending" ? "warn" : "ok"}` }, a.state)),
    el("td", {}, el("span", { class: `badge ${a.severity}` }, a.severity || "-")),
    el("td", {}, el("b", {}, a.alertname), el("div", { class: "hint" }, who), el("div", {}, ann.summary || "")),
    el("td", {}, a.layer || "-"),
    el("td", { class: "mono" }, against(a)),
    el("td", {}, fmtDateTime(a.fired_at || a.active_at), el("div", { class: "hint" }, fmtAgo(a.fired_at || a.active_at))),
    el("td", {}, ann.runbook ? el("pre", { class: "cmd" }, ann.runbook) : "-"));
}

function table(rows, empty) {
  if (!rows.length) return el("p", { class: "hint" }, empty);
  return el("table", { class: "list" },
    el("thead", {}, el("tr", {}, ["state", "severity", "alert", "layer", "value vs threshold", "since", "runbook"].map((h) => el("th", {}, h)))),
    el("tbody", {}, rows.map(row)));
}

export function mount(main, ctx) {
  const now = el("div", { "data-testid": "alerts-active" }, el("p", { class: "hint" }, "loading…"));
  const recent = el("div", { "data-testid": "alerts-recent" });
  const banner = el("div");
  main.append(banner, el("h2", {}, "Firing and pending"), now, el("h2", {}, "Recent (resolved and past transitions)"), recent);
  const poller = new Poller((signal) => getJSON("/console/api/alerts", [], signal), {
    interval: ctx.tick,
    onData: (data) => {
      clear(banner);
      if (data.note) banner.append(el("div", { class: "banner info" }, data.note));
      fill(now, table(data.alerts, "No alert is firing or pending."));
      const active = new Set(data.alerts.map((a) => a.alertname + JSON.stringify(a.labels)));
      const past = data.history.filter((a) => a.state === "resolved" || !active.has(a.alertname + JSON.stringify(a.labels)))
        .slice(-50).reverse();
      fill(recent, table(past, "No recent alert transitions."));
    },
    onError: (e, wait) => {
      fill(banner, el("div", { class: "banner" }, `Alerts unavailable: ${e.message}. Retrying in ${Math.round(wait / 1000)} s.`));
    },
  });
  poller.start();
  return { stop: () => poller.stop() };
}
