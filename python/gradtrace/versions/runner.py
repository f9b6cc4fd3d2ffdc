"""Run one entry point under one release of a distribution and capture it (gradtrace-versions).

Entry points:
- `script:PATH`: the user's script, started once per rank (the contract is in command.py);
- DeepSpeed's built-in ones (gradtrace.deepspeed_versions.entries): `model:ds5248`, `model:moe` (the
  #5248 Ulysses loop) and `emulation` (gradtrace-train --scaling deepspeed@RELEASE).

A run is a trace directory plus a summary (loss, the grad norm the framework reported); the caller caches
both. The comparison is the installed gradtrace-diff (`diff`), the one implementation of it.
"""

import dataclasses
import hashlib
import json
import os
import pathlib
import shutil
import subprocess
import sys
import time
import types

import gradtrace
from gradtrace.deepspeed_versions import ds5248_run, entries

# Not resolved: a dev build's package folder may hold symlinks to the sources, without the extension.
PACKAGE_PARENT = pathlib.Path(os.path.abspath(gradtrace.__file__)).parent.parent


@dataclasses.dataclass(frozen=True)
class Entry:
    kind: str  # "model", "script" or "emulation"
    name: str  # ds5248 / moe; the script's path; "gradtrace-train"
    script_args: tuple = ()
    loss: str = "loss"  # the loop's loss recipe (model and emulation entries)

    def digest(self) -> str:
        """Hash of what the entry runs: the script's bytes, or the package's loop sources."""
        h = hashlib.sha256(f"{self.kind}:{self.name}:{self.loss}:{json.dumps(self.script_args)}".encode())
        files = [pathlib.Path(self.name)] if self.kind == "script" else entries.loop_sources()
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


def run(entry: Entry, python, config_path, layout: Layout, out: pathlib.Path, log: pathlib.Path, package: str,
        release: str, timeout: float = 900) -> int:
    """One capture into `out` (removed first); the exit status. Output goes to `log`."""
    if out.exists():
        shutil.rmtree(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as f:
        if entry.kind == "script":
            return _script(entry, python, config_path, layout, out, f, package, release, timeout)
        if entry.kind == "model":
            cmd = entries.loop_command(python, entry.name, layout.sp, layout.dp, config_path, entry.loss, out, timeout)
        else:
            cmd = entries.emulation_command(find_binary("gradtrace-train"), config_path, layout.sp, layout.dp,
                                            entry.loss, release, out)
        f.write("+ " + " ".join(cmd) + "\n")
        f.flush()
        try:
            return subprocess.call(cmd, stdout=f, stderr=subprocess.STDOUT, env=child_env(), timeout=timeout + 60)
        except subprocess.TimeoutExpired:
            return 124


def script_env(out, config_path, layout: Layout, package: str, release: str) -> dict:
    """The script contract's variables (command.py's docstring); DeepSpeed's names stay for its scripts."""
    env = {"GRADTRACE_OUT_DIR": str(out), "GRADTRACE_SP": str(layout.sp), "GRADTRACE_DP": str(layout.dp),
           "GRADTRACE_PACKAGE": package, "GRADTRACE_RELEASE": release}
    if config_path is not None:
        env["GRADTRACE_CONFIG"] = str(config_path)
    if package == "deepspeed":
        env.update(GRADTRACE_DS_CONFIG=str(config_path), GRADTRACE_DEEPSPEED_RELEASE=release)
    return env


def _script(entry, python, config_path, layout, out, f, package, release, timeout):
    """A user script: one process per rank (ds5248_run.launch: RANK, WORLD_SIZE, MASTER_* on 127.0.0.1), each
    `python -m gradtrace.versions.script_main SCRIPT ARGS` (as `python SCRIPT ARGS`; see script_main)."""
    f.write(f"+ {python} {entry.name} {' '.join(entry.script_args)} (x{layout.world} ranks)\n")
    f.flush()
    extra = script_env(out, config_path, layout, package, release)
    env = child_env(extra)
    args = types.SimpleNamespace(sp=layout.sp, dp=layout.dp, timeout=timeout)
    argv = [os.path.abspath(entry.name), *entry.script_args]
    return ds5248_run.launch(args, argv, module="gradtrace.versions.script_main", python=python, log=f,
                             extra_env={k: env[k] for k in ("PYTHONPATH", "DS_ACCELERATOR", *extra)})


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
