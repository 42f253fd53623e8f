// The console's shell: the hash router, the range picker, the status bar and the
// page lifecycle (a page mounts into <main> and is stopped before the next mounts).

import { getJSON, conn, Poller } from "./api.js";
import { el, clear, tzLabel } from "./dom.js";
import { registry } from "./chart.js";
import * as overview from "./pages/overview.js";
import * as alerts from "./pages/alerts.js";
import * as diagnosis from "./pages/diagnosis.js";
import * as fleet from "./pages/fleet.js";
import * as report from "./pages/report.js";

const PAGES = { overview, alerts, diagnosis, fleet, report };
const main = document.getElementById("page");
const rangeSel = document.getElementById("range");

export const state = { meta: null, range: Number(rangeSel.value), page: null, params: new URLSearchParams() };

function tick() {
  // Live updates every scrape interval; never faster than 1 s.
  return Math.max(1000, (state.meta ? state.meta.tick : 5) * 1000);
}

const ctx = {
  state, tick,
  goDiagnose(start, end) { location.hash = `#/diagnosis?start=${start}&end=${end}`; },
};

function route() {
  const [path, query] = location.hash.replace(/^#\/?/, "").split("?");
  const name = PAGES[path] ? path : "overview";
  state.params = new URLSearchParams(query || "");
  if (state.page && state.page.stop) state.page.stop();
  for (const p of [...registry]) p.destroy();
  clear(main);
  for (const a of document.querySelectorAll("nav a")) a.classList.toggle("active", a.dataset.page === name);
  document.title = `aivitals · ${name}`;
  state.page = PAGES[name].mount(main, ctx) || null;
}

function showConn(c) {
  const node = document.getElementById("conn");
  if (c.failing) {
    node.className = "conn bad";
    node.textContent = `backend problem: ${c.lastError} (retrying with backoff)`;
  } else {
    node.className = "conn ok";
    node.textContent = "live";
  }
}

async function loadMeta() {
  // The status bar's own poller: backend, GPU kind, firing count.
  const poll = new Poller(async (signal) => {
    let alErr = null;
    const [meta, al] = await Promise.all([
      getJSON("/console/api/meta", [], signal),
      getJSON("/console/api/alerts", [], signal).catch((e) => { alErr = e; return null; }),
    ]);
    return { meta, al, alErr };
  }, {
    interval: () => Math.max(5000, tick()),
    onData: ({ meta, al, alErr }) => {
      const first = !state.meta;
      // the console answered but the backend behind it did not: say so
      if (alErr && (alErr.status === 0 || alErr.status >= 500)) conn.report(false, `alerts: ${alErr.message}`);
      state.meta = meta;
      document.getElementById("backend").textContent = `${meta.backend.kind}: ${meta.backend.url} · refresh every ${meta.tick} s`;
      const gpu = document.getElementById("gpu-kind");
      const kinds = meta.gpu_backends || [];
      gpu.hidden = kinds.length === 0;
      gpu.className = kinds.includes("sim") ? "badge sim" : "badge info";
      gpu.textContent = kinds.includes("sim") ? "GPU: sim (simulated device)" : `GPU: ${kinds.join(", ")}`;
      const count = document.getElementById("alert-count");
      const firing = al ? al.alerts.filter((a) => a.state === "firing").length : 0;
      count.hidden = firing === 0;
      count.textContent = String(firing);
      if (first) route();
    },
    onError: (e, wait) => {
      document.getElementById("backend").textContent = `cannot reach the console API: ${e.message}; retrying in ${Math.round(wait / 1000)} s`;
    },
  });
  poll.start();
}

document.getElementById("tz").textContent = `times in ${tzLabel()}`;
conn.listeners.add(showConn);
rangeSel.addEventListener("change", () => {
  state.range = Number(rangeSel.value);
  if (state.page && state.page.rangeChanged) state.page.rangeChanged();
});
window.addEventListener("hashchange", () => { if (state.meta) route(); });
window.__aivitals = { registry, state };
loadMeta();
