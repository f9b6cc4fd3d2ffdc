#!/usr/bin/env python3
"""One command for the #5248 measurements.

    # every DeepSpeed release of the study, each in its pinned environment (envs.py creates them):
    PYTHONPATH=build/python python3 tools/repro/ds5248/repro.py --versions all
    # only the DeepSpeed installed in this Python (the original mode):
    PYTHONPATH=build/python .venv/bin/python tools/repro/ds5248/repro.py --out traces/ds5248 [--quick]

For every cell of (layout x ZeRO stage x loss recipe x ignore fraction) it runs run.py (the
issue's loop, real DeepSpeed, captured by gradtrace.deepspeed_adapter), the matching single-rank
full-sequence reference (same weights, same global batch, same DeepSpeed and torch), and compares FINAL
gradients with gradtrace-diff (if built; else compare.py in numpy). Writes OUT/deepspeed-<v>/table.md and
results.json; with --versions also the combined tools/repro/ds5248/results.json and table.md, rewritten
after every cell so that partial progress survives.

Cells that cannot be measured on CPU are marked "not runnable on CPU: <reason>", never with a number.
They are detected, not assumed:
- a sanity cell per ZeRO stage: pure data parallel (dp=2, sp=1, `loss`), whose FINAL must equal the
  reference (scale 1, ranks agreeing) in every DeepSpeed version; a stage that fails it is not runnable;
- per cell: the ranks' FINAL gradients must agree, and POST_REDUCE must be a scaled sum over the ranks
  of PRE_REDUCE (the adapter's records); otherwise the reduction did not combine the ranks.
When a stage fails its sanity cell, one sp2 cell of that stage is still run to show the failure there,
and the stage's other cells are marked without being run.
"""

import argparse
import itertools
import json
import os
import pathlib
import shutil
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path.insert(0, str(HERE))

LAYOUTS = {"sp2": (2, 1), "sp4": (4, 1), "dp2xsp2": (2, 2), "dp2": (1, 2)}
# MoE (deepspeed.moe.layer.MoE, 2 experts, ep_size 1) around PR #4957: not part of the default matrix;
# `--layouts dp2-moe2,sp2-moe2 --stages 2`.
MOE_LAYOUTS = {"dp2-moe2": (1, 2, 2), "sp2-moe2": (2, 1, 2)}


def layout_dims(layout):
    """(sp, dp, moe_experts) of a layout name."""
    if layout in MOE_LAYOUTS:
        return MOE_LAYOUTS[layout]
    sp, dp = LAYOUTS[layout]
    return sp, dp, 0
RECIPES = ["loss", "loss-div-sp", "token-weighted", "full-sequence"]
SANITY = ("dp2", "loss", 0.0)  # layout, recipe, ignore of the per-stage sanity cell
RUN_TIMEOUT = 240

# What code reading says about the CPU-only failures (deepspeed file:line at each tag); quoted in the
# reason of a cell that the checks above flagged, never used to skip a cell without running it.
KNOWN_CPU_LIMITS = {
    0: ("stage 0 before 0.13: engine.py split_half_float_double_sparse compares t.type() with "
        "'torch.cpu.FloatTensor' (CPU tensors say 'torch.FloatTensor')"),
    1: ("ZeRO-1 before 0.13: the reduction buckets are filtered by the type string "
        "'torch.cpu.FloatTensor' (stage_1_and_2.py split_half_float_double), so nothing is reduced"),
    2: ("ZeRO-2 with contiguous_gradients false: buffered_reduce_fallback filters by the type string "
        "'torch.cpu.FloatTensor' (stage_1_and_2.py split_half_float_double)"),
}


def find_diff():
    for b in [os.environ.get("GRADTRACE_BUILD_DIR", "build"), "build", "build-old", "build-diff", "build-ds"]:
        p = ROOT / b / "bin" / "gradtrace-diff"
        if p.exists():
            return p
    return shutil.which("gradtrace-diff")


def run(out, sp, dp, stage, loss, ignore, batch, common, log, moe=0):
    done = pathlib.Path(str(out) + ".done")
    if (out / "rank-00000.gtrace").exists() and done.exists():
        return 0
    if out.exists():
        shutil.rmtree(out)
    cmd = [sys.executable, str(HERE / "run.py"), "--sp", str(sp), "--dp", str(dp), "--zero-stage", str(stage),
           "--loss", loss, "--ignore-frac", str(ignore), "--batch", str(batch), "--out", str(out),
           "--timeout", str(RUN_TIMEOUT), *common] + (["--moe-experts", str(moe)] if moe else [])
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


def reduction_check(trace):
    """From the adapter's records of step 0: the largest disagreement between the ranks' FINAL gradients,
    and, where PRE_REDUCE/POST_REDUCE were recorded, the effective divisor d and residual of
    POST ~ (sum over ranks of PRE) / d over the elements each rank holds after the reduction."""
    import numpy as np
    import gradtrace
    from compare import final_grads
    _, spread = final_grads(trace)
    readers = gradtrace.read_trace_set(trace)
    numel = {p["id"]: p["numel"] for p in readers[0].run_info["params"]}
    pre_sum, post, have = {}, {}, {}
    own_pre, own_post = [], []  # each rank's POST against its own PRE, same elements
    recorded = set()
    for r in readers:
        mine = {}
        for f in r.frames():
            if f["type"] != "bucket" or f["step"] != 0 or f["phase"] not in ("PRE_REDUCE", "POST_REDUCE"):
                continue
            recorded.add(f["phase"])
            for s in f["slices"]:
                v = gradtrace.slice_values(s, np.float64)
                pid, off = s["param_id"], s["offset"]
                if f["phase"] == "PRE_REDUCE":
                    pre_sum.setdefault(pid, np.zeros(numel[pid]))[off:off + v.size] += v
                    mine.setdefault(pid, np.zeros(numel[pid]))[off:off + v.size] += v
                else:
                    post.setdefault(pid, np.zeros(numel[pid]))[off:off + v.size] = v
                    have.setdefault(pid, np.zeros(numel[pid], bool))[off:off + v.size] = True
                    if pid in mine:
                        own_pre.append(mine[pid][off:off + v.size].copy())
                        own_post.append(v)
    out = {"final_rank_spread": spread, "phases_recorded": sorted(recorded)}
    # Per bucket (same bucket ids on every rank): the effective divisor of that bucket alone.
    bpre, bpost = {}, {}
    for r in readers:
        for f in r.frames():
            if f["type"] != "bucket" or f["step"] != 0 or f["phase"] not in ("PRE_REDUCE", "POST_REDUCE"):
                continue
            for sl in f["slices"]:
                v = gradtrace.slice_values(sl, np.float64)
                k = (f["bucket_id"], sl["param_id"])
                if f["phase"] == "PRE_REDUCE":
                    acc = bpre.setdefault(k, np.zeros(numel[sl["param_id"]]))
                    acc[sl["offset"]:sl["offset"] + v.size] += v
                else:
                    bpost.setdefault(k, []).append((sl["offset"], v))
    per_bucket = {}
    for (b, pid), parts in bpost.items():
        if (b, pid) not in bpre:
            continue
        ss, sp_ = per_bucket.get(b, (0.0, 0.0))
        for off, v in parts:
            seg = bpre[(b, pid)][off:off + v.size]
            ss, sp_ = ss + float(seg @ seg), sp_ + float(seg @ v)
        per_bucket[b] = (ss, sp_)
    if per_bucket:
        out["bucket_divisors"] = {str(b): round(ss / sp_, 4) if sp_ else None for b, (ss, sp_) in sorted(per_bucket.items())}
    if own_pre:
        a, b = np.concatenate(own_pre), np.concatenate(own_post)
        if float(a @ a) > 0 and np.linalg.norm(b) > 0:
            k = float(a @ b) / float(a @ a)
            out["post_vs_own_pre"] = k
            out["post_vs_own_pre_residual"] = float(np.linalg.norm(b - k * a) / np.linalg.norm(b))
    if pre_sum and post:
        s = np.concatenate([pre_sum[p][have[p]] for p in post if p in pre_sum])
        p = np.concatenate([post[q][have[q]] for q in post if q in pre_sum])
        sp = float(s @ p)
        d = float(s @ s) / sp if sp != 0 else float("inf")
        res = float(np.linalg.norm(p - s / d) / max(np.linalg.norm(p), 1e-30)) if np.isfinite(d) else 1.0
        out.update({"effective_divisor": d, "reduction_residual": res})
    return out


def runnable_problem(check):
    """A reason string when the checks say the reduction did not combine the ranks, else None."""
    if check.get("final_rank_spread", 0.0) > 1e-5:
        return f"the ranks' FINAL gradients disagree (relative spread {check['final_rank_spread']:.2g})"
    if check.get("reduction_residual", 0.0) > 1e-4:
        why = (f"POST_REDUCE is not a scaled sum of the ranks' PRE_REDUCE (residual "
               f"{check['reduction_residual']:.2g})")
        if check.get("post_vs_own_pre_residual", 1.0) < 1e-6:
            why += (f"; each rank's POST_REDUCE = {check['post_vs_own_pre']:.3f} x its own PRE_REDUCE: "
                    f"nothing was reduced")
        return why
    return None


def failure_reason(log):
    try:
        text = pathlib.Path(log).read_text(errors="replace")
    except OSError:
        return ""
    for line in reversed(text.splitlines()):
        if "Error" in line or "error" in line or "assert" in line.lower():
            return line.strip()[:240]
    return ""


def cell_name(layout, stage, recipe, ignore):
    return f"{layout}-z{stage}-{recipe}-ign{ignore}"


def row_key(r):
    return (r["deepspeed"], r["layout"], r["zero_stage"], r["loss"], r["ignore_frac"])


def sort_rows(rows):
    order = {name: i for i, name in enumerate(["dp2", "sp2", "sp4", "dp2xsp2", "dp2-moe2", "sp2-moe2"])}
    return sorted(rows, key=lambda r: (tuple(int(x) for x in r["deepspeed"].split(".")[:3]),
                                       order.get(r["layout"], 99), r["ignore_frac"], r["zero_stage"],
                                       RECIPES.index(r["loss"]) if r["loss"] in RECIPES else 99))


def write_table(rows, path, title=None):
    lines = ([f"# {title}", ""] if title else []) + [
        "| DeepSpeed | layout | ZeRO | loss | ignore | FINAL scale (median [min, max]) | max residual | eff. divisor |",
        "|---|---|---|---|---|---|---|---|"]
    for r in sort_rows(rows):
        if r.get("scale") is not None:
            cellv = f"{r['scale']:.4f} [{r['min']:.4f}, {r['max']:.4f}]"
            resid = f"{r['residual']:.1e}"
        else:
            cellv, resid = r.get("note", ""), ""
        d = r.get("effective_divisor")
        dv = f"{d:.3f}" if isinstance(d, float) and r.get("scale") is not None else ""
        lines.append(f"| {r['deepspeed']} | {r['layout']} | {r['zero_stage']} | {r['loss']} | {r['ignore_frac']} | "
                     f"{cellv} | {resid} | {dv} |")
    pathlib.Path(path).write_text("\n".join(lines) + "\n")


def write_pivot(rows, path):
    """One table per (layout, ignore fraction): rows DeepSpeed x ZeRO stage, columns loss recipes; a cell is
    the median FINAL scale (with [min, max] when the parameters disagree), 'n/r' for not runnable on CPU,
    'fail' for a failed run, '' for not measured yet."""
    by = {}
    for r in rows:
        if r.get("sanity_cell") or r["layout"] == "dp2":
            continue
        by.setdefault((r["layout"], r["ignore_frac"]), {})[(r["deepspeed"], r["zero_stage"], r["loss"])] = r
    order = {name: i for i, name in enumerate(["sp2", "sp4", "dp2xsp2", "dp2-moe2", "sp2-moe2"])}
    lines = ["# FINAL gradient / single-rank reference (median over parameters; generated by repro.py)", "",
             "n/r = not runnable on CPU (detected; see results.json 'note'), fail = the run failed.", ""]
    for (layout, ign), cells in sorted(by.items(), key=lambda kv: (order.get(kv[0][0], 9), kv[0][1])):
        lines += [f"## {layout}, ignore {ign}", "", "| DeepSpeed | ZeRO | " + " | ".join(RECIPES) + " |",
                  "|---|---|" + "---|" * len(RECIPES)]
        keys = sorted({(v, s) for v, s, _ in cells}, key=lambda k: (tuple(int(x) for x in k[0].split(".")), k[1]))
        for v, s in keys:
            vals = []
            for rec in RECIPES:
                r = cells.get((v, s, rec))
                if r is None:
                    vals.append("")
                elif r.get("scale") is not None:
                    t = f"{r['scale']:.4f}"
                    if r["max"] - r["min"] > 1e-3:
                        t += f" [{r['min']:.3f}, {r['max']:.3f}]"
                    vals.append(t)
                else:
                    vals.append("n/r" if r.get("status") == "not-runnable" else "fail")
            lines.append(f"| {v} | {s} | " + " | ".join(vals) + " |")
        lines.append("")
    pathlib.Path(path).write_text("\n".join(lines))


def merge_write(out, rows):
    """Merge rows into OUT/results.json (keyed by configuration) and rewrite table.md."""
    merged = {}
    if (out / "results.json").exists():
        merged = {row_key(r): r for r in json.loads((out / "results.json").read_text())}
    merged.update({row_key(r): r for r in rows})
    rows = sort_rows(merged.values())
    (out / "results.json").write_text(json.dumps(rows, indent=1))
    write_table(rows, out / "table.md")
    return rows


# ---- one DeepSpeed version (the Python running this) --------------------------------------------

def single_version(args):
    import deepspeed
    version = deepspeed.__version__
    out = pathlib.Path(args.out) / f"deepspeed-{version}"
    out.mkdir(parents=True, exist_ok=True)
    common = ["--seq-len", str(args.seq_len), "--steps", "1"]
    diff = find_diff()
    if args.cells:
        cells = []
        for c in args.cells.split(","):
            layout, stage, recipe, ignore = c.split(":")
            cells.append((layout, int(stage), recipe, float(ignore)))
    else:
        cells = list(itertools.product(args.layouts.split(","), map(int, args.stages.split(",")),
                                       args.recipes.split(","), map(float, args.ignore.split(","))))
    previous = {}
    if (out / "results.json").exists():
        previous = {row_key(r): r for r in json.loads((out / "results.json").read_text())}

    def do_cell(layout, stage, recipe, ignore, sanity=False):
        key = (version, layout, stage, recipe, ignore)
        if key in previous and not args.redo and previous[key].get("status") in ("measured", "not-runnable"):
            return previous[key]
        sp, dp, moe = layout_dims(layout)
        t0 = time.time()
        ref = out / (f"ref-b{args.batch * dp}-ign{ignore}" + (f"-moe{moe}" if moe else ""))
        # World 1: nothing is reduced, the ZeRO stage does not matter; ZeRO-2 for every reference.
        if run(ref, 1, 1, 2, "loss", ignore, args.batch * dp, common, str(ref) + ".log", moe) != 0:
            raise SystemExit(f"reference {ref} failed, see {ref}.log: {failure_reason(str(ref) + '.log')}")
        cell = out / cell_name(layout, stage, recipe, ignore)
        rc = run(cell, sp, dp, stage, recipe, ignore, args.batch, common, str(cell) + ".log", moe)
        row = {"deepspeed": version, "layout": layout, "sp": sp, "dp": dp, "zero_stage": stage,
               "loss": recipe, "ignore_frac": ignore, "trace": str(cell), "reference": str(ref),
               "sanity_cell": sanity, "moe_experts": moe}
        try:
            import torch
            row["torch"] = torch.__version__.split("+")[0]
        except ImportError:
            pass
        if rc != 0:
            why = failure_reason(str(cell) + ".log")
            if "unsupported grad type: torch.FloatTensor" in why:
                # engine.py split_half_float_double_sparse: the CPU tensor's type string is not in the
                # list of 'torch.cpu.*Tensor' names, so the stage-0 reduction refuses it.
                row.update({"scale": None, "status": "not-runnable",
                            "note": f"not runnable on CPU: the run stops in the stage-0 gradient all-reduce "
                                    f"({why}) (code: {KNOWN_CPU_LIMITS[0]})"})
            else:
                row.update({"scale": None, "status": "failed",
                            "note": f"run failed (exit {rc}): {why}; see {cell}.log"})
        else:
            row.update(measure(diff, ref, cell, cell))
            check = reduction_check(cell)
            row.update(check)
            # MoE: buckets with and without expert parameters may be divided differently (that is what
            # PR #4957 is about), so one divisor over all buckets is not expected; only the ranks'
            # agreement on FINAL decides there.
            problem = runnable_problem({"final_rank_spread": check["final_rank_spread"]} if moe else check)
            if problem:
                known = KNOWN_CPU_LIMITS.get(stage, "")
                row.update({"measured_but_invalid": {k: row[k] for k in ("scale", "min", "max", "residual")},
                            "scale": None, "status": "not-runnable",
                            "note": f"not runnable on CPU: {problem}" + (f" (code: {known})" if known else "")})
            else:
                row["status"] = "measured"
        row["seconds"] = round(time.time() - t0, 1)
        previous[key] = row
        merge_write(out, [row])
        s = row.get("scale")
        print(f"deepspeed {version} {layout:8s} z{stage} {recipe:15s} ignore {ignore:4.2f}: "
              + (f"FINAL scale {s:.4f} [{row['min']:.4f}, {row['max']:.4f}] residual {row['residual']:.1e} "
                 f"divisor {row.get('effective_divisor', float('nan')):.3f}"
                 if s is not None else row["note"]) + f"  ({row['seconds']} s)", flush=True)
        return row

    stage_ok = {}
    if not args.no_sanity:
        for stage in sorted({c[1] for c in cells}):
            r = do_cell(SANITY[0], stage, SANITY[1], SANITY[2], sanity=True)
            ok = r.get("scale") is not None and abs(r["scale"] - 1.0) < 1e-4 and abs(r["min"] - 1.0) < 1e-3 \
                and abs(r["max"] - 1.0) < 1e-3
            stage_ok[stage] = (ok, r)
    # Stages whose failure an sp cell already shows (this run or an earlier one into the same OUT).
    shown_failure = {r["zero_stage"] for r in previous.values()
                     if not r.get("sanity_cell") and r.get("status") == "not-runnable" and not r.get("not_run")}
    for layout, stage, recipe, ignore in cells:
        if (layout, recipe, ignore) == SANITY:
            continue
        ok, srow = stage_ok.get(stage, (True, None))
        if not ok and stage in shown_failure:
            key = (version, layout, stage, recipe, ignore)
            sp, dp, _ = layout_dims(layout)
            sc = srow.get("scale") if srow.get("scale") is not None else (srow.get("measured_but_invalid") or {}).get("scale")
            row = {"deepspeed": version, "layout": layout, "sp": sp, "dp": dp, "zero_stage": stage, "loss": recipe,
                   "ignore_frac": ignore, "scale": None, "status": "not-runnable", "not_run": True,
                   "note": (f"not runnable on CPU: ZeRO-{stage} fails the dp=2 sanity cell "
                            f"({srow.get('note') or f'FINAL scale {sc}'}); not run")}
            previous[key] = row
            merge_write(out, [row])
            continue
        do_cell(layout, stage, recipe, ignore)
        if not ok:
            shown_failure.add(stage)
    print(f"wrote {out / 'table.md'}")
    return 0


# ---- every version, each in its own environment ------------------------------------------------

def priority_cells(stages, layouts, recipes, ignores):
    """Cells in the order the study wants them: sp2 ZeRO-1/2 with loss and loss/sp on every version
    first, then stage 0, the other recipes, unequal shards, sp4 and dp2 x sp2, then the rest."""
    allc = [c for c in itertools.product(layouts, stages, recipes, ignores)]
    phases = [
        lambda c: c[0] == "sp2" and c[1] in (1, 2) and c[2] in ("loss", "loss-div-sp") and c[3] == 0,
        lambda c: c[0] == "sp2" and c[2] in ("loss", "loss-div-sp") and c[3] == 0,
        lambda c: c[0] == "sp2" and c[3] == 0,
        lambda c: c[0] == "sp2" and c[1] == 2,
        lambda c: c[0] == "sp2",
        lambda c: c[0] in ("sp4", "dp2xsp2") and c[1] in (1, 2) and c[2] in ("loss", "loss-div-sp") and c[3] == 0,
        lambda c: c[3] == 0,
        lambda c: True,
    ]
    seen, out = set(), []
    for ph in phases:
        group = [c for c in allc if ph(c) and c not in seen]
        seen.update(group)
        out.append(group)
    return [g for g in out if g]


def all_versions(args):
    import envs
    versions = list(envs.VERSIONS) + [envs.NEWEST] if args.versions == "all" else args.versions.split(",")
    results_path = pathlib.Path(args.results)
    stages = list(map(int, args.stages.split(",")))
    layouts = args.layouts.split(",")
    recipes = args.recipes.split(",")
    ignores = list(map(float, args.ignore.split(",")))
    out = pathlib.Path(args.out)
    timing = {}
    if args.tables_only:
        combine(out, versions, results_path, timing)
        return 0
    env = dict(os.environ)
    # build*/python hold the gradtrace package with its compiled codec (tools/python lacks _gtcodec).
    py_path = [str(ROOT / "build" / "python"), str(ROOT / "build-old" / "python")]
    env["PYTHONPATH"] = os.pathsep.join([p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p] + py_path)
    for phase in priority_cells(stages, layouts, recipes, ignores):
        for v in versions:
            py = envs.python_of(v)
            if not py.exists():
                print(f"deepspeed {v}: no environment at {py}; run tools/repro/ds5248/envs.py {v}", file=sys.stderr)
                continue
            cells = ",".join(f"{l}:{s}:{r}:{i}" for l, s, r, i in phase)
            cmd = [str(py), str(HERE / "repro.py"), "--out", str(out), "--cells", cells,
                   "--seq-len", str(args.seq_len), "--batch", str(args.batch)]
            if args.redo:
                cmd.append("--redo")
            t0 = time.time()
            rc = subprocess.call(cmd, env=env)
            timing[v] = timing.get(v, 0.0) + time.time() - t0
            if rc != 0:
                print(f"deepspeed {v}: repro exited {rc}", file=sys.stderr)
            combine(out, versions, results_path, timing)
    combine(out, versions, results_path, timing)
    return 0


def combine(out, versions, results_path, timing):
    rows = []
    for v in versions:
        p = out / f"deepspeed-{v}" / "results.json"
        if p.exists():
            rows += json.loads(p.read_text())
    results_path.write_text(json.dumps(sort_rows(rows), indent=1))
    write_table(rows, results_path.with_name("table.md"),
                title="DeepSpeed #5248: FINAL gradient / single-rank reference (generated by repro.py)")
    write_pivot(rows, results_path.with_name("pivot.md"))
    # Time per version: the wall time of every cell measured (its run, its reference if it ran then,
    # the diff), summed from the rows, so that it adds up across resumed invocations.
    per = {}
    for r in rows:
        t = per.setdefault(r["deepspeed"], {"cells": 0, "cells_run": 0, "seconds": 0.0})
        t["cells"] += 1
        if r.get("seconds") is not None:
            t["cells_run"] += 1
            t["seconds"] = round(t["seconds"] + r["seconds"], 1)
    results_path.with_name("timing.json").write_text(json.dumps(per, indent=1))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(ROOT / "out" / "ds5248"), help="trace directory root")
    ap.add_argument("--versions", default=None,
                    help="'all' or a comma list: run each DeepSpeed release in its envs.py environment")
    ap.add_argument("--results", default=str(HERE / "results.json"),
                    help="with --versions: the combined results (table.md and timing.json beside it)")
    ap.add_argument("--layouts", default="sp2,sp4,dp2xsp2")
    ap.add_argument("--stages", default="0,1,2")
    ap.add_argument("--recipes", default=",".join(RECIPES))
    ap.add_argument("--ignore", default="0,0.25", help="ignore fractions (0.25: uneven valid tokens per shard)")
    ap.add_argument("--cells", default=None, help="explicit cells layout:stage:recipe:ignore,... (one version)")
    ap.add_argument("--quick", action="store_true", help="sp2 only, ZeRO-1/2, loss and loss-div-sp, no ignore")
    ap.add_argument("--no-sanity", action="store_true", help="skip the per-stage dp=2 sanity cell")
    ap.add_argument("--redo", action="store_true", help="re-measure cells already in results.json")
    ap.add_argument("--tables-only", action="store_true",
                    help="with --versions: only rebuild the combined results.json/table.md/pivot.md")
    ap.add_argument("--seq-len", type=int, default=32)
    ap.add_argument("--batch", type=int, default=1)
    args = ap.parse_args(argv)
    if args.quick:
        args.layouts, args.stages, args.recipes, args.ignore = "sp2", "1,2", "loss,loss-div-sp", "0"
    if args.versions:
        return all_versions(args)
    return single_version(args)


if __name__ == "__main__":
    sys.exit(main())
