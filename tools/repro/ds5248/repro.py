#!/usr/bin/env python3
"""One command for the #5248 measurements with the DeepSpeed installed in this Python:

    PYTHONPATH=build/python .venv/bin/python tools/repro/ds5248/repro.py --out traces/ds5248 [--quick]

For every cell of (layout x ZeRO stage x loss recipe x ignore fraction) it runs run.py (the
issue's loop, real DeepSpeed, captured by gradtrace.deepspeed_adapter), the matching single-rank
full-sequence reference (same weights, same global batch), and compares FINAL gradients with
gradtrace-diff (if built; else compare.py in numpy). Writes OUT/table.md and OUT/results.json.
Cells that cannot be measured on CPU are marked with the reason, never with a number.
"""

import argparse
import itertools
import json
import os
import pathlib
import shutil
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path.insert(0, str(HERE))

LAYOUTS = {"sp2": (2, 1), "sp4": (4, 1), "dp2xsp2": (2, 2)}
RECIPES = ["loss", "loss-div-sp", "token-weighted", "full-sequence"]


def find_diff():
    for b in [os.environ.get("GRADTRACE_BUILD_DIR", "build"), "build", "build-diff", "build-ds"]:
        p = ROOT / b / "bin" / "gradtrace-diff"
        if p.exists():
            return p
    return shutil.which("gradtrace-diff")


def run(out, sp, dp, stage, loss, ignore, batch, common, log):
    done = pathlib.Path(str(out) + ".done")
    if (out / "rank-00000.gtrace").exists() and done.exists():
        return 0
    cmd = [sys.executable, str(HERE / "run.py"), "--sp", str(sp), "--dp", str(dp), "--zero-stage", str(stage),
           "--loss", loss, "--ignore-frac", str(ignore), "--batch", str(batch), "--out", str(out), *common]
    with open(log, "w") as f:
        rc = subprocess.call(cmd, stdout=f, stderr=subprocess.STDOUT)
    if rc == 0:
        done.write_text(" ".join(cmd) + "\n")
    return rc


def measure(diff, ref, got, out):
    """(median scale, min, max, max residual, verdict) of FINAL, step 0."""
    if diff:
        j = pathlib.Path(str(out) + ".diff.json")
        subprocess.call([str(diff), str(ref), str(got), "--phase", "final", "--step", "0", "--threads", "1",
                         "--json", str(j), "--markdown", str(out) + ".diff.md"], stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL)
        if j.exists():
            rep = json.loads(j.read_text())
            sc = [p["scale"] for p in rep["params"]]
            return {"scale": sorted(sc)[len(sc) // 2], "min": min(sc), "max": max(sc),
                    "residual": max(p["residual"] for p in rep["params"]), "verdict": rep["verdict"],
                    "explanation": "; ".join(g.get("explanation", "") for g in rep["groups"]), "tool": "gradtrace-diff"}
    from compare import final_grads, scales
    a, _ = final_grads(ref)
    b, _ = final_grads(got)
    t = scales(a, b)
    sc = sorted(r["scale"] for r in t.values())
    return {"scale": sc[len(sc) // 2], "min": sc[0], "max": sc[-1],
            "residual": max(r["residual"] for r in t.values()), "verdict": "", "explanation": "", "tool": "compare.py"}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--layouts", default="sp2,sp4,dp2xsp2")
    ap.add_argument("--stages", default="0,1,2")
    ap.add_argument("--recipes", default=",".join(RECIPES))
    ap.add_argument("--ignore", default="0,0.25", help="ignore fractions (0.25: uneven valid tokens per shard)")
    ap.add_argument("--quick", action="store_true", help="sp2 only, ZeRO-1/2, loss and loss-div-sp, no ignore")
    ap.add_argument("--seq-len", type=int, default=32)
    ap.add_argument("--batch", type=int, default=1)
    args = ap.parse_args(argv)
    if args.quick:
        args.layouts, args.stages, args.recipes, args.ignore = "sp2", "1,2", "loss,loss-div-sp", "0"
    import deepspeed
    out = pathlib.Path(args.out) / f"deepspeed-{deepspeed.__version__}"
    out.mkdir(parents=True, exist_ok=True)
    common = ["--seq-len", str(args.seq_len), "--steps", "1"]
    diff = find_diff()
    results = []
    for layout, stage, recipe, ignore in itertools.product(args.layouts.split(","), map(int, args.stages.split(",")),
                                                           args.recipes.split(","),
                                                           map(float, args.ignore.split(","))):
        sp, dp = LAYOUTS[layout]
        ref = out / f"ref-b{args.batch * dp}-ign{ignore}"
        # World 1: nothing is reduced, the ZeRO stage does not matter; ZeRO-2 for every reference.
        if run(ref, 1, 1, 2, "loss", ignore, args.batch * dp, common, str(ref) + ".log") != 0:
            print(f"reference {ref} failed, see {ref}.log", file=sys.stderr)
            return 2
        cell = out / f"{layout}-z{stage}-{recipe}-ign{ignore}"
        rc = run(cell, sp, dp, stage, recipe, ignore, args.batch, common, str(cell) + ".log")
        row = {"deepspeed": deepspeed.__version__, "layout": layout, "sp": sp, "dp": dp, "zero_stage": stage,
               "loss": recipe, "ignore_frac": ignore, "trace": str(cell), "reference": str(ref)}
        if rc != 0:
            row.update({"scale": None, "note": f"run failed (exit {rc}); see {cell}.log"})
        else:
            row.update(measure(diff, ref, cell, cell))
        results.append(row)
        s = row.get("scale")
        print(f"{layout:8s} z{stage} {recipe:15s} ignore {ignore:4.2f}: "
              + (f"FINAL scale {s:.4f} [{row['min']:.4f}, {row['max']:.4f}] residual {row['residual']:.1e}"
                 if s is not None else row["note"]), flush=True)
    # Merge with cells measured by earlier invocations into the same OUT (keyed by configuration).
    key = lambda r: (r["layout"], r["zero_stage"], r["loss"], r["ignore_frac"])  # noqa: E731
    merged = {}
    if (out / "results.json").exists():
        merged = {key(r): r for r in json.loads((out / "results.json").read_text())}
    merged.update({key(r): r for r in results})
    order = {name: i for i, name in enumerate(LAYOUTS)}
    results = sorted(merged.values(), key=lambda r: (order.get(r["layout"], 99), r["ignore_frac"], -r["zero_stage"],
                                                     RECIPES.index(r["loss"]) if r["loss"] in RECIPES else 99))
    (out / "results.json").write_text(json.dumps(results, indent=1))
    lines = [f"| DeepSpeed | layout | ZeRO | loss | ignore | FINAL scale (median [min, max]) | max residual |",
             "|---|---|---|---|---|---|---|"]
    for r in results:
        cellv = (f"{r['scale']:.4f} [{r['min']:.4f}, {r['max']:.4f}]" if r.get("scale") is not None else r["note"])
        resid = f"{r['residual']:.1e}" if r.get("scale") is not None else ""
        lines.append(f"| {r['deepspeed']} | {r['layout']} | {r['zero_stage']} | {r['loss']} | {r['ignore_frac']} | "
                     f"{cellv} | {resid} |")
    (out / "table.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {out / 'table.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
