"""Runs the whole zoo and writes its results: the 4-rank gloo launch of every plain-PyTorch scenario
(launch.py), the gradtrace-train emulation runs (two at a time, beside it), then gradtrace-diff of
every buggy and every corrected run against its reference.

    python tests/zoo/run_all.py --out out/zoo [--slow] [--table] [--results tests/zoo/results.json] [--mode MODE]

OUT/traces/<run>/ holds the trace sets, OUT/reports/<run>.json the diff reports, OUT/results.json
one entry per case (row, report, how, and per run: exit code, verdict, factor per parameter group,
summary); --table prints the README's Markdown table from it. --slow adds the real DeepSpeed ZeRO-3
cases (tools/repro/ds5248/run.py, about a minute per run, one after the other). Needs the build's gradtrace-diff and
gradtrace-train ($GRADTRACE_BUILD_DIR, default build/) and its Python package on PYTHONPATH.

--mode: gradtrace.attach's mode of the gloo launch's captures (launch.py --mode; default "full"). With
the live guard ("full+guard", "stats+guard": a trace to diff is still needed) each run's entry gains
"guard" (its violations from OUT/traces/<run>/rank-*.guard.jsonl), and the rows whose runs the guard
cannot watch are left out (results.json "left_out"): the gradtrace-train emulation rows 1-3
(a C++ binary with a guard of its own, held in tests/python/test_guard_train.py) and the real DeepSpeed row 14
(tools/repro/ds5248/run.py takes no mode).
"""

import argparse
import concurrent.futures
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
from cases import CASES, DS_RUNS, TRAIN_MODEL, TRAIN_RUNS, group_of  # noqa: E402


def build_dir() -> pathlib.Path:
    build = pathlib.Path(os.environ.get("GRADTRACE_BUILD_DIR", "build"))
    return build if build.is_absolute() else ROOT / build


def _check(cmd, timeout=300):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=_env())
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))} exited {p.returncode}:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return p


def _env():
    path = [str(build_dir() / "python")] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path), DS_ACCELERATOR="cpu")
    env.pop("RANK", None)
    return env


def guarded(mode: str) -> bool:
    """Whether ``mode`` (gradtrace.attach's) runs the live guard."""
    return "guard" in mode.split("+")


def guardable(case) -> bool:
    """Whether the guard can watch the case's runs: only the gloo launch's captures take a mode."""
    return case.reference not in TRAIN_RUNS and case.reference not in DS_RUNS


LEFT_OUT_WHY = ("gradtrace-train (rows 1-3) is a C++ binary with a guard of its own "
                "(tests/python/test_guard_train.py), and tools/repro/ds5248/run.py (row 14) takes no capture mode")


def capture(traces: pathlib.Path, slow: bool, mode: str = "full") -> None:
    """Every trace set the cases name, into traces/<run> (with the guard: only the gloo launch's)."""
    train = build_dir() / "bin" / "gradtrace-train"
    jobs = [[sys.executable, str(HERE / "launch.py"), str(traces), *(["--mode", mode] if mode != "full" else [])]]
    if not guarded(mode):
        jobs += [[str(train), *args.split(), *TRAIN_MODEL, "--out", str(traces / name)]
                 for name, args in TRAIN_RUNS.items()]
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        for f in [pool.submit(_check, job) for job in jobs]:
            f.result()
    if slow and not guarded(mode):  # each DeepSpeed run starts its own ranks: one at a time
        for name, args in DS_RUNS.items():
            _check([sys.executable, str(ROOT / "tools" / "repro" / "ds5248" / "run.py"), *args.split(), "--out",
                    str(traces / name)], timeout=900)


def diff(traces, reports, ref, run) -> dict:
    """gradtrace-diff ref run: exit code, verdict, factor per parameter group (median of the
    parameters' scales; None when any parameter of the group is a mismatch), summary."""
    out = reports / f"{run}.json"
    p = subprocess.run([str(build_dir() / "bin" / "gradtrace-diff"), str(traces / ref), str(traces / run),
                        "--json", str(out)], capture_output=True, text=True, timeout=120)
    if p.returncode not in (0, 1):
        raise RuntimeError(f"gradtrace-diff {ref} {run} exited {p.returncode}: {p.stderr.strip()}")
    return {"report": out.name, "exit": p.returncode, **json.loads(out.read_text())}


def guard_summary(run_dir: pathlib.Path) -> dict:
    """The guard's verdict on a run, over its ranks' logs: violations (total), by_check, the first
    violation's step, the causes of its divisor violations, steps checked per rank, disabled ranks."""
    out = {"violations": 0, "by_check": {}, "first_step": None, "causes": set(), "steps_checked": {}, "disabled": []}
    for log in sorted(run_dir.glob("rank-*.guard.jsonl")):
        for line in log.read_text().splitlines():
            e = json.loads(line)
            if e["event"] == "violation":
                out["violations"] += 1
                out["by_check"][e["check"]] = out["by_check"].get(e["check"], 0) + 1
                out["first_step"] = e["step"] if out["first_step"] is None else min(out["first_step"], e["step"])
                if e["check"] == "divisor":
                    out["causes"].add(e["cause"])
            elif e["event"] == "summary":
                out["steps_checked"][str(e["rank"])] = e["steps_checked"]
                if e.get("disabled"):
                    out["disabled"].append(e["rank"])
    out["causes"] = sorted(out["causes"])
    return out


def summarize(case, report) -> dict:
    groups = {}
    for param in report["params"]:
        groups.setdefault(group_of(param["name"], case.factors), []).append(param)
    factors = {g: (None if any(p["verdict"] not in ("match", "scaled") for p in ps)
                   else round(statistics.median(p["scale"] for p in ps), 6)) for g, ps in sorted(groups.items())}
    residual = {g: round(max(p["residual"] for p in ps), 6) for g, ps in sorted(groups.items())}
    gn = report["grad_norm"] or {}
    return {"report": report["report"], "exit": report["exit"], "verdict": report["verdict"], "factors": factors,
            "max_residual": residual, "summary": report["summary"], "grad_norm_off": gn.get("off_b")}


def run(out: pathlib.Path, slow: bool = False, mode: str = "full") -> dict:
    start = time.perf_counter()
    traces, reports = out / "traces", out / "reports"
    reports.mkdir(parents=True, exist_ok=True)
    capture(traces, slow, mode)
    captured = time.perf_counter() - start
    results, left_out = [], []
    for case in CASES:
        if case.slow and not slow:
            continue
        if guarded(mode) and not guardable(case):
            left_out.append(case.row)
            continue
        entry = {"row": case.row, "report": case.report, "how": case.how, "reference": case.reference,
                 "expected": case.factors, "bug": summarize(case, diff(traces, reports, case.reference, case.bug))}
        if case.ok:
            entry["ok"] = summarize(case, diff(traces, reports, case.reference, case.ok))
        if guarded(mode):
            for side, name in (("bug", case.bug), ("ok", case.ok)):
                if name:
                    entry[side]["guard"] = guard_summary(traces / name)
        results.append(entry)
    doc = {"cases": results, "seconds": {"capture": round(captured, 1),
                                         "total": round(time.perf_counter() - start, 1)}}
    if mode != "full":
        doc["mode"] = mode
    if left_out:
        doc["left_out"] = {"rows": left_out, "why": LEFT_OUT_WHY}
    (out / "results.json").write_text(json.dumps(doc, indent=2) + "\n")
    return doc


def _factor(entry) -> str:
    f = entry["bug"]["factors"]
    if entry["row"].startswith("D"):
        return f"gradients 1.000; reported norm x {entry['bug']['grad_norm_off']:.3f}"
    text = ", ".join(("not a scalar (residual %.2f)" % entry["bug"]["max_residual"][g]) if v is None
                     else f"{v:.3f}" for g, v in f.items())
    return text if list(f) == ["all"] else ", ".join(
        f"{g} " + ("not a scalar" if v is None else f"{v:.3f}") for g, v in f.items())


def _guard(run) -> str:
    g = run.get("guard")
    if g is None:
        return "-"
    if not g["violations"]:
        return "silent"
    checks = ", ".join(f"{c} {n}" for c, n in sorted(g["by_check"].items()))
    causes = f" ({', '.join(g['causes'])})" if g["causes"] else ""
    return f"step {g['first_step']}: {checks}{causes}"


def table(doc) -> str:
    guard = any("guard" in e["bug"] for e in doc["cases"])
    extra = " guard: buggy | guard: corrected |" if guard else ""
    lines = ["| # | report | how reproduced | buggy run: factor measured | buggy: verdict (exit) "
             "| corrected: verdict (exit) |" + extra,
             "|---|---|---|---|---|---|" + ("---|---|" if guard else "")]
    for e in doc["cases"]:
        ok = f"{e['ok']['verdict']} ({e['ok']['exit']})" if "ok" in e else "-"
        cells = f" {_guard(e['bug'])} | {_guard(e['ok']) if 'ok' in e else '-'} |" if guard else ""
        lines.append(f"| {e['row']} | {e['report']} | {e['how']} | {_factor(e)} | {e['bug']['verdict']} "
                     f"({e['bug']['exit']}) | {ok} |" + cells)
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=pathlib.Path)
    ap.add_argument("--slow", action="store_true", help="also the real DeepSpeed ZeRO-3 cases (minutes)")
    ap.add_argument("--table", action="store_true", help="print the Markdown table of the results")
    ap.add_argument("--results", type=pathlib.Path, help="also copy results.json here (without the reports)")
    ap.add_argument("--mode", default="full", help='gradtrace.attach mode of the gloo runs (default "full"; '
                                                  '"full+guard": also the live guard, rows 1-3 and 14 left out)')
    args = ap.parse_args(argv)
    if guarded(args.mode) and args.mode.split("+") == ["guard"]:
        ap.error('--mode guard writes no trace to diff: use "full+guard" or "stats+guard"')
    doc = run(args.out, args.slow, args.mode)
    if args.results:
        args.results.write_text(json.dumps(doc, indent=2) + "\n")
    if args.table:
        print(table(doc))
    print(f"zoo: {len(doc['cases'])} cases, capture {doc['seconds']['capture']} s, total {doc['seconds']['total']} s",
          file=sys.stderr)
    if "left_out" in doc:
        print(f"zoo: rows {', '.join(doc['left_out']['rows'])} left out under --mode {args.mode}: "
              f"{doc['left_out']['why']}", file=sys.stderr)


if __name__ == "__main__":
    main()
