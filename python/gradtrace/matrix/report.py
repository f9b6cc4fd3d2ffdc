"""The matrix report: one row per layout (world, verdict, exit code, the worst factor, the cause in words, the
first step that differs, setup differences, or why the layout was not run), as text, Markdown and JSON (schema:
docs/user/matrix.md, "JSON"), and the command's exit code."""

from __future__ import annotations

import json
import os

SCHEMA_VERSION = "1.0"


def row(run, judgement) -> dict:
    j = judgement
    out = {"name": run.name, "layout": run.layout, "world": run.world, "status": run.status, "reason": run.reason,
           "run_exit": run.exit_code, "seconds": round(run.seconds, 1), "verdict": "", "diff_exit": None,
           "worst_scale": None, "not_a_multiple": 0, "cause": "", "first_step": None, "setup": [],
           "report_json": "", "report_html": "", "params": []}
    if j is not None:
        out.update(verdict=j.verdict, diff_exit=j.diff_exit, worst_scale=j.worst_scale,
                   not_a_multiple=j.not_a_multiple, cause=j.cause or (j.error if j.verdict == "error" else ""),
                   first_step=j.first_step, setup=j.setup, report_json=j.report_json, report_html=j.report_html,
                   params=j.params)
    return out


def exit_code(rows: list) -> int:
    """1: a layout differs, failed or could not be compared; else 3: a layout's setup differs; else 0."""
    judged = [r for r in rows if r["status"] != "skipped"]
    if any(r["status"] == "failed" or r["diff_exit"] in (1, 2) for r in judged):
        return 1
    if any(r["diff_exit"] == 3 for r in judged):
        return 3
    return 0


def summary(rows: list, reference: str) -> str:
    ran = [r for r in rows if r["status"] == "ran"]
    match = [r for r in ran if r["diff_exit"] == 0]
    differ = [r for r in ran if r["diff_exit"] in (1, 2)]
    setup = [r for r in ran if r["diff_exit"] == 3]
    failed = [r for r in rows if r["status"] == "failed"]
    skipped = [r for r in rows if r["status"] == "skipped"]
    parts = [f"{len(match)} match"]
    if differ:
        parts.append(f"{len(differ)} differ ({', '.join(r['name'] for r in differ)})")
    if setup:
        parts.append(f"{len(setup)} with a different setup ({', '.join(r['name'] for r in setup)})")
    if failed:
        parts.append(f"{len(failed)} failed ({', '.join(r['name'] for r in failed)})")
    if skipped:
        parts.append(f"{len(skipped)} skipped")
    return f"{len(rows)} layouts against {reference}: " + ", ".join(parts)


def factor(r: dict) -> str:
    if r["status"] != "ran" or r["verdict"] in ("", "reference", "error"):
        return "-"
    if r["not_a_multiple"]:
        return f"not a multiple ({r['not_a_multiple']})"
    return f"{r['worst_scale']:.3f}" if r["worst_scale"] is not None else "1.000"


def words(r: dict) -> str:
    if r["status"] != "ran":
        return f"{r['status']}: {r['reason']}"
    if r["verdict"] == "reference":
        return "the reference: every other layout is diffed against it"
    text = r["cause"] or ("gradients match" if r["diff_exit"] == 0 else r["verdict"])
    if r["setup"]:
        text += " [setup: " + "; ".join(r["setup"]) + "]"
    return text


def _cells(r: dict) -> list:
    step = "-" if r["first_step"] is None else str(r["first_step"])
    verdict = r["verdict"] or r["status"]
    exit_text = "-" if r["diff_exit"] is None else str(r["diff_exit"])
    return [r["name"], str(r["world"]) if r["world"] else "?", verdict, exit_text, factor(r), step, words(r)]


HEAD = ["LAYOUT", "WORLD", "VERDICT", "EXIT", "WORST", "FIRST STEP", "CAUSE"]


def printable(cell: str) -> str:
    """A cell for a terminal: control characters (a folder name from --collect is anyone's) escaped."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in cell)


def text(matrix: dict, width: int = 110) -> str:
    rows = [[printable(c) for c in _cells(r)] for r in matrix["layouts"]]
    widths = [max(len(c[i]) for c in rows + [HEAD]) for i in range(len(HEAD) - 1)]
    lines = [f"gradtrace-matrix: {printable(matrix['summary'])}", ""]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths) + "  {}"
    lines.append(fmt.format(*HEAD))
    for c in rows:
        cause = c[-1] if len(c[-1]) <= width else c[-1][:width - 3] + "..."
        lines.append(fmt.format(*c[:-1], cause))
    if matrix.get("expectation"):
        e = matrix["expectation"]
        lines += ["", f"expectation {e['file']}: " + ("held" if e["held"] else "broken")]
        lines += [f"  {printable(b)}" for b in e["broken"]]
    return "\n".join(lines) + "\n"


def _md(cell: str) -> str:
    return cell.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ").replace("<", "&lt;").replace(">", "&gt;")


def markdown(matrix: dict) -> str:
    out = [f"**gradtrace-matrix**: {_md(matrix['summary'])}", "", "| " + " | ".join(h.lower() for h in HEAD) + " |",
           "|" + "---|" * len(HEAD)]
    for r in matrix["layouts"]:
        out.append("| " + " | ".join(_md(c) for c in _cells(r)) + " |")
    return "\n".join(out) + "\n"


def to_json(matrix: dict) -> str:
    return json.dumps(matrix, indent=1, sort_keys=False, allow_nan=False) + "\n"


def write(path: str, data: str) -> None:
    """Writes through a temporary file, so that a reader never sees half a report."""
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(data)
    os.replace(tmp, path)
