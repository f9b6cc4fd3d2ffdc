#!/usr/bin/env python3
"""Issue 24's goals side by side, in one run (issue 24, item 5).

    .venv/bin/python tools/bench/goals.py [--quick] [--repeat 3] [--skip diff,memory,cluster,capture]
        [--ranks 1,4] [--dtypes fp32] [--cluster-ranks 64] [--out DIR] [--build DIR] [--json F] [--markdown F]

It runs the existing benchmarks as subprocesses, reads their JSON (or text) output, and prints one table:
each goal, the range (min-max) of what --repeat runs measured, the 1-minute load average at the start and
end of that part, and whether every run met it. Nothing is measured here itself:

  diff     tools/bench/diff_bench.py --ranks R --dtypes D --threads 0 --repeat 1 --json F, once per repeat
           (traces cached under --out): zstd -d wall / diff wall >= 1.0 (diff at its default thread
           count, all cores) and diff CPU / zstd -d CPU <= 1.5, per case
  memory   tests/diff/big_param_test.py (gradtrace-synth --big-param: a 1 GiB fp32 parameter, B = 2 x A;
           gradtrace-diff on 2 threads, peak RSS from wait4), once per repeat: peak RSS <= its cap
  cluster  tools/bench/cluster_bench.py --ranks R --repeat 1 --json F, once per repeat: its "T1 / shard"
           (one process --threads 1 against 2 concurrent --shard processes + --merge, wall) >= 1.6, and
           the diff, the merged shards and --self each find the planted stage
  capture  tools/bench/capture_overhead --repeats N (1 rank, the 23M model, fp32; its medians): step
           time x off, stats <= 1.03 and full <= 1.3; and gradtrace-codec-bench BM_StatsKernel,
           baseline against the dispatched (AVX2) kernel, GB/s, informational

Progress goes to stderr, each sub-run's output to DIR/goals/. Exit 0 whether or not the goals are met
(it is a measurement); 2 when a sub-run fails. See tools/bench/README.md.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join(ROOT, "tools", "bench")
BIG_PARAM_TEST = os.path.join(ROOT, "tests", "diff", "big_param_test.py")
PARTS = ("diff", "memory", "cluster", "capture")


def load_module(name: str, path: str):
    """The module at `path`, imported by file (tools/bench and tests/diff are not packages)."""
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # before exec: dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


# Reused, not copied: machine facts and table formatting (diff_bench), the planted stage's parameters
# (cluster_bench), the memory cap and thread count (big_param_test).
diff_bench = load_module("diff_bench", os.path.join(BENCH, "diff_bench.py"))
cluster_bench = load_module("cluster_bench", os.path.join(BENCH, "cluster_bench.py"))
big_param = load_module("big_param_test", BIG_PARAM_TEST)

# Issue 24's goals.
GOAL_ZSTD_OVER_DIFF_WALL = 1.0  # zstd -d wall / diff wall: the diff at least as fast as decompressing
GOAL_DIFF_OVER_ZSTD_CPU = 1.5  # diff CPU / zstd -d CPU: at most 1.5x the CPU of decompressing
GOAL_SHARD_SPEEDUP = 1.6  # one process (--threads 1) wall / 2 shards at once + merge wall
GOAL_STATS = 1.03  # capture stats: step time x off
GOAL_FULL = 1.3  # capture full: step time x off
MIB = 1 << 20
QUICK_BIG_NUMEL = 8 << 20  # --quick: 8 Mi fp32 elements (32 MiB) instead of 1 GiB; still windowed (> 4 Mi)
# --quick for the cluster: the smallest layout cluster_bench accepts (dp >= 2): 2 x 2 x 2 = 8 ranks, 4 layers.
CLUSTER_QUICK = ["--tp", "2", "--pp", "2", "--layers", "4"]
CLUSTER_QUICK_RANKS = "8"
CLUSTER_LAYOUT = {"tp": 8, "pp": 4, "layers": 80}  # cluster_bench's defaults (its --tp, --pp, --layers)


class SubRunFailed(Exception):
    pass


def log(msg: str) -> None:
    print(f"goals: {msg}", file=sys.stderr, flush=True)


def load1() -> float:
    return round(os.getloadavg()[0], 2)


def run_sub(args, cmd: list[str], name: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """Runs cmd with its stdout and stderr to DIR/goals/<name>.log; raises SubRunFailed on a nonzero exit."""
    logf = os.path.join(args.work, name + ".log")
    with open(logf, "w") as f:
        f.write("$ " + shlex.join(cmd) + "\n")
        f.flush()
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        f.write(p.stdout + p.stderr)
    p.log = logf
    if p.returncode != 0:
        raise SubRunFailed(f"{shlex.join(cmd)} exited {p.returncode} (output in {logf})")
    return p


def span(values: list[float], fmt: str = "{:.2f}") -> str:
    """'min-max' of the values, or the one value."""
    vals = [v for v in values if v is not None]
    if not vals:
        return "-"
    lo, hi = min(vals), max(vals)
    return fmt.format(lo) if fmt.format(lo) == fmt.format(hi) else f"{fmt.format(lo)}-{fmt.format(hi)}"


def secs(values: list[float]) -> str:
    """A range of seconds, with three decimals when they are under one second (the --quick sizes)."""
    return span(values, "{:.3f}" if max(values, default=0) < 1 else "{:.2f}")


def verdict(values: list[float], goal: float, higher_is_better: bool) -> str:
    """✓ when every run met the goal, ✗ when none did, '✗ (k of n met)' in between."""
    vals = [v for v in values if v is not None]
    if not vals:
        return "-"
    met = sum(1 for v in vals if (v >= goal if higher_is_better else v <= goal))
    return "✓" if met == len(vals) else "✗" if met == 0 else f"✗ ({met} of {len(vals)} met)"


def goal_row(part: str, goal: str, measured: str, load: tuple, met: str, values=None, case: str = "") -> dict:
    return {"part": part, "case": case, "goal": goal, "measured": measured, "load_start": load[0],
            "load_end": load[1], "met": met, "values": values}


# ---------------------------------------------------------------- 1. streaming diff against zstd -d


def part_diff(args, step: str) -> tuple[list[dict], dict]:
    load0 = load1()
    runs = []
    for i in range(args.repeat):
        log(f"{step} diff, repeat {i + 1}/{args.repeat} (diff_bench.py, cases {args.ranks} x {args.dtypes})")
        out = os.path.join(args.work, f"diff_bench-{i + 1}.json")
        cmd = [sys.executable, os.path.join(BENCH, "diff_bench.py"), "--ranks", args.ranks, "--dtypes", args.dtypes,
               "--threads", "0", "--repeat", "1", "--out", args.out, "--build", args.build, "--json", out]
        run_sub(args, cmd + (["--quick"] if args.quick else []), f"diff_bench-{i + 1}")
        with open(out) as f:
            runs.append(json.load(f))
    load = (load0, load1())
    cases: dict[str, list[dict]] = {}
    for run in runs:
        for row in run["rows"]:
            cases.setdefault(row["case"], []).append(row)
    rows = []
    for case, rs in cases.items():
        diff_wall = [r["diff"]["default"]["wall_s"] for r in rs]
        diff_cpu = [r["diff"]["default"]["cpu_s"] for r in rs]
        if not all("zstd_d" in r for r in rs):
            rows.append(goal_row("diff", f"{case}: zstd -d wall / diff wall ≥ {GOAL_ZSTD_OVER_DIFF_WALL:g}",
                                 "no zstd CLI: not measured", load, "-", case=case))
            continue
        zstd_wall = [r["zstd_d"]["wall_s"] for r in rs]
        zstd_cpu = [r["zstd_d"]["cpu_s"] for r in rs]
        speed = [z / d for z, d in zip(zstd_wall, diff_wall)]
        cpu = [d / z if z > 0 else None for d, z in zip(diff_cpu, zstd_cpu)]
        rows.append(goal_row(
            "diff", f"{case}: zstd -d wall / diff wall (T={runs[0]['machine']['usable_cpus']}) "
                    f"≥ {GOAL_ZSTD_OVER_DIFF_WALL:g}",
            f"{span(speed)}x (zstd -d {secs(zstd_wall)} s, diff {secs(diff_wall)} s)", load,
            verdict(speed, GOAL_ZSTD_OVER_DIFF_WALL, True), speed, case))
        rows.append(goal_row(
            "diff", f"{case}: diff CPU / zstd -d CPU ≤ {GOAL_DIFF_OVER_ZSTD_CPU:g}",
            f"{span(cpu)}x (zstd -d {secs(zstd_cpu)} CPU-s, diff {secs(diff_cpu)} CPU-s)", load,
            verdict(cpu, GOAL_DIFF_OVER_ZSTD_CPU, False), cpu, case))
    return rows, {"runs": runs}


# ---------------------------------------------------------------- 2. memory bounded by frames


DIFF_LINE = re.compile(r"gradtrace-diff: exit (\d+), ([0-9.]+) s wall, ([0-9.]+) s CPU, peak RSS (\d+) MiB "
                       r"\(cap (\d+) MiB\), load ([0-9.]+)")


def part_memory(args, step: str) -> tuple[list[dict], dict]:
    numel = QUICK_BIG_NUMEL if args.quick else None  # None: big_param_test's own 1 GiB
    load0 = load1()
    runs = []
    for i in range(args.repeat):
        log(f"{step} memory, repeat {i + 1}/{args.repeat} (tests/diff/big_param_test.py)")
        cmd = [sys.executable, BIG_PARAM_TEST, args.bin("gradtrace-diff"), args.bin("gradtrace-synth")]
        cmd += [str(numel)] if numel else []
        try:
            p = run_sub(args, cmd, f"big_param-{i + 1}")
            text = p.stdout + p.stderr
        except SubRunFailed:
            # The test fails when the RSS is over the cap: that is a measurement (✗), not a failed run.
            with open(os.path.join(args.work, f"big_param-{i + 1}.log")) as f:
                text = f.read()
            if "over the cap" not in text:
                raise
        m = DIFF_LINE.search(text)
        if not m:
            raise SubRunFailed(f"{shlex.join(cmd)}: no 'gradtrace-diff: ... peak RSS' line in its output")
        runs.append({"exit": int(m.group(1)), "wall_s": float(m.group(2)), "cpu_s": float(m.group(3)),
                     "rss_mib": int(m.group(4)), "cap_mib": int(m.group(5)), "load": float(m.group(6))})
    load = (load0, load1())
    rss = [r["rss_mib"] for r in runs]
    cap = big_param.CAP / MIB
    size = (f"{numel >> 20} Mi fp32 elements: not the goal's size" if numel
            else "a 1 GiB fp32 parameter")
    row = goal_row(
        "memory", f"diff peak RSS ≤ 256 MiB + {big_param.THREADS} threads x 3 x 4 MiB = {cap:.0f} MiB ({size})",
        f"{span(rss, '{:.0f}')} MiB; diff {span([r['wall_s'] for r in runs], '{:.1f}')} s wall, "
        f"{span([r['cpu_s'] for r in runs], '{:.1f}')} CPU-s", load, verdict(rss, cap, False), rss)
    return [row], {"numel": numel or "1 GiB (big_param_test default)", "cap_mib": cap, "runs": runs}


# ---------------------------------------------------------------- 3. simulated cluster


def self_found(answer: str, dp: int, expected: int) -> bool:
    """cluster_bench's --self answer ('divisors 1 (182), 2 (541) (dp 2), verdict ...') names dp/2 for
    exactly the planted stage's parameters (summed over the groups that report it)."""
    groups = re.findall(r"([0-9.]+) \((\d+)\)", answer)
    return sum(int(n) for d, n in groups if float(d) == dp / 2) == expected


def part_cluster(args, step: str) -> tuple[list[dict], dict]:
    layout = dict(CLUSTER_LAYOUT)
    extra = []
    if args.quick:
        layout.update(tp=2, pp=2, layers=4)
        extra = CLUSTER_QUICK
    expected = len(cluster_bench.last_stage_names(layout["layers"], layout["pp"]))
    load0 = load1()
    runs = []
    for i in range(args.repeat):
        log(f"{step} cluster, repeat {i + 1}/{args.repeat} (cluster_bench.py --ranks {args.cluster_ranks})")
        out = os.path.join(args.work, f"cluster_bench-{i + 1}.json")
        cmd = [sys.executable, os.path.join(BENCH, "cluster_bench.py"), "--ranks", args.cluster_ranks, "--repeat", "1",
               "--build", args.build, "--out", os.path.join(args.out, "cluster"), "--json", out, *extra]
        run_sub(args, cmd, f"cluster_bench-{i + 1}")
        with open(out) as f:
            runs.append(json.load(f))
    load = (load0, load1())
    by_ranks: dict[int, list[dict]] = {}
    for run in runs:
        for row in run:
            by_ranks.setdefault(row["ranks"], []).append(row)
    if not by_ranks:
        raise SubRunFailed(f"cluster_bench.py measured no rank count of {args.cluster_ranks} "
                           f"(each must be dp x {layout['tp']} x {layout['pp']} with dp >= 2)")
    rows = []
    for ranks, rs in sorted(by_ranks.items()):
        case = f"{ranks} ranks ({rs[0]['dp']}x{rs[0]['tp']}x{rs[0]['pp']})"
        t1 = [min(x["wall"] for x in r["runs"]["diff_t1"]) for r in rs]
        pair = [min(x["wall"] for x in r["runs"]["shard"]) for r in rs]
        speed = [a / b for a, b in zip(t1, pair)]  # cluster_bench's own "T1 / shard" column
        rows.append(goal_row(
            "cluster", f"{case}: one process --threads 1 / (2 x --shard at once + --merge), wall ≥ "
                       f"{GOAL_SHARD_SPEEDUP:g}",
            f"{span(speed)}x (T1 {span(t1, '{:.1f}')} s, shards + merge {span(pair, '{:.1f}')} s)", load,
            verdict(speed, GOAL_SHARD_SPEEDUP, True), speed, case))
        found = []
        for r in rs:
            ok = {"diff": r.get("diff_answer", "").startswith("found"),
                  "merge": r.get("merge_answer", "").startswith("found"),
                  "self": self_found(r.get("self_answer", ""), r["dp"], expected)}
            found.append(ok)
        each = ", ".join(f"{k} {sum(f[k] for f in found)}/{len(found)}" for k in ("diff", "merge", "self"))
        all_ok = [1.0 if all(f.values()) else 0.0 for f in found]
        rows.append(goal_row(
            "cluster", f"{case}: diff, merged shards and --self each find the planted stage ({expected} params)",
            f"runs that found it: {each}", load, verdict(all_ok, 1.0, True), all_ok, case))
    return rows, {"layout": layout, "runs": runs}


# ---------------------------------------------------------------- 4. capture overhead and the stats kernel


def parse_capture(text: str) -> dict:
    """capture_overhead's table: {mode: (step s, step x off)} (the full mode's zstd level column dropped)."""
    out = {}
    for line in text.splitlines():
        tok = line.split()
        if not tok or tok[0] == "mode":
            continue
        if tok[0] == "full" and len(tok) > 2:
            tok = [f"full (zstd {tok[1]})" if tok[1] != "1" else "full"] + tok[2:]
        try:
            out[tok[0]] = (float(tok[1]), float(tok[2]))
        except (IndexError, ValueError):
            continue
    return out


def stats_kernel(args) -> dict | None:
    path = args.bin("gradtrace-codec-bench")
    if not os.access(path, os.X_OK):
        return None
    cmd = [path, "--benchmark_filter=BM_StatsKernel", "--benchmark_format=json",
           f"--benchmark_repetitions={args.repeat}"]
    p = run_sub(args, cmd, "codec_bench-stats_kernel")
    res: dict[str, dict] = {}
    for b in json.loads(p.stdout)["benchmarks"]:
        if b.get("run_type", "iteration") != "iteration":
            continue  # the repetitions' mean/median/stddev
        kind = b["name"].split("/")[1] if "/" in b["name"] else b["name"]
        r = res.setdefault(kind, {"label": b.get("label", ""), "gb_per_s": []})
        r["gb_per_s"].append(b["bytes_per_second"] / 1e9)
    return res


def part_capture(args, step: str) -> tuple[list[dict], dict]:
    load0 = load1()
    log(f"{step} capture, {args.repeat} repeats inside capture_overhead (modes interleaved)")
    cmd = [sys.executable, os.path.join(BENCH, "capture_overhead"), "--bin", args.bin("gradtrace-train")]
    cmd += diff_bench.CAPTURE_QUICK if args.quick else []
    cmd += ["--repeats", str(args.repeat)]  # after CAPTURE_QUICK's --repeats 1: the last one counts
    p = run_sub(args, cmd, "capture_overhead")
    modes = parse_capture(p.stdout)
    log(f"{step} capture: gradtrace-codec-bench BM_StatsKernel, {args.repeat} repetitions")
    kernel = stats_kernel(args)
    load = (load0, load1())
    model = "tiny model, 3 steps: not the goal's size" if args.quick else "23M model, fp32"
    rows = []
    for mode, goal in (("stats", GOAL_STATS), ("full", GOAL_FULL)):
        if mode not in modes:
            raise SubRunFailed(f"{shlex.join(cmd)}: no '{mode}' row in its table (output in {p.log})")
        step_s, ratio = modes[mode]
        off = modes.get("off", (None, None))[0]
        rows.append(goal_row(
            "capture", f"capture {mode}: step time x off ≤ {goal:g} (1 rank, {model})",
            f"{ratio:.3f} (median of {args.repeat}: {step_s:.3f} s against {off:.3f} s)", load,
            verdict([ratio], goal, False), [ratio]))
    if "sketch:4096" in modes:
        step_s, ratio = modes["sketch:4096"]
        rows.append(goal_row("capture", f"capture sketch:4096: step time x off (no goal here; 1 rank, {model})",
                             f"{ratio:.3f} (median of {args.repeat})", load, "·", [ratio]))
    if kernel:
        cells = [f"{r['label'] or kind} {span(r['gb_per_s'])} GB/s" for kind, r in kernel.items()]
        rows.append(goal_row("capture", "stats kernel alone, 16 MiB fp32, one thread (informational)",
                             "; ".join(cells), load, "·", None))
    return rows, {"capture_overhead": p.stdout, "modes": modes, "stats_kernel": kernel}


# ---------------------------------------------------------------- output


HEAD = ["goal", "measured (range over runs)", "load avg start/end", "met"]
LEGEND = (
    "Each goal of issue 24 as measured by the existing benchmarks, run {repeat} times (capture_overhead: one run "
    "of --repeats {repeat}, modes interleaved, its medians). Ranges are min-max over the runs; ✓ when every run met "
    "the goal, ✗ when none did, '✗ (k of n met)' in between; · informational. Load: the 1-minute load average when "
    "the part started and when it ended. diff: diff_bench.py (one comparison's FINAL frames; the diff at its default "
    "thread count; zstd -d on the same compressed bytes). memory: tests/diff/big_param_test.py (peak RSS of the diff "
    "process from wait4). cluster: cluster_bench.py (gradtrace-synth --llama70b, sketch:4096, bug planted in the "
    "last stage; its T1 / shard column). capture: tools/bench/capture_overhead and gradtrace-codec-bench "
    "BM_StatsKernel."
)


def body(rows: list[dict]) -> list[list[str]]:
    return [[r["goal"], r["measured"], f"{r['load_start']} / {r['load_end']}", r["met"]] for r in rows]


def emit(args, machine: dict, rows: list[dict], notes: list[str], parts: dict) -> None:
    legend = LEGEND.format(repeat=args.repeat)
    print(f"machine: {diff_bench.machine_line(machine)}")
    print(diff_bench.text_table(HEAD, body(rows)))
    for n in notes:
        print(f"note: {n}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": machine, "argv": args.argv, "notes": notes, "legend": legend, "goals": rows,
                       "parts": parts}, f, indent=1)
        log(f"wrote {args.json}")
    if args.markdown:
        cmd = " ".join([".venv/bin/python tools/bench/goals.py", *map(shlex.quote, args.argv)])
        text = [f"Measured with `{cmd}` on: {diff_bench.machine_line(machine)}.", "",
                diff_bench.md_table(HEAD, body(rows)), "", legend, ""] + [f"- {n}" for n in notes]
        with open(args.markdown, "w") as f:
            f.write("\n".join(text).rstrip() + "\n")
        log(f"wrote {args.markdown}")


# ---------------------------------------------------------------- main


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 2)[2])
    ap.add_argument("--repeat", type=int, default=3, help="runs of each benchmark (default 3); ranges are over them")
    ap.add_argument("--quick", action="store_true",
                    help="the smallest settings of each part (tiny models, an 8 Mi-element parameter, 8 cluster "
                         "ranks): checks the script, says nothing about the goals")
    ap.add_argument("--skip", default="", help=f"comma list of parts to skip: {','.join(PARTS)}")
    ap.add_argument("--ranks", default="1,4", help="diff_bench.py --ranks (default 1,4)")
    ap.add_argument("--dtypes", default="fp32", help="diff_bench.py --dtypes (default fp32)")
    ap.add_argument("--cluster-ranks", help=f"cluster_bench.py --ranks (default 64; --quick: {CLUSTER_QUICK_RANKS})")
    ap.add_argument("--out", default=os.path.join(ROOT, "out", "bench"),
                    help="diff_bench.py's trace cache (--out), cluster_bench.py's sets (DIR/cluster), and this "
                         "script's sub-run outputs (DIR/goals); default out/bench")
    ap.add_argument("--build", default=os.path.join(ROOT, "build"), help="build directory (default build)")
    ap.add_argument("--json", help="write the goals and every sub-run's results as JSON to FILE")
    ap.add_argument("--markdown", help="write the table as Markdown with the machine line (for docs/dev/performance.md)")
    args = ap.parse_args(argv)
    args.argv = argv
    args.skip = {x for x in args.skip.split(",") if x}
    unknown = args.skip - set(PARTS)
    if unknown:
        ap.error(f"--skip: unknown part(s) {','.join(sorted(unknown))}; parts: {','.join(PARTS)}")
    if args.repeat < 1:
        ap.error("--repeat must be at least 1")
    args.cluster_ranks = args.cluster_ranks or (CLUSTER_QUICK_RANKS if args.quick else "64")
    args.out = os.path.abspath(args.out)
    args.build = os.path.abspath(args.build)
    args.work = os.path.join(args.out, "goals")
    args.bin = lambda name: os.path.join(args.build, "bin", name)
    return args


NEEDS = {"diff": ["gradtrace-train", "gradtrace-diff"], "memory": ["gradtrace-synth", "gradtrace-diff"],
         "cluster": ["gradtrace-synth", "gradtrace-diff"], "capture": ["gradtrace-train"]}
RUNNERS = {"diff": part_diff, "memory": part_memory, "cluster": part_cluster, "capture": part_capture}


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    todo = [p for p in PARTS if p not in args.skip]
    for part in todo:
        for name in NEEDS[part]:
            if not os.access(args.bin(name), os.X_OK):
                log(f"error: {args.bin(name)} is missing (needed by {part}): build first (cmake --build build), "
                    f"or --skip {part}")
                return 2
    os.makedirs(args.work, exist_ok=True)
    machine = diff_bench.machine_info()
    notes = []
    if args.quick:
        notes.append("--quick: the smallest settings of each part; the numbers check the script, not the goals")
    rows, parts = [], {}
    for i, part in enumerate(todo):
        t0 = time.monotonic()
        try:
            part_rows, parts[part] = RUNNERS[part](args, f"[{i + 1}/{len(todo)}]")
        except SubRunFailed as e:
            log(f"error: {e}")
            return 2
        log(f"[{i + 1}/{len(todo)}] {part} done in {time.monotonic() - t0:.0f} s")
        rows += part_rows
    machine["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    if machine["loadavg_start"][0] > 0.5 * machine["usable_cpus"]:
        notes.append(f"load average {machine['loadavg_start'][0]} on {machine['usable_cpus']} cores at start: "
                     "other work shared the machine; wall times are noisy upper bounds (the load at each part's "
                     "end includes these runs' own)")
    emit(args, machine, rows, notes, parts)
    return 0


if __name__ == "__main__":
    sys.exit(main())
