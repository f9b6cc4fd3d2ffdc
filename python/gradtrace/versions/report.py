"""The table and the Markdown report of gradtrace-versions (from its result rows; no running).

A row: {"release", "status" ("ok" | "failed"), "error", "loss", "grad_norm", "seconds", "cached",
"vs_reference": {"verdict", "summary", "groups": [...]}, "vs_previous": {"previous", "verdict", ...}}.
"""

import json


def md_text(s) -> str:
    """A cell or a line made of outside strings (a release, an error, a path): no table break, no HTML, no code."""
    out = str(s).replace("\\", "\\\\").replace("\r", " ").replace("\n", " ")
    for c in "|`<>":
        out = out.replace(c, "\\" + c)
    return out


def fmt(x, spec=".4g"):
    return "-" if x is None else format(x, spec)


def groups_text(cmp) -> str:
    """`2.000 x14 (res 3e-07)`, one per group, `; ` between; the verdict when there is no comparison."""
    if not cmp:
        return "-"
    if cmp.get("error"):
        return "diff failed: " + cmp["error"]
    parts = []
    for g in cmp.get("groups", []):
        if g["kind"] == "scale":
            expr = f" = {g['expression']}" if g.get("expression") else ""
            parts.append(f"{fmt(g['scale'], '.4f')}{expr} x{g['count']} (res {fmt(g['residual'], '.1e')})")
        else:
            parts.append(f"{g['kind']} x{g['count']}")
    return "; ".join(parts) or cmp.get("verdict", "-")


def compare_failed(row) -> bool:
    """True when the row ran but its comparison with its predecessor failed (the diff refused the pair, e.g.
    different models): nothing was measured, so it is no change."""
    prev = row.get("vs_previous")
    return row.get("status") == "ok" and bool(prev) and bool(prev.get("error"))


def changed(row) -> bool:
    """True when the row ran and the diff measured gradients that differ from its predecessor's; a failed
    comparison (:func:`compare_failed`) is not a change."""
    prev = row.get("vs_previous")
    return (row.get("status") == "ok" and bool(prev) and not prev.get("error")
            and prev.get("verdict") not in (None, "match"))


def transitions(rows) -> list:
    """Every (previous, release) at which the gradients measurably changed, oldest first."""
    return [(r["vs_previous"]["previous"], r["release"]) for r in rows if changed(r)]


def failed_between(rows, previous, release) -> list:
    """The releases between ``previous`` and ``release`` (row order) that failed to run: a change measured from
    ``previous`` to ``release`` may have come with any of them."""
    names = [r["release"] for r in rows]
    lo, hi = names.index(previous), names.index(release)
    return [r["release"] for r in rows[lo + 1:hi] if r.get("status") != "ok"]


def transition_text(rows, previous, release) -> str:
    """``0.18.5 (after 0.18.2)``, or the range when releases between failed: ``0.18.3, 0.18.4 or 0.18.5 (after
    0.18.2; 0.18.3 and 0.18.4 failed to run)``."""
    failed = failed_between(rows, previous, release)
    if not failed:
        return f"**{md_text(release)}** (after {md_text(previous)})"
    names = [md_text(x) for x in failed]
    which = ", ".join(names + [f"or {md_text(release)}"]) if len(names) > 1 else f"{names[0]} or {md_text(release)}"
    which = which.replace(", or", " or")
    did = " and ".join(names) if len(names) <= 2 else ", ".join(names[:-1]) + " and " + names[-1]
    return f"**{which}** (after {md_text(previous)}; {did} failed to run)"


def failed_comparisons(rows) -> list:
    """Every (previous, release) whose comparison failed, oldest first."""
    return [(r["vs_previous"]["previous"], r["release"]) for r in rows if compare_failed(r)]


def against(result) -> str:
    """What the table's second comparison is against: each release's predecessor, or in a bisection
    the good end (every visited release is compared with GOOD)."""
    b = result.get("bisect")
    return f"vs good end ({b['good']})" if b else "vs previous"


def table_rows(rows, versus: str = "vs previous"):
    head = ["release", "vs reference: scale per group", versus, "loss", "reported grad norm", "seconds"]
    body = []
    for r in rows:
        if r.get("status") != "ok":
            body.append([r["release"], "FAILED: " + (r.get("error") or "?")[:160], "-", "-", "-",
                         fmt(r.get("seconds"), ".0f")])
            continue
        prev = r.get("vs_previous")
        if not prev:
            pv = "-"
        elif prev.get("error"):
            pv = f"NOT COMPARED with {prev['previous']}: {groups_text(prev)}"
        else:
            pv = "same" if prev.get("verdict") == "match" else f"CHANGED vs {prev['previous']}: {groups_text(prev)}"
        body.append([r["release"], groups_text(r.get("vs_reference")), pv, fmt(r.get("loss"), ".6g"),
                     fmt(r.get("grad_norm"), ".6g"),
                     "cached" if r.get("cached") else fmt(r.get("seconds"), ".0f")])
    return head, body


def text_table(rows, versus: str = "vs previous") -> str:
    head, body = table_rows(rows, versus)
    widths = [max(len(str(x)) for x in col) for col in zip(head, *body)]
    line = lambda cells: "  ".join(str(c).ljust(w) for c, w in zip(cells, widths)).rstrip()
    return "\n".join([line(head), line(["-" * w for w in widths])] + [line(b) for b in body])


def md_table(rows, versus: str = "vs previous") -> str:
    head, body = table_rows(rows, versus)
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(md_text(c) for c in b) + " |" for b in body]
    return "\n".join(out)


def _range(before, after, failed) -> str:
    """``1.4.0`` or, next to failed releases, ``1.3.3, 1.3.4 or 1.4.0``: the release that brought a change."""
    names = [md_text(x) for x in [*failed, after]]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


def causes_text(groups) -> str:
    """The diff's causes of a transition's groups (those that differ: a matching group's cause is "none"), once
    each."""
    seen = []
    for g in groups:
        c = g.get("cause") or ("" if g["kind"] == "match" else g["kind"])
        if c and c != "none" and c not in seen:
            seen.append(c)
    return ", ".join(seen) or "-"


def changelog_rows(t) -> list:
    """One row per change of a --transitions result: [release, after, scale per group, causes, reproduce]."""
    out = []
    for c in t["changes"]:
        failed = c.get("failed_between") or []
        out.append([_range(c["before"], c["after"], failed), c["before"], groups_text(c), causes_text(c["groups"]),
                    c["command"]])
    return out


def changelog_text(t) -> str:
    """The changelog of the gradients as a text table, then what was run and what could not be seen."""
    head = ["changed in", "after", "B/A per group (vs the release before)", "cause", "reproduce"]
    body = changelog_rows(t)
    lines = [f"Changelog of the gradients, {t['good']} to {t['bad']}:"]
    if body:
        widths = [max(len(str(x)) for x in col) for col in zip(head, *body)]
        line = lambda cells: "  ".join(str(c).ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
        lines += [line(head), line(["-" * w for w in widths])] + [line(b) for b in body]
    else:
        lines.append("no release changed the gradients measurably")
    return "\n".join(lines + [runs_text(t)]).replace("**", "")


def runs_text(t) -> str:
    """The runs made against a sweep's, the failed and not-compared releases, and the blind spot."""
    every = t.get("every", 1)
    out = [f"{t['runs']} of the {t['sweep_runs']} releases run (a sweep runs {t['sweep_runs']})"
           + (f"; probed every {every} releases, then each range whose ends differ split." if every > 1 else ".")]
    if t.get("failed") or t.get("unrunnable_ends"):
        out.append("Failed to run: " + ", ".join(md_text(x) for x in [*t.get("unrunnable_ends", []), *t["failed"]])
                   + " (never counted as changes).")
    for n in t.get("not_compared", []):
        out.append(f"Not compared (the diff refused the pair, nothing measured): {md_text(n['before'])} -> "
                   f"{md_text(n['after'])}.")
    if t.get("unentered"):
        out.append("Not seen: a change that a later release reverts inside a range whose ends agree; ranges judged by "
                   "their ends alone: " + ", ".join(f"{md_text(a)}..{md_text(b)}" for a, b in t["unentered"]) + ".")
    return " ".join(out)


def conclusion(result) -> str:
    """One or two sentences: the first change (or the bisect's answer, or every transition)."""
    t = result.get("transitions")
    if t:
        cs = t["changes"]
        if not cs:
            return f"No release from {md_text(t['good'])} to {md_text(t['bad'])} changed the gradients measurably."
        said = ", ".join(f"**{_range(c['before'], c['after'], c.get('failed_between') or [])}** (after "
                         f"{md_text(c['before'])})" for c in cs)
        return f"{len(cs)} release{'s' * (len(cs) != 1)} changed the gradients: {said}."
    b = result.get("bisect")
    if b:
        if b.get("first_bad"):
            return (f"First bad release: **{b['first_bad']}** (last good {b['last_good']}; "
                    f"{len(b['visited'])} releases visited by the search).")
        return (f"First bad release is one of {', '.join(b['skipped_between'] + [b['first_bad_or_skipped']])} "
                f"(after {b['last_good']}): the releases between could not be run.")
    ts = transitions(result["rows"])
    failed = failed_comparisons(result["rows"])
    unmeasured = ("" if not failed else " Not compared (the diff failed, so nothing was measured): "
                  + ", ".join(f"{md_text(a)} -> {md_text(b)}" for a, b in failed) + ".")
    not_run = [r["release"] for r in result["rows"] if r.get("status") != "ok"]
    if not ts:
        if failed or not_run:
            return "No change was measured." + unmeasured + (
                f" Failed to run: {', '.join(md_text(x) for x in not_run)}." if not_run else "")
        return "Nothing changed between the releases compared."
    rows = result["rows"]
    first = transition_text(rows, *ts[0])
    more = "" if len(ts) == 1 else " Later changes: " + ", ".join(
        f"{a} -> {b}" + (f" (or {', '.join(failed_between(rows, a, b))}, which failed)" if failed_between(rows, a, b)
                         else "") for a, b in ts[1:]) + "."
    return f"First release at which anything changed: {first}.{more}{unmeasured}"


def markdown(result) -> str:
    """The report to attach to a bug report."""
    a = result["setup"]
    name = a.get("display_name") or a["package"]  # the package description's (results written before it: none)
    lines = [
        f"# {md_text(name)} versions compared with gradtrace", "",
        f"Command: `{a['command'].replace('`', chr(39))}`", "",
        f"- entry point: {md_text(a['entry'])}; layout: sp={a['sp']} dp={a['dp']}; loss recipe: {a['loss']}"
        + (f"; dependencies: {a['deps']}" if a.get("deps") else ""),
        f"- reference: {md_text(a['reference'])}",
        f"- releases: {', '.join(md_text(r['release']) for r in result['rows'])}",
        f"- compared: FINAL gradients of optimizer step 0, `gradtrace-diff REF RELEASE` (scale = B/A per "
        "parameter group, res = worst residual in the group); "
        + ("`vs good end` = `gradtrace-diff GOOD RELEASE`" if result.get("bisect")
           else "`vs previous` = `gradtrace-diff PREVIOUS RELEASE`"),
        "",
    ]
    if a.get("config") is not None:
        fence = "````"  # longer than any run of backticks json.dumps can write inside a string
        lines += [f"{a.get('config_title') or 'Config'}:", "", fence + "json",
                  json.dumps(a["config"], indent=2), fence, ""]
    lines += ["## Results", "", md_table(result["rows"], against(result)), "", conclusion(result), ""]
    t = result.get("transitions")
    if t:
        head = ["changed in", "after", "B/A per group (vs the release before)", "cause", "reproduce"]
        lines += ["## Changelog of the gradients", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join([*(md_text(x) for x in r[:4]), f"`{r[4].replace('`', chr(39))}`"]) + " |"
                  for r in changelog_rows(t)]
        lines += ["", runs_text(t), ""]
        for c in t["changes"]:
            if c.get("markdown"):
                lines += [f"## The transition {md_text(c['before'])} -> {md_text(c['after'])} "
                          f"(gradtrace-diff {md_text(c['before'])} {md_text(c['after'])})", "",
                          c["markdown"].rstrip(), ""]
    tr = result.get("transition")
    if tr and tr.get("markdown"):
        lines += [f"## The transition {md_text(tr['from'])} -> {md_text(tr['to'])} "
                  f"(gradtrace-diff {md_text(tr['from'])} {md_text(tr['to'])})", "", tr["markdown"].rstrip(), ""]
    return "\n".join(lines)
