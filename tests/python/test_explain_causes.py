"""Explanations by cause on real gradtrace-train traces, and the reduction semantics the Python tools read
through _gtcodec (semantics/: the one DeepSpeed release table and its bucket divisors).

gradtrace-train --scaling deepspeed@0.12.6 with MoE at ZeRO-2 divides the buckets holding expert parameters
twice (PR #4957 removed the second division in 0.13.1): against deepspeed@0.13.1 the diff must explain the
MoE buckets' 0.5 as that double division, with the configurations' prediction 0.5.
"""

import json
import subprocess
import sys

import pytest

from conftest import BUILD, REPORT_SCHEMA_VERSION, ROOT, train_small  # $GRADTRACE_BUILD_DIR, default build/
from gradtrace import _gtcodec

DIFF = BUILD / "bin" / "gradtrace-diff"
sys.path.insert(0, str(ROOT / "tools" / "repro" / "ds5248"))

import cells  # noqa: E402

def _diff(a, b, out):
    p = subprocess.run([str(DIFF), str(a), str(b), "--json", str(out)], capture_output=True, text=True, timeout=120)
    assert p.returncode in (0, 1), p.stdout + p.stderr
    return json.loads(out.read_text())


def test_deepspeed_0_12_6_moe_is_the_double_division(tmp_path):
    common = ["--nproc", "4", "--dp", "2", "--sp", "2", "--moe-experts", "2", "--zero-stage", "2",
              "--loss", "local-mean-div-sp"]
    a = train_small(tmp_path / "a", *common, "--scaling", "deepspeed@0.13.1")
    b = train_small(tmp_path / "b", *common, "--scaling", "deepspeed@0.12.6")
    r = _diff(a, b, tmp_path / "r.json")
    assert r["verdict"] == "scaled" and r["schema_version"] == REPORT_SCHEMA_VERSION
    half = [g for g in r["groups"] if g["kind"] == "scale" and abs(g["scale"] - 0.5) < 1e-4]
    assert len(half) == 1, [(g["scale"], g["count"]) for g in r["groups"]]
    g = half[0]
    assert g["cause"] == "double-division" and g["side"] == "B"
    assert g["param_kind"] in ("expert", "mixed")  # a MoE bucket divides every parameter it holds
    assert g["predicted"] == 0.5
    assert "divides MoE buckets twice" in g["explanation"] and "PR #4957" in g["explanation"]
    assert "predict" not in g["explanation"]
    # The expert parameters are all in it; the headline is this finding.
    experts = {p["name"] for p in r["params"] if p["param_kind"] == "expert"}
    assert experts and experts <= set(g["params"])
    assert r["summary"] == r["groups"][0]["explanation"] == g["explanation"]
    ones = [g for g in r["groups"] if g["kind"] == "scale" and abs(g["scale"] - 1) < 1e-4]
    assert ones and all(o["cause"] == "none" for o in ones)


def test_one_release_table():
    releases = _gtcodec.deepspeed_releases()
    versions = [r["version"] for r in releases]
    assert "0.12.6" in versions and "0.19.8" in versions
    by = {r["version"]: r for r in releases}
    assert by["0.12.6"]["zero"] == "ds-pre-4957" and not by["0.12.6"]["has_pr4957"]
    assert by["0.13.1"]["zero"] == "ds-4530" and by["0.13.1"]["has_pr4957"]
    assert by["0.11.1"]["zero"] == "mean" and not by["0.11.1"]["has_pr4530"]
    # The MoE cells of the #5248 matrix: around PR #4957, and the newest release, from the same table.
    assert cells.moe_versions() == ("0.13.0", "0.13.1", versions[-1])


def test_bucket_divisor_from_the_policies():
    # ZeRO-1/2 at dp 2 x sp 2: group / sp, twice on MoE buckets before PR #4957.
    assert _gtcodec.bucket_divisor("deepspeed@0.12.6", "zero", 4, 2, has_moe=True) == 4.0
    assert _gtcodec.bucket_divisor("deepspeed@0.12.6", "zero", 4, 2, has_moe=False) == 2.0
    assert _gtcodec.bucket_divisor("deepspeed@0.13.1", "zero", 4, 2, has_moe=True) == 2.0
    assert _gtcodec.bucket_divisor("deepspeed@0.14.0", "engine", 4, 2) == 4.0
    assert _gtcodec.bucket_divisor("deepspeed@0.19.8", "zero3-reduce-scatter", 4, 2) == 4.0
    assert _gtcodec.bucket_divisor("mean", "engine", 4, 2) == 4.0
    with pytest.raises(ValueError, match="no table entry"):
        _gtcodec.bucket_divisor("deepspeed@0.1.0", "zero", 4, 2)
    with pytest.raises(ValueError, match="path"):
        _gtcodec.bucket_divisor("mean", "nowhere", 4, 2)


def test_unequal_shards_name_the_valid_token_cause(tmp_path):
    """The Hugging Face gradient-accumulation class on sp shards: backward(loss / sp) with 30% of labels ignored
    is not a multiple of the reference; the shards' valid-token counts differ, and the mismatch says so."""
    common = ["--zero-stage", "2", "--ignore-frac", "0.3", "--seed", "5248"]
    a = train_small(tmp_path / "a", *common, "--nproc", "1", "--dp", "1", "--sp", "1", "--scaling", "mean",
                    "--loss", "local-mean")
    b = train_small(tmp_path / "b", *common, "--nproc", "2", "--dp", "1", "--sp", "2", "--scaling", "ds-4530",
                    "--loss", "local-mean-div-sp")
    r = _diff(a, b, tmp_path / "r.json")
    assert r["verdict"] == "mismatch"
    g = r["groups"][0]
    assert g["kind"] == "mismatch" and g["cause"] == "token-normalisation" and g["side"] == "B"
    assert r["trace_b"]["valid_tokens_min"] < r["trace_b"]["valid_tokens_max"]
    assert "not by the total valid tokens" in r["summary"]
    # The token-weighted loss on the same shards matches: no finding, nothing blamed on tokens.
    c = train_small(tmp_path / "c", *common, "--nproc", "2", "--dp", "1", "--sp", "2", "--scaling", "ds-4530",
                    "--loss", "token-weighted")
    assert _diff(a, c, tmp_path / "c.json")["verdict"] == "match"
