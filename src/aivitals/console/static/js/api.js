// Fetching: one request in flight per poller, a timeout on each, and exponential
// backoff after a failure, so a slow or dead backend never gets a pile of requests.

const TIMEOUT_MS = 10000;

export class ApiError extends Error {
  constructor(message, status) { super(message); this.status = status; }
}

export async function getJSON(path, params, signal) {
  const url = new URL(path, location.origin);
  for (const [k, v] of params || []) url.searchParams.append(k, v);
  const ctl = new AbortController();
  const timer = setTimeout(() => ctl.abort(), TIMEOUT_MS);
  const onAbort = () => ctl.abort();
  if (signal) signal.addEventListener("abort", onAbort, { once: true });
  let r;
  try {
    r = await fetch(url, { signal: ctl.signal, headers: { Accept: "application/json" } });
  } catch (e) {
    if (signal && signal.aborted) throw e;
    throw new ApiError(ctl.signal.aborted ? "the backend did not answer within 10 s" : "the backend is unreachable", 0);
  } finally {
    clearTimeout(timer);
    if (signal) signal.removeEventListener("abort", onAbort);
  }
  let body = null;
  try { body = await r.json(); } catch { /* not JSON: reported below */ }
  if (!r.ok || !body || body.status !== "success") {
    const msg = body && body.error ? body.error : `HTTP ${r.status}`;
    throw new ApiError(msg, r.status);
  }
  return body.data;
}

/** Connection state shared by every poller: the status bar shows it. */
export const conn = {
  failing: -1, listeners: new Set(), lastError: "",
  report(ok, err) {
    const was = this.failing;
    this.failing = ok ? 0 : Math.max(0, this.failing) + 1;
    if (!ok) this.lastError = err;
    if (was !== this.failing || !ok) for (const f of this.listeners) f(this);
  },
};

/**
 * Calls `fn(signal)` every `interval()` ms while started. A call still running when the
 * next is due is not doubled: the next waits for it. After a failure the wait doubles
 * (up to 60 s) and `onError` is told when the next try is.
 */
export class Poller {
  constructor(fn, { interval, onData, onError }) {
    this.fn = fn; this.interval = interval; this.onData = onData; this.onError = onError;
    this.timer = null; this.ctl = null; this.inFlight = false; this.failures = 0; this.stopped = true;
  }
  start() { this.stopped = false; this.now(); return this; }
  stop() {
    this.stopped = true;
    clearTimeout(this.timer); this.timer = null;
    if (this.ctl) this.ctl.abort();
  }
  /** Run now (a range change); an in-flight call is cancelled first. */
  now() {
    clearTimeout(this.timer);
    if (this.ctl) this.ctl.abort();
    this.inFlight = false;
    this.tick();
  }
  async tick() {
    if (this.stopped || this.inFlight) return;
    this.inFlight = true;
    const ctl = (this.ctl = new AbortController());
    let wait = this.interval();
    try {
      const data = await this.fn(ctl.signal);
      if (ctl.signal.aborted) return;
      this.failures = 0;
      conn.report(true);
      this.onData(data);
    } catch (e) {
      if (ctl.signal.aborted) return;
      this.failures++;
      wait = Math.min(60000, this.interval() * 2 ** Math.min(this.failures, 6));
      if (e.status === 0 || e.status >= 500) conn.report(false, e.message);
      if (this.onError) this.onError(e, wait);
    } finally {
      if (this.ctl === ctl) { this.inFlight = false; this.ctl = null; }
    }
    if (!this.stopped && this.ctl === null) this.timer = setTimeout(() => this.tick(), wait);
  }
}
