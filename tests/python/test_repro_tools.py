"""The bookkeeping of tools/repro/ds5248 (checks.py, emulation.py, tables.py) on real gradtrace-train traces:
the effective divisor of a reduction, bucket divisors with and without expert parameters (how MoE cells
compare emulation and real DeepSpeed), and the emulation summary table.

gradtrace-train --scaling deepspeed@0.13.0 divides buckets holding expert parameters twice (the PR #4957
bug): at dp=2 their effective divisor is 4 and the dense buckets' is 2; deepspeed@0.13.1 gives 2 and 2.
"""

import sys

import pytest

from conftest import ROOT, train_small
sys.path.insert(0, str(ROOT / "tools" / "repro" / "ds5248"))

import checks  # noqa: E402
import emulation  # noqa: E402
import tables  # noqa: E402

@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    d = tmp_path_factory.mktemp("repro_tools")
    common = ["--nproc", "2", "--dp", "2", "--moe-experts", "2", "--zero-stage", "2"]
    return {v: train_small(d / v, *common, "--scaling", f"deepspeed@{v}", timeout=120) for v in ("0.13.0", "0.13.1")}


def test_bucket_divisors_by_class(moe):
    assert emulation.bucket_class_divisors(moe["0.13.0"]) == {"expert": [4.0], "dense": [2.0]}
    assert emulation.bucket_class_divisors(moe["0.13.1"]) == {"expert": [2.0], "dense": [2.0]}


def test_compare_moe_tells_the_releases_apart(moe):
    assert emulation.compare_moe(moe["0.13.1"], moe["0.13.1"])["emulation_exit"] == 0
    assert emulation.compare_moe(moe["0.13.0"], moe["0.13.1"])["emulation_exit"] == 1


def test_reduction_check_finds_the_divisor(moe):
    c = checks.reduction_check(moe["0.13.1"])
    assert c["final_rank_spread"] < 1e-6
    assert abs(c["effective_divisor"] - 2.0) < 1e-4 and c["reduction_residual"] < 1e-5
    assert checks.runnable_problem(c) is None
    # Mixed divisors (2 and 4) are not one scaled sum: the check says so.
    c = checks.reduction_check(moe["0.13.0"])
    assert "not a scaled sum" in checks.runnable_problem(c)


def test_emulation_table_counts(tmp_path):
    base = {"layout": "sp2", "zero_stage": 2, "loss": "loss", "ignore_frac": 0.0, "status": "measured"}
    rows = [dict(base, deepspeed="0.19.8", emulation_exit=0, emulation_residual=3e-7),
            dict(base, deepspeed="0.19.8", loss="loss-div-sp", emulation_exit=1, emulation_residual=0.5),
            dict(base, deepspeed="0.11.1", zero_stage=0, emulation_exit=None, emulation_note="not modelled: x"),
            dict(base, deepspeed="0.11.1", status="not-runnable", scale=None)]
    tables.write_emulation(rows, tmp_path / "emulation.md")
    text = (tmp_path / "emulation.md").read_text()
    assert "| 0.11.1 | 1 | 0 | 0 | 1 |  |" in text
    assert "| 0.19.8 | 2 | 1 | 1 | 0 | 3.0e-07 |" in text
    assert "| 0.19.8 | sp2 | 2 | loss-div-sp | 0.0 | exit 1 (5.0e-01) |" in text
    assert "not modelled: x" in text
