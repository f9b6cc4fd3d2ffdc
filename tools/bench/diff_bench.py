#!/usr/bin/env python3
"""gradtrace-diff against its baselines, in one run (issue 12, item 1).

    .venv/bin/python tools/bench/diff_bench.py [--quick] [--ranks 1,4,16] [--dtypes fp32,bf16]
        [--out DIR] [--json F] [--markdown F] [--repeat 3] [--capture]

For every (ranks, dtype) it makes a trace pair A/B with gradtrace-train (cached under --out, keyed by
the command), then measures on the bytes of one comparison -- the FINAL BucketRecord frames of the
first step, every rank, both sides:

  diff     `gradtrace-diff A B --json F` at the default thread count and at --threads 1
           (wall, user+sys CPU, peak RSS of that process alone, via wait4)
  zstd -d  the same compressed payloads (codec-1 frames: one zstd frame each) concatenated into one
           .zst per side, `zstd -d -c A.zst B.zst > /dev/null`
  numpy    the same FINAL gradients from uncompressed .npz, scale <a,b>/<a,a> and residual
           ||b - s a|| / ||b|| per parameter and each rank's replica disagreement with rank 0, in
           float64, in a fresh interpreter (startup and loading counted)
  memory   the diff's peak RSS against the largest parameter (numel x dtype bytes, from RunInfo)
  write    (1-rank pairs) the FINAL slices byte-shuffled as the codec does (FORMAT.md 4.6), timed
           through `zstd -1/-3 -T1` and through the codec's own writer (gradtrace.TraceWriter,
           levels 1 and 3), next to the trace's stored size

Every timing is the best (lowest wall) of --repeat runs; peak RSS is the largest of them. Results
go to stdout (tables), --json and --markdown (the machine included); progress to stderr.
See tools/bench/README.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import platform
import shutil
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Goals of issue 24 item 1 that this benchmark checks (ratios; see the table legend). Issue 12's 10x over
# numpy is retired (it would be faster than decompressing the trace alone); numpy/diff is still shown.
GOAL_VS_ZSTD = 1.0  # diff's wall time at most `zstd -d`'s on the same bytes (all cores)
GOAL_CPU_VS_ZSTD = 1.5  # diff's CPU time at most 1.5x zstd's
GOAL_RSS_PER_PARAM = 3.0  # diff peak memory at most 3x the largest parameter (issue 12)

# Models. "23m" is the earlier measurement's model (issue 12): 23M parameters, a step of seconds.
# "5m" stands in at 16 ranks by default: 16 processes of the 23M model on a 2-core machine take
# minutes per step and 2 x 16 x 0.5 GB of traces per dtype (--full16 uses 23m there too).
MODELS = {
    "tiny": [],  # gradtrace-train's defaults: 2 layers, hidden 64, vocab 128, seq 32
    "5m": ["--layers", "4", "--hidden", "256", "--heads", "4", "--vocab", "4096", "--seq-len", "256"],
    "23m": ["--layers", "6", "--hidden", "512", "--heads", "8", "--vocab", "8192", "--seq-len", "256"],
}
BASE_BATCH = 4
STEPS = 2
# B differs from A by masking a quarter of the labels: same model, weights and tokens, so the
# parameter tables match, and every gradient differs by more than a scale factor.
B_EXTRA = ["--ignore-frac", "0.25"]

FRAME_HEADER = struct.Struct("<IIIBBH")  # stored_len raw_len crc type codec reserved (FORMAT.md 3)
CODEC_NONE, CODEC_ZSTD = 0, 1
MB = 1e6

# The numpy baseline, timed in a fresh interpreter: everything the diff's answer needs, per parameter.
NUMPY_BASELINE = r'''
import json, sys, numpy as np
a, b = np.load(sys.argv[1]), np.load(sys.argv[2])
wide = lambda x: ((x.astype(np.uint32) << 16).view(np.float32) if x.dtype == np.uint16 else x).astype(np.float64)
names, ranks = sorted({k.rsplit("@", 1)[0] for k in a.files}), sorted({int(k.rsplit("@", 1)[1]) for k in a.files})
worst = {"residual": 0.0, "replica": 0.0}
for name in names:
    x, y = wide(a[f"{name}@0"]), wide(b[f"{name}@0"])
    for side, ref in ((a, x), (b, y)):
        for r in ranks[1:]:
            d = np.linalg.norm(wide(side[f"{name}@{r}"]) - ref) / (np.linalg.norm(ref) or 1)
            worst["replica"] = max(worst["replica"], d)
    s = (x @ y) / (x @ x)
    worst["residual"] = max(worst["residual"], np.linalg.norm(y - s * x) / np.linalg.norm(y))
print(json.dumps({"params": len(names), "ranks": len(ranks), **{k: float(v) for k, v in worst.items()}}))
'''


def log(msg: str) -> None:
    print(f"diff_bench: {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- machine and timing


def machine_info() -> dict:
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        pass
    mem_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    zstd = shutil.which("zstd")
    zstd_version = None
    if zstd:
        banner = subprocess.run([zstd, "-V"], capture_output=True, text=True).stdout
        words = [w.rstrip(",") for w in banner.split()]
        zstd_version = "zstd " + next((w for w in words if w.startswith("v") and w[1:2].isdigit()), "?")
    head = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                           text=True)
    return {
        "nproc": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)),
        "cpu_model": cpu or platform.processor(),
        "memory_gib": round(mem_gb, 1),
        "loadavg_start": [round(x, 2) for x in os.getloadavg()],
        "python": platform.python_version(),
        "numpy": np.__version__,
        "zstd": zstd_version,
        "git": head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else ""),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
    }


@dataclasses.dataclass
class Timing:
    wall_s: float
    cpu_s: float  # user + sys of the process (and its children, none here)
    peak_rss_mb: float  # largest over the repeats
    runs: int
    walls: list


# Peak RSS comes from /usr/bin/time, not from our own wait4: Linux folds the RSS of the mm a process
# had before exec (a fork or vfork of this Python process, tens of MB) into its ru_maxrss, so only a
# child forked by a small process reports its own peak. CPU and wall time come from here (wait4 of
# /usr/bin/time covers its reaped child, to the microsecond).
GNU_TIME = "/usr/bin/time" if os.access("/usr/bin/time", os.X_OK) else None


def run_once(cmd: list[str], stdout=subprocess.DEVNULL, stderr_path: str | None = None) -> tuple[float, float, float]:
    """(wall s, user+sys s, peak RSS MB) of one run of `cmd`. Exit 0 and 1 both pass (gradtrace-diff
    exits 1 when it finds differences); anything else raises."""
    err = open(stderr_path, "wb") if stderr_path else subprocess.DEVNULL
    rss_file = tempfile.NamedTemporaryFile("r", prefix="diff_bench-rss-", delete=False)
    rss_file.close()
    full = [GNU_TIME, "-f", "%M", "-o", rss_file.name, *cmd] if GNU_TIME else cmd
    try:
        t0 = time.perf_counter()
        p = subprocess.Popen(full, stdout=stdout, stderr=err)
        _, status, ru = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t0
        p.returncode = os.waitstatus_to_exitcode(status)
        with open(rss_file.name) as f:
            reported = f.read().split()
    finally:
        os.remove(rss_file.name)
        if stderr_path:
            err.close()
    if p.returncode not in (0, 1):
        tail = open(stderr_path, errors="replace").read()[-2000:] if stderr_path else ""
        raise RuntimeError(f"{' '.join(cmd)} exited {p.returncode}\n{tail}")
    rss_kib = int(reported[-1]) if GNU_TIME and reported and reported[-1].isdigit() else ru.ru_maxrss
    return wall, ru.ru_utime + ru.ru_stime, rss_kib * 1024 / MB


def best_of(cmd: list[str], repeat: int, **kw) -> Timing:
    runs = [run_once(cmd, **kw) for _ in range(repeat)]
    best = min(runs, key=lambda r: r[0])
    return Timing(best[0], best[1], max(r[2] for r in runs), repeat, [round(r[0], 3) for r in runs])


# ---------------------------------------------------------------- trace pairs


@dataclasses.dataclass
class Case:
    model: str
    ranks: int
    dtype: str
    a_cmd: list  # gradtrace-train arguments without --out
    b_cmd: list

    @property
    def label(self) -> str:
        return f"{self.model} {self.dtype} x{self.ranks}"


def plan_cases(args) -> list[Case]:
    cases = []
    for ranks in args.ranks:
        if args.quick:
            model = "tiny"
        elif ranks >= 16 and not args.full16:
            model = "5m"
        else:
            model = "23m"
        for dtype in args.dtypes:
            # gradtrace-train splits the global batch over dp: it must be a multiple of the ranks.
            batch = max(BASE_BATCH, ranks)
            a = ["--nproc", str(ranks), "--dp", str(ranks), "--sp", "1", "--scaling", "mean", "--loss", "local-mean",
                 "--steps", str(STEPS), "--batch", str(batch), "--dtype", dtype, "--capture", "full",
                 "--timeout", "900", *MODELS[model]]
            cases.append(Case(model, ranks, dtype, a, a + B_EXTRA))
    return cases


def trace_dir_for(args, train_args: list[str], format_version: tuple) -> str:
    """Generates the trace set of `train_args` once; later runs find it by the hash of the command and of the
    trace format the build writes (a 1.5 trace holds no references: not what a 1.6 build's diff reads)."""
    key = hashlib.sha1(json.dumps([train_args, list(format_version)]).encode()).hexdigest()[:12]
    d = os.path.join(args.out, "traces", key)
    done = os.path.join(d, "command.json")
    if os.path.exists(done):
        return d
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    cmd = [args.bin("gradtrace-train"), *train_args, "--out", d]
    log(f"generating traces: {' '.join(cmd)}")
    t0 = time.perf_counter()
    p = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"gradtrace-train exited {p.returncode}:\n{p.stderr[-3000:]}")
    with open(done, "w") as f:  # written last: its presence marks a complete trace set
        json.dump({"args": train_args, "seconds": round(time.perf_counter() - t0, 1)}, f)
    return d


def trace_files(d: str) -> list[str]:
    return sorted(os.path.join(d, n) for n in os.listdir(d) if n.startswith("rank-") and n.endswith(".gtrace"))


def dir_bytes(d: str) -> int:
    return sum(os.path.getsize(p) for p in trace_files(d))


# ---------------------------------------------------------------- the frames a comparison reads


@dataclasses.dataclass
class FrameRef:
    path: str
    offset: int
    stored_len: int
    raw_len: int
    codec: int
    target: bool = False  # the frame a FINAL reference names (format 1.6): decompressed, its values the FINAL's


def final_steps(gt, d: str) -> set[int]:
    index = gt.TraceReader(trace_files(d)[0]).index()
    return {e["step"] for e in index if e["type"] == "bucket" and e["phase"] == "FINAL"}


def final_frames(gt, d: str, step: int) -> list[FrameRef]:
    """Every FINAL BucketRecord frame of `step` in every rank file: what gradtrace-diff reads; for a record by
    reference (format 1.6: a frame with no values of its own, a few KiB at most), the frame it names too."""
    out = []
    for path in trace_files(d):
        reader = gt.TraceReader(path)
        if not reader.has_index:
            raise RuntimeError(f"{path}: no index (truncated?)")
        with open(path, "rb") as f:
            def frame_ref(offset, target=False):
                f.seek(offset)
                stored, raw, _crc, ftype, codec, _ = FRAME_HEADER.unpack(f.read(FRAME_HEADER.size))
                assert ftype == 3, f"{path}: offset {offset}: index says bucket, header says type {ftype}"
                return FrameRef(path, offset, stored, raw, codec, target)

            for e in reader.index():
                if e["type"] != "bucket" or e["phase"] != "FINAL" or e["step"] != step:
                    continue
                out.append(frame_ref(e["offset"]))
                target = reader.frame_at(e["offset"])["values_from"] if out[-1].raw_len < (1 << 20) else 0
                if target:
                    out.append(frame_ref(target, True))
    return out


def write_zst(frames: list[FrameRef], dest: str) -> None:
    """Concatenates the codec-1 payloads (one zstd frame each: a valid multi-frame zstd stream)."""
    with open(dest + ".part", "wb") as out:
        for fr in frames:
            if fr.codec != CODEC_ZSTD:
                continue
            with open(fr.path, "rb") as f:
                f.seek(fr.offset + FRAME_HEADER.size)
                out.write(f.read(fr.stored_len))
    os.replace(dest + ".part", dest)


def final_values(gt, frames: list[FrameRef]) -> dict[str, np.ndarray]:
    """{"name@rank": values in the recorded dtype (bf16 as uint16 bits)} of the FINAL frames.
    Chunks are placed by their slices' own offsets, so no merging is needed."""
    arrays = {}
    readers = {}
    for fr in frames:
        if fr.target:  # its values are the reference's, read with it
            continue
        if fr.path not in readers:
            readers[fr.path] = gt.TraceReader(fr.path)
        reader = readers[fr.path]
        params = reader.run_info["params"]
        frame = reader.frame_at(fr.offset)
        for s in frame["slices"]:
            if s["mode"] != "full":
                raise RuntimeError(f"{fr.path}: FINAL slice of mode {s['mode']}: the benchmark needs --capture full")
            p = params[s["param_id"]]
            key = f"{p['name']}@{reader.rank}"
            if key not in arrays:
                arrays[key] = np.zeros(p["numel"], dtype=gt.codec.dtypes.NUMPY_DTYPES[s["dtype"]])
            arrays[key][s["offset"]:s["offset"] + s["count"]] = s["values"]
    return arrays


def shuffled_bytes(gt, d: str, frames: list[FrameRef]) -> tuple[bytes, list[dict]]:
    """Rank 0's FINAL full slices byte-shuffled per slice as the codec stores them (FORMAT.md 4.6:
    byte j*n + i is element i's byte j), and the slices themselves for the codec's writer."""
    rank0 = trace_files(d)[0]
    reader = gt.TraceReader(rank0)
    parts, slices = [], []
    for fr in frames:
        if fr.path != rank0 or fr.target:
            continue
        for s in reader.frame_at(fr.offset)["slices"]:
            v = np.ascontiguousarray(s["values"])
            parts.append(v.view(np.uint8).reshape(v.size, v.itemsize).T.tobytes())
            slices.append({"param_id": s["param_id"], "offset": s["offset"], "values": v, "dtype": s["dtype"]})
    return b"".join(parts), slices


# ---------------------------------------------------------------- one case


def bench_case(args, gt, case: Case) -> dict:
    a_dir = trace_dir_for(args, case.a_cmd, gt.FORMAT_VERSION)
    b_dir = trace_dir_for(args, case.b_cmd, gt.FORMAT_VERSION)
    common = final_steps(gt, a_dir) & final_steps(gt, b_dir)
    if not common:
        raise RuntimeError(f"{case.label}: A and B share no step with FINAL records")
    step = min(common)  # one step: the first both sets recorded (gradtrace-diff --step; its default is every step)
    work = os.path.join(args.out, "work", os.path.basename(a_dir) + "-" + os.path.basename(b_dir))
    os.makedirs(work, exist_ok=True)
    frames = {"A": final_frames(gt, a_dir, step), "B": final_frames(gt, b_dir, step)}

    row = pair_facts(gt, case, a_dir, b_dir, step, frames)
    report = time_diff(args, case, a_dir, b_dir, work, row, step)
    if args.zstd:
        time_zstd_d(args, case, frames, work, row)
    time_numpy(args, gt, case, {"A": a_dir, "B": b_dir}, frames, work, report, row)
    if case.ranks == 1:
        row["write"] = bench_write(args, gt, case, a_dir, frames["A"], work)
    derive_ratios(row)
    return row


def pair_facts(gt, case: Case, a_dir: str, b_dir: str, step: int, frames: dict) -> dict:
    """Sizes of the pair and of what one comparison reads."""
    params = gt.TraceReader(trace_files(a_dir)[0]).run_info["params"]
    every = [fr for fs in frames.values() for fr in fs]
    raw_frames = [fr for fr in every if fr.codec == CODEC_NONE]
    return {
        "case": case.label, "model": case.model, "dtype": case.dtype, "ranks": case.ranks, "step": step,
        "params": len(params), "numel": sum(p["numel"] for p in params),
        "largest_param_mb": max(p["numel"] * gt.codec.dtypes.NUMPY_DTYPES[p["dtype"]].itemsize for p in params) / MB,
        "a_mb": dir_bytes(a_dir) / MB, "b_mb": dir_bytes(b_dir) / MB,
        "final_frames": sum(not fr.target for fr in every),
        "referenced_frames": sum(fr.target for fr in every),  # format 1.6: FINAL's values in earlier frames
        "compared_zstd_mb": sum(fr.stored_len for fr in every if fr.codec == CODEC_ZSTD) / MB,
        "compared_raw_mb": sum(fr.raw_len for fr in every) / MB,
        "codec0_frames": len(raw_frames), "codec0_mb": sum(fr.stored_len for fr in raw_frames) / MB,
        "a_cmd": "gradtrace-train " + " ".join(case.a_cmd), "b_cmd": "gradtrace-train " + " ".join(case.b_cmd),
        "a_dir": a_dir, "b_dir": b_dir,
    }


def time_diff(args, case: Case, a_dir: str, b_dir: str, work: str, row: dict, step: int) -> dict:
    """gradtrace-diff of `step` (the bytes the baselines measure; without --step the diff compares every
    common step) at each thread count asked for; returns its JSON report."""
    report = os.path.join(work, "diff.json")
    row["diff"] = {}
    for threads in args.threads:
        cmd = [args.bin("gradtrace-diff"), a_dir, b_dir, "--json", report, "--step", str(step)]
        if threads:
            cmd += ["--threads", str(threads)]
        log(f"{case.label}: {' '.join(cmd)} (best of {args.repeat})")
        t = best_of(cmd, args.repeat, stderr_path=os.path.join(work, "diff.stderr"))
        row["diff"][str(threads or "default")] = dataclasses.asdict(t)
    with open(report) as f:
        rep = json.load(f)
    row["diff_verdict"], row["diff_exit"] = rep.get("verdict"), rep.get("exit_code")
    return rep


def time_zstd_d(args, case: Case, frames: dict, work: str, row: dict) -> None:
    """zstd -d on exactly the compressed payloads the diff reads."""
    zst = [os.path.join(work, f"final-{side}.zst") for side in frames]
    for side, path in zip(frames, zst):
        if not os.path.exists(path):
            write_zst(frames[side], path)
    log(f"{case.label}: zstd -d -c {' '.join(zst)} (best of {args.repeat})")
    row["zstd_d"] = dataclasses.asdict(best_of([args.zstd, "-q", "-d", "-c", *zst], args.repeat))


def time_numpy(args, gt, case: Case, dirs: dict, frames: dict, work: str, report: dict, row: dict) -> None:
    """numpy on the same FINAL gradients from uncompressed .npz (exported once, untimed), and a check
    that it answers what the diff answered."""
    npz = [os.path.join(work, f"final-{side}.npz") for side in frames]
    for side, path in zip(frames, npz):
        if not os.path.exists(path):
            log(f"{case.label}: exporting {side}'s FINAL gradients to {path}")
            np.savez(path + ".part.npz", **final_values(gt, frames[side]))
            os.replace(path + ".part.npz", path)
    row["npz_mb"] = sum(os.path.getsize(p) for p in npz) / MB
    script = os.path.join(args.out, "numpy_baseline.py")
    with open(script, "w") as f:
        f.write(NUMPY_BASELINE.lstrip())
    log(f"{case.label}: numpy baseline (best of {args.repeat})")
    answer = os.path.join(work, "numpy.out")
    with open(answer, "wb") as out:
        row["numpy"] = dataclasses.asdict(best_of([sys.executable, script, *npz], args.repeat, stdout=out))
    with open(answer) as f:
        row["numpy_answer"] = json.loads(f.read().splitlines()[-1])
    diff_worst = max((p["residual"] for p in report["params"] if p.get("residual") is not None), default=None)
    mine = row["numpy_answer"]["residual"]
    row["numpy_agrees"] = diff_worst is not None and abs(mine - diff_worst) <= 1e-9 * max(1.0, abs(diff_worst))
    if not row["numpy_agrees"]:
        log(f"{case.label}: numpy's worst residual {mine} differs from the diff's {diff_worst}")


def bench_write(args, gt, case: Case, a_dir: str, frames: list[FrameRef], work: str) -> dict:
    """Trace size and write rate: the codec's writer against the zstd CLI on the same shuffled bytes."""
    payload, slices = shuffled_bytes(gt, a_dir, frames)
    res = {"payload_mb": len(payload) / MB,
           "trace_stored_mb": sum(fr.stored_len for fr in frames) / MB,  # what gradtrace-train wrote (level 3)
           "trace_raw_mb": sum(fr.raw_len for fr in frames) / MB}
    src = os.path.join(work, "final-A.shuffled")
    with open(src, "wb") as f:
        f.write(payload)
    dst = os.path.join(work, "final-A.shuffled.zst")
    params = gt.TraceReader(trace_files(a_dir)[0]).run_info["params"]
    run = {"producer": "diff_bench", "params": [{k: p[k] for k in ("name", "shape", "dtype")} for p in params]}
    for level in (1, 3):
        if args.zstd:
            log(f"{case.label}: zstd -{level} -T1 on {len(payload) / MB:.1f} MB of shuffled FINAL gradients")
            t = best_of([args.zstd, "-q", "-f", f"-{level}", "-T1", src, "-o", dst], args.repeat)
            res[f"zstd_{level}"] = {"s": t.wall_s, "mb": os.path.getsize(dst) / MB,
                                    "mb_per_s": len(payload) / MB / t.wall_s}
        # The codec's writer (shuffle + zstd + CRC32C + protobuf + chunking), one thread, same slices.
        best = None
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            with gt.TraceWriter(dst, run, zstd_level=level, overwrite=True) as w:  # zstd's output, the last repeat
                w.write_bucket({"step": 0, "phase": "FINAL", "slices": slices})
            s = time.perf_counter() - t0
            best = s if best is None else min(best, s)
        res[f"writer_{level}"] = {"s": best, "mb": os.path.getsize(dst) / MB, "mb_per_s": len(payload) / MB / best}
    os.remove(src)
    os.remove(dst)
    return res


def codec_bench(args) -> dict | None:
    """The codec's own write benchmark (synthetic N(0, 1e-3) fp32), when it was built."""
    path = args.bin("gradtrace-codec-bench")
    if not os.access(path, os.X_OK):
        return None
    log("gradtrace-codec-bench --benchmark_filter=BM_WriteFull")
    p = subprocess.run([path, "--benchmark_filter=BM_WriteFull", "--benchmark_format=json"], capture_output=True,
                       text=True)
    if p.returncode != 0:
        return {"error": p.stderr[-500:]}
    out = {}
    for b in json.loads(p.stdout)["benchmarks"]:
        level = b["name"].rsplit("/", 1)[-1]
        scale = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}[b.get("time_unit", "ns")]
        nbytes = b["bytes_per_second"] * b["cpu_time"] * scale  # bytes per iteration
        out[f"level_{level}"] = {"mb": nbytes / MB, "cpu_mb_per_s": b["bytes_per_second"] / MB,
                                 "wall_mb_per_s": nbytes / MB / (b["real_time"] * scale)}
    return out


def derive_ratios(row: dict) -> None:
    d = row["diff"]
    default = d.get("default") or next(iter(d.values()))
    one = d.get("1")
    row["diff_mb_per_s"] = row["compared_zstd_mb"] / default["wall_s"]
    row["speedup_threads"] = one["wall_s"] / default["wall_s"] if one and "default" in d else None
    if "zstd_d" in row:
        row["zstd_mb_per_s"] = row["compared_zstd_mb"] / row["zstd_d"]["wall_s"]
        row["vs_zstd"] = row["zstd_d"]["wall_s"] / default["wall_s"]  # diff speed / zstd speed
        row["cpu_vs_zstd"] = default["cpu_s"] / row["zstd_d"]["cpu_s"]  # diff CPU / zstd CPU
    row["vs_numpy"] = row["numpy"]["wall_s"] / default["wall_s"]
    row["rss_per_param"] = max(t["peak_rss_mb"] for t in d.values()) / row["largest_param_mb"]


# ---------------------------------------------------------------- output


def ok(value, goal, higher_is_better=True) -> str:
    if value is None:
        return "-"
    good = value >= goal if higher_is_better else value <= goal
    return f"{value:.2f}{'' if good else ' ✗'}"


def table(rows: list[dict], threads_default: int) -> tuple[list[str], list[list[str]]]:
    head = ["case", "params", "A+B MB", "compared MB (zstd)", f"diff s T={threads_default} wall/CPU",
            "diff s T=1 wall/CPU", "T1/T", "zstd -d s", "zstd MB/s", "diff MB/s",
            f"diff/zstd speed (≥{GOAL_VS_ZSTD:g})", f"diff/zstd CPU (≤{GOAL_CPU_VS_ZSTD:g})", "numpy s", "numpy/diff",
            "diff peak RSS MB",
            "largest param MB", f"RSS/param (≤{GOAL_RSS_PER_PARAM:g})", "verdict"]
    body = []
    for r in rows:
        d = r["diff"]
        default, one = d.get("default"), d.get("1")
        fmt = lambda t: f"{t['wall_s']:.2f} / {t['cpu_s']:.2f}" if t else "-"
        zs = r.get("zstd_d")
        body.append([
            r["case"], f"{r['numel'] / 1e6:.1f}M", f"{r['a_mb'] + r['b_mb']:.0f}",
            f"{r['compared_zstd_mb']:.1f}" + (f" (+{r['codec0_mb']:.1f} raw)" if r["codec0_frames"] else ""),
            fmt(default), fmt(one), f"{r['speedup_threads']:.2f}" if r["speedup_threads"] else "-",
            f"{zs['wall_s']:.2f}" if zs else "-", f"{r['zstd_mb_per_s']:.0f}" if zs else "-",
            f"{r['diff_mb_per_s']:.0f}", ok(r.get("vs_zstd"), GOAL_VS_ZSTD),
            ok(r.get("cpu_vs_zstd"), GOAL_CPU_VS_ZSTD, higher_is_better=False),
            f"{r['numpy']['wall_s']:.2f}" + ("" if r["numpy_agrees"] else " ≠"), f"{r['vs_numpy']:.2f}",
            f"{max(t['peak_rss_mb'] for t in d.values()):.0f}", f"{r['largest_param_mb']:.1f}",
            ok(r["rss_per_param"], GOAL_RSS_PER_PARAM, higher_is_better=False), f"{r['diff_verdict']}",
        ])
    return head, body


def write_table(rows: list[dict]) -> tuple[list[str], list[list[str]]]:
    head = ["case", "FINAL payload MB", "trace stored MB (level 3)", "zstd -1 -T1 MB / MB/s", "zstd -3 -T1 MB / MB/s",
            "codec writer L1 MB / MB/s", "codec writer L3 MB / MB/s"]
    body = []
    for r in rows:
        w = r.get("write")
        if not w:
            continue
        cell = lambda k: f"{w[k]['mb']:.1f} / {w[k]['mb_per_s']:.0f}" if k in w else "-"
        body.append([r["case"], f"{w['payload_mb']:.1f}", f"{w['trace_stored_mb']:.1f}", cell("zstd_1"), cell("zstd_3"),
                     cell("writer_1"), cell("writer_3")])
    return head, body


def text_table(head, body) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(head, *body)]
    line = lambda cells: "  ".join(str(c).ljust(w) for c, w in zip(cells, widths)).rstrip()
    return "\n".join([line(head), line(["-" * w for w in widths])] + [line(r) for r in body])


def md_table(head, body) -> str:
    return "\n".join(["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] +
                     ["| " + " | ".join(str(c) for c in r) + " |" for r in body])


def machine_line(m: dict) -> str:
    return (f"{m['nproc']} cores ({m['usable_cpus']} usable), {m['cpu_model']}, {m['memory_gib']} GiB; load average "
            f"{' '.join(map(str, m['loadavg_start']))} at start, "
            f"{' '.join(map(str, m.get('loadavg_end', [])))} at end; "
            f"gradtrace {m['git']}, {m['zstd'] or 'no zstd CLI'}, numpy {m['numpy']}; {m['date']}")


LEGEND = (
    "Best of {repeat} runs (lowest wall time; peak RSS the largest of the runs). MB = 10^6 bytes. "
    "compared MB: the stored zstd payloads of every FINAL frame of the compared step, all ranks, A and B: "
    "what both `zstd -d` and `gradtrace-diff` decompress (codec-0 frames, stored raw, counted apart). "
    "diff MB/s and zstd MB/s are that byte count over each tool's wall time; diff/zstd speed = zstd wall / diff wall; "
    "diff/zstd CPU = diff CPU / zstd CPU (user + sys; zstd -d is single-threaded). The diff reads every one of those "
    "bytes but decompresses a replica's frame only when its bytes differ from a frame it already decoded (data "
    "parallel ranks write byte-identical FINAL frames); zstd -d decompresses them all. "
    "numpy/diff = numpy wall / diff wall, no longer a goal (numpy: fresh interpreter, load both uncompressed .npz, scale, residual and "
    "replica disagreement per parameter in float64; ≠ marks a worst residual that differs from the diff's). "
    "RSS/param: the diff's peak RSS over the largest parameter (numel x dtype bytes). ✗: misses the goal. "
    "verdict: the diff's own (B masks 25% of labels, so `mismatch` is expected)."
)


def codec_line(codec: dict | None) -> str | None:
    if not codec or "error" in codec:
        return f"gradtrace-codec-bench failed: {codec['error']}" if codec else None
    levels = "; ".join(f"level {k.split('_')[1]}: {v['cpu_mb_per_s']:.0f} MB/s CPU, {v['wall_mb_per_s']:.0f} MB/s wall"
                       for k, v in sorted(codec.items()))
    return ("The codec's writer on synthetic gradients (`gradtrace-codec-bench --benchmark_filter=BM_WriteFull`: "
            f"8 x 16 MiB fp32 N(0, 1e-3), shuffle + zstd + CRC32C + fflush per frame): {levels}")


def emit(args, machine: dict, rows: list[dict], notes: list[str], codec: dict | None, capture: str | None) -> None:
    threads_default = machine["usable_cpus"]
    h, b = table(rows, threads_default)
    wh, wb = write_table(rows)
    legend = LEGEND.format(repeat=args.repeat)
    print(f"machine: {machine_line(machine)}")
    print(text_table(h, b))
    if wb:
        print("\ntrace size and write rate (rank 0's FINAL gradients, one thread):")
        print(text_table(wh, wb))
    if codec_line(codec):
        print(codec_line(codec))
    for n in notes:
        print(f"note: {n}")
    if capture:
        print("\ncapture overhead (tools/bench/capture_overhead):\n" + capture)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": machine, "notes": notes, "legend": legend, "rows": rows, "capture_overhead": capture,
                       "codec_bench": codec,
                       "goals": {"vs_zstd": GOAL_VS_ZSTD, "cpu_vs_zstd": GOAL_CPU_VS_ZSTD,
                                 "rss_per_param": GOAL_RSS_PER_PARAM}}, f, indent=1)
        log(f"wrote {args.json}")
    if args.markdown:
        parts = [f"Measured with `.venv/bin/python tools/bench/diff_bench.py {' '.join(args.argv)}` on: "
                 f"{machine_line(machine)}.", "", md_table(h, b), "", legend]
        if wb:
            parts += ["", "Trace size and write rate: rank 0's FINAL gradients of the 1-rank pairs, byte-shuffled per "
                      "slice as the codec stores them; `zstd -T1` on that file against the codec's own writer "
                      "(`gradtrace.TraceWriter`: shuffle, zstd, CRC32C, protobuf; one thread) on the same slices; MB/s "
                      "of uncompressed gradient bytes.", "", md_table(wh, wb)]
        if codec_line(codec):
            parts += ["", codec_line(codec) + "."]
        parts += [""] + [f"- {n}" for n in notes]
        if capture:
            parts += ["", "Capture overhead (`tools/bench/capture_overhead`):", "", "```", capture.rstrip(), "```"]
        with open(args.markdown, "w") as f:
            f.write("\n".join(parts).rstrip() + "\n")
        log(f"wrote {args.markdown}")


# ---------------------------------------------------------------- main


# --quick: gradtrace-train's default tiny model, one repeat of three steps.
CAPTURE_QUICK = ["--steps", "3", "--repeats", "1", "--model", "--layers 2"]


def capture_overhead(args) -> str | None:
    """Runs tools/bench/capture_overhead (off vs stats vs sketch:K vs full, 1 rank, fp32)."""
    path = os.path.join(ROOT, "tools", "bench", "capture_overhead")
    if os.path.exists(path):
        cmd = [sys.executable, path] + (CAPTURE_QUICK if args.quick else [])
        log(f"capture overhead: {' '.join(cmd)}")
        p = subprocess.run(cmd, capture_output=True, text=True)
        return p.stdout + (f"(exit {p.returncode}: {p.stderr[-1000:]})" if p.returncode else "")
    return None


def import_gradtrace(build: str):
    try:
        import gradtrace
    except ImportError:
        sys.path.insert(0, os.path.join(build, "python"))
        import gradtrace
    return gradtrace


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="tiny model (gradtrace-train's defaults): tests the script in a minute")
    ap.add_argument("--ranks", default="1,4,16", help="comma-separated rank counts (dp = ranks, sp = 1)")
    ap.add_argument("--dtypes", default="fp32,bf16", help="comma-separated parameter dtypes")
    ap.add_argument("--threads", default="0,1",
                    help="gradtrace-diff thread counts to time; 0 = its default (all cores) (default: 0,1, and 2 when "
                         "the machine has more than 2 cores)")
    ap.add_argument("--full16", action="store_true", help="use the 23M model at 16 ranks too (default there: 5M)")
    ap.add_argument("--repeat", type=int, default=3, help="runs per timing; the best is reported")
    ap.add_argument("--out", default=os.path.join(ROOT, "out", "bench"), help="trace cache and work files")
    ap.add_argument("--build", default=os.path.join(ROOT, "build"), help="build directory (bin/, python/)")
    ap.add_argument("--json", help="write the results as JSON to FILE")
    ap.add_argument("--markdown", help="write the tables as Markdown (for docs/dev/performance.md) to FILE")
    ap.add_argument("--capture", action="store_true", help="also run tools/bench/capture_overhead when it exists")
    args = ap.parse_args(argv)
    args.argv = argv
    args.ranks = [int(x) for x in args.ranks.split(",") if x]
    args.dtypes = [x for x in args.dtypes.split(",") if x]
    args.threads = [int(x) for x in args.threads.split(",") if x]
    if args.threads == [0, 1] and len(os.sched_getaffinity(0)) > 2:
        args.threads.append(2)
    args.out = os.path.abspath(args.out)
    args.bin = lambda name: os.path.join(args.build, "bin", name)
    args.zstd = shutil.which("zstd")
    return args


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    for name in ("gradtrace-train", "gradtrace-diff"):
        if not os.access(args.bin(name), os.X_OK):
            log(f"{args.bin(name)} is missing: build first (tools/setup, or cmake --build build)")
            return 2
    gt = import_gradtrace(args.build)
    os.makedirs(args.out, exist_ok=True)
    machine = machine_info()
    notes = []
    if not GNU_TIME:
        notes.append("no /usr/bin/time: peak RSS taken from wait4, which includes this Python process's RSS at fork")
    if not args.zstd:
        notes.append("no `zstd` CLI on PATH: zstd -d and the write-rate comparison were skipped "
                     "(add zstd to tools/setup's apt list)")
    if machine["loadavg_start"][0] > 0.5 * machine["usable_cpus"]:
        notes.append(f"load average {machine['loadavg_start'][0]} on {machine['usable_cpus']} cores at start: "
                     "other work shared the machine; timings are noisy upper bounds")
    cases = plan_cases(args)
    if any(c.model == "5m" for c in cases):
        notes.append("16 ranks use the 5M-parameter model (--layers 4 --hidden 256 --vocab 4096), not the 23M one: "
                     "16 training processes of the 23M model are too slow on a small machine (--full16 to override)")
    if args.quick:
        notes.append("--quick: gradtrace-train's default tiny model; timings say nothing about large traces")
    rows = []
    for case in cases:
        log(f"== {case.label}")
        rows.append(bench_case(args, gt, case))
    codec = codec_bench(args)
    capture = capture_overhead(args) if args.capture else None
    if args.capture and capture is None:
        notes.append("--capture: tools/bench/capture_overhead does not exist yet; capture overhead not measured")
    machine["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    emit(args, machine, rows, notes, codec, capture)
    return 0


if __name__ == "__main__":
    sys.exit(main())
