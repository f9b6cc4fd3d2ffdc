"""The matrix as one self-contained HTML page: the table of layouts, and a heatmap of each parameter's scale
factor (rows, grouped by kind) in each layout (columns) against the reference; each cell links to that
layout's full gradtrace-diff report. Every name comes from a trace and is escaped."""

from __future__ import annotations

import html
import math
import os

from gradtrace.matrix import report

STYLE = """
body { font: 14px system-ui, sans-serif; margin: 1.5em; color: #222; }
table { border-collapse: collapse; margin: 0.8em 0; }
th, td { border: 1px solid #ccc; padding: 3px 7px; text-align: left; vertical-align: top; }
td:first-child { white-space: nowrap; }
table.heat td { text-align: center; min-width: 4.2em; padding: 0; }
table.heat td a { display: block; padding: 3px 6px; color: inherit; text-decoration: none; }
table.heat th.param { font-family: ui-monospace, monospace; font-weight: normal; white-space: nowrap; }
tr.kind th { background: #f3f3f3; }
td.mismatch { background: repeating-linear-gradient(45deg, #bbb, #bbb 4px, #ddd 4px, #ddd 8px); }
td.absent { background: #fafafa; color: #999; }
.legend span { display: inline-block; padding: 2px 8px; margin-right: 4px; border: 1px solid #ccc; }
"""


def _color(scale: float) -> str:
    """White at 1; red above (2x full), blue below (0.5x full)."""
    t = min(abs(math.log2(scale)), 1.0) if scale > 0 else 1.0
    fade = int(255 - 155 * t)
    return f"rgb(255,{fade},{fade})" if scale > 1 else f"rgb({fade},{fade},255)"


def _cell(param: dict | None, href: str, title: str) -> str:
    e = html.escape
    if param is None:
        return f'<td class="absent" title="{e(title)}: absent">-</td>'
    verdict, scale = param["verdict"], param["scale"]
    link = f'<a href="{e(href)}" title="{e(title)}: {e(verdict)}">'
    if verdict == "match":
        return f'<td style="background:#e6f4ea">{link}1</a></td>'
    if verdict == "scaled" and scale:
        return f'<td style="background:{_color(scale)}">{link}{scale:.3g}</a></td>'
    return f'<td class="mismatch">{link}{e(verdict)}</a></td>'


def page(matrix: dict, out_path: str) -> str:
    e = html.escape
    here = os.path.dirname(os.path.abspath(out_path))
    compared = [r for r in matrix["layouts"] if r["status"] == "ran" and r["params"]]

    def href(r):
        return os.path.relpath(r["report_html"], here) if r["report_html"] else ""

    params_of = [{p["name"]: p for p in r["params"]} for r in compared]  # one lookup per cell, not a scan
    names, kinds = [], {}
    for r in compared:
        for p in r["params"]:
            if p["name"] not in kinds:
                names.append(p["name"])
                kinds[p["name"]] = p["kind"] or "-"
    rank = {n: i for i, n in enumerate(matrix.get("param_order", []))}
    names.sort(key=lambda n: (rank.get(n, len(rank)), n))
    by_kind = {}
    for n in names:
        by_kind.setdefault(kinds[n], []).append(n)
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>gradtrace-matrix</title>"
             f"<style>{STYLE}</style></head><body>",
             f"<h1>gradtrace-matrix</h1><p>{e(matrix['summary'])}</p>"]
    if matrix.get("script"):
        parts.append(f"<p>script: <code>{e(matrix['script'])}</code>; reference: "
                     f"<code>{e(matrix['reference']['name'])}</code></p>")
    parts.append("<table><tr>" + "".join(f"<th>{e(h.lower())}</th>" for h in report.HEAD) + "</tr>")
    for r in matrix["layouts"]:
        cells = report._cells(r)
        first = f'<a href="{e(href(r))}">{e(cells[0])}</a>' if href(r) else e(cells[0])
        parts.append("<tr><td>" + first + "</td>" + "".join(f"<td>{e(c)}</td>" for c in cells[1:]) + "</tr>")
    parts.append("</table>")
    if compared:
        parts.append("<h2>Scale factor B/A per parameter and layout</h2><p class='legend'>"
                     "<span style='background:#e6f4ea'>1: matches</span>"
                     f"<span style='background:{_color(2.0)}'>&gt; 1</span>"
                     f"<span style='background:{_color(0.5)}'>&lt; 1</span>"
                     "<span class='mismatch' style='background:#ccc'>not a multiple</span>"
                     " each cell links to that layout's diff report</p>")
        parts.append("<table class='heat'><tr><th>parameter</th>" +
                     "".join(f'<th><a href="{e(href(r))}">{e(r["name"])}</a></th>' for r in compared) + "</tr>")
        for kind, members in by_kind.items():
            parts.append(f"<tr class='kind'><th colspan='{len(compared) + 1}'>{e(kind)} "
                         f"({len(members)})</th></tr>")
            for n in members:
                cells = []
                for r, by_name in zip(compared, params_of):
                    cells.append(_cell(by_name.get(n), href(r), f"{n} in {r['name']}"))
                parts.append(f"<tr><th class='param'>{e(n)}</th>{''.join(cells)}</tr>")
        parts.append("</table>")
    parts.append("</body></html>\n")
    return "".join(parts)
