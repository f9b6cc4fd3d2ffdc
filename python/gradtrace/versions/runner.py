"""Run one entry point under one release of a distribution and capture it (gradtrace-versions).

Entry points:
- `script:PATH`: the user's script, started once per rank (gradtrace.versions.launch; the contract is in
  command.py);
- a package description's built-in ones (gradtrace.versions.packages): `model:NAME`, a loop in a gradtrace
  source checkout (DeepSpeed's ds5248 and moe: tools/repro/ds5248/run.py, the #5248 Ulysses loop), and
  `emulation` (DeepSpeed's: gradtrace-train --scaling deepspeed@RELEASE).

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
from importlib import util as importlib_util

import gradtrace
from gradtrace.versions import launch

# Not resolved: a dev build's package folder may hold symlinks to the sources, without the extension.
PACKAGE_PARENT = pathlib.Path(os.path.abspath(gradtrace.__file__)).parent.parent


@dataclasses.dataclass(frozen=True)
class Entry:
    kind: str  # "model", "script" or "emulation"
    name: str  # the loop's name (ds5248 / moe); the script's path; "gradtrace-train"
    script_args: tuple = ()
    loss: str = "loss"  # the loop's loss recipe (model and emulation entries)
    files: tuple = ()  # what the entry runs: the script, or the loop's sources
    target: str = ""  # model: the loop's script
    target_args: tuple = ()  # model: the loop's arguments, {sp} {dp} {config} {loss} {out} {timeout} to fill in

    def digest(self) -> str:
        """Hash of what the entry runs: the script's bytes, or the loop's sources."""
        h = hashlib.sha256(f"{self.kind}:{self.name}:{self.loss}:{json.dumps(self.script_args)}".encode())
        for f in map(pathlib.Path, self.files):
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


def find_checkout(relative: str, explicit=None):
    """The gradtrace source checkout that holds `relative` (a built-in loop's script), or None: `explicit` (the
    user's --checkout) alone when given, else a folder above this package (a build inside its checkout, or the
    sources themselves) or the source folder of the build holding it (its CMakeCache.txt). A wheel has none."""
    if explicit is not None:
        return pathlib.Path(explicit).resolve() if (pathlib.Path(explicit) / relative).is_file() else None
    here = [PACKAGE_PARENT, pathlib.Path(__file__).resolve().parent]
    cands = [d for p in here for d in (p, *p.parents)]
    for d in cands:
        cache = d / "CMakeCache.txt"
        if cache.is_file():
            for line in cache.read_text(errors="replace").splitlines():
                if line.startswith("CMAKE_HOME_DIRECTORY:"):
                    cands.append(pathlib.Path(line.partition("=")[2]))
    return next((d for d in cands if (d / relative).is_file()), None)


def module_files(modules) -> list:
    """The files of the named modules, found without importing them (they may import torch)."""
    return [pathlib.Path(importlib_util.find_spec(m).origin) for m in modules]


def child_env(extra=None) -> dict:
    """This gradtrace package first on PYTHONPATH (an old-release env has no gradtrace of its own), one thread
    per rank, no RANK from an outer launcher."""
    path = [str(PACKAGE_PARENT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path), OMP_NUM_THREADS="1")
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


def run_env(desc, world: int) -> dict:
    """The description's run variables ({world} filled in)."""
    return {k: str(v).replace("{world}", str(world)) for k, v in desc["run_env"].items()}


def run(entry: Entry, python, config_path, layout: Layout, out: pathlib.Path, log: pathlib.Path, desc,
        release: str, timeout: float = 900) -> int:
    """One capture into `out` (removed first) of the package `desc` describes; the exit status. Output goes to
    `log`."""
    if out.exists():
        shutil.rmtree(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as f:
        if entry.kind == "script":
            return _script(entry, python, config_path, layout, out, f, desc, release, timeout)
        if entry.kind == "model":
            fill = dict(sp=layout.sp, dp=layout.dp, config=config_path, loss=entry.loss, out=out, timeout=timeout)
            cmd = [str(python), entry.target, *(a.format(**fill) for a in entry.target_args)]
        else:
            cmd = desc.hook(desc["emulation"])(find_binary("gradtrace-train"), config_path, layout.sp, layout.dp,
                                               entry.loss, release, out)
        f.write("+ " + " ".join(cmd) + "\n")
        f.flush()
        try:
            return subprocess.call(cmd, stdout=f, stderr=subprocess.STDOUT, env=child_env(run_env(desc, layout.world)),
                                   timeout=timeout + 60)
        except subprocess.TimeoutExpired:
            return 124


def script_env(out, config_path, layout: Layout, desc, release: str) -> dict:
    """The script contract's variables (command.py's docstring), and the description's own names for the config
    and the release (DeepSpeed's GRADTRACE_DS_CONFIG, GRADTRACE_DEEPSPEED_RELEASE)."""
    env = {"GRADTRACE_OUT_DIR": str(out), "GRADTRACE_SP": str(layout.sp), "GRADTRACE_DP": str(layout.dp),
           "GRADTRACE_PACKAGE": desc.name, "GRADTRACE_RELEASE": release}
    if config_path is not None:
        env["GRADTRACE_CONFIG"] = str(config_path)
    if desc["config"]["variable"]:
        env[desc["config"]["variable"]] = str(config_path)
    if desc["release_variable"]:
        env[desc["release_variable"]] = release
    return env


def _script(entry, python, config_path, layout, out, f, desc, release, timeout):
    """A user script: one process per rank (gradtrace.versions.launch: RANK, WORLD_SIZE, MASTER_* on
    127.0.0.1), each `python -m gradtrace.versions.script_main SCRIPT ARGS` (as `python SCRIPT ARGS`; see
    script_main)."""
    f.write(f"+ {python} {entry.name} {' '.join(entry.script_args)} (x{layout.world} ranks)\n")
    f.flush()
    extra = dict(run_env(desc, layout.world), **script_env(out, config_path, layout, desc, release))
    env = child_env(extra)
    argv = [os.path.abspath(entry.name), *entry.script_args]
    return launch.launch(["-m", "gradtrace.versions.script_main"], argv, layout.world, timeout, python=python, log=f,
                         extra_env={k: env[k] for k in ("PYTHONPATH", *extra)}, name="gradtrace-versions")


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
    """The report's groups as table cells: kind, scale, count, expression, the worst residual in it, its
    parameters, and the diff's cause and sentence."""
    if "error" in report:
        return []
    resid = {p["name"]: p.get("residual") for p in report.get("params", [])}
    out = []
    for g in report.get("groups", []):
        rs = [resid.get(n) for n in g.get("params", []) if resid.get(n) is not None]
        out.append({"kind": g["kind"], "scale": g.get("scale"), "count": g.get("count"),
                    "expression": g.get("expression", ""), "residual": max(rs) if rs else None,
                    "params": g.get("params", []), "cause": g.get("cause", ""),
                    "explanation": g.get("explanation", "")})
    return out


def timed(fn, *a, **kw):
    t = time.time()
    r = fn(*a, **kw)
    return r, time.time() - t
