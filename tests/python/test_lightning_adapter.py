"""gradtrace.lightning_adapter on real PyTorch Lightning 2.6 runs (tests/python/lightning_runs.py: a two-layer MLP,
16 samples per optimizer step, SGD, CPU). Lightning steps its optimizer with a closure that runs the last
micro-batch's forward and backward inside ``optimizer.step``; FINAL taken before the step held the previous
micro-batch's local, unreduced gradient (issue 41: a false "mismatch" with scales 0.19-0.38 and false replica
findings). The truth here is B/A = 1.000 for every parameter of every correct layout.

Runs: one device (the reference), Lightning's "ddp" strategy on 2 gloo ranks with accumulate_grad_batches 2
(Lightning launches rank 1 by running the script again), the same with a loss that sums its per-sample
losses, ModelParallelStrategy with fully_shard (FSDP2), and Fabric's DDP stepping ``optimizer.step(closure)``.
"""

import importlib.util
import json
import subprocess
import sys

import pytest

import gradtrace

from conftest import BUILD, ROOT, deepspeed_env

if importlib.util.find_spec("lightning") is None:  # a broken setup, not a reason to skip
    raise ImportError("lightning is not installed in this Python: run ./tools/setup (tools/requirements.txt)")

RUNS = ROOT / "tests" / "python" / "lightning_runs.py"
DIFF = BUILD / "bin" / "gradtrace-diff"
NAMES = ["net.0.weight", "net.0.bias", "net.2.weight", "net.2.bias"]


def _run(out, *args):
    cmd = [sys.executable, str(RUNS), *map(str, args[:3]), str(out), *args[3:]]
    p = subprocess.run(cmd, env=deepspeed_env(), capture_output=True, text=True, timeout=300, cwd=out.parent)
    assert p.returncode == 0, f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("lightning")
    return {"ref": _run(d / "ref", "trainer", 1, 1), "ddp": _run(d / "ddp", "trainer", 2, 2),
            "sum": _run(d / "sum", "trainer", 2, 2, "--sum-loss"),
            "fsdp2": _run(d / "fsdp2", "trainer", 2, 2, "--fsdp2"), "fabric": _run(d / "fabric", "fabric", 2, 2),
            "x-world": _run(d / "x-world", "trainer", 2, 2, "--times-world"), "tmp": d}


def diff(runs, *args):
    """gradtrace-diff with a JSON report: (exit code, report, stdout)."""
    report = runs["tmp"] / f"report-{abs(hash(args))}.json"
    p = subprocess.run([str(DIFF), *map(str, args), "--json", str(report)], capture_output=True, text=True, timeout=120)
    return p.returncode, json.loads(report.read_text()), p.stdout


@pytest.mark.parametrize("layout", ["ddp", "fsdp2", "fabric"])
def test_a_correct_layout_matches_one_device_with_no_replica_finding(runs, layout):
    code, rep, out = diff(runs, runs["ref"], runs[layout])
    assert code == 0, out
    assert sorted(p["name"] for p in rep["params"]) == sorted(NAMES)  # the LightningModule's names, no renames
    assert all(p["verdict"] == "match" and p["scale"] == pytest.approx(1.0, abs=1e-5) for p in rep["params"]), out
    assert not [f for f in rep["findings"] if f["kind"] != "note"], out
    assert len(rep["steps"]) == 2  # every step compared


@pytest.mark.parametrize("layout", ["ddp", "fsdp2"])
def test_self_on_a_correct_lightning_run_passes(runs, layout):
    code, rep, out = diff(runs, "--self", runs[layout])
    assert code == 0, out
    assert [round(p["divisor"], 6) for p in rep["self_params"]] == [2.0] * 4, out


def test_trainer_trace_records_the_steps_lightning_ran(runs):
    ranks = gradtrace.read_trace_set(runs["ddp"])
    assert [r.run_info["rank"] for r in ranks] == [0, 1]
    for r in ranks:
        info = r.run_info
        assert info["config"]["gas"] == 2 and info["config"]["dp"] == 2
        assert info["extra"]["driven_by"] == "lightning.Trainer"
        assert [p["name"] for p in info["params"]] == NAMES
        frames = list(r.frames())
        finals = [(f["step"], f["micro_step"]) for f in frames if f.get("phase") == "FINAL"]
        assert finals == [(0, 1), (1, 1)]  # once per optimizer step, after the closure's micro-batch
        # DDP reduces only the last micro-batch (Lightning's no_sync on the others): PRE/POST at micro-step 1
        assert {f["micro_step"] for f in frames if f.get("phase") in ("PRE_REDUCE", "POST_REDUCE")} == {1}
        losses = [(f["step"], f["micro_step"]) for f in frames if f.get("type") == "step" and not f["optimizer_step"]]
        assert losses == [(0, 0), (0, 1), (1, 0), (1, 1)]  # on_before_backward's loss, each micro-step once


def test_a_summed_loss_is_named_with_its_factor(runs):
    # 4 samples per micro-batch and rank, summed instead of averaged: B/A = 4, which no layout degree gives
    # (dp 2, gas 2, world 2); the recorded losses (Lightning's, divided by gas) carry the factor.
    code, rep, out = diff(runs, runs["ref"], runs["sum"])
    assert code == 1, out
    (group,) = rep["groups"]
    assert group["scale"] == pytest.approx(4.0, rel=1e-5) and group["count"] == 4
    assert group["cause"] == "loss-multiplier" and group["side"] == "B" and group["dimension"] == ""
    assert ("B's loss passed to backward is scaled by 4.000, which no layout degree gives (e.g. a sum over samples "
            "or tokens where a mean is meant); the recorded losses agree (B's loss per data-parallel replica is "
            "4.000 x A's)") in group["explanation"]


def test_a_loss_times_the_processes_with_dp_equal_to_gas_names_both_causes_and_the_rerun(runs):
    # dp = gas = 2 and the loss x 2 processes: B's DDP reductions divide as its layout needs (the divisor in dp is
    # ruled out), but a loss x dp and a loss not divided by gas give the same 2.000: both are reported, with the
    # rerun that separates them, never one of them as the cause (issue 41).
    code, rep, out = diff(runs, runs["ref"], runs["x-world"])
    assert code == 1, out
    (group,) = rep["groups"]
    assert group["scale"] == pytest.approx(2.0, rel=1e-5) and group["cause"] == "ambiguous"
    left = {(c["expression"], c["cause"]) for c in group["candidates"] if not c["ruled_out_by"]}
    assert left == {("dp(B)", "loss-multiplier"), ("gas(B)", "loss-multiplier")}
    (out_,) = [c for c in group["candidates"] if c["ruled_out_by"]]
    assert (out_["expression"], out_["cause"], out_["ruled_out_by"]) == \
        ("dp(B)", "reduction-divisor", "B's reductions divide as its layout needs")
    assert group["rerun"] == "rerun B with gas 4: dp(B) predicts 2.000, gas(B) predicts 4.000"
    assert "2 causes fit and the traces do not tell them apart" in group["explanation"]
