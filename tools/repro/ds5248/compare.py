#!/usr/bin/env python3
"""Per-parameter scale factors between two trace sets, in numpy (no gradtrace-diff needed).

    compare.py REF RUN [--phase final] [--step 0] [--json FILE]

Same definition as gradtrace-diff: for each parameter, s = <a,b>/<a,a> (RUN ~ s * REF) and the
residual ||b - s a|| / ||b||. FINAL records hold the full gradient on every rank; the ranks must
agree (a disagreement is reported). Prints one line per parameter and a summary; exit 0.
"""

import argparse
import json
import sys

import numpy as np


def final_grads(directory, step=None, phase="FINAL"):
    """{name: float64 array} of the FINAL gradient at `step` (default: first step with one),
    and the largest relative disagreement between ranks."""
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


def scales(ref, run):
    out = {}
    for name, a in ref.items():
        if name not in run:
            continue
        b = run[name]
        aa = float(a @ a)
        s = float(a @ b) / aa if aa > 0 else float("nan")
        res = float(np.linalg.norm(b - s * a) / max(np.linalg.norm(b), 1e-30))
        out[name] = {"scale": s, "residual": res, "numel": int(a.size)}
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("ref")
    ap.add_argument("run")
    ap.add_argument("--step", type=int, default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    a, sa = final_grads(args.ref, args.step)
    b, sb = final_grads(args.run, args.step)
    table = scales(a, b)
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
