"""Each layout's trace set against the reference's, by gradtrace-diff (the one implementation of the
comparison): its exit code, its JSON report (kept, with its HTML, for the matrix's links) and what the matrix
shows of it."""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib
import subprocess

from gradtrace.versions.runner import find_binary


@dataclasses.dataclass
class Judgement:
    diff_exit: int | None = None
    verdict: str = ""  # the diff's verdict; "" when not compared
    summary: str = ""
    worst_scale: float | None = None  # the factor furthest from 1 among scaled parameters
    not_a_multiple: int = 0  # parameters no multiple of the reference's
    cause: str = ""  # the worst group's explanation
    first_step: int | None = None  # the first step that differs
    setup: list = dataclasses.field(default_factory=list)  # setup findings, in words
    params: list = dataclasses.field(default_factory=list)  # [{"name", "kind", "verdict", "scale"}]
    report_json: str = ""
    report_html: str = ""
    error: str = ""


def _finite(x):
    return x if isinstance(x, (int, float)) and math.isfinite(x) else None


def judge(reference: pathlib.Path, trace_dir: pathlib.Path, reports: pathlib.Path, name: str,
          timeout: float = 3600) -> Judgement:
    reports.mkdir(parents=True, exist_ok=True)
    j = Judgement(report_json=str(reports / f"{name}.json"), report_html=str(reports / f"{name}.html"))
    cmd = [str(find_binary("gradtrace-diff")), str(reference), str(trace_dir), "--json", j.report_json,
           "--html", j.report_html]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    j.diff_exit = p.returncode
    if p.returncode == 2 or not pathlib.Path(j.report_json).is_file():
        j.error = (p.stderr.strip().splitlines() or [f"gradtrace-diff exited {p.returncode}"])[-1]
        j.verdict = "error"
        return j
    report = json.loads(pathlib.Path(j.report_json).read_text())
    j.verdict, j.summary = report.get("verdict", ""), report.get("summary", "")
    worst = None
    for row in report.get("params", []):
        scale = _finite(row.get("scale"))
        j.params.append({"name": row.get("name", ""), "kind": row.get("param_kind", ""),
                         "verdict": row.get("verdict", ""), "scale": scale})
        if row.get("verdict") == "scaled" and scale and scale > 0:
            if worst is None or abs(math.log(scale)) > abs(math.log(worst)):
                worst = scale
        elif row.get("verdict") in ("mismatch", "missing", "nonfinite"):
            j.not_a_multiple += 1
    j.worst_scale = worst
    groups = [g for g in report.get("groups", []) if not (g.get("kind") == "scale" and
                                                             abs((_finite(g.get("scale")) or 1.0) - 1.0) < 1e-6)]
    if groups:
        j.cause = groups[0].get("explanation", "")
    for s in report.get("steps", []):
        if s.get("verdict") != "match":
            j.first_step = s.get("step")
            break
    if j.first_step is None and j.verdict != "match":
        j.first_step = report.get("step")
    j.setup = [f.get("message", "") for f in report.get("findings", []) if f.get("kind") == "setup"]
    return j
