#!/usr/bin/env python3
"""gradtrace-diff on a simulated cluster: a 70B-class model over 64 to 1,024 ranks (issue 24, item 3), or an MoE
model of 20,000 tensors over 4,096 ranks (issue 42, item 3).

    python3 tools/bench/cluster_bench.py [--ranks 64,128,256,512,1024] [--tp 8] [--pp 4] [--layers 80]
        [--hidden H --intermediate I --kv K --vocab V --experts-per-layer E --no-world-group]
        [--capture sketch:4096] [--nofile 1024] [--repeat 1] [--skip ...] [--out DIR] [--json F]
        [--markdown F] [--keep]

The issue-42 cluster (20,083 tensors, 4,096 ranks, stats):
    python3 tools/bench/cluster_bench.py --ranks 1024,2048,4096 --layers 40 --experts-per-layer 165 \
        --hidden 64 --intermediate 32 --kv 16 --vocab 256 --capture stats --skip diff1

For each rank count R it writes two sets with `gradtrace-synth --llama70b` (Llama-70B shapes,
dp = R / (tp x pp)): A, a correct run, and B, the same run with the last stage's reductions
dividing by dp/2 (the planted bug). Then, each under `/usr/bin/time -v` (wall, user+sys CPU, peak
RSS, and the most files it held open at once, sampled from /proc every 10 ms), in a process whose
RLIMIT_NOFILE is --nofile (default 1,024, the common default), with the load average read just before:

  diff     gradtrace-diff A B --json F (default threads)
  diff T1  the same with --threads 1
  self     gradtrace-diff --self B --json F
  shard    gradtrace-diff A B --shard 0/2 and 1/2 as two concurrent processes, --threads 1 each,
           then gradtrace-diff --merge (wall: both shards until the last ends, plus the merge)
  pack     gradtrace-pack A B -o X --limit (twice the sets): the traces copied as captured, the archive's
           sets diffed (the archive is deleted after)

It checks the answers (the diff's scaled group is 2.000 over exactly the last stage's parameters;
--self reports divisor dp/2 for them) and prints a Markdown table; sets are deleted after each rank
count unless --keep. Exit 2, with one line on stderr, when a rank count does not fit dp x tp x pp
(dp >= 2; checked before anything runs) or a command exits otherwise than expected (the diff, --self
and the merge exit 1: they find the planted stage). Timings belong in docs/dev/performance.md, never in tests.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


NOFILE = 1024  # RLIMIT_NOFILE of every measured command (--nofile)


def start(cmd: list[str]) -> tuple[subprocess.Popen, dict]:
    """Starts cmd under RLIMIT_NOFILE = NOFILE, its stderr to a temporary file; a thread samples its open files."""
    def lower():
        resource.setrlimit(resource.RLIMIT_NOFILE, (NOFILE, NOFILE))

    err = tempfile.TemporaryFile()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, preexec_fn=lower)
    state = {"fds": 0, "err": err}

    def sample():
        fd_dir = f"/proc/{p.pid}/fd"
        while p.returncode is None:
            try:
                state["fds"] = max(state["fds"], len(os.listdir(fd_dir)))
            except OSError:
                pass
            time.sleep(0.01)

    state["thread"] = threading.Thread(target=sample, daemon=True)
    state["thread"].start()
    return p, state


def finish(p: subprocess.Popen, state: dict) -> dict:
    """Waits for p (wait4: its own CPU and peak RSS); returns rc, cpu, rss_mb, fds, stderr_tail."""
    _, status, usage = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    state["thread"].join()
    state["err"].seek(0)
    text = state["err"].read().decode(errors="replace")
    return {"rc": p.returncode, "cpu": usage.ru_utime + usage.ru_stime, "rss_mb": usage.ru_maxrss / 1024.0,
            "fds": state["fds"], "stderr_tail": text[-400:] if p.returncode not in (0, 1) else ""}


def timed(cmd: list[str]) -> dict:
    """Runs cmd; returns wall, cpu, rss_mb, fds (most open at once), rc, load."""
    load = os.getloadavg()[0]
    t0 = time.monotonic()
    run = finish(*start(cmd))
    return {"wall": time.monotonic() - t0, "load": load, **run}


def concurrent(cmds: list[list[str]]) -> dict:
    """Runs cmds at once; wall until the last ends, CPU summed, RSS and open files the largest of one."""
    load = os.getloadavg()[0]
    t0 = time.monotonic()
    started = [start(c) for c in cmds]
    parsed = [finish(p, st) for p, st in started]
    wall = time.monotonic() - t0
    # The worst process speaks for all, with its own stderr: an exit other than 0 or 1 (a crash, a signal) first.
    worst = max(parsed, key=lambda x: (x["rc"] not in (0, 1), x["rc"]))
    return {"wall": wall, "load": load, "rc": worst["rc"], "stderr_tail": worst["stderr_tail"],
            "cpu": sum(x["cpu"] for x in parsed), "rss_mb": max(x["rss_mb"] for x in parsed),
            "fds": max(x["fds"] for x in parsed)}


class RunFailed(Exception):
    pass


def expect(run: dict, codes: set[int], what: str) -> dict:
    """The run's exit code is one of codes (the diff exits 1 when it finds the planted stage), else RunFailed."""
    if run["rc"] not in codes:
        raise RunFailed(f"{what} exited {run['rc']} (expected {'/'.join(map(str, sorted(codes)))})"
                        f"{': ' + run['stderr_tail'] if run.get('stderr_tail') else ''}")
    return run


def set_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))


def last_stage(name: str, layers: int, pp: int) -> bool:
    """Whether the synthesiser puts `name` on the last stage (synth_cluster.cc StageOf)."""
    m = re.match(r"model\.layers\.(\d+)\.", name)
    if m:
        return int(m.group(1)) >= layers - layers // pp
    return name != "model.embed_tokens.weight"


def check_diff(report: dict, layers: int, pp: int) -> str:
    expected = {p["name"] for p in report["params"] if last_stage(p["name"], layers, pp)}
    scaled = {p["name"] for p in report["params"] if p["verdict"] == "scaled"}
    scales = sorted({round(p["scale"], 3) for p in report["params"] if p["verdict"] == "scaled"})
    others = {p["verdict"] for p in report["params"] if p["name"] not in expected}
    ok = scaled == expected and scales == [2.0] and others <= {"match"}
    return (f"{'found' if ok else 'NOT found'}: {len(scaled)} scaled x{','.join(f'{s:.3f}' for s in scales)}"
            f", verdict {report['verdict']}")


def check_self(report: dict, dp: int) -> str:
    divs = []
    for g in report.get("groups", []):
        m = re.search(r"effective divisor ([0-9.]+)", g.get("explanation", ""))
        if m:
            divs.append(f"{float(m.group(1)):g} ({g.get('count', '?')})")
    return f"divisors {', '.join(divs)} (dp {dp}), verdict {report.get('verdict')}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", default="64,128,256,512,1024")
    ap.add_argument("--tp", type=int, default=8)
    ap.add_argument("--pp", type=int, default=4)
    ap.add_argument("--layers", type=int, default=80)
    ap.add_argument("--capture", default="sketch:4096")
    for dim in ("hidden", "intermediate", "kv", "vocab", "experts-per-layer"):
        ap.add_argument(f"--{dim}", type=int, help="the model's dimension (synth_cluster.h ModelShape)")
    ap.add_argument("--no-world-group", action="store_true", help="RunInfo lists no world group")
    ap.add_argument("--nofile", type=int, default=1024, help="RLIMIT_NOFILE of every measured command")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--out", default=os.path.join(ROOT, "out", "bench", "cluster"))
    ap.add_argument("--json", dest="json_out")
    ap.add_argument("--markdown")
    ap.add_argument("--keep", action="store_true", help="keep the trace sets")
    ap.add_argument("--reuse", action="store_true", help="measure sets a --keep run left in --out (same layout)")
    ap.add_argument("--skip", default="", help="comma list of measurements to skip: diff,diff1,self,shard,pack")
    ap.add_argument("--shard-diff", help="gradtrace-diff binary for the --shard runs (a patched build to compare)")
    args = ap.parse_args()
    global NOFILE
    NOFILE = args.nofile
    synth = os.path.join(args.build, "bin", "gradtrace-synth")
    diff = os.path.join(args.build, "bin", "gradtrace-diff")
    skip = set(filter(None, args.skip.split(",")))
    os.makedirs(args.out, exist_ok=True)
    rows = []
    rank_counts = [int(r) for r in args.ranks.split(",")]
    for ranks in rank_counts:
        if ranks % (args.tp * args.pp) or ranks // (args.tp * args.pp) < 2:
            print(f"cluster_bench: --ranks {ranks} is not dp x {args.tp} x {args.pp} with dp >= 2", file=sys.stderr)
            return 2
    try:
        for ranks in rank_counts:
            rows.append(measure(args, ranks, synth, diff, skip))
    except RunFailed as e:
        print(f"cluster_bench: {e}", file=sys.stderr)
        return 2
    md = markdown(rows)
    print(md)
    if args.markdown:
        open(args.markdown, "w").write(md)
    if args.json_out:
        json.dump(rows, open(args.json_out, "w"), indent=1)
    return 0


def measure(args, ranks: int, synth: str, diff: str, skip: set[str]) -> dict:
    """Writes the pair at `ranks`, runs the measurements not in skip, deletes the pair (unless --keep)."""
    dp = ranks // (args.tp * args.pp)
    a, b = os.path.join(args.out, f"A{ranks}"), os.path.join(args.out, f"B{ranks}")
    lay = ["--llama70b", "--dp", str(dp), "--tp", str(args.tp), "--pp", str(args.pp), "--layers",
           str(args.layers), "--capture", args.capture, "--threads", "2"]
    for dim in ("hidden", "intermediate", "kv", "vocab", "experts_per_layer"):
        if getattr(args, dim) is not None:
            lay += [f"--{dim.replace('_', '-')}", str(getattr(args, dim))]
    if args.no_world_group:
        lay.append("--no-world-group")
    row = {"ranks": ranks, "dp": dp, "tp": args.tp, "pp": args.pp, "capture": args.capture, "nofile": NOFILE}
    need_a = not {"diff", "diff1", "shard", "pack"} <= skip  # --self reads B alone
    if args.reuse and os.path.isdir(b) and (os.path.isdir(a) or not need_a):
        row["write"] = {"wall": float("nan"), "load": float("nan")}  # written by an earlier run
    else:
        for d in (a, b):
            shutil.rmtree(d, ignore_errors=True)
        # Sets are written with 2 threads on the same cores the measurements use.
        gen = [timed([synth, b] + lay + ["--planted-stage", str(args.pp - 1)])]
        if need_a:
            gen.append(timed([synth, a] + lay))
        for g in gen:
            expect(g, {0}, f"gradtrace-synth at {ranks} ranks")
        row["write"] = {"wall": sum(g["wall"] for g in gen) / len(gen), "load": gen[0]["load"]}
    row["set_mb"] = set_bytes(b) / 1e6
    runs: dict[str, list[dict]] = {}
    rep = os.path.join(args.out, "report.json")
    for _ in range(args.repeat):
        if "diff" not in skip:
            runs.setdefault("diff", []).append(expect(timed([diff, a, b, "--json", rep]), {1}, f"the diff at {ranks} ranks"))
            row["diff_answer"] = check_diff(json.load(open(rep)), args.layers, args.pp)
        if "diff1" not in skip:
            runs.setdefault("diff_t1", []).append(
                expect(timed([diff, a, b, "--threads", "1", "--json", rep]), {1}, f"the diff --threads 1 at {ranks} ranks"))
        if "self" not in skip:
            runs.setdefault("self", []).append(expect(timed([diff, "--self", b, "--json", rep]), {1}, f"--self B at {ranks} ranks"))
            row["self_answer"] = check_self(json.load(open(rep)), dp)
        if "shard" not in skip:
            parts = [os.path.join(args.out, f"part{k}.json") for k in (0, 1)]
            shard_bin = args.shard_diff or diff
            sh = concurrent([[shard_bin, a, b, "--shard", f"{k}/2", "--threads", "1", "--json", parts[k]]
                             for k in (0, 1)])
            expect(sh, {0, 1}, f"the --shard processes at {ranks} ranks")
            mg = expect(timed([diff, "--merge"] + parts + ["--json", rep]), {1}, f"the --merge at {ranks} ranks")
            merged = json.load(open(rep))
            row["merge_answer"] = check_diff(merged, args.layers, args.pp)
            runs.setdefault("shard", []).append(
                {"wall": sh["wall"] + mg["wall"], "cpu": sh["cpu"] + mg["cpu"],
                 "rss_mb": max(sh["rss_mb"], mg["rss_mb"]), "load": sh["load"], "rc": mg["rc"],
                 "merge_wall": mg["wall"], "fds": max(sh["fds"], mg["fds"])})
        if "pack" not in skip:
            archive = os.path.join(args.out, "cluster.gtpack")
            limit = 2 * (set_bytes(a) + set_bytes(b)) + (64 << 20)
            pk = expect(timed([os.path.join(args.build, "bin", "gradtrace-pack"), a, b, "-o", archive, "--limit",
                               str(limit)]), {0}, f"the pack at {ranks} ranks")
            pk["archive_mb"] = os.path.getsize(archive) / 1e6
            os.remove(archive)
            runs.setdefault("pack", []).append(pk)
    row["params"] = params_of(rep) if os.path.exists(rep) else None
    row["runs"] = runs
    print(json.dumps(row), flush=True)
    if not args.keep and not args.reuse:
        shutil.rmtree(a, ignore_errors=True)
        shutil.rmtree(b, ignore_errors=True)
    return row


def params_of(report_path: str) -> int | None:
    try:
        r = json.load(open(report_path))
    except (OSError, ValueError):
        return None
    return len(r.get("params") or r.get("self_params") or [])


def cell(rs: list[dict] | None) -> str:
    if not rs:
        return "-"
    walls = sorted(r["wall"] for r in rs)
    w = f"{walls[0]:.2f}" if len(walls) == 1 else f"{walls[0]:.2f}-{walls[-1]:.2f}"
    best = min(rs, key=lambda r: r["wall"])
    fds = max(r.get("fds", 0) for r in rs)
    return (f"{w} s / {best['cpu']:.2f} s, {max(r['rss_mb'] for r in rs):.0f} MB, {fds} files"
            f" (load {best['load']:.1f})")


def markdown(rows: list[dict]) -> str:
    out = ["| ranks (dp x tp x pp), params | set MB (each) | write s | diff wall / CPU, RSS, open files |"
           " diff --threads 1 | --self B | 2 x --shard + --merge | pack (archive MB) | T1 / shard | answer |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        runs = r["runs"]
        speed = "-"
        if runs.get("diff_t1") and runs.get("shard"):
            speed = f"{min(x['wall'] for x in runs['diff_t1']) / min(x['wall'] for x in runs['shard']):.2f}"
        pack = cell(runs.get("pack"))
        if runs.get("pack"):
            pack += f" ({runs['pack'][0]['archive_mb']:.0f})"
        out.append(f"| {r['ranks']} ({r['dp']}x{r['tp']}x{r['pp']}), {r.get('params') or '?'} | {r['set_mb']:.0f} |"
                   f" {r['write']['wall']:.1f} | {cell(runs.get('diff'))} | {cell(runs.get('diff_t1'))} |"
                   f" {cell(runs.get('self'))} | {cell(runs.get('shard'))} | {pack} | {speed} |"
                   f" diff {r.get('diff_answer', '-')}; merge"
                   f" {r.get('merge_answer', '-')}; self {r.get('self_answer', '-')} |")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.exit(main())
