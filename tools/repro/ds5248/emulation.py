"""gradtrace-train's emulation of a DeepSpeed release (--scaling deepspeed@VERSION) next to the real
run of the same #5248 cell, and the comparison of the two.

Dense cells are compared elementwise: both sides run gradtrace-train's model from the weights and global
batches of one `gradtrace-train --export-init` file (run.py --model gradtrace), and `gradtrace-diff EMU
REAL` on FINAL must exit 0. MoE cells cannot be compared elementwise (the real side is DeepSpeed's MoE
layer with its TopKGate, capacity and auxiliary loss; the emulation's MoE is top-1 with replicated
experts and no auxiliary loss), so there the comparison is of what the emulation models: the effective
divisor of each reduction bucket, for buckets with and without expert parameters.
"""

import json
import pathlib
import subprocess

from cells import run_once
from checks import self_report, step0_buckets

from gradtrace import loss_recipes

BUCKET_ELEMENTS = 2000  # run.py's default reduce_bucket_size, so both sides have several buckets


def model_flags(args):
    """The model and data flags both sides share (gradtrace-train and run.py spell them alike)."""
    return ["--seed", str(args.seed), "--seq-len", str(args.seq_len), "--hidden", str(args.hidden), "--heads",
            str(args.heads), "--layers", str(args.layers), "--vocab", str(args.vocab), "--steps", "1"]


def export_init(train, path, flags, global_batch, ignore, gas):
    """gradtrace-train's initial weights and global batches for this (batch, ignore, gas); cached."""
    if path.exists():
        return
    tmp = path.with_suffix(".tmp")
    subprocess.run([str(train), *flags, "--batch", str(global_batch), "--ignore-frac", str(ignore), "--gas", str(gas),
                    "--export-init", str(tmp)], check=True, capture_output=True, timeout=120)
    tmp.rename(path)


def emulate(train, out, version, layout, stage, recipe, ignore, global_batch, flags, log):
    """Run gradtrace-train --scaling deepspeed@VERSION for the cell; (exit status, last error line)."""
    cmd = [str(train), *flags, "--nproc", str(layout.sp * layout.dp), "--sp", str(layout.sp), "--dp", str(layout.dp),
           "--zero-stage", str(stage), "--scaling", f"deepspeed@{version}", "--loss", loss_recipes.resolve(recipe),
           "--batch", str(global_batch), "--ignore-frac", str(ignore), "--gas", str(layout.gas),
           "--reduce-bucket-size", str(layout.bucket or BUCKET_ELEMENTS), "--moe-experts", str(layout.moe),
           "--out", str(out)]
    if stage == 3:
        # gradtrace-train models contiguous_gradients true; with it false stage 3 always takes the
        # reduce-scatter path (stage3.py:1673), which --zero-reduce-scatter true selects.
        cmd += ["--zero-reduce-scatter", "true" if layout.reduce_scatter or not layout.contiguous else "false"]
    rc = run_once(cmd, out, log, timeout=300)
    if rc == 0:
        return 0, ""
    lines = [l for l in pathlib.Path(log).read_text(errors="replace").splitlines() if l.strip()]
    return rc, (lines[-1] if lines else "")


def compare_dense(diff, emu, real, json_path):
    """gradtrace-diff EMU REAL on FINAL of step 0: its exit status, scale and residual per parameter."""
    p = subprocess.run([str(diff), str(emu), str(real), "--phase", "final", "--step", "0", "--threads", "1",
                        "--json", str(json_path)], capture_output=True, text=True, timeout=300)
    out = {"emulation_exit": p.returncode}
    if p.returncode in (0, 1) and json_path.exists():
        rep = json.loads(json_path.read_text())
        sc = sorted(q["scale"] for q in rep["params"])
        out.update({"emulation_scale": sc[len(sc) // 2], "emulation_scale_range": [sc[0], sc[-1]],
                    "emulation_residual": max(q["residual"] for q in rep["params"]),
                    "emulation_rtol": rep["tolerance"].get("rtol") if isinstance(rep.get("tolerance"), dict) else None})
    else:
        out["emulation_error"] = (p.stderr or p.stdout).strip().splitlines()[-1:] or [""]
        out["emulation_error"] = out["emulation_error"][0][:240]
    return out


def bucket_class_divisors(trace):
    """{"expert": [divisors], "dense": [divisors]}: gradtrace-diff --self's effective divisor of each step-0
    bucket reduction (bucket_view, one per rank and micro-step), by whether the bucket holds an expert
    parameter."""
    import gradtrace
    params = gradtrace.read_trace_set(trace)[0].run_info["params"]
    # The recorded ParamInfo.kind (format 1.2); older traces: the DeepSpeed MoE layer's parameter names.
    kind = {p["id"]: p.get("kind", "PARAM_KIND_UNSPECIFIED") for p in params}
    expert = {p["id"] for p in params
              if kind[p["id"]] == "EXPERT" or (kind[p["id"]] == "PARAM_KIND_UNSPECIFIED" and "expert" in p["name"])}
    members, _ = step0_buckets(trace)
    classes = {"expert": set(), "dense": set()}
    for c in self_report(trace)["bucket_view"]:
        if c["divisor"]:
            classes["expert" if members.get(c["bucket_id"], set()) & expert else "dense"].add(round(c["divisor"], 3))
    return {k: sorted(v) for k, v in classes.items()}


def compare_moe(emu, real):
    """Bucket divisors by class on both sides; exit 0 when every class present on both sides agrees."""
    e, r = bucket_class_divisors(emu), bucket_class_divisors(real)
    same = all(e[k] == r[k] for k in ("expert", "dense") if e[k] and r[k]) and bool(e["expert"]) == bool(r["expert"])
    return {"emulation_exit": 0 if same else 1, "emulation_bucket_divisors": e, "real_bucket_divisors": r}
