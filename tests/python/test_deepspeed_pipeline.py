"""DeepSpeed's PipelineEngine captured by gradtrace.deepspeed_adapter (gradtrace.adapters.deepspeed_pipe), with the
installed release, through the version command as a user runs it: tools/repro/ds_pipe/capture.py on 2
ranks = 2 pipeline stages, gas 4 (tools/repro/ds_pipe/ds_pipe.json), against the command's single-rank reference
(the same layers as an nn.Sequential, all 16 samples at once, gas 1). DeepSpeed 0.19.8 gives each stage the
mean gradient over the micro-batches (measured without gradtrace: tools/repro/upstream/ds_pipe.py prints 1.0000
for every parameter of both stages), so the diff must say 1.000 for all 6 parameters, joined across the stages.
Releases whose pipelines scaled wrongly are a documented sweep (tools/repro/ds_pipe/README.md), not a test.
"""

import json
import subprocess
import sys

import pytest

import gradtrace

from conftest import BUILD, ROOT, deepspeed_env

SCRIPT = ROOT / "tools" / "repro" / "ds_pipe" / "capture.py"
CONFIG = ROOT / "tools" / "repro" / "ds_pipe" / "ds_pipe.json"
DIFF = BUILD / "bin" / "gradtrace-diff"


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    import deepspeed

    tmp = tmp_path_factory.mktemp("ds-pipe")
    env = deepspeed_env()
    env["GRADTRACE_BUILD_DIR"] = str(BUILD)
    cmd = [sys.executable, "-m", "gradtrace.versions", "--package", "deepspeed", "--script", str(SCRIPT), "--config",
           str(CONFIG), "--sp", "1", "--dp", "2", "--releases", deepspeed.__version__, "--cache-dir",
           str(tmp / "cache"), "--json", str(tmp / "r.json")]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    return p, json.loads((tmp / "r.json").read_text()), tmp


def test_the_pipeline_matches_the_unpipelined_reference(sweep):
    p, res, _ = sweep
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    (row,) = res["rows"]
    assert row["status"] == "ok"
    (group,) = row["vs_reference"]["groups"]
    assert group["kind"] == "scale" and group["scale"] == pytest.approx(1.0, abs=1e-5) and group["count"] == 6


def test_every_stage_records_the_whole_model_and_its_own_final(sweep):
    _, res, _ = sweep
    ranks = gradtrace.read_trace_set(res["rows"][0]["trace"])
    assert [r.run_info["rank"] for r in ranks] == [0, 1]
    owned = {0: {0, 1, 2, 3}, 1: {4, 5}}  # stage 0: layers 0 and 2; stage 1: layer 4
    for r in ranks:
        info = r.run_info
        assert [(p["name"], p["stages"]) for p in info["params"]] == [
            ("0.weight", [0]), ("0.bias", [0]), ("2.weight", [0]), ("2.bias", [0]), ("4.weight", [1]), ("4.bias", [1])]
        cfg = info["config"]
        assert (cfg["pp"], cfg["pp_stages"], cfg["gas"], cfg["dp"]) == (2, 2, 4, 1)
        assert cfg["pp_schedule"] == "deepspeed.TrainSchedule"
        frames = list(r.frames())
        finals = [f for f in frames if f.get("phase") == "FINAL"]
        assert [(f["step"], f["micro_step"]) for f in finals] == [(0, 3)]  # once, after the 4 micro-batches
        assert {s["param_id"] for s in finals[0]["slices"]} == owned[info["rank"]]
        losses = [f["micro_step"] for f in frames if f.get("type") == "step" and not f["optimizer_step"]]
        assert losses == ([0, 1, 2, 3] if info["rank"] == 1 else [])  # the last stage computes the loss


def test_self_check_of_the_pipeline_passes(sweep):
    _, res, tmp = sweep
    report = tmp / "self.json"
    p = subprocess.run([str(DIFF), "--self", res["rows"][0]["trace"], "--json", str(report)], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stdout[-3000:]
