"""gradtrace-matrix: run a training script under every layout of a grid and say which layouts change the
gradients, and why.

    gradtrace-matrix --script train.py --grid dp=1,2 tp=1,2 gas=1,2
    gradtrace-matrix --script train.py --grid dp=1,2 tp=1,2 --layout pp=2 --html matrix.html --json matrix.json
    gradtrace-matrix --script train.py --grid tp=1,2 --launcher 'torchrun --nproc-per-node {world} {script} {args}'
    gradtrace-matrix --collect traces/ --reference dp1-tp1      # trace sets captured elsewhere (a cluster)
    gradtrace-matrix --script train.py --grid dp=1,2 tp=1,2 --expect matrix-expect.json   # a CI gate

Each layout runs the script once per rank (world = dp x tp x pp x cp x sp; gas and any other name take no
ranks) with torch.distributed's variables (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, ...), the layout as
JSON in GRADTRACE_LAYOUT, one variable per axis (GRADTRACE_DP=2, GRADTRACE_GAS=1, ...), GRADTRACE_STEPS
(--steps) and the trace folder in GRADTRACE_OUT_DIR, where the script captures with
gradtrace.attach(model, os.environ["GRADTRACE_OUT_DIR"], ...). Every layout must train the same weights on
the same global batch per optimizer step. A script declines a layout it does not build by exiting 77: the
layout is listed as skipped with the script's last line. Layouts of a world above --max-world are skipped,
never dropped. Each layout is diffed against the reference (default: every axis 1) with gradtrace-diff;
its reports stay in OUT/reports/.

Exit: 0 every compared layout matches, 1 a layout differs or failed, 3 a layout's setup differs (other
weights or data), 2 bad input or usage. With --expect: 0 when the expectation holds, 1 when it breaks.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import time

from gradtrace.matrix import expect, grid, heatmap, judge, report, runs

PROG = "gradtrace-matrix"


def default_max_world() -> int:
    """The GPUs the NVIDIA driver lists, else 8: ranks on CPU (gloo) may share cores."""
    gpus = pathlib.Path("/proc/driver/nvidia/gpus")
    n = len(list(gpus.iterdir())) if gpus.is_dir() else 0
    return n or 8


class Parser(argparse.ArgumentParser):
    def error(self, message):
        """Usage errors in one line (argparse's usage block is for --help)."""
        self.exit(2, f"{PROG}: {message} (see {PROG} --help)\n")


def parse_args(argv):
    ap = Parser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_argument_group("what to run")
    src.add_argument("--script", help="the training script, run once per rank of each layout")
    src.add_argument("--args", default="", help="the script's arguments; {dp}, {tp}, ... {gas}, {world}, {out}, "
                                                "{steps}, {name} are filled in per layout")
    src.add_argument("--grid", nargs="+", default=[], metavar="NAME=V1,V2",
                     help="axes whose product is the grid, e.g. dp=1,2 tp=1,2 gas=1,2")
    src.add_argument("--layout", action="append", default=[], metavar="NAME=V,NAME=V",
                     help="one more layout (repeatable), e.g. pp=2,dp=2")
    src.add_argument("--reference", metavar="LAYOUT", help="the layout every other is diffed against (NAME=V,... "
                     "or a folder name such as dp1-tp1; default: every axis 1)")
    src.add_argument("--steps", type=int, help="optimizer steps to train (GRADTRACE_STEPS)")
    src.add_argument("--python", default=runs.python_default(), help="the interpreter (default: this one)")
    src.add_argument("--launcher", help="a command template that starts one layout on many hosts, e.g. "
                     "'torchrun --nnodes 2 --nproc-per-node {tp} {script} {args}' or 'srun -n {world} {python} "
                     "{script} {args}'; it gets the layout's GRADTRACE_* variables")
    src.add_argument("--max-world", type=int, default=default_max_world(),
                     help="skip layouts with more ranks (default: this host's GPUs, else 8)")
    src.add_argument("--timeout", type=float, default=1800, help="seconds per layout (default 1800)")
    src.add_argument("--out", default="gradtrace-matrix", help="the folder of the trace sets, logs and reports "
                                                             "(default ./gradtrace-matrix)")
    src.add_argument("--collect", metavar="DIR", help="judge the trace sets in DIR's folders (one per layout, "
                                                      "named like dp2-tp1) instead of running anything")
    out = ap.add_argument_group("the report")
    out.add_argument("--json", metavar="FILE")
    out.add_argument("--markdown", metavar="FILE")
    out.add_argument("--html", metavar="FILE", help="the table and a heatmap of scale factors, cells linking to "
                                                    "each layout's diff report")
    out.add_argument("--expect", metavar="FILE", help="hold the matrix to this expectation (--write-expect)")
    out.add_argument("--write-expect", metavar="FILE", help="write what this matrix gives as an expectation")
    args = ap.parse_args(argv)
    if bool(args.script) == bool(args.collect):
        ap.error("give --script (run the grid) or --collect DIR (judge trace sets captured elsewhere)")
    if args.collect and (args.grid or args.layout or args.launcher or args.args):
        ap.error("--collect judges what DIR holds: --grid, --layout, --launcher and --args are for --script")
    if args.script and not (args.grid or args.layout):
        ap.error("--script needs layouts: --grid NAME=V1,V2 ... and/or --layout NAME=V,...")
    if args.max_world < 1 or (args.steps is not None and args.steps < 1) or args.timeout <= 0:
        ap.error("--max-world, --steps and --timeout must be positive")
    return args


def fail(message: str) -> int:
    print(f"{PROG}: {message}", file=sys.stderr)
    return 2


def progress(i: int, n: int, run, text: str) -> None:
    print(f"[{PROG} {i}/{n}] {run.name} (world {run.world or '?'}): {text}", file=sys.stderr, flush=True)


def _reference_of(args, layouts):
    if args.reference:
        by_name = grid.from_name(args.reference)
        wanted = by_name if by_name is not None and "=" not in args.reference else grid.parse_layout(args.reference)
    else:
        wanted = {}
    names = list(layouts[0]) if layouts else list(wanted)
    ref = {**{k: 1 for k in names}, **wanted}
    if set(ref) != set(names):
        raise grid.BadGrid(f"--reference {args.reference}: its axes {sorted(wanted)} are not the grid's {names}")
    return {k: ref[k] for k in names}


def run_grid(args, root: pathlib.Path):
    axes = [grid.parse_axis(w) for w in args.grid]
    if len({n for n, _ in axes}) != len(axes):
        raise grid.BadGrid("--grid: an axis is given twice")
    layouts = grid.expand(axes, [grid.parse_layout(x) for x in args.layout])
    reference = _reference_of(args, layouts)
    layouts = [reference] + [x for x in layouts if x != reference]
    script = pathlib.Path(args.script)
    if not script.is_file():
        raise grid.BadGrid(f"--script {args.script}: no such file")
    args.script = str(script.resolve())
    for text, what in ((args.args, "--args"), (args.launcher, "--launcher")):  # every placeholder known, now
        if text:
            extra = {"script": "", "args": "", "python": ""} if what == "--launcher" else {}
            runs.fill(text, dict(runs.placeholders(reference, root, args.steps), **extra), what)
    root.mkdir(parents=True, exist_ok=True)
    done = []
    for i, layout in enumerate(layouts, 1):
        name = grid.name(layout)
        if grid.world(layout) <= args.max_world:
            print(f"[{PROG} {i}/{len(layouts)}] {name} (world {grid.world(layout)}): running", file=sys.stderr,
                  flush=True)
        run = runs.run_layout(layout, args, root)
        took = f" in {run.seconds:.1f} s" if run.exit_code is not None else ""
        progress(i, len(layouts), run, f"{run.status}{took}" + (f": {run.reason}" if run.reason else ""))
        done.append(run)
        if i == 1 and run.status != "ran":
            raise grid.BadGrid(f"the reference {name} did not run ({run.status}: {run.reason}); nothing to compare")
    return done


def collect(args):
    root = pathlib.Path(args.collect)
    if not root.is_dir():
        raise grid.BadGrid(f"--collect {args.collect}: no such directory")
    found = runs.collect(root)
    if not found:
        raise grid.BadGrid(f"--collect {args.collect}: no folder in it holds a trace set (rank-NNNNN.gtrace)")
    if args.reference:
        ref = [r for r in found if r.name == args.reference or
               ("=" in args.reference and r.layout == grid.parse_layout(args.reference))]
    else:
        ref = [r for r in found if r.layout and all(v == 1 for v in r.layout.values())]
    if len(ref) != 1:
        raise grid.BadGrid(f"--collect {args.collect}: " + (f"no folder is the reference {args.reference}" if
                           args.reference else "no folder is named like the reference (every axis 1, e.g. dp1-tp1)"
                           "; name it with --reference"))
    return ref + [r for r in found if r is not ref[0]]


def model_order(trace_dir: pathlib.Path) -> list:
    """The reference's parameter names in the model's order (its first rank file's table): the heatmap's rows."""
    from gradtrace.codec.trace import TraceError, TraceReader

    files = runs.rank_files(trace_dir)
    try:
        return [p["name"] for p in TraceReader(files[0]).run_info.get("params", [])] if files else []
    except (TraceError, OSError):  # a damaged reference: the diff says what is wrong; rows keep the diff's order
        return []


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    t0 = time.time()
    try:
        expectation = expect.load(args.expect) if args.expect else None
        root = pathlib.Path(args.collect or args.out)
        done = collect(args) if args.collect else run_grid(args, root)
    except (grid.BadGrid, expect.BadExpectation) as e:
        return fail(str(e))
    reference = done[0]
    rows = [report.row(reference, None)]
    rows[0]["verdict"] = "reference"
    compared = [r for r in done[1:] if r.status == "ran"]
    for i, run in enumerate(done[1:], 1):
        if run.status != "ran":
            rows.append(report.row(run, None))
            continue
        j = judge.judge(reference.trace_dir, run.trace_dir, root / "reports", run.name)
        rows.append(report.row(run, j))
        print(f"[{PROG}] diff {run.name} against {reference.name}: exit {j.diff_exit}, {j.verdict}"
              f" ({compared.index(run) + 1}/{len(compared)})", file=sys.stderr, flush=True)
    matrix = {"schema_version": report.SCHEMA_VERSION, "tool": PROG, "exit_code": 0, "summary": "",
              "script": args.script, "collected_from": args.collect, "axes": list(reference.layout),
              "reference": {"name": reference.name, "layout": reference.layout},
              "param_order": model_order(reference.trace_dir), "layouts": rows, "expectation": None}
    matrix["summary"] = report.summary(rows[1:], reference.name)
    code = report.exit_code(rows[1:])
    if expectation is not None:
        broken = expect.check(matrix, expectation)
        matrix["expectation"] = {"file": args.expect, "held": not broken, "broken": broken}
        code = 1 if broken else 0
    matrix["exit_code"] = code
    try:
        if args.write_expect:
            report.write(args.write_expect, report.to_json(expect.build(matrix)))
        if args.json:
            report.write(args.json, report.to_json(matrix))
        if args.markdown:
            report.write(args.markdown, report.markdown(matrix))
        if args.html:
            report.write(args.html, heatmap.page(matrix, args.html))
    except OSError as e:
        return fail(f"{e.filename}: {e.strerror}")
    sys.stdout.write(report.text(matrix))
    print(f"[{PROG}] {len(done)} layouts in {time.time() - t0:.0f} s", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
