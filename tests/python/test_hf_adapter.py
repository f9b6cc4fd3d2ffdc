"""gradtrace.hf_adapter.GradtraceCallback on real Hugging Face Trainer runs (tests/python/hf_runs.py:
a config-built one-layer Llama, CPU): 2 processes (DDP over gloo through accelerate; the callback attaches
gradtrace.ddp_adapter) against 1, the same
4 samples as each step's global batch. Trainer's loss is the global token mean (its token count is
gathered across ranks), so FINAL = reference: gradtrace-diff exit 0, scale 1.000. FINAL is taken at
on_pre_optimizer_step, after Trainer clips to max_grad_norm 1.0, so its norm is min(logged grad_norm, 1).
"""

import importlib.util
import json
import subprocess
import sys

import numpy as np
import pytest

import gradtrace

from conftest import BUILD, ROOT, deepspeed_env

# Trainer needs accelerate (tools/requirements.txt): its absence is a broken setup, not a reason to skip.
if importlib.util.find_spec("accelerate") is None:
    raise ImportError("accelerate is not installed in this Python: run ./tools/setup (tools/requirements.txt)")

RUNS = ROOT / "tests" / "python" / "hf_runs.py"


def _run(out, world, *mode):
    cmd = [sys.executable, str(RUNS), str(world), str(out), *mode]
    p = subprocess.run(cmd, env=deepspeed_env(), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("hf")
    return {"ref": _run(d / "ref", 1), "dp2": _run(d / "dp2", 2), "acc": _run(d / "acc", 2, "accelerate"),
            "acc-ds": _run(d / "acc-ds", 2, "accelerate", "2"), "tmp": d}


def _self_params(trace_dir, report):
    """``gradtrace-diff --self`` of a set that must pass (exit 0): its self_params rows."""
    p = subprocess.run([str(BUILD / "bin" / "gradtrace-diff"), "--self", str(trace_dir), "--json", str(report)],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout[-2000:]
    return json.loads(report.read_text())["self_params"]


def test_trainer_run_on_two_ranks_matches_one_rank(runs):
    report = runs["tmp"] / "report.json"
    p = subprocess.run([str(BUILD / "bin" / "gradtrace-diff"), str(runs["ref"]), str(runs["dp2"]), "--json",
                        str(report)], capture_output=True, text=True, timeout=120)
    params = json.loads(report.read_text())["params"]
    assert p.returncode == 0, p.stdout[-2000:]
    table = gradtrace.read_trace_set(runs["ref"])[0].run_info["params"]
    assert len(params) == len(table) == 12 and all(abs(r["scale"] - 1.0) < 1e-4 for r in params), params


def test_trainer_layout_versions_and_grad_norm(runs):
    readers = gradtrace.read_trace_set(runs["dp2"])
    run = readers[1].run_info
    # The callback found Trainer's DDP model and attached gradtrace.ddp_adapter to it (issue 26).
    assert (run["framework"], run["config"]["world"], run["config"]["dp"], run["dp_rank"]) == ("pytorch-ddp", 2, 2, 1)
    assert run["extra"]["driven_by"] == "transformers.Trainer"
    # hf_runs.py sets WORLD_SIZE=1 even for one process, so accelerate wraps the model in DDP there too.
    assert gradtrace.read_trace_set(runs["ref"])[0].run_info["framework"] == "pytorch-ddp"
    assert set(run["versions"]) >= {"torch", "python", "transformers", "accelerate"}
    assert readers[0].run_info["run_id"] == run["run_id"]
    frames = list(readers[0].frames())
    for step in (0, 1):
        final = [f for f in frames if f["type"] == "bucket" and f["phase"] == "FINAL" and f["step"] == step]
        norm = np.sqrt(sum(float(np.sum(s["values"].astype(np.float64) ** 2)) for s in final[0]["slices"]))
        marks = [f for f in frames if f["type"] == "step" and f["optimizer_step"] and f["step"] == step]
        assert len(marks) == 1
        assert abs(norm - min(marks[0]["reported_grad_norm"], 1.0)) < 1e-4
        losses = [f for f in frames if f["type"] == "step" and not f["optimizer_step"] and f["step"] == step]
        assert len(losses) == 1 and losses[0]["valid_tokens"] == 2 * 8 and losses[0]["loss"] > 0


def test_trainer_ddp_buckets_divide_by_dp(runs, tmp_path):
    """PRE/POST per DDP bucket under Trainer, from the callback alone: --self measures DDP's mean, 2 = dp."""
    frames = list(gradtrace.read_trace_set(runs["dp2"])[0].frames())
    assert [(f["phase"], f["step"]) for f in frames if f["type"] == "bucket"] == \
        [("PRE_REDUCE", 0), ("POST_REDUCE", 0), ("FINAL", 0), ("PRE_REDUCE", 1), ("POST_REDUCE", 1), ("FINAL", 1)]
    report = tmp_path / "self.json"
    rows = _self_params(runs["dp2"], report)
    assert len(rows) == 12 and all(abs(r["divisor"] - 2.0) < 1e-5 for r in rows), rows


def test_accelerate_prepared_model_with_the_ddp_adapter(runs):
    """Accelerate without Trainer: the DDP adapter on the prepared model, its step hooks on the optimizer
    AcceleratedOptimizer wraps (which steps only at the end of an accumulation): one FINAL per optimizer
    step, PRE/POST only on the micro-step that synchronises, and an effective divisor of 2 = dp."""
    readers = gradtrace.read_trace_set(runs["acc"])
    frames = list(readers[0].frames())
    phases = [(f["phase"], f["step"], f["micro_step"]) for f in frames if f["type"] == "bucket"]
    assert phases == [("PRE_REDUCE", 0, 1), ("POST_REDUCE", 0, 1), ("FINAL", 0, 1),
                      ("PRE_REDUCE", 1, 1), ("POST_REDUCE", 1, 1), ("FINAL", 1, 1)]
    report = runs["tmp"] / "self-acc.json"
    rows = _self_params(runs["acc"], report)
    assert len(rows) == 4 and all(abs(r["divisor"] - 2.0) < 1e-5 for r in rows), rows


def test_accelerate_with_a_deepspeed_plugin(runs, tmp_path):
    """The same loop with a DeepSpeed plugin (ZeRO-2): attach_accelerate finds the engine behind the prepared
    model and attaches gradtrace.deepspeed_adapter: PRE/POST every micro-step (ZeRO-2 reduces each one),
    FINAL at the boundary, and --self measures DeepSpeed's divisor 2 = dp."""
    readers = gradtrace.read_trace_set(runs["acc-ds"])
    assert (readers[0].run_info["framework"], readers[0].run_info["extra"]["driven_by"]) == ("deepspeed", "accelerate")
    assert readers[0].run_info["config"]["gas"] == 2
    phases = [(f["phase"], f["step"], f["micro_step"]) for f in readers[0].frames() if f["type"] == "bucket"]
    assert phases == [(p, step, m) for step in (0, 1) for m in (0, 1)
                      for p in ("PRE_REDUCE", "POST_REDUCE", "FINAL") if p != "FINAL" or m == 1]
    report = tmp_path / "self.json"
    rows = _self_params(runs["acc-ds"], report)
    assert len(rows) == 4 and all(abs(r["divisor"] - 2.0) < 1e-5 for r in rows), rows
