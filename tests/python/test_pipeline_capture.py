"""Issue 25: pipeline parallelism (torch.distributed.pipelining) captured in one call per rank
(manual_adapter.attach(schedule, ...)), diffed against the unpipelined single-rank reference.

The runs (pipeline_runs.py, gloo on CPU): GPipe and 1F1B over 2 stages and 2 stages x dp 2 (the dp
reduction hand-written, DDP or FSDP2 stage modules), ScheduleInterleaved1F1B with 2 stages per rank, 4
micro-batches, a mean loss per micro-batch. With scale_grads=True (torch's default) the gradients equal the
reference's (exit 0); with scale_grads=False they are 4.000 = n_microbatches x, named as the schedule's
scaling. DDP stage modules under GPipe are not run: torch 2.15 itself fails there at the second step
(reducer.cpp:2079 "rebuilt parameter indices size is not same as original model parameters size",
reproduced without gradtrace); 1F1B runs them.
"""

import json
import subprocess

import pytest

import gradtrace
from conftest import BUILD, ROOT, script_runs

RUNS = ROOT / "tests" / "python" / "pipeline_runs.py"
DIFF = BUILD / "bin" / "gradtrace-diff"
# name -> pipeline_runs.py arguments
RUNS_ARGS = {
    "ref": ["ref"],
    "ref-tied": ["ref", "--tied"],
    "gpipe": ["gpipe"],
    "gpipe-noscale": ["gpipe", "--no-scale-grads"],
    "gpipe-fsdp2": ["gpipe", "--dp", "2", "--fsdp2"],
    "gpipe-fsdp2-noscale": ["gpipe", "--dp", "2", "--fsdp2", "--no-scale-grads"],
    "1f1b-ddp": ["1f1b", "--dp", "2", "--ddp"],
    "1f1b": ["1f1b"],
    "1f1b-dp2": ["1f1b", "--dp", "2"],
    "1f1b-dp2-noscale": ["1f1b", "--dp", "2", "--no-scale-grads"],
    "interleaved": ["interleaved"],
    "interleaved-noscale": ["interleaved", "--no-scale-grads"],
    "tied": ["gpipe", "--tied"],
    "tied-unsummed": ["gpipe", "--tied-unsummed"],
    "per-stage": ["gpipe", "--per-stage"],
}
PARAMS = 12  # embed, 4 x (weight, bias), norm (weight, bias), head; 11 when the head is the embedding


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """run(name) -> the trace directory of that run, made once per module."""
    return script_runs(tmp_path_factory, "pipeline",
                       lambda name, out: [RUNS, RUNS_ARGS[name][0], out, *RUNS_ARGS[name][1:]], timeout=300)


def _diff(a, b, *args):
    report = b.parent / f"diff-{a.name}-{b.name}.json"
    p = subprocess.run([str(DIFF), str(a), str(b), "--json", str(report), *args], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode in (0, 1), p.stderr
    return p.returncode, json.loads(report.read_text()), p.stderr


@pytest.mark.parametrize("name", ["gpipe", "gpipe-fsdp2", "1f1b", "1f1b-dp2", "1f1b-ddp", "interleaved"])
def test_scale_grads_with_a_mean_loss_matches_the_unpipelined_reference(run, name):
    code, report, _ = _diff(run("ref"), run(name))
    assert code == 0, report["summary"]
    assert report["verdict"] == "match"
    assert len(report["params"]) == PARAMS
    assert all(abs(p["scale"] - 1) < 1e-5 for p in report["params"])
    assert report["step"] == 0


@pytest.mark.parametrize("name", ["gpipe-noscale", "1f1b-dp2-noscale", "gpipe-fsdp2-noscale", "interleaved-noscale"])
def test_scale_grads_false_is_n_microbatches_x_named_as_the_schedules_scaling(run, name):
    code, report, _ = _diff(run("ref"), run(name))
    assert code == 1
    assert report["verdict"] == "scaled"
    assert len(report["params"]) == PARAMS
    assert all(abs(p["scale"] - 4.0) < 1e-4 for p in report["params"]), [p["scale"] for p in report["params"]]
    (group,) = [g for g in report["groups"] if g["kind"] == "scale"]
    assert group["count"] == PARAMS
    assert abs(group["scale"] - 4.0) < 1e-4
    assert (group["cause"], group["dimension"], group["side"]) == ("pp-schedule-scaling", "pp_microbatches", "B")
    assert group["expression"] == "pp_microbatches(B)"
    assert group["predicted"] == pytest.approx(4.0)
    assert "scale_grads=True" in group["explanation"]
    assert "scale_grads=False" in group["explanation"]
    cfg = report["config_b"]
    assert (cfg["pp_microbatches"], cfg["pp_scale_grads"], cfg["gas"]) == (4, False, 1)


def test_every_rank_names_the_whole_model_with_stages_and_the_schedule(run):
    ref = gradtrace.read_trace_set(run("ref"))[0]
    readers = gradtrace.read_trace_set(run("1f1b-dp2"))
    assert len(readers) == 4
    names = [p["name"] for p in ref.run_info["params"]]
    for r in readers:
        assert [p["name"] for p in r.run_info["params"]] == names
        assert r.model_fingerprint == ref.model_fingerprint
        cfg = r.run_info["config"]
        assert (cfg["world"], cfg["pp"], cfg["dp"], cfg["pp_stages"], cfg["pp_microbatches"]) == (4, 2, 2, 2, 4)
        assert cfg["pp_schedule"] == "Schedule1F1B" and cfg["pp_scale_grads"] is True
        stages = {p["name"]: p["stages"] for p in r.run_info["params"]}
        assert stages["embed.weight"] == [0] and stages["layers.1.bias"] == [0]
        assert stages["layers.2.weight"] == [1] and stages["head.weight"] == [1]
        # This rank's FINAL holds its own stage's parameters only.
        own = {p["id"] for p in r.run_info["params"] if r.run_info.get("pp_rank", 0) in p["stages"]}
        finals = [f for f in r.frames() if f["type"] == "bucket" and f["phase"] == "FINAL"]
        assert finals and {s["param_id"] for f in finals for s in f["slices"]} == own
        groups = {g["name"]: g["ranks"] for g in r.run_info["groups"]}
        assert len(groups["pp"]) == 2 and len(groups["dp"]) == 2 and r.rank in groups["pp"]


def test_interleaved_ranks_hold_two_stages_each(run):
    for r in gradtrace.read_trace_set(run("interleaved")):
        cfg = r.run_info["config"]
        assert (cfg["pp"], cfg["pp_stages"], cfg["pp_schedule"]) == (2, 4, "ScheduleInterleaved1F1B")
        held = sorted({s for p in r.run_info["params"] for s in p["stages"] if s % 2 == r.rank})
        assert held == [r.rank, r.rank + 2]


def test_micro_batches_are_not_read_as_gradient_accumulation(run):
    code, report, stderr = _diff(run("ref"), run("gpipe"))
    assert code == 0
    assert report["config_b"]["gas"] == 1 and report["config_b"]["pp_microbatches"] == 4
    assert not any("gas" in f["message"] for f in report["findings"]), report["findings"]
    assert "inferred" not in stderr
    assert "micro-steps" not in run.stderr("gpipe")  # no "pass gas=4" warning at close


@pytest.mark.parametrize("name", ["1f1b-dp2", "1f1b-ddp", "gpipe-fsdp2", "gpipe-fsdp2-noscale"])
def test_self_check_measures_the_dp_reduction_before_the_schedule_scales(run, name):
    """PRE/POST around the dp reduction (hand-written, DDP's bucket hook, FSDP2's reduce-scatter, read before
    the schedule divides by the micro-batches in place): the divisor is dp = 2 whatever scale_grads."""
    out = run(name)
    p = subprocess.run([str(DIFF), "--self", str(out), "--json", str(out.parent / f"self-{name}.json")],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr
    report = json.loads((out.parent / f"self-{name}.json").read_text())
    assert report["verdict"] == "ok"
    divisors = [q["divisor"] for q in report["self_params"]]
    assert len(divisors) == PARAMS and all(abs(d - 2.0) < 1e-4 for d in divisors), divisors


def test_tied_embedding_summed_over_its_stages_matches_the_reference(run):
    readers = gradtrace.read_trace_set(run("tied"))
    stages = {p["name"]: p["stages"] for p in readers[0].run_info["params"]}
    assert stages["embed.weight"] == [0, 1] and "head.weight" not in stages
    code, report, _ = _diff(run("ref-tied"), run("tied"))
    assert code == 0, report["summary"]
    assert len(report["params"]) == PARAMS - 1


def test_tied_embedding_left_unsummed_is_flagged_as_copies_that_disagree(run):
    code, report, _ = _diff(run("ref-tied"), run("tied-unsummed"))
    assert code == 1
    bad = {p["name"]: p for p in report["params"] if p["verdict"] != "match"}
    assert list(bad) == ["embed.weight"], report["summary"]
    (replica,) = [f["message"] for f in report["findings"] if f["kind"] == "replica"]
    assert "'embed.weight' disagree" in replica and "tied parameter" in replica and "stages 0 and 1" in replica
    # The set alone shows it too: --self finds the copies disagreeing.
    out = run("tied-unsummed")
    p = subprocess.run([str(DIFF), "--self", str(out), "--json", str(out.parent / "self-tied.json")],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 1, p.stderr
    self_report = json.loads((out.parent / "self-tied.json").read_text())
    assert self_report["verdict"] == "inconsistent"
    assert any("tied parameter" in f["message"] for f in self_report["findings"])


def test_stages_captured_as_separate_models_are_refused_with_how_to_attach(run):
    """attach(stage_module, pp=2), as a user first tried: each rank's table is its own stage's, so the set is
    not one model. One line, exit 2, naming the fix."""
    p = subprocess.run([str(DIFF), str(run("ref")), str(run("per-stage"))], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 2
    (line,) = p.stderr.strip().splitlines()
    assert "rank-00001.gtrace: model fingerprint" in line
    assert "each rank recorded only its own stage's parameters" in line
    assert "gradtrace.manual_adapter.attach(schedule, ...)" in line
