"""Issue 24 item 2: gradtrace-diff's memory is bounded by frames, not parameters.

Writes A and B holding one fp32 parameter of 1 GiB (268,435,456 elements, B = 2 x A; gradtrace-synth
--big-param writes it chunk by chunk), diffs them with --json on 2 threads and checks the answer (scaled,
B/A = 2.000 over every element) and the diff's peak RSS, measured by wait4 on the diff process alone:

    cap = 256 MiB + threads x 3 x 4 MiB

256 MiB for the process, the window buffers (2 sides x 4 Mi elements x (4-byte value + 2-byte stamp), and a
rank buffer) and the kept boundary frames; per thread, a frame in flight is 4 MiB stored, 4 MiB decompressed
and the parsed copy (FORMAT.md 7: kChunkTarget). The whole-parameter path needed 2.6 GB here.

Usage: big_param_test.py GRADTRACE_DIFF GRADTRACE_SYNTH [NUMEL]
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

MIB = 1 << 20
THREADS = 2
CAP = 256 * MIB + THREADS * 3 * 4 * MIB


def run(cmd):
    """Runs cmd; returns (exit code, wall seconds, peak RSS bytes, user+sys CPU seconds) of that process."""
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, time.monotonic() - start, usage.ru_maxrss * 1024, usage.ru_utime + usage.ru_stime


def main():
    diff, synth = sys.argv[1], sys.argv[2]
    numel = int(sys.argv[3]) if len(sys.argv) > 3 else 1 << 28
    work = tempfile.mkdtemp(prefix="gradtrace_big_param.")
    try:
        a, b, report = (os.path.join(work, n) for n in ("a", "b", "report.json"))
        for out, factor in ((a, "1"), (b, "2")):
            code, wall, _, _ = run([synth, out, "--big-param", str(numel), "--big-factor", factor])
            assert code == 0, f"gradtrace-synth {out}: exit {code}"
            print(f"wrote {out} in {wall:.1f} s")
        code, wall, rss, cpu = run([diff, a, b, "--json", report, "--threads", str(THREADS)])
        with open("/proc/loadavg") as f:
            load = f.read().split()[0]
        print(f"gradtrace-diff: exit {code}, {wall:.1f} s wall, {cpu:.1f} s CPU, peak RSS {rss / MIB:.0f} MiB "
              f"(cap {CAP / MIB:.0f} MiB), load {load}")
        assert code == 1, f"exit {code}, expected 1 (scaled)"
        with open(report) as f:
            r = json.load(f)
        p = r["params"][0]
        assert (p["name"], p["verdict"], p["basis"], p["compared"]) == ("big.weight", "scaled", "full", numel), p
        assert p["scale"] == 2.0 and p["residual"] == 0.0, p
        assert r["groups"][0]["scale"] == 2.0 and r["groups"][0]["count"] == 1, r["groups"]
        assert rss <= CAP, f"peak RSS {rss / MIB:.0f} MiB over the cap {CAP / MIB:.0f} MiB"
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("ok")


if __name__ == "__main__":
    main()
