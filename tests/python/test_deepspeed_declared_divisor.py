"""The DeepSpeed adapter declares the divisor its release applies (BucketRecord.divisor, from the one
semantics table through _gtcodec.bucket_divisor), and gradtrace-diff --self measures the same one.

Real DeepSpeed (the installed release, tools/constraints.txt), CPU + gloo: a 2-rank ZeRO-2 run of
tools/repro/ds5248/run.py with sequence parallelism 2 and `loss / sp`. DeepSpeed's average_tensor
divides by world(dp group) / sp = 2 / 2 = 1 (since PR #4530), which `loss / sp` needs: --self exits 0
and every parameter's declared divisor equals its measured effective divisor, 1."""

import json
import subprocess
import sys

import pytest

import gradtrace
from conftest import BUILD, ROOT, deepspeed_env
from gradtrace.adapters.deepspeed_divisors import declared_divisor

RUNNER = ROOT / "tools" / "repro" / "ds5248" / "run.py"


@pytest.fixture(scope="module")
def zero2_sp2(tmp_path_factory):
    out = tmp_path_factory.mktemp("ds_declared") / "z2sp2"
    cmd = [sys.executable, str(RUNNER), "--out", str(out), "--timeout", "240", "--sp", "2", "--dp", "1",
           "--zero-stage", "2", "--loss", "loss-div-sp"]
    p = subprocess.run(cmd, env=deepspeed_env(), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return out


def test_post_reduce_records_declare_the_table_divisor(zero2_sp2):
    import deepspeed
    want = declared_divisor(deepspeed.__version__, "zero", 2, 2)
    assert want == 1.0  # the table's 0.19.8 row: ds-4530, group / sp
    seen = 0
    for reader in gradtrace.read_trace_set(zero2_sp2):
        for f in reader.frames():
            if f["type"] == "bucket" and f["phase"] == "POST_REDUCE":
                assert f["divisor"] == want
                seen += 1
            elif f["type"] == "bucket":
                assert f["divisor"] == 0.0  # PRE_REDUCE and FINAL declare nothing
    assert seen > 0


def test_self_check_measures_the_declared_divisor(zero2_sp2, tmp_path):
    report = tmp_path / "self.json"
    p = subprocess.run([str(BUILD / "bin" / "gradtrace-diff"), "--self", str(zero2_sp2), "--json", str(report)],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    rep = json.loads(report.read_text())
    assert rep["verdict"] == "ok" and rep["exit_code"] == 0
    params = rep["self_params"]
    assert len(params) == 29
    for q in params:
        assert q["verdict"] == "ok", q
        assert q["declared"] == 1.0 and q["divisor"] == pytest.approx(q["declared"], rel=1e-5), q
    assert not [f for f in rep["findings"] if f["kind"] == "divisor"]


def test_releases_outside_the_table_declare_nothing():
    assert declared_divisor("0.0.1", "zero", 2, 2) == 0.0
    # 0.12.6 divides buckets holding expert parameters twice (before PR #4957): the table says so.
    assert declared_divisor("0.12.6", "zero", 2, 1, True) == 4.0
    assert declared_divisor("0.12.6", "zero", 2, 1, False) == 2.0
