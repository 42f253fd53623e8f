// One chart panel: its queries, a uPlot chart on the server's shared time grid,
// threshold lines from the rule pack, event markers, and "not collected" when the
// backend has none of its series. Selecting a range on the chart calls onSelect.

import { el, clear, fmtAxis, fmtValue, seriesName } from "./dom.js";

const uPlot = window.uPlot;
const PALETTE = ["#4fa3ff", "#3fbf7f", "#e8b339", "#ef5b5b", "#c98bff", "#3fd0d0", "#ff8c42", "#9ccc65",
  "#f06292", "#90a4ae", "#ffd54f", "#7986cb"];
const SEVERITY_COLOR = { P0: "#ef5b5b", P1: "#e8b339", P2: "#4fa3ff" };

/** Every panel on the page, for the tests and the benchmark to inspect. */
export const registry = new Set();

export class Panel {
  /**
   * spec: {id, title, unit, queries: [{expr, name}], thresholds: [{alert, op, value, severity}],
   *        help, sim: bool (a GPU panel: say "sim" when the series are simulated)}
   */
  constructor(spec, { onSelect } = {}) {
    this.spec = spec;
    this.onSelect = onSelect;
    this.markers = [];
    this.plot = null;
    this.shape = "";
    this.points = 0;
    this.simBadge = el("span", { class: "badge sim", title: "a simulated GPU (no real device)", hidden: true }, "sim");
    this.msg = el("div", { class: "msg" });
    this.body = el("div", { class: "plot" });
    const th = (spec.thresholds || []).map((t) => `${t.alert} ${t.op} ${fmtValue(t.value, spec.unit)}`).join(" · ");
    this.node = el("section", { class: "panel", "data-testid": `panel-${spec.id}` },
      el("div", { class: "head" }, el("h3", {}, spec.title), this.simBadge, el("span", { class: "unit" }, spec.unitLabel || "")),
      el("div", { class: "msg hint" }, th ? `alert: ${th}` : spec.help || ""),
      this.msg, this.body);
    registry.add(this);
    this.resize = new ResizeObserver(() => {
      if (this.plot) this.plot.setSize({ width: this.width(), height: 170 });
    });
    this.resize.observe(this.node);
  }

  width() { return Math.max(240, this.node.clientWidth - 24); }

  destroy() {
    registry.delete(this);
    this.resize.disconnect();
    if (this.plot) this.plot.destroy();
    this.plot = null;
  }

  setError(message, retryMs) {
    this.msg.className = "msg err";
    this.msg.textContent = retryMs ? `${message}: retrying in ${Math.round(retryMs / 1000)} s` : message;
  }

  /** Vertical markers [{t, text, color}] drawn over the chart (timeline, first deviation). */
  setMarkers(markers) {
    this.markers = markers || [];
    if (this.plot) this.plot.redraw(false, false);
  }

  /** data: the /console/api/range answer for this panel's queries. */
  update(data) {
    const cols = [data.times];
    const series = [{}];
    const errors = [];
    let sim = false;
    data.results.forEach((res, qi) => {
      if (res.error) errors.push(res.error);
      const q = this.spec.queries[qi] || {};
      for (const s of res.series) {
        if (s.metric && s.metric.backend === "sim") sim = true;
        const name = [q.name, seriesName(s.metric)].filter(Boolean).join(" ") || (q.name === "" ? "none" : this.spec.title);
        const color = PALETTE[(series.length - 1) % PALETTE.length];
        series.push({ label: name + (s.metric && s.metric.backend === "sim" ? " (sim)" : ""), stroke: color, width: 1.5,
          value: (u, v) => fmtValue(v, this.spec.unit), spanGaps: false,
          // a sparse series (a long range over a young backend) shows its points, not nothing
          points: { show: (u, si) => u.data[si].reduce((n, v) => n + (v == null ? 0 : 1), 0) < 30, size: 4 } });
        cols.push(s.values);
      }
    });
    this.simBadge.hidden = !sim;
    this.points = cols.slice(1).reduce((n, c) => n + c.reduce((k, v) => k + (v == null ? 0 : 1), 0), 0);
    if (errors.length) {
      this.msg.className = "msg err";
      this.msg.textContent = `query error: ${errors[0]}`;
    } else {
      this.msg.className = "msg";
      this.msg.textContent = "";
    }
    if (series.length === 1) {
      // The backend has none of these series: say so instead of drawing an empty chart.
      if (this.plot) { this.plot.destroy(); this.plot = null; }
      this.shape = "";
      clear(this.body).append(el("div", { class: "empty", "data-testid": "not-collected" },
        errors.length ? "no data (the query failed)" : "not collected: the backend has no such series in this range"));
      return;
    }
    const shape = series.map((s) => s.label).join("\u0000");
    if (this.plot && shape === this.shape) {
      this.plot.setData(cols);          // the fast path of a live update
      return;
    }
    if (this.plot) this.plot.destroy();
    clear(this.body);
    this.shape = shape;
    this.plot = new uPlot(this.options(series), cols, this.body);
    // the first chart drawn with data: the page's first meaningful paint (the benchmark reads it)
    if (!performance.getEntriesByName("aivitals:first-chart").length) performance.mark("aivitals:first-chart");
  }

  options(series) {
    const unit = this.spec.unit;
    const self = this;
    return {
      width: this.width(), height: 170,
      series,
      legend: { live: true },
      cursor: { drag: { x: true, y: false, setScale: false }, points: { size: 5 } },
      select: { show: true },
      scales: { x: { time: true }, y: { range: (u, min, max) => yRange(min, max, unit) } },
      axes: [
        { stroke: "#8b98a8", grid: { stroke: "#222c38", width: 1 }, ticks: { stroke: "#263140" }, space: 70,
          values: (u, splits) => splits.map((v) => fmtAxis(v, u.scales.x.max - u.scales.x.min)) },
        { stroke: "#8b98a8", grid: { stroke: "#222c38", width: 1 }, ticks: { stroke: "#263140" }, size: 72,
          values: (u, splits) => splits.map((v) => fmtValue(v, unit)) },
      ],
      hooks: {
        draw: [(u) => self.drawOverlays(u)],
        setSelect: [(u) => {
          if (u.select.width < 4 || !self.onSelect) return;
          const a = u.posToVal(u.select.left, "x"), b = u.posToVal(u.select.left + u.select.width, "x");
          u.setSelect({ left: 0, width: 0, top: 0, height: 0 }, false);
          self.onSelect(Math.floor(a), Math.ceil(b));
        }],
      },
    };
  }

  drawOverlays(u) {
    const ctx = u.ctx;
    const { left, top, width, height } = u.bbox;
    ctx.save();
    ctx.font = `${11 * devicePixelRatio}px system-ui, sans-serif`;
    ctx.textAlign = "left";
    ctx.textBaseline = "bottom";
    ctx.setLineDash([6 * devicePixelRatio, 4 * devicePixelRatio]);
    ctx.lineWidth = devicePixelRatio;
    for (const t of this.spec.thresholds || []) {
      const y = u.valToPos(t.value, "y", true);
      if (!(y >= top && y <= top + height)) continue;
      ctx.strokeStyle = SEVERITY_COLOR[t.severity] || "#e8b339";
      ctx.fillStyle = ctx.strokeStyle;
      ctx.beginPath(); ctx.moveTo(left, y); ctx.lineTo(left + width, y); ctx.stroke();
      ctx.fillText(`${t.alert} ${t.op} ${fmtValue(t.value, this.spec.unit)}`, left + 4, y - 3);
    }
    ctx.setLineDash([]);
    // Labels of markers at (nearly) the same x are joined ("1,2") instead of overprinted.
    const seen = [];
    for (const m of this.markers) {
      const x = u.valToPos(m.t, "x", true);
      if (!(x >= left && x <= left + width)) continue;
      ctx.strokeStyle = m.color || "#c98bff";
      ctx.beginPath(); ctx.moveTo(x, top); ctx.lineTo(x, top + height); ctx.stroke();
      const near = seen.find((g) => Math.abs(g.x - x) < 14 * devicePixelRatio && g.color === ctx.strokeStyle);
      if (near) near.text += `,${m.text}`; else seen.push({ x, text: String(m.text), color: ctx.strokeStyle });
    }
    let row = 0;
    for (const g of seen) {
      ctx.fillStyle = g.color;
      // the first deviation is written at the foot of its line, the numbered moments at the top
      const y = g.text.startsWith("first") ? top + height - 4 : top + 12 * devicePixelRatio * (1 + (row++ % 2));
      // Canvas text: a label value can never become markup here.
      ctx.fillText(g.text.slice(0, 48), g.x + 3, y);
    }
    ctx.restore();
  }
}

function yRange(min, max, unit) {
  if (min == null || max == null) return [0, 1];
  let lo = Math.min(0, min), hi = max;
  if (unit === "ratio") hi = Math.max(hi, Math.min(1, hi * 1.1 || 0.01));
  if (hi === lo) hi = lo + 1;
  return [lo, hi + (hi - lo) * 0.08];
}
