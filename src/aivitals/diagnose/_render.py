"""A Diagnosis as terminal text (rich), Markdown, and a self-contained HTML page.

The HTML page draws the first-deviation timeline as inline SVG: no scripts,
no external assets, so it can be attached to a bug report or an incident.
"""

from __future__ import annotations

import html
import io
from collections.abc import Callable
from datetime import UTC, datetime

from ._model import Diagnosis, Finding

__all__ = ["to_html", "to_markdown", "to_terminal"]

MAX_FINDINGS = 5


def _t(ts: float | None) -> str:
    if ts is None:
        return "-"
    return datetime.fromtimestamp(ts, UTC).strftime("%H:%M:%S")


def held_text(f: Finding) -> str:
    """ "held since 12:04:10, evidence last seen 12:04:31" for a finding a memory holds;
    "" for any other."""
    if f.held_since is None:
        return ""
    text = f"held since {_t(f.held_since)}"
    if f.evidence_unseen_since is not None:
        return text + f", evidence unseen since {_t(f.evidence_unseen_since)} (queries failed)"
    if f.evidence_seen is not None:
        text += f", evidence last seen {_t(f.evidence_seen)}"
    return text


def _v(value: float) -> str:
    return f"{value:.4g}"


def _labels(labels: object) -> str:
    items = dict(labels)  # type: ignore[call-overload]
    return ",".join(f"{k}={v}" for k, v in items.items() if k != "text") or "-"


def _header(d: Diagnosis) -> str:
    head = (
        f"window {_t(d.start)}-{_t(d.end)} UTC (step {d.step:g}s), shape: {d.shape}, "
        f"diagnosed in {d.elapsed_s:.2f}s"
    )
    if d.queries:
        head += f" with {d.queries} queries"
    if d.location is not None:
        head += f", {len(d.nodes)} nodes by {d.location}"
    return head


def _where(f: Finding) -> str:
    """Where a finding is: the fleet's share, or its node, instance, GPU, pid, model."""
    if f.scope == "fleet":
        return f"fleet-wide on {len(f.nodes)} nodes" + (
            " (" + ", ".join(f"{k}={v}" for k, v in f.where.items()) + ")" if f.where else ""
        )
    return ", ".join(f"{k}={v}" for k, v in f.where.items())


def _node_lines(d: Diagnosis) -> list[str]:
    """Nodes grouped by verdict: each fault's nodes named, the healthy ones counted."""
    by: dict[str, list[str]] = {}
    for node, verdict in d.nodes.items():
        by.setdefault(verdict, []).append(node)
    lines = []
    for verdict, nodes in sorted(by.items(), key=lambda kv: (kv[0] == "healthy", kv[0])):
        shown = ", ".join(nodes[:12]) + (f" and {len(nodes) - 12} more" if len(nodes) > 12 else "")
        lines.append(f"{verdict}: {shown}")
    return lines


def to_markdown(d: Diagnosis) -> str:
    out = io.StringIO()
    w = out.write
    w("# aivitals diagnosis\n\n")
    w(_header(d) + "\n\n")
    if not d.findings:
        w("No finding: nothing left its baseline and no signature matched.\n\n")
    for i, f in enumerate(d.findings[:MAX_FINDINGS], 1):
        _md_finding(w, i, f)
    if d.nodes:
        w("## Nodes\n\n")
        for line in _node_lines(d):
            w(f"- {line}\n")
        w("\n")
    if d.deviations:
        w(
            "## Timeline (first deviation)\n\n"
            "| time | signal | layer | change |\n|---|---|---|---|\n"
        )
        for dv in d.deviations:
            w(
                f"| {_t(dv.first_deviation)} | {dv.name} {_labels(dv.labels)} | {dv.layer} | "
                f"{dv.direction} {_v(dv.baseline)} -> {_v(dv.latest)} |\n"
            )
        w("\n")
    if d.events:
        w("## Events\n\n")
        for e in d.events[:20]:
            w(f"- {_t(e.time)} [{e.kind}] {e.text}\n")
        w("\n")
    if d.unseen:
        w("## Could not see\n\n")
        for u in d.unseen:
            w(f"- {u.what}: {u.why}\n")
    return out.getvalue()


def _md_finding(write: Callable[[str], object], i: int, f: Finding) -> None:
    write(f"## {i}. {f.title}\n\n")
    write(
        f"layer **{f.layer}**, signature `{f.signature}`, confidence **{f.confidence:.2f}**, "
        f"first deviation {_t(f.first_deviation)}\n\n"
    )
    if f.held_since is not None:
        write(f"{held_text(f)}\n\n")
    if f.where or f.scope == "fleet":
        write(f"where: {_where(f)}\n\n")
    if f.summary:
        write(f"{f.summary}\n\n")
    write("Evidence:\n\n")
    for e in f.evidence:
        mark = "held" if e.held else ("not seen" if not e.seen else "no")
        vals = "; ".join(f"{_labels(lab)} = {_v(val)}" for lab, val in e.values[:3])
        write(f"- [{mark}] ({e.role}) {e.says}" + (f" ({vals})" if vals else "") + "\n")
    if f.commands:
        write("\nNext commands:\n\n")
        for c in f.commands:
            write(f"    {c}\n")
    if f.stop_loss:
        write("\nStop the loss:\n\n")
        for c in f.stop_loss:
            write(f"- {c}\n")
    write("\n")


def to_terminal(d: Diagnosis, *, width: int = 110) -> str:
    """Rich-formatted text (ANSI colours when printed to a terminal)."""
    from rich.console import Console
    from rich.table import Table

    console = Console(file=io.StringIO(), width=width, force_terminal=False, record=True)
    console.print(f"[bold]aivitals diagnosis[/bold]  {_header(d)}")
    if not d.findings:
        console.print("[green]No finding[/green]: nothing left its baseline.")
    for i, f in enumerate(d.findings[:MAX_FINDINGS], 1):
        colour = "red" if f.confidence >= 0.6 else "yellow"
        console.print(
            f"\n[bold {colour}]{i}. {f.title}[/]  layer={f.layer} "
            f"confidence={f.confidence:.2f} since {_t(f.first_deviation)}"
        )
        if f.held_since is not None:
            console.print(f"   {held_text(f)}", markup=False, highlight=False)
        if f.where or f.scope == "fleet":
            console.print(f"   where: {_where(f)}", markup=False, highlight=False)
        table = Table(show_header=False, box=None, padding=(0, 1))
        for e in f.evidence:
            mark = (
                "[green]held[/]" if e.held else ("[dim]unseen[/]" if not e.seen else "[dim]no[/]")
            )
            vals = "; ".join(f"{_labels(lab)}={_v(val)}" for lab, val in e.values[:2])
            table.add_row(mark, e.role, e.says, vals)
        console.print(table)
        for c in f.commands[:4]:
            console.print(f"  $ {c}", markup=False, highlight=False)
        for c in f.stop_loss[:2]:
            console.print(f"  stop-loss: {c}", markup=False, highlight=False)
    if d.nodes:
        console.print("\n[bold]Nodes[/bold]")
        for line in _node_lines(d):
            console.print(f"  {line}", markup=False, highlight=False)
    if d.deviations:
        console.print("\n[bold]Timeline[/bold]")
        for dv in d.deviations[:15]:
            console.print(
                f"  {_t(dv.first_deviation)}  {dv.layer:<15} {dv.name} {dv.direction} "
                f"{_v(dv.baseline)} -> {_v(dv.latest)}",
                markup=False,
            )
    for u in d.unseen:
        console.print(f"[dim]could not see {u.what}: {u.why}[/dim]")
    return console.export_text(styles=False)


_CSS = """body{font-family:system-ui,sans-serif;margin:2em;max-width:1100px;color:#222}
h1{font-size:1.4em}h2{font-size:1.15em;margin-top:1.6em}.held{color:#0a7d32}.no{color:#999}
.unseen{color:#b36b00}code,pre{background:#f4f4f4;padding:2px 4px}table{border-collapse:collapse}
td,th{border-bottom:1px solid #ddd;padding:3px 8px;text-align:left;font-size:.9em}
.conf{font-weight:bold}"""

_LAYER_COLOUR = {
    "model": "#7b3fbf",
    "service": "#1f6fd1",
    "infrastructure": "#c77800",
    "business": "#1d8f5a",
}


def to_html(d: Diagnosis) -> str:
    """One self-contained page: findings, evidence, commands, and an SVG timeline."""
    e = html.escape
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>aivitals diagnosis"
        f"</title><style>{_CSS}</style></head><body>",
        "<h1>aivitals diagnosis</h1>",
        f"<p>{e(_header(d))}</p>",
        _svg_timeline(d),
    ]
    for i, f in enumerate(d.findings[:MAX_FINDINGS], 1):
        parts.append(
            f"<h2>{i}. {e(f.title)}</h2><p>layer <b>{e(f.layer)}</b>, signature "
            f"<code>{e(f.signature)}</code>, <span class='conf'>confidence "
            f"{f.confidence:.2f}</span>, first deviation {_t(f.first_deviation)}</p>"
        )
        if f.held_since is not None:
            parts.append(f"<p class='held'>{e(held_text(f))}</p>")
        if f.where or f.scope == "fleet":
            parts.append(f"<p>where: {e(_where(f))}</p>")
        parts.append("<table><tr><th></th><th>role</th><th>evidence</th><th>values</th></tr>")
        for ev in f.evidence:
            cls = "held" if ev.held else ("unseen" if not ev.seen else "no")
            vals = "; ".join(f"{_labels(lab)} = {_v(val)}" for lab, val in ev.values[:3])
            parts.append(
                f"<tr class='{cls}'><td>{cls}</td><td>{e(ev.role)}</td>"
                f"<td>{e(ev.says)}<br><code>{e(ev.expr)}</code></td><td>{e(vals)}</td></tr>"
            )
        parts.append("</table>")
        if f.commands:
            parts.append("<p>Next commands:</p><pre>" + e("\n".join(f.commands)) + "</pre>")
        if f.stop_loss:
            parts.append(
                "<p>Stop the loss:</p><ul>"
                + "".join(f"<li>{e(c)}</li>" for c in f.stop_loss)
                + "</ul>"
            )
    if d.nodes:
        parts.append(
            "<h2>Nodes</h2><ul>" + "".join(f"<li>{e(x)}</li>" for x in _node_lines(d)) + "</ul>"
        )
    if d.unseen:
        parts.append(
            "<h2>Could not see</h2><ul>"
            + "".join(f"<li>{e(u.what)}: {e(u.why)}</li>" for u in d.unseen)
            + "</ul>"
        )
    parts.append("</body></html>")
    return "\n".join(parts)


def _svg_timeline(d: Diagnosis) -> str:
    """Each deviating signal as a bar from its first deviation to the window's end."""
    items = [(dv.first_deviation, f"{dv.name} {dv.direction}", dv.layer) for dv in d.deviations]
    items += [(e.time, f"[{e.kind}] {e.text[:50]}", "event") for e in d.events[:10]]
    items.sort()
    if not items:
        return "<p>No signal left its baseline in this window.</p>"
    width, left, row = 1000, 260, 18
    height = row * len(items) + 30
    span = max(d.end - d.start, 1.0)

    def x(t: float) -> float:
        return left + (width - left - 10) * (t - d.start) / span

    out = [
        f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' "
        f"font-size='11' role='img' aria-label='first-deviation timeline'>"
    ]
    for k, (t, label, layer) in enumerate(items):
        y = 10 + k * row
        colour = _LAYER_COLOUR.get(layer, "#555")
        out.append(f"<text x='4' y='{y + 11}'>{html.escape(label)}</text>")
        if layer == "event":
            out.append(f"<circle cx='{x(t):.1f}' cy='{y + 7}' r='4' fill='#c00'/>")
        else:
            out.append(
                f"<rect x='{x(t):.1f}' y='{y + 2}' width='{max(x(d.end) - x(t), 2):.1f}' "
                f"height='{row - 6}' fill='{colour}' opacity='0.8'/>"
            )
    axis_y = height - 12
    out.append(f"<line x1='{left}' y1='{axis_y}' x2='{width - 10}' y2='{axis_y}' stroke='#999'/>")
    for frac in (0.0, 0.25, 0.5, 0.75, 1.0):
        t = d.start + frac * span
        out.append(f"<text x='{x(t) - 20:.1f}' y='{height - 1}'>{_t(t)}</text>")
    out.append("</svg>")
    return "".join(out)
