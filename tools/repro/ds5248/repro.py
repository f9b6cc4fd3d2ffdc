#!/usr/bin/env python3
"""One command for the #5248 measurements.

    # every DeepSpeed release of the study, each in its pinned environment (envs.py creates them):
    PYTHONPATH=build/python python3 tools/repro/ds5248/repro.py --versions all
    # only the DeepSpeed installed in this Python (the original mode):
    PYTHONPATH=build/python .venv/bin/python tools/repro/ds5248/repro.py --out traces/ds5248 [--quick]

For every cell of (layout x ZeRO stage x loss recipe x ignore fraction, plus the extra cells of
cells.py: gradient accumulation, contiguous_gradients false, MoE) it runs run.py (the issue's loop, real
DeepSpeed, captured by gradtrace.attach), the matching single-rank full-sequence reference
(same weights, same global batch, same DeepSpeed and torch), and compares FINAL gradients with
gradtrace-diff; the reductions' effective divisors are gradtrace-diff --self's (checks.py). Then it runs gradtrace-train's emulation of that
release (--scaling deepspeed@VERSION) on the same cell and diffs it against the real run (emulation.py).
Dense cells run gradtrace-train's model on both sides (run.py --model gradtrace, weights and batches from
one gradtrace-train --export-init file); MoE cells run DeepSpeed's MoE layer (model.py).
Writes OUT/deepspeed-<v>/table.md and results.json; with --versions also the combined tools/repro/ds5248/results.json and table.md, rewritten
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
import json
import os
import pathlib
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path.insert(0, str(HERE))

from cells import LAYOUTS, RECIPES, Layout, SANITY, cell_name, extra_cells, priority_cells, run_once  # noqa: E402
from checks import KNOWN_CPU_LIMITS, failure_reason, reduction_check, runnable_problem  # noqa: E402
import emulation  # noqa: E402
from binaries import find_binary  # noqa: E402
from tables import combine, merge_write, paste_into_doc, row_key  # noqa: E402

RUN_TIMEOUT = 240


def run(out, layout, stage, loss, ignore, batch, flags, log, model_args):
    """One real DeepSpeed run of run.py (cached by OUT.done); its exit status."""
    cmd = [sys.executable, str(HERE / "run.py"), "--sp", str(layout.sp), "--dp", str(layout.dp), "--zero-stage",
           str(stage), "--loss", loss, "--ignore-frac", str(ignore), "--batch", str(batch), "--gas", str(layout.gas),
           "--out", str(out), "--timeout", str(RUN_TIMEOUT), *flags, *model_args]
    if layout.moe:
        cmd += ["--moe-experts", str(layout.moe)]
    if not layout.contiguous:
        cmd.append("--no-contiguous-gradients")
    if not layout.reduce_scatter:
        cmd.append("--no-reduce-scatter")
    if layout.bucket:
        cmd += ["--reduce-bucket-size", str(layout.bucket)]
    return run_once(cmd, out, log)


def measure(diff, ref, got, out):
    """(median scale, min, max, max residual, verdict) of FINAL, step 0, from gradtrace-diff's report."""
    if not diff:
        raise SystemExit("gradtrace-diff is not built (cmake --build build): it measures every cell")
    j = pathlib.Path(str(out) + ".diff.json")
    p = subprocess.run([str(diff), str(ref), str(got), "--phase", "final", "--step", "0", "--threads", "1",
                        "--json", str(j), "--markdown", str(out) + ".diff.md"], capture_output=True, text=True)
    if p.returncode not in (0, 1) or not j.exists():
        raise SystemExit(f"gradtrace-diff {ref} {got}: exit {p.returncode}: {(p.stderr or p.stdout).strip()[-240:]}")
    rep = json.loads(j.read_text())
    sc = [p["scale"] for p in rep["params"]]
    return {"scale": sorted(sc)[len(sc) // 2], "min": min(sc), "max": max(sc),
            "residual": max(p["residual"] for p in rep["params"]), "verdict": rep["verdict"],
            "explanation": "; ".join(g.get("explanation", "") for g in rep["groups"]), "tool": "gradtrace-diff"}


def stage3_paths(log):
    """{"stage3_paths": {path: buckets}}: which ZeRO-3 reduction path each bucket took, as run.py printed it."""
    import ast
    import re
    m = re.search(r"stage-3 paths (\{[^}]*\})", pathlib.Path(log).read_text(errors="replace"))
    return {"stage3_paths": ast.literal_eval(m.group(1))} if m else {}


def emulation_row(args, tools, out, version, layout_name, stage, recipe, ignore, cell, init_flags):
    """Run the emulation of the cell and compare it with the real run; fields for the row."""
    train, diff = tools["train"], tools["diff"]
    if train is None or diff is None:
        return {"emulation_note": "gradtrace-train/gradtrace-diff not built"}
    layout = LAYOUTS[layout_name]
    emu = out / (cell_name(layout_name, stage, recipe, ignore) + "-emu")
    rc, why = emulation.emulate(train, emu, version, layout, stage, recipe, ignore, args.batch * layout.dp,
                                init_flags, str(emu) + ".log")
    if rc == 2:  # the emulation refuses what it does not model (e.g. 0.11.1's stage-0 group)
        return {"emulation_exit": None, "emulation_note": f"not modelled: {why}"}
    if rc != 0:
        return {"emulation_exit": None, "emulation_note": f"gradtrace-train failed (exit {rc}): {why}"}
    if layout.moe:
        return emulation.compare_moe(emu, cell)
    return emulation.compare_dense(diff, emu, cell, pathlib.Path(str(emu) + ".vs-real.json"))


def requested_cells(args, version):
    """[(layout, stage, recipe, ignore)]: --cells as given, else the matrix of the options plus the extra
    cells, in priority order."""
    if args.cells:
        cells = []
        for c in args.cells.split(","):
            layout, stage, recipe, ignore = c.split(":")
            cells.append((layout, int(stage), recipe, float(ignore)))
        return cells
    stages = list(map(int, args.stages.split(",")))
    extra = [] if args.no_extra else [c for c in extra_cells(version) if c[1] in stages]
    return [c for g in priority_cells(stages, args.layouts.split(","), args.recipes.split(","),
                                      list(map(float, args.ignore.split(","))), extra) for c in g]


def cell_line(row):
    """The progress line of a measured (or not measurable) cell."""
    s, emu = row.get("scale"), row.get("emulation_exit")
    if s is None:
        outcome = row["note"]
    else:
        outcome = (f"FINAL scale {s:.4f} [{row['min']:.4f}, {row['max']:.4f}] residual {row['residual']:.1e} "
                   f"divisor {row.get('effective_divisor', float('nan')):.3f}; emulation "
                   + ("exit 0 (match)" if emu == 0 else f"exit {emu}" if emu is not None
                      else row.get("emulation_note", "-")))
    return (f"deepspeed {row['deepspeed']} {row['layout']:12s} z{row['zero_stage']} {row['loss']:15s} "
            f"ignore {row['ignore_frac']:4.2f}: {outcome}  ({row['seconds']} s)")


class VersionCells:
    """The cells of the DeepSpeed installed in this Python, measured into OUT/deepspeed-<version>, whose
    results.json keeps every row (a cell measured before is not run again unless --redo)."""

    def __init__(self, args):
        import deepspeed
        self.args = args
        self.version = deepspeed.__version__
        self.out = pathlib.Path(args.out) / f"deepspeed-{self.version}"
        self.out.mkdir(parents=True, exist_ok=True)
        self.tools = {"diff": find_binary("gradtrace-diff"), "train": find_binary("gradtrace-train")}
        self.flags = emulation.model_flags(args)
        self.previous = {}
        if (self.out / "results.json").exists():
            self.previous = {row_key(r): r for r in json.loads((self.out / "results.json").read_text())}

    def inputs(self, layout, ignore):
        """(reference trace, run.py model arguments) of a cell; dense cells share one init file per
        (global batch, ignore, gas) with the emulation."""
        B = self.args.batch * layout.dp
        if layout.moe:
            return self.out / f"ref-b{B}-ign{ignore}-moe{layout.moe}", ["--seed", str(self.args.seed)]
        if self.tools["train"] is None:
            raise SystemExit("gradtrace-train is not built (cmake --build build): it writes the dense cells' init")
        init = self.out / f"init-b{B}-ign{ignore}-gas{layout.gas}.pt"
        emulation.export_init(self.tools["train"], init, self.flags, B, ignore, layout.gas)
        return self.out / f"ref-b{B}-ign{ignore}-gas{layout.gas}", ["--model", "gradtrace", "--init", str(init)]

    def cell(self, layout_name, stage, recipe, ignore, sanity=False):
        """The row of one cell: measured now, or the one results.json holds."""
        key = (self.version, layout_name, stage, recipe, ignore)
        row = self.previous.get(key)
        if row is not None and not self.args.redo and row.get("status") in ("measured", "not-runnable"):
            if self.args.redo_emulation and row.get("status") == "measured" and row.get("emulation_exit") is None:
                self.redo_emulation(row, layout_name, stage, recipe, ignore)
            return row
        row = self.measure_cell(layout_name, stage, recipe, ignore, sanity)
        self.previous[key] = row
        merge_write(self.out, [row])
        print(cell_line(row), flush=True)
        return row

    def redo_emulation(self, row, layout_name, stage, recipe, ignore):
        """The real run stands; only its emulation is run (again) and compared."""
        row.update(emulation_row(self.args, self.tools, self.out, self.version, layout_name, stage, recipe, ignore,
                                 pathlib.Path(row["trace"]), self.flags))
        merge_write(self.out, [row])
        print(f"deepspeed {self.version} {layout_name:12s} z{stage} {recipe:15s} ignore {ignore:4.2f}: emulation "
              + (f"exit {row['emulation_exit']}" if row.get("emulation_exit") is not None
                 else row.get("emulation_note", "-")), flush=True)

    def measure_cell(self, layout_name, stage, recipe, ignore, sanity):
        """Runs the cell's reference and the cell, then judges the run (or says why it failed)."""
        args, layout = self.args, LAYOUTS[layout_name]
        t0 = time.time()
        ref, model_args = self.inputs(layout, ignore)
        ref_layout = Layout(1, 1, moe=layout.moe, gas=layout.gas)
        # World 1: nothing is reduced, the ZeRO stage does not matter; ZeRO-2 for every reference.
        if run(ref, ref_layout, 2, "loss", ignore, args.batch * layout.dp, self.flags, str(ref) + ".log",
               model_args) != 0:
            raise SystemExit(f"reference {ref} failed, see {ref}.log: {failure_reason(str(ref) + '.log')}")
        cell = self.out / cell_name(layout_name, stage, recipe, ignore)
        rc = run(cell, layout, stage, recipe, ignore, args.batch, self.flags, str(cell) + ".log", model_args)
        row = {"deepspeed": self.version, "layout": layout_name, "sp": layout.sp, "dp": layout.dp, "gas": layout.gas,
               "contiguous_gradients": layout.contiguous, "reduce_scatter": layout.reduce_scatter,
               "reduce_bucket_size": layout.bucket or 2000, "zero_stage": stage, "loss": recipe,
               "ignore_frac": ignore, "trace": str(cell), "reference": str(ref), "sanity_cell": sanity,
               "moe_experts": layout.moe, "model": "tiny" if layout.moe else "gradtrace"}
        try:
            import torch
            row["torch"] = torch.__version__.split("+")[0]
        except ImportError:
            pass
        row.update(failed_run(rc, cell) if rc != 0 else self.judge(layout_name, stage, recipe, ignore, ref, cell))
        row["seconds"] = round(time.time() - t0, 1)
        return row

    def judge(self, layout_name, stage, recipe, ignore, ref, cell):
        """Fields of a cell that ran: FINAL against the reference, the reduction checks, and either why it is
        not runnable on CPU or the emulation's comparison."""
        layout = LAYOUTS[layout_name]
        fields = measure(self.tools["diff"], ref, cell, cell)
        check = reduction_check(cell)
        fields.update(check)
        # MoE: buckets with and without expert parameters may be divided differently (that is what
        # PR #4957 is about), so one divisor over all buckets is not expected; only the ranks'
        # agreement on FINAL decides there.
        problem = runnable_problem({"final_rank_spread": check["final_rank_spread"]} if layout.moe else check,
                                   per_bucket=stage == 3)
        fields.update(stage3_paths(str(cell) + ".log"))
        if problem:
            known = KNOWN_CPU_LIMITS[stage] if stage < 2 or (stage == 2 and not layout.contiguous) else ""
            fields.update({"measured_but_invalid": {k: fields[k] for k in ("scale", "min", "max", "residual")},
                           "scale": None, "status": "not-runnable",
                           "note": f"not runnable on CPU: {problem}" + (f" (code: {known})" if known else "")})
            return fields
        fields["status"] = "measured"
        if not self.args.no_emulation:
            fields.update(emulation_row(self.args, self.tools, self.out, self.version, layout_name, stage, recipe,
                                        ignore, cell, self.flags))
        return fields

    def sanity(self, cells):
        """{stage: (ok, row)} of each stage's sanity cell. A run that failed (a crash, a timeout) says nothing
        about the stage: its cells still run and are checked one by one. Only a sanity cell that ran and did
        not reduce marks the stage."""
        stage_ok = {}
        for stage in sorted({c[1] for c in cells}):
            r = self.cell(SANITY[0], stage, SANITY[1], SANITY[2], sanity=True)
            ok = r.get("status") == "failed" or (
                r.get("scale") is not None and abs(r["scale"] - 1.0) < 1e-4 and abs(r["min"] - 1.0) < 1e-3
                and abs(r["max"] - 1.0) < 1e-3)
            stage_ok[stage] = (ok, r)
        return stage_ok

    def mark_not_run(self, layout_name, stage, recipe, ignore, srow):
        """A cell of a stage whose sanity cell failed, once an sp cell shows the failure: marked, not run."""
        layout = LAYOUTS[layout_name]
        sc = srow.get("scale") if srow.get("scale") is not None else (srow.get("measured_but_invalid") or {}).get("scale")
        row = {"deepspeed": self.version, "layout": layout_name, "sp": layout.sp, "dp": layout.dp, "gas": layout.gas,
               "zero_stage": stage, "loss": recipe, "ignore_frac": ignore, "scale": None,
               "status": "not-runnable", "not_run": True,
               "note": (f"not runnable on CPU: ZeRO-{stage} fails the dp=2 sanity cell "
                        f"({srow.get('note') or f'FINAL scale {sc}'}); not run")}
        self.previous[(self.version, layout_name, stage, recipe, ignore)] = row
        merge_write(self.out, [row])

    def run_all(self, cells):
        stage_ok = {} if self.args.no_sanity else self.sanity(cells)
        # Stages whose failure an sp cell already shows (this run or an earlier one into the same OUT).
        shown_failure = {r["zero_stage"] for r in self.previous.values()
                         if not r.get("sanity_cell") and r.get("status") == "not-runnable" and not r.get("not_run")}
        for layout_name, stage, recipe, ignore in cells:
            if (layout_name, recipe, ignore) == SANITY:
                continue
            ok, srow = stage_ok.get(stage, (True, None))
            if not ok and stage in shown_failure:
                self.mark_not_run(layout_name, stage, recipe, ignore, srow)
                continue
            self.cell(layout_name, stage, recipe, ignore)
            if not ok:
                shown_failure.add(stage)
        print(f"wrote {self.out / 'table.md'}")
        return 0


def failed_run(rc, cell):
    """Fields of a cell whose run exited `rc` != 0: not runnable on CPU when the log shows stage 0's known
    refusal, else failed."""
    why = failure_reason(str(cell) + ".log")
    if "unsupported grad type: torch.FloatTensor" in why:
        # engine.py split_half_float_double_sparse: the CPU tensor's type string is not in the
        # list of 'torch.cpu.*Tensor' names, so the stage-0 reduction refuses it.
        return {"scale": None, "status": "not-runnable",
                "note": f"not runnable on CPU: the run stops in the stage-0 gradient all-reduce "
                        f"({why}) (code: {KNOWN_CPU_LIMITS[0]})"}
    return {"scale": None, "status": "failed", "note": f"run failed (exit {rc}): {why}; see {cell}.log"}


def single_version(args):
    """Every requested cell for the DeepSpeed installed in this Python."""
    cells = VersionCells(args)
    return cells.run_all(requested_cells(args, cells.version))


# ---- every version, each in its own environment ------------------------------------------------

def all_versions(args):
    import envs
    versions = list(envs.VERSIONS) + [envs.NEWEST] if args.versions == "all" else args.versions.split(",")
    results_path = pathlib.Path(args.results)
    stages = list(map(int, args.stages.split(",")))
    out = pathlib.Path(args.out)
    if args.tables_only:
        combine(out, versions, results_path, keep_existing=args.merge)
        if args.update_docs:
            paste_into_doc(args.update_docs, results_path)
        return 0
    env = dict(os.environ)
    # build*/python hold the gradtrace package with its compiled codec (python lacks _gtcodec).
    py_path = [str(ROOT / "build" / "python"), str(ROOT / "build-old" / "python")]
    env["PYTHONPATH"] = os.pathsep.join([p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p] + py_path)
    phases_of = {v: priority_cells(stages, args.layouts.split(","), args.recipes.split(","),
                                   list(map(float, args.ignore.split(","))),
                                   [] if args.no_extra else [c for c in extra_cells(v) if c[1] in stages])
                 for v in versions}
    for i in range(max(len(p) for p in phases_of.values())):
        for v in versions:
            if i >= len(phases_of[v]):
                continue
            py = envs.python_of(v)
            if not py.exists():
                print(f"deepspeed {v}: no environment at {py}; run tools/repro/ds5248/envs.py {v}", file=sys.stderr)
                continue
            cmd = [str(py), str(HERE / "repro.py"), "--out", str(out),
                   "--cells", ",".join(f"{l}:{s}:{r}:{g}" for l, s, r, g in phases_of[v][i]),
                   *[f"--{k.replace('_', '-')}={getattr(args, k)}" for k in
                     ("seq_len", "batch", "seed", "hidden", "heads", "layers", "vocab")]]
            cmd += ["--redo"] if args.redo else []
            cmd += ["--no-emulation"] if args.no_emulation else []
            rc = subprocess.call(cmd, env=env)
            if rc != 0:
                print(f"deepspeed {v}: repro exited {rc}", file=sys.stderr)
            combine(out, versions, results_path)
    combine(out, versions, results_path)
    if args.update_docs:
        paste_into_doc(args.update_docs, results_path)
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(ROOT / "out" / "ds5248"), help="trace directory root")
    ap.add_argument("--versions", default=None,
                    help="'all' or a comma list: run each DeepSpeed release in its envs.py environment")
    ap.add_argument("--results", default=str(HERE / "results.json"),
                    help="with --versions: the combined results (table.md, pivot.md, emulation.md, timing.json "
                         "beside it)")
    ap.add_argument("--layouts", default="sp2,sp4,dp2xsp2")
    ap.add_argument("--stages", default="0,1,2,3")
    ap.add_argument("--recipes", default=",".join(RECIPES))
    ap.add_argument("--ignore", default="0,0.25", help="ignore fractions (0.25: uneven valid tokens per shard)")
    ap.add_argument("--cells", default=None, help="explicit cells layout:stage:recipe:ignore,... (one version)")
    ap.add_argument("--quick", action="store_true", help="sp2 only, ZeRO-1/2, loss and loss-div-sp, no ignore")
    ap.add_argument("--no-extra", action="store_true", help="without the extra cells (gas 2, contiguous false, MoE)")
    ap.add_argument("--no-sanity", action="store_true", help="skip the per-stage dp=2 sanity cell")
    ap.add_argument("--no-emulation", action="store_true", help="do not run and compare gradtrace-train's emulation")
    ap.add_argument("--redo", action="store_true", help="re-measure cells already in results.json")
    ap.add_argument("--redo-emulation", action="store_true",
                    help="run the emulation of measured cells that have none yet (e.g. after gradtrace-train "
                         "learned a stage); the real runs are kept")
    ap.add_argument("--tables-only", action="store_true",
                    help="with --versions: only rebuild the combined results.json/table.md/pivot.md")
    ap.add_argument("--merge", action="store_true",
                    help="with --tables-only: keep the cells of --results that OUT does not hold (e.g. after "
                         "measuring only ZeRO-3 cells into a fresh OUT)")
    ap.add_argument("--update-docs", nargs="?", const=str(ROOT / "docs" / "studies" / "ds5248.md"), default=None,
                    help="with --versions: paste pivot.md, emulation.md and the timing into the generated blocks of "
                         "this file (default docs/studies/ds5248.md)")
    ap.add_argument("--seq-len", type=int, default=32)
    ap.add_argument("--batch", type=int, default=1, help="micro-batch rows per DP rank")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--hidden", type=int, default=32)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=64)
    args = ap.parse_args(argv)
    if args.quick:
        args.layouts, args.stages, args.recipes, args.ignore = "sp2", "1,2", "loss,loss-div-sp", "0"
        args.no_extra = True
    if args.versions:
        return all_versions(args)
    return single_version(args)


if __name__ == "__main__":
    sys.exit(main())
