"""Cluster-sized trace sets under an ordinary open-file limit (issue 42 item 1): a 600-rank stats set (gradtrace-synth,
dp 600) diffed against itself, --self checked, sharded and merged, verified and packed, every command in a process
whose RLIMIT_NOFILE is 64. Before the rank files were opened on demand (proto/file_pool.h), --self of 2,000 ranks
failed at rank-00138 under a limit of 256 ("cannot open: Too many open files"): every reader kept its file open."""

import resource
import subprocess

import pytest

from conftest import BUILD

BIN = BUILD / "bin"
LIMIT = 64


def limited(cmd, cwd):
    """`cmd` run with at most LIMIT open files: (exit code, stdout + stderr)."""
    def lower():
        resource.setrlimit(resource.RLIMIT_NOFILE, (LIMIT, LIMIT))

    p = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, timeout=300, preexec_fn=lower)
    return p.returncode, p.stdout + p.stderr


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    root = tmp_path_factory.mktemp("open-files")
    p = subprocess.run([str(BIN / "gradtrace-synth"), "s600", "--dp", "600", "--capture", "stats", "--run-id", "s600"],
                       cwd=root, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert len(list((root / "s600").glob("rank-*.gtrace"))) == 600
    return root


def test_diff_self_and_verify_of_600_ranks_under_64_open_files(big):
    code, out = limited([BIN / "gradtrace-diff", "s600", "s600"], big)
    assert code == 0 and "Verdict: match -- all 14 parameters match" in out, out[-2000:]
    code, out = limited([BIN / "gradtrace-diff", "--self", "s600"], big)
    assert code == 0 and "effective divisor 600.000 = group size for all 14 parameters" in out, out[-2000:]
    code, out = limited([BIN / "gradtrace-inspect", "--verify", "s600"], big)
    assert code == 0 and "Too many open files" not in out, out[-2000:]


def test_shards_merge_and_pack_of_600_ranks_under_64_open_files(big):
    for k in (0, 1):
        code, out = limited([BIN / "gradtrace-diff", "s600", "s600", "--shard", f"{k}/2", "--json", f"part-{k}.json"], big)
        assert code == 0, out[-2000:]
    code, out = limited([BIN / "gradtrace-diff", "--merge", "part-0.json", "part-1.json"], big)
    assert code == 0 and "all 14 parameters match" in out, out[-2000:]
    code, out = limited([BIN / "gradtrace-pack", "s600", "s600", "-o", "bug.gtpack"], big)
    assert code == 0 and "match" in out, out[-2000:]
    # the archive's 1,200 members are read through one file each, as many as the pool allows at once
    code, out = limited([BIN / "gradtrace-diff", "bug.gtpack:a", "bug.gtpack:b"], big)
    assert code == 0 and "all 14 parameters match" in out, out[-2000:]
