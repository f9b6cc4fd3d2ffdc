"""Running one layout of the matrix: the user's script once per rank (gradtrace.versions.launch, as the version
command starts it) or through a launcher template (torchrun, srun), with the layout in its environment; or
collecting trace sets captured elsewhere. A layout that is not run says why: never silently dropped."""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import re
import shlex
import subprocess
import sys
import time

from gradtrace import _gtcodec
from gradtrace.matrix import grid
from gradtrace.versions import launch

# The exit code with which a script declines a layout it does not build (automake's "skip").
DECLINE = 77
_PLACEHOLDER = re.compile(r"\{([a-z_][a-z0-9_]*)\}")


@dataclasses.dataclass
class Run:
    layout: dict
    name: str
    world: int
    trace_dir: pathlib.Path
    status: str = "ran"  # "ran", "skipped" or "failed"
    reason: str = ""
    exit_code: int | None = None
    seconds: float = 0.0


def fill(template: str, values: dict, what: str) -> str:
    """``template`` with each ``{name}`` replaced by ``values[name]``; an unknown name is a BadGrid."""
    def one(m):
        if m.group(1) not in values:
            raise grid.BadGrid(f"{what} {template!r}: unknown placeholder {{{m.group(1)}}}; known: "
                               f"{', '.join(sorted(values))}")
        return str(values[m.group(1)])
    return _PLACEHOLDER.sub(one, template)


def placeholders(layout: dict, trace_dir, steps) -> dict:
    return {**layout, "world": grid.world(layout), "out": str(trace_dir), "steps": steps if steps else "",
            "name": grid.name(layout)}


def rank_files(trace_dir: pathlib.Path) -> list:
    if not trace_dir.is_dir():
        return []
    return sorted(p for p in trace_dir.iterdir() if _gtcodec.parse_rank_file_name(p.name) is not None)


def layout_env(layout: dict, trace_dir, steps) -> dict:
    env = {"GRADTRACE_LAYOUT": json.dumps(layout), "GRADTRACE_OUT_DIR": str(trace_dir)}
    env.update({f"GRADTRACE_{k.upper()}": str(v) for k, v in layout.items()})
    if steps:
        env["GRADTRACE_STEPS"] = str(steps)
    return env


def _last_line(log_path: pathlib.Path) -> str:
    try:
        lines = [x.strip() for x in log_path.read_text(errors="replace").splitlines() if x.strip()]
    except OSError:
        return ""
    return lines[-1][:300] if lines else ""


def run_layout(layout: dict, opts, root: pathlib.Path) -> Run:
    """Runs ``layout`` (or says why not) into ``root/NAME``; its output goes to ``root/NAME.log``."""
    name, w = grid.name(layout), grid.world(layout)
    run = Run(layout, name, w, root / name)
    if w > opts.max_world:
        run.status, run.reason = "skipped", f"world {w} > --max-world {opts.max_world}"
        return run
    for old in rank_files(run.trace_dir):  # a rerun replaces this layout's trace set, nothing else
        old.unlink()
    run.trace_dir.mkdir(parents=True, exist_ok=True)
    values = placeholders(layout, run.trace_dir, opts.steps)
    script_args = shlex.split(fill(opts.args, values, "--args")) if opts.args else []
    env = layout_env(layout, run.trace_dir, opts.steps)
    log_path = root / f"{name}.log"
    t0 = time.time()
    with open(log_path, "w") as log:
        if opts.launcher:
            argv = shlex.split(fill(opts.launcher, dict(values, script=shlex.quote(str(opts.script)),
                                                        args=" ".join(map(shlex.quote, script_args)),
                                                        python=shlex.quote(opts.python)), "--launcher"))
            log.write(f"+ {shlex.join(argv)}\n")
            log.flush()
            try:
                rc = subprocess.run(argv, env=dict(os.environ, **env), stdout=log, stderr=subprocess.STDOUT,
                                    timeout=opts.timeout).returncode
            except subprocess.TimeoutExpired:
                rc = 124
            except OSError as e:
                log.write(f"gradtrace-matrix: cannot start {argv[0]}: {e.strerror}\n")
                rc = 127
        else:
            log.write(f"+ {opts.python} {opts.script} {shlex.join(script_args)} (x{w} ranks)\n")
            log.flush()
            rc = launch.launch([str(opts.script)], script_args, w, opts.timeout, python=opts.python, extra_env=env,
                               log=log, name="gradtrace-matrix")
    run.seconds, run.exit_code = time.time() - t0, rc
    if rc == DECLINE:
        run.status, run.reason = "skipped", f"declined by the script (exit {DECLINE}): {_last_line(log_path)}"
    elif rc != 0:
        why = "timed out" if rc == 124 else f"exit {rc}"
        run.status, run.reason = "failed", f"{why}: {_last_line(log_path)} (log: {log_path})"
    elif not rank_files(run.trace_dir):
        run.status, run.reason = "failed", f"the script exited 0 but wrote no trace into {run.trace_dir}"
    return run


def collect(root: pathlib.Path) -> list[Run]:
    """Every folder under ``root`` that holds a trace set, as a run: its layout from its name (``dp2-tp1``)."""
    out = []
    for d in sorted(p for p in root.iterdir() if p.is_dir()):
        if rank_files(d):
            layout = grid.from_name(d.name) or {}
            out.append(Run(layout, d.name, grid.world(layout) if layout else 0, d, exit_code=None))
    return out


def python_default() -> str:
    return sys.executable
