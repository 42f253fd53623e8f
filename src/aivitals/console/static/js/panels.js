// Chart panels over a live window: each panel polls on its own (one request in
// flight per panel), asking the server for about as many points as it has pixels.

import { conn, getJSON, Poller } from "./api.js";
import { Panel } from "./chart.js";

/** Mount panels for `specs` into `grid`; returns {stop, refresh}. window() gives [start, end]. */
export function livePanels(grid, specs, ctx, { window, markers, live = true } = {}) {
  const items = specs.map((spec) => {
    const panel = new Panel(spec, { onSelect: (a, b) => ctx.goDiagnose(a, b) });
    grid.append(panel.node);
    const poller = new Poller(async (signal) => {
      const [start, end] = window ? window() : [Date.now() / 1000 - ctx.state.range, Date.now() / 1000];
      // About one point per pixel; the server picks a round step and the rate window ($W).
      const points = Math.max(120, Math.round(panel.width() - 70));
      const params = [["start", start.toFixed(3)], ["end", end.toFixed(3)], ["points", String(points)]];
      for (const q of spec.queries) params.push(["q", q.expr]);
      panel.lastParams = params;
      return getJSON("/console/api/range", params, signal);
    }, {
      interval: live ? ctx.tick : () => 3600000,
      onData: (data) => {
        panel.update(data);
        if (markers) panel.setMarkers(markers());
        // a query the backend could not answer (down, timed out) is a backend problem
        const down = data.results.find((r) => r.error && /^Backend/.test(r.error));
        if (down) conn.report(false, down.error);
      },
      onError: (e, wait) => panel.setError(e.message, live ? wait : 0),
    });
    return { panel, poller };
  });
  for (const it of items) it.poller.start();
  return {
    items,
    stop() { for (const it of items) it.poller.stop(); },
    refresh() { for (const it of items) it.poller.now(); },
  };
}
