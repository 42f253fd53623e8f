// DOM and formatting helpers. Data is only ever set as text (textContent,
// attributes through setAttribute on a fixed allow-list): no innerHTML, so a label
// value or an annotation holding markup shows as the characters it is.

const ATTRS = new Set(["class", "href", "title", "id", "colspan", "role", "hidden", "data-page", "data-testid", "style"]);

/** el("div", {class: "x"}, "text", child, ...): children are nodes or text. */
export function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (!ATTRS.has(k)) throw new Error(`attribute ${k} is not allowed`);
    if (k === "href" && !/^(#|\/|https?:)/.test(String(v))) continue; // no javascript: URLs
    node.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c === undefined || c === null || c === false) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

export function clear(node) {
  while (node.firstChild) node.removeChild(node.firstChild);
  return node;
}

/** Replace node's children with `children` (nested arrays flattened, text as text). */
export function fill(node, ...children) {
  clear(node);
  for (const c of children.flat(3)) {
    if (c === undefined || c === null || c === false) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

// --- time, with the timezone shown --------------------------------------------------------
const tzName = Intl.DateTimeFormat().resolvedOptions().timeZone || "local";
export function tzLabel(at = new Date()) {
  const off = -at.getTimezoneOffset();
  const sign = off >= 0 ? "+" : "-";
  const hh = String(Math.floor(Math.abs(off) / 60)).padStart(2, "0");
  const mm = String(Math.abs(off) % 60).padStart(2, "0");
  return `${tzName} (UTC${sign}${hh}:${mm})`;
}
const timeFmt = new Intl.DateTimeFormat(undefined, { hour: "2-digit", minute: "2-digit", second: "2-digit", hour12: false });
const dateTimeFmt = new Intl.DateTimeFormat(undefined, { month: "short", day: "2-digit", hour: "2-digit", minute: "2-digit", second: "2-digit", hour12: false, timeZoneName: "short" });
const axisFmt = {
  sec: new Intl.DateTimeFormat(undefined, { hour: "2-digit", minute: "2-digit", second: "2-digit", hour12: false }),
  min: new Intl.DateTimeFormat(undefined, { hour: "2-digit", minute: "2-digit", hour12: false }),
  day: new Intl.DateTimeFormat(undefined, { month: "short", day: "2-digit", hour: "2-digit", minute: "2-digit", hour12: false }),
};
/** An x-axis tick, in the page's timezone (the status bar names it), as precise as the span needs. */
export function fmtAxis(sec, span) {
  const f = span <= 900 ? axisFmt.sec : span <= 1.1 * 86400 ? axisFmt.min : axisFmt.day;
  return f.format(new Date(sec * 1000));
}
export function fmtTime(sec) { return sec == null ? "-" : timeFmt.format(new Date(sec * 1000)); }
export function fmtDateTime(sec) { return sec == null ? "-" : dateTimeFmt.format(new Date(sec * 1000)); }
export function fmtAgo(sec) {
  if (sec == null) return "-";
  const d = Math.max(0, Date.now() / 1000 - sec);
  if (d < 90) return `${Math.round(d)} s ago`;
  if (d < 5400) return `${Math.round(d / 60)} min ago`;
  return `${(d / 3600).toFixed(1)} h ago`;
}

// --- values by unit ------------------------------------------------------------------------
const BYTES = ["B", "KiB", "MiB", "GiB", "TiB"];
export function fmtValue(v, unit) {
  if (v == null || !Number.isFinite(v)) return "-";
  if (v === 0) return "0";
  switch (unit) {
    case "bytes": {
      let i = 0, x = Math.abs(v);
      while (x >= 1024 && i < BYTES.length - 1) { x /= 1024; i++; }
      return `${(Math.sign(v) * x).toFixed(x >= 100 ? 0 : 1)} ${BYTES[i]}`;
    }
    case "ratio": return `${(v * 100).toFixed(Math.abs(v) < 0.1 ? 2 : 1)}%`;
    case "seconds":
      if (Math.abs(v) < 1e-3) return `${(v * 1e6).toFixed(0)} µs`;
      if (Math.abs(v) < 1) return `${(v * 1e3).toFixed(Math.abs(v) < 0.01 ? 2 : 0)} ms`;
      return `${v.toFixed(2)} s`;
    default: {
      const a = Math.abs(v);
      if (a >= 1e6) return `${(v / 1e6).toFixed(2)}M`;
      if (a >= 1e3) return `${(v / 1e3).toFixed(1)}k`;
      return a >= 10 || a === 0 ? v.toFixed(a >= 100 ? 0 : 1) : v.toPrecision(3);
    }
  }
}

/** A series name from its labels, dropping the ones every series shares. */
export function seriesName(metric, drop = ["job", "instance", "__name__"]) {
  const parts = Object.entries(metric || {}).filter(([k]) => !drop.includes(k)).map(([k, v]) => `${k}=${v}`);
  return parts.length ? parts.join(", ") : "";
}
