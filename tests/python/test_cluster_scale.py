"""A 10,000-rank trace set under an open-file limit of 256 (issue 42 item 1): diffed, self-checked, sharded and
merged, verified and packed, each command a process whose RLIMIT_NOFILE is 256 (the reader pool keeps 64 open).

The set is a simulated Megatron run (gradtrace-synth --llama70b, tests/diff/synth_cluster.h) of a small
Llama-shaped model (5 layers, hidden 16) over dp 500 x tp 4 x pp 5, stats mode, 79 MB: B's last stage divides its
reductions by dp/2 = 250 instead of 500. Its RunInfo lists no world group (10,000 members on each of 10,000 ranks
would make the set 4x larger; the loader stores a group listed by many ranks once: TraceSetGroups in
tests/diff/reader_cache_test.cc).

Before this issue: --self on 10,000 ranks failed at rank-01018 under 1,024 open files; with the limit raised, a
diff of a 10,000-rank set held 6.3 GB (a zstd context, a parameter table and the groups per reader and rank) and
--self took 41 s (its evidence passes walked all 10,000 ranks once per member). Peak RSS is asserted with room to
spare, as a bound against that regression; timings are the benchmark's (tools/bench/cluster_bench.py)."""

import json
import os
import resource
import subprocess

import pytest

from conftest import BUILD

BIN = BUILD / "bin"
LIMIT = 256
LAYOUT = ["--llama70b", "--dp", "500", "--tp", "4", "--pp", "5", "--layers", "5", "--hidden", "16", "--intermediate",
          "32", "--kv", "8", "--vocab", "32", "--capture", "stats", "--threads", "2", "--no-world-group"]
# Peak RSS bound per command (measured 245 MB for the diff, 260 MB for --self after the fix).
RSS_BOUND_KB = 700 * 1024


def run_measured(cmd, cwd):
    """`cmd` under LIMIT open files: (exit code, output, peak RSS in KB of that process alone, from wait4)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: limit, redirect, exec
        try:
            os.chdir(cwd)
            resource.setrlimit(resource.RLIMIT_NOFILE, (LIMIT, LIMIT))
            os.dup2(w, 1)
            os.dup2(w, 2)
            os.close(r)
            os.execv(str(cmd[0]), [str(c) for c in cmd])
        finally:
            os._exit(127)
    os.close(w)
    chunks = []
    with os.fdopen(r, "r", errors="replace") as f:
        for chunk in iter(lambda: f.read(65536), ""):
            chunks.append(chunk)
    _, status, usage = os.wait4(pid, 0)
    return os.waitstatus_to_exitcode(status), "".join(chunks), usage.ru_maxrss


@pytest.fixture(scope="module")
def sets(tmp_path_factory):
    root = tmp_path_factory.mktemp("cluster-10k")
    for name, extra in (("ref", []), ("bug", ["--planted-stage", "4"])):
        p = subprocess.run([str(BIN / "gradtrace-synth"), name] + LAYOUT + ["--run-id", name] + extra, cwd=root,
                           capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, p.stderr
        assert len(list((root / name).glob("rank-*.gtrace"))) == 10000
    return root


LAST_STAGE = 11  # layer 4's 9 parameters, the final norm and lm_head


def test_diff_and_self_of_10000_ranks_under_256_open_files(sets):
    code, out, rss = run_measured([BIN / "gradtrace-diff", "ref", "bug", "--json", "diff.json"], sets)
    assert code == 1, out[-3000:]
    report = json.loads((sets / "diff.json").read_text())
    scaled = [p for p in report["params"] if p["verdict"] == "scaled"]
    assert len(scaled) == LAST_STAGE and len(report["params"]) == 48
    assert all(abs(p["scale"] - 2.0) < 1e-9 for p in scaled), [p["scale"] for p in scaled]
    assert {p["name"] for p in scaled} >= {"model.norm.weight", "lm_head.weight"}
    assert all(p["verdict"] == "match" for p in report["params"] if p not in scaled)
    assert report["trace_a"]["world"] == 10000 and report["trace_b"]["world"] == 10000
    assert rss < RSS_BOUND_KB, f"the diff of 10,000 ranks held {rss} KB"

    code, out, rss = run_measured([BIN / "gradtrace-diff", "--self", "bug", "--json", "self.json"], sets)
    assert code == 1, out[-3000:]
    report = json.loads((sets / "self.json").read_text())
    divisors = sorted(round(p["divisor"], 6) for p in report["self_params"])
    assert divisors == [250.0] * LAST_STAGE + [500.0] * (48 - LAST_STAGE), divisors
    assert rss < RSS_BOUND_KB, f"--self of 10,000 ranks held {rss} KB"
    assert "Too many open files" not in out


def test_shards_merge_verify_and_pack_of_10000_ranks_under_256_open_files(sets):
    for k in (0, 1):
        code, out, _ = run_measured(
            [BIN / "gradtrace-diff", "ref", "bug", "--shard", f"{k}/2", "--json", f"part-{k}.json"], sets)
        assert code in (0, 1), out[-3000:]
    code, out, _ = run_measured([BIN / "gradtrace-diff", "--merge", "part-0.json", "part-1.json"], sets)
    assert code == 1 and "B/A = 2.000 for 11 of 48 parameters" in out, out[-3000:]

    code, out, _ = run_measured([BIN / "gradtrace-inspect", "--verify", "bug"], sets)
    assert code == 0, out[-3000:]
    assert out.count("verify       ok") == 10000 and "set          ok: bug: 10000 ranks of run 'bug'" in out
    # a group of 500 ranks is shown by its ends and its size, not 500 numbers on each of 10,000 files
    assert "group        dp     [0, 4, 8, 12, 16, 20, 24, 28, ..., 1968, 1972, 1976, 1980, 1984, 1988, 1992, 1996] " \
           "(500 ranks)\n" in out

    code, out, rss = run_measured([BIN / "gradtrace-pack", "ref", "bug", "-o", "bug.gtpack", "--limit", "200M"], sets)
    assert code == 0, out[-3000:]
    assert rss < RSS_BOUND_KB, f"the pack of 2 x 10,000 ranks held {rss} KB"
    # the archive's 20,000 members, read in place through the same pool
    code, out, _ = run_measured([BIN / "gradtrace-diff", "bug.gtpack:a", "bug.gtpack:b"], sets)
    assert code == 1 and "B/A = 2.000 for 11 of 48 parameters" in out, out[-3000:]
