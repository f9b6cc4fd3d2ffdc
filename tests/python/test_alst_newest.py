"""DeepSpeed's own Ulysses recipe for Hugging Face models (ALST: UlyssesSPAttentionHF, UlyssesSPDataLoaderAdapter
and the loss code of DeepSpeed's ALST tutorial), newest DeepSpeed and transformers (pinned in tools/constraints.txt),
on CPU with gloo: sp=2 (2 ranks, dp=1), ZeRO-2, a tiny LlamaForCausalLM built from a config, 25% of the labels
ignored (the shards hold 10 and 12 valid tokens), against a single-rank reference with the same weights and data
whose loss is the model's own mean over the valid shifted tokens (tools/repro/ds5248/alst.py, ALST.md).

Measured on deepspeed 0.19.8 / torch 2.15.0 / transformers 5.24.0, and asserted here:
- the tutorial's loss as written: every SP rank's loss equals the reference loss, yet FINAL = 2.000 x reference
  for every parameter (residual ~1e-7). Why: every SP rank back-propagates the whole-sequence loss; the backward
  of torch.distributed.nn.functional.all_gather sums over the SP group the gradients that all sp ranks send to each
  rank's local loss, so the SP group back-propagates sp x the loss, and ZeRO divides by world(sdp) / sp = dp = 1
  (stage_1_and_2.py:1688). `gradtrace-diff --self`: effective divisor 1.000.
- the same loss / sp: 1.000 (gradtrace-diff exit 0), exact with the unequal shards.
"""

import importlib.util
import json
import pathlib
import subprocess
import sys

import pytest

import gradtrace

from conftest import BUILD, ROOT, deepspeed_env  # $GRADTRACE_BUILD_DIR, default build/
RUNNER = ROOT / "tools" / "repro" / "ds5248" / "alst.py"
DIFF = BUILD / "bin" / "gradtrace-diff"

# tools/setup installs the pinned DeepSpeed and transformers: their absence is a broken setup, not a reason to skip.
for _pkg in ("deepspeed", "transformers"):
    if importlib.util.find_spec(_pkg) is None:
        raise ImportError(f"{_pkg} is not installed in this Python: run ./tools/setup (tools/requirements.txt)")

TOL = 1e-4  # fp32, a few thousand summands per element; measured residuals ~1.2e-7
COMMON = ["--zero-stage", "2", "--ignore-frac", "0.25", "--seq-len", "32", "--timeout", "240"]
NPARAMS = 21  # LlamaForCausalLM, 2 layers, untied lm_head


def _run(out, *args):
    env = deepspeed_env()
    cmd = [sys.executable, str(RUNNER), "--out", str(out), *COMMON, *args]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    if not DIFF.exists():
        pytest.fail(f"{DIFF} not built: cmake --build {BUILD} --target gradtrace-diff")
    d = tmp_path_factory.mktemp("alst")
    return {
        "ref": _run(d / "ref", "--sp", "2", "--reference"),
        "alst": _run(d / "sp2-alst", "--sp", "2", "--loss", "alst"),
        "div": _run(d / "sp2-alst-div-sp", "--sp", "2", "--loss", "alst-div-sp"),
    }


def _diff(name, *args):
    out = pathlib.Path(args[-1]).parent / f"{name}.json"
    p = subprocess.run([str(DIFF), *map(str, args), "--threads", "1", "--json", str(out)], capture_output=True,
                       text=True)
    report = json.loads(out.read_text())
    assert report["exit_code"] == p.returncode, p.stdout + p.stderr
    return p.returncode, report, p.stdout + p.stderr


def _steps(trace):
    """Micro-step StepInfo frames by rank (not the optimizer-step frames that carry the grad norm, FORMAT.md 4.2)."""
    return {r.rank: [f for f in r.frames() if f["type"] == "step" and not f["optimizer_step"]]
            for r in gradtrace.read_trace_set(trace)}


def test_forward_is_exact_and_shards_are_unequal(runs):
    ref = _steps(runs["ref"])[0]
    alst = _steps(runs["alst"])
    assert len(ref) == 1 and sorted(alst) == [0, 1]
    counts = [alst[r][0]["valid_tokens"] for r in (0, 1)]
    assert counts[0] != counts[1], "the shards were meant to hold different valid-token counts"
    assert sum(counts) == ref[0]["valid_tokens"]
    for r in (0, 1):  # the tutorial's loss is the full-sequence mean on every SP rank
        assert abs(alst[r][0]["loss"] - ref[0]["loss"]) <= 1e-6 * abs(ref[0]["loss"])


def test_adapter_groups_with_the_ulysses_mpu(runs):
    for r in gradtrace.read_trace_set(runs["alst"]):
        ri = r.run_info
        c = ri["config"]
        assert (c["world"], c["dp"], c["sp"], c["zero_stage"], c["loss"]) == (2, 1, 2, 2, "alst-tutorial")
        assert {g["name"]: g["ranks"] for g in ri["groups"]} == {"world": [0, 1], "sp": [0, 1], "dp": [r.rank],
                                                                 "sdp": [0, 1]}
        assert json.loads(ri["extra"]["adapter_unrecordable_phases"]) == {}
        assert len(ri["params"]) == NPARAMS
        assert {f["phase"] for f in r.frames() if f["type"] == "bucket"} == {"PRE_REDUCE", "POST_REDUCE", "FINAL"}


def test_alst_tutorial_loss_is_scaled_by_sp(runs):
    rc, report, text = _diff("diff-alst", runs["ref"], runs["alst"])
    assert rc == 1, text
    assert [(g["kind"], g["count"], g["expression"]) for g in report["groups"]] == [("scale", NPARAMS, "sp(B)")], text
    assert abs(report["groups"][0]["scale"] - 2.0) < TOL
    assert len(report["params"]) == NPARAMS
    for p in report["params"]:
        assert p["verdict"] == "scaled" and abs(p["scale"] - 2.0) < TOL and p["residual"] < TOL, p


def test_alst_effective_divisor_is_dp(runs):
    rc, report, text = _diff("self-alst", "--self", runs["alst"])
    # Every SP rank back-propagates the whole loss (all_gather's backward sums), so the SP ranks' gradients
    # add up to sp x the sequence's gradient and the loss needs a divisor of dp x sp = 2: wrong-divisor.
    assert rc == 1, text
    assert [(g["kind"], g["count"]) for g in report["groups"]] == [("divisor", NPARAMS)], text
    assert abs(report["groups"][0]["scale"] - 1.0) < TOL
    assert {p["expected"] for p in report["self_params"]} == {2.0}
    # With / sp the ranks' gradients add up to the sequence's gradient: divisor dp = 1 is right.
    rc, report, text = _diff("self-div", "--self", runs["div"])
    assert rc == 0, text
    assert {p["expected"] for p in report["self_params"]} == {1.0}


def test_alst_loss_div_sp_matches_reference(runs):
    rc, report, text = _diff("diff-div", runs["ref"], runs["div"])
    assert rc == 0, text
    assert report["verdict"] == "match"
    assert [(g["count"], round(g["scale"], 4)) for g in report["groups"]] == [(NPARAMS, 1.0)], text
    assert max(p["residual"] for p in report["params"]) < TOL
