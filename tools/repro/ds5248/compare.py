#!/usr/bin/env python3
"""Per-parameter scale factors between two trace sets, as gradtrace-diff computes them.

    compare.py REF RUN [--step 0] [--json FILE]

The numbers are gradtrace-diff's (`gradtrace-diff REF RUN --phase final --json`, params[].scale and
.residual, diff/REPORT_SCHEMA.md): for each parameter s = <a,b>/<a,a> (RUN ~ s * REF) and the residual
||b - s a|| / ||b||. This file only runs it and reshapes the report. FINAL records hold the full gradient
on every rank; how far the ranks disagree is reported too (final_grads). Prints one line per parameter
and a summary; exit 0.
"""

import argparse
import json
import pathlib
import subprocess
import sys
import tempfile

import numpy as np

from binaries import find_binary


def run_diff(args):
    """`gradtrace-diff ARGS --json` (one thread): the report as a dict. Exit 2 (bad input) or a missing
    binary stops with the diff's one-line error."""
    diff = find_binary("gradtrace-diff")
    if diff is None:
        raise SystemExit("gradtrace-diff is not built (cmake --build build)")
    with tempfile.TemporaryDirectory() as d:
        report = pathlib.Path(d) / "report.json"
        p = subprocess.run([str(diff), *map(str, args), "--threads", "1", "--json", str(report)],
                           capture_output=True, text=True, timeout=600)
        if p.returncode not in (0, 1) or not report.exists():
            last = ((p.stderr or p.stdout).strip().splitlines() or [""])[-1]
            raise SystemExit(f"gradtrace-diff {' '.join(map(str, args))}: exit {p.returncode}: {last}")
        return json.loads(report.read_text())


def final_grads(directory, step=None, phase="FINAL"):
    """{name: float64 array} of the FINAL gradient at `step` (default: first step with one),
    and the largest relative disagreement between ranks. Read in numpy: the arrays are data for the
    callers, and the diff's report names disagreeing ranks only above its tolerance (a `replica`
    finding), not the spread itself."""
    import gradtrace
    readers = gradtrace.read_trace_set(directory)
    if not readers:
        raise SystemExit(f"{directory}: no rank-*.gtrace files")
    names = {p["id"]: p["name"] for p in readers[0].run_info["params"]}
    per_rank = []
    for r in readers:
        got = {}
        chosen = step
        for f in r.frames():
            if f["type"] != "bucket" or f["phase"] != phase:
                continue
            if chosen is None:
                chosen = f["step"]
            if f["step"] != chosen:
                continue
            for s in f["slices"]:
                v = gradtrace.slice_values(s, np.float64)
                name = names[s["param_id"]]
                if s["offset"] == 0 and name not in got:
                    got[name] = v
        per_rank.append(got)
    ref = per_rank[0]
    spread = 0.0
    for other in per_rank[1:]:
        for k, v in ref.items():
            if k in other:
                d = np.linalg.norm(other[k] - v) / max(np.linalg.norm(v), 1e-30)
                spread = max(spread, float(d))
    return ref, spread


def scales(ref, run, step=None):
    """{name: {"scale", "residual", "numel"}} of FINAL, RUN against REF (trace set directories), from
    gradtrace-diff's params[] (parameters compared on both sides; null numbers as NaN)."""
    args = [ref, run, "--phase", "final"] + (["--step", step] if step is not None else [])
    nan = float("nan")
    return {q["name"]: {"scale": nan if q["scale"] is None else q["scale"],
                        "residual": nan if q["residual"] is None else q["residual"], "numel": q["numel"]}
            for q in run_diff(args)["params"] if q["verdict"] != "missing"}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("ref")
    ap.add_argument("run")
    ap.add_argument("--step", type=int, default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    _, sa = final_grads(args.ref, args.step)
    _, sb = final_grads(args.run, args.step)
    table = scales(args.ref, args.run, args.step)
    for name, r in table.items():
        print(f"{name:32s} {r['numel']:8d}  scale {r['scale']:.6f}  residual {r['residual']:.2e}")
    vals = np.array([r["scale"] for r in table.values()])
    summary = {"params": len(table), "scale_min": float(vals.min()), "scale_max": float(vals.max()),
               "scale_median": float(np.median(vals)), "max_residual": max(r["residual"] for r in table.values()),
               "rank_disagreement": max(sa, sb)}
    print(json.dumps(summary))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"summary": summary, "params": table}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
