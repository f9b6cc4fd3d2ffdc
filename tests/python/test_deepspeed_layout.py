"""The layout the DeepSpeed adapter records (format 1.2), on the newest DeepSpeed (tools/constraints.txt),
CPU + gloo: a 2-rank data-parallel ZeRO-2 run of tools/repro/ds5248/run.py's tiny model with
deepspeed.moe.layer.MoE (2 experts, ep_size 1). DeepSpeed marks expert parameters `allreduce = False`
and reduces them over their expert-data-parallel group: the trace must say EXPERT over `edp` for
exactly those, DENSE over `sdp` for the rest, with the ep/edp groups' ranks; and the grad norm
DeepSpeed reports (engine.get_global_grad_norm) must agree with the norm of the FINAL gradients
(gradtrace-diff's grad_norm check, diff/evidence/grad_norm.h)."""

import json
import subprocess
import sys

import pytest

import gradtrace
from conftest import BUILD, ROOT, deepspeed_env

RUNNER = ROOT / "tools" / "repro" / "ds5248" / "run.py"


@pytest.fixture(scope="module")
def moe_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("ds_layout") / "moe"
    cmd = [sys.executable, str(RUNNER), "--out", str(out), "--timeout", "240", "--sp", "1", "--dp", "2",
           "--moe-experts", "2", "--zero-stage", "2"]
    p = subprocess.run(cmd, env=deepspeed_env(), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return out


def test_experts_are_recorded_over_their_expert_data_parallel_group(moe_run):
    for reader in gradtrace.read_trace_set(moe_run):
        run = reader.run_info
        assert run["framework"] == "deepspeed" and run["versions"]["deepspeed"]
        groups = {g["name"]: g["ranks"] for g in run["groups"]}
        assert groups["edp"] == [0, 1] and groups["ep"] == [run["rank"]] and groups["sdp"] == [0, 1]
        assert run["config"]["ep_size"] == 1 and run["config"]["edp"] == 2
        experts = [p for p in run["params"] if ".deepspeed_experts." in p["name"]]
        dense = [p for p in run["params"] if ".deepspeed_experts." not in p["name"]]
        assert len(experts) == 2 * 2 * 4  # 2 layers x 2 experts x (fc1, fc2) x (weight, bias)
        assert all(p["kind"] == "EXPERT" and p["grad_group"] == "edp" for p in experts)
        assert dense and all(p["kind"] == "DENSE" and p["grad_group"] == "sdp" for p in dense)


def test_reported_grad_norm_agrees_with_final(moe_run, tmp_path):
    diff = BUILD / "bin" / "gradtrace-diff"
    report = tmp_path / "r.json"
    p = subprocess.run([str(diff), str(moe_run), str(moe_run), "--json", str(report)], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    g = json.loads(report.read_text())["grad_norm"]
    assert g["verdict"] == "consistent"
    assert g["reported_a"] > 0 and g["off_a"] == pytest.approx(1.0, abs=1e-5)
