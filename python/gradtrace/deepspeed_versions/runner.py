"""Run one training entry point under one DeepSpeed release and capture it (gradtrace-deepspeed-versions).

Entry points:
- `model:ds5248`: the #5248 Ulysses loop (gradtrace.deepspeed_versions.ds5248_run) with the tiny dense model;
- `model:moe`: the same loop with every MLP a deepspeed.moe.layer.MoE of 2 experts (ep_size 1);
- `script:PATH`: the user's script, started once per rank (the contract is in command.py);
- `emulation`: gradtrace-train --scaling deepspeed@RELEASE (the C++ emulation of that release's reduction,
  a real capture by gradtrace-train; for tests and for checking the command without DeepSpeed envs).

A run is a trace directory plus a summary (loss, the grad norm DeepSpeed reported); the caller caches both.
"""

import dataclasses
import hashlib
import importlib.util
import json
import os
import pathlib
import shutil
import subprocess
import sys
import time
import types

import gradtrace
from gradtrace.adapters import loss_recipes
from gradtrace.deepspeed_versions import ds5248_run

# Not resolved: a dev build's package folder may hold symlinks to the sources, without the extension.
PACKAGE_PARENT = pathlib.Path(os.path.abspath(gradtrace.__file__)).parent.parent
MOE_EXPERTS = 2
LOOP_MODULE = "gradtrace.deepspeed_versions.ds5248_run"  # the built-in #5248 loop, run with -m
# The modules that loop runs: their bytes key the cache of a model entry.
LOOP_SOURCES = (LOOP_MODULE, "gradtrace.deepspeed_versions.ds5248_model",
                "gradtrace.deepspeed_versions.ds5248_mpu", "gradtrace.adapters.deepspeed_adapter",
                "gradtrace.adapters.deepspeed_zero3")


def _source_of(module: str) -> pathlib.Path:
    """The file of `module`, found without importing it (the model and the adapter import torch)."""
    return pathlib.Path(importlib.util.find_spec(module).origin)


@dataclasses.dataclass(frozen=True)
class Entry:
    kind: str  # "model", "script" or "emulation"
    name: str  # ds5248 / moe; the script's path; "gradtrace-train"
    script_args: tuple = ()
    loss: str = "loss"  # the loop's loss recipe (model and emulation entries)

    def digest(self) -> str:
        """Hash of what the entry runs: the script's bytes, or the package's loop sources."""
        h = hashlib.sha256(f"{self.kind}:{self.name}:{self.loss}:{json.dumps(self.script_args)}".encode())
        files = [pathlib.Path(self.name)] if self.kind == "script" else [_source_of(m) for m in LOOP_SOURCES]
        for f in files:
            h.update(f.read_bytes() if f.exists() else b"")
        return h.hexdigest()[:16]


@dataclasses.dataclass(frozen=True)
class Layout:
    sp: int = 2
    dp: int = 1

    @property
    def world(self):
        return self.sp * self.dp

    def text(self):
        return f"sp{self.sp}xdp{self.dp}"


def reference_config(cfg: dict, layout: Layout) -> dict:
    """The single-rank reference's DeepSpeed config: one rank takes the global batch (dp x micro-batch rows);
    train_batch_size is dropped so that DeepSpeed derives it for world 1."""
    ref = json.loads(json.dumps(cfg))
    ref["train_micro_batch_size_per_gpu"] = int(cfg.get("train_micro_batch_size_per_gpu", 1)) * layout.dp
    ref.pop("train_batch_size", None)
    return ref


def child_env(extra=None) -> dict:
    """This gradtrace package first on PYTHONPATH (an old-release env has no gradtrace of its own), CPU
    accelerator, no RANK from an outer launcher."""
    path = [str(PACKAGE_PARENT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path), DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1")
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT"):
        env.pop(k, None)
    env.update(extra or {})
    return env


def find_binary(name: str) -> pathlib.Path:
    """gradtrace-diff / gradtrace-train: $GRADTRACE_BUILD_DIR/bin, next to a dev build's package, or PATH."""
    cands = []
    if os.environ.get("GRADTRACE_BUILD_DIR"):
        cands.append(pathlib.Path(os.environ["GRADTRACE_BUILD_DIR"]) / "bin" / name)
    cands.append(PACKAGE_PARENT.parent / "bin" / name)  # build/python/gradtrace -> build/bin
    cands.append(pathlib.Path(sys.executable).parent / name)  # a wheel's scripts
    for c in cands:
        if c.exists():
            return c
    found = shutil.which(name)
    if not found:
        raise FileNotFoundError(f"{name} not found (set GRADTRACE_BUILD_DIR or put it on PATH)")
    return pathlib.Path(found)


def run(entry: Entry, python, config_path, layout: Layout, out: pathlib.Path, log: pathlib.Path, release: str,
        timeout: float = 900) -> int:
    """One capture into `out` (removed first); the exit status. Output goes to `log`."""
    if out.exists():
        shutil.rmtree(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as f:
        if entry.kind == "model":
            cmd = [str(python), "-m", LOOP_MODULE, "--sp", str(layout.sp), "--dp", str(layout.dp),
                   "--ds-config", str(config_path), "--loss", entry.loss, "--out", str(out),
                   "--timeout", str(timeout)]
            if entry.name == "moe":
                cmd += ["--moe-experts", str(MOE_EXPERTS)]
            f.write("+ " + " ".join(cmd) + "\n")
            f.flush()
            try:
                return subprocess.call(cmd, stdout=f, stderr=subprocess.STDOUT, env=child_env(),
                                       timeout=timeout + 60)
            except subprocess.TimeoutExpired:
                return 124
        if entry.kind == "emulation":
            return _emulate(entry, config_path, layout, out, f, release, timeout)
        # A user script: one process per rank, the contract's variables set.
        f.write(f"+ {python} {entry.name} {' '.join(entry.script_args)} (x{layout.world} ranks)\n")
        f.flush()
        extra = {"GRADTRACE_OUT_DIR": str(out), "GRADTRACE_DS_CONFIG": str(config_path),
                 "GRADTRACE_SP": str(layout.sp), "GRADTRACE_DP": str(layout.dp),
                 "GRADTRACE_DEEPSPEED_RELEASE": release}
        args = types.SimpleNamespace(sp=layout.sp, dp=layout.dp, timeout=timeout)
        env = child_env(extra)
        return ds5248_run.launch(args, list(entry.script_args), script=entry.name, python=python, log=f,
                                 extra_env={k: env[k] for k in ("PYTHONPATH", "DS_ACCELERATOR", *extra)})


def _emulate(entry, config_path, layout, out, f, release, timeout):
    cfg = json.loads(pathlib.Path(config_path).read_text())
    zero = cfg.get("zero_optimization", {})
    gt_loss = loss_recipes.ALIASES.get(entry.loss, entry.loss)
    micro = int(cfg.get("train_micro_batch_size_per_gpu", 1))
    cmd = [str(find_binary("gradtrace-train")), "--nproc", str(layout.world), "--sp", str(layout.sp),
           "--dp", str(layout.dp), "--zero-stage", str(zero.get("stage", 0)),
           "--scaling", f"deepspeed@{release}", "--loss", gt_loss, "--batch", str(micro * layout.dp),
           "--gas", str(cfg.get("gradient_accumulation_steps", 1)), "--steps", "1",
           "--reduce-bucket-size", str(zero.get("reduce_bucket_size", 2000)), "--out", str(out)]
    f.write("+ " + " ".join(cmd) + "\n")
    f.flush()
    try:
        return subprocess.call(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=timeout)
    except subprocess.TimeoutExpired:
        return 124


def summarize(trace_dir: pathlib.Path) -> dict:
    """loss: the mean over ranks and micro-steps of the first step's losses (each rank's loss as passed to
    backward); grad_norm: the norm DeepSpeed reported for that step (rank 0), None when none was."""
    from gradtrace import _gtcodec
    from gradtrace.codec.trace import TraceReader
    losses, norm = [], None
    trace_dir = pathlib.Path(trace_dir)
    names = sorted(os.listdir(trace_dir)) if trace_dir.is_dir() else []
    for name in names:
        if _gtcodec.parse_rank_file_name(name) is None:  # proto/rank_file.h's rule
            continue
        for fr in TraceReader(trace_dir / name).frames():
            if fr["type"] != "step" or fr["step"] != 0:
                continue
            if fr.get("optimizer_step"):
                if norm is None and fr.get("reported_grad_norm") is not None:
                    norm = fr["reported_grad_norm"]
            else:
                losses.append(fr["loss"])
    return {"loss": sum(losses) / len(losses) if losses else None, "grad_norm": norm}


def diff(a: pathlib.Path, b: pathlib.Path, json_path: pathlib.Path, markdown_path=None) -> dict:
    """gradtrace-diff A B on FINAL of step 0 (the installed CLI: one implementation of the comparison);
    its report, or {"error": ...} when it could not compare (exit 2)."""
    cmd = [str(find_binary("gradtrace-diff")), str(a), str(b), "--phase", "final", "--step", "0",
           "--threads", "1", "--json", str(json_path)]
    if markdown_path:
        cmd += ["--markdown", str(markdown_path)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if p.returncode not in (0, 1) or not json_path.exists():
        lines = (p.stderr or p.stdout).strip().splitlines()
        return {"error": (lines[-1] if lines else f"exit {p.returncode}")[:300]}
    return json.loads(json_path.read_text())


def scale_groups(report: dict) -> list:
    """The report's groups as table cells: kind, scale, count, expression and the worst residual in it."""
    if "error" in report:
        return []
    resid = {p["name"]: p.get("residual") for p in report.get("params", [])}
    out = []
    for g in report.get("groups", []):
        rs = [resid.get(n) for n in g.get("params", []) if resid.get(n) is not None]
        out.append({"kind": g["kind"], "scale": g.get("scale"), "count": g.get("count"),
                    "expression": g.get("expression", ""), "residual": max(rs) if rs else None,
                    "params": g.get("params", [])})
    return out


def timed(fn, *a, **kw):
    t = time.time()
    r = fn(*a, **kw)
    return r, time.time() - t
