"""Issue 26: gradtrace.hf_adapter.GradtraceCallback under Trainer + DeepSpeed ZeRO-1, 2 and 3 (real DeepSpeed on
CPU, 2 gloo ranks, gradient accumulation 2; tests/python/hf_ds_runs.py). The callback attaches
gradtrace.deepspeed_adapter to Trainer's engine by itself: its capture equals the adapter's attached by
hand on an identical run (gradtrace-diff exit 0, frame for frame), and matches a one-process Trainer run
over the same global batch (exit 0: Trainer's loss is the global token mean, DeepSpeed divides by dp).
Before issue 26 the callback read .grad, which ZeRO leaves empty: such a capture (``grad``) now warns once
per rank, naming ZeRO, and gradtrace-inspect marks its trace.
"""

import importlib.util
import json
import subprocess
import sys

import pytest

import gradtrace

from conftest import BUILD, ROOT, deepspeed_env

if importlib.util.find_spec("transformers") is None or importlib.util.find_spec("deepspeed") is None:
    raise ImportError("transformers and deepspeed are needed (tools/requirements.txt): run ./tools/setup")

RUNS = ROOT / "tests" / "python" / "hf_ds_runs.py"
DIFF = BUILD / "bin" / "gradtrace-diff"
PARAMS = 12  # the one-layer Llama's parameters


def _run(out, world, *args):
    cmd = [sys.executable, str(RUNS), str(out), str(world), *args]
    p = subprocess.run(cmd, env=dict(deepspeed_env(), HF_HUB_OFFLINE="1"), capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return p.stderr


def _diff(tmp, a, b, *args):
    report = tmp / "report.json"
    p = subprocess.run([str(DIFF), str(a), str(b), "--json", str(report), *args], capture_output=True, text=True,
                       timeout=120)
    return p.returncode, json.loads(report.read_text()), p.stdout


def _frames(trace_dir):
    """Per rank, (type, phase, step, micro-step, optimizer step) of every frame."""
    return [[(f["type"], f.get("phase"), f["step"], f["micro_step"], f.get("optimizer_step")) for f in r.frames()]
            for r in gradtrace.read_trace_set(trace_dir)]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    out = tmp_path_factory.mktemp("hf-ref")
    _run(out, 1)
    return out / "callback"


@pytest.fixture(scope="module", params=[1, 2, 3], ids=["zero1", "zero2", "zero3"])
def runs(request, tmp_path_factory):
    stage = request.param
    d = tmp_path_factory.mktemp(f"hf-zero{stage}")
    stderr = _run(d / "cb", 2, "--zero", str(stage))
    # The hand-attached adapter on an identical run, and beside it the .grad capture of before issue 26.
    grad_stderr = _run(d / "by-hand", 2, "--zero", str(stage), "--capture", "adapter,grad")
    return {"stage": stage, "cb": d / "cb" / "callback", "adapter": d / "by-hand" / "adapter",
            "grad": d / "by-hand" / "grad", "stderr": stderr, "grad_stderr": grad_stderr}


def test_callback_captures_what_the_deepspeed_adapter_captures(runs, tmp_path):
    assert _frames(runs["cb"]) == _frames(runs["adapter"])
    for phase in ("final", "post", "pre"):
        rc, report, out = _diff(tmp_path, runs["adapter"], runs["cb"], "--phase", phase)
        assert rc == 0, out[-2000:]
        assert len(report["params"]) == PARAMS and all(abs(r["scale"] - 1) < 1e-6 for r in report["params"])


def test_callback_matches_the_single_process_trainer(runs, reference, tmp_path):
    rc, report, out = _diff(tmp_path, reference, runs["cb"])
    assert rc == 0, out[-2000:]
    assert len(report["params"]) == PARAMS and all(abs(r["scale"] - 1) < 1e-4 for r in report["params"])
    assert report["grad_norm"]["verdict"] == "consistent"


def test_one_process_trainer_is_captured_from_grad(reference):
    run = gradtrace.read_trace_set(reference)[0].run_info
    assert (run["framework"], run["config"]["world"], run["config"]["gas"]) == ("hf-trainer", 1, 2)


def test_callback_records_layout_buckets_and_grad_norm(runs, reference):
    readers = gradtrace.read_trace_set(runs["cb"])
    run = readers[1].run_info
    assert (run["framework"], run["rank"], run["extra"]["driven_by"]) == ("deepspeed", 1, "transformers.Trainer")
    cfg = run["config"]
    assert (cfg["world"], cfg["dp"], cfg["gas"], cfg["zero_stage"]) == (2, 2, 2, runs["stage"])
    assert set(run["versions"]) >= {"deepspeed", "transformers", "accelerate"}
    frames = _frames(runs["cb"])[0]
    for step in (0, 1):
        phases = {(p, m) for t, p, s, m, _ in frames if t == "bucket" and s == step}
        # ZeRO-1 reduces once, at the boundary; ZeRO-2 and 3 every micro-step.
        micro = [1] if runs["stage"] == 1 else [0, 1]
        assert phases == {("PRE_REDUCE", m) for m in micro} | {("POST_REDUCE", m) for m in micro} | {("FINAL", 1)}
    norms = [[f["reported_grad_norm"] for f in r.frames() if f["type"] == "step" and f["optimizer_step"]]
             for r in (readers[0], gradtrace.read_trace_set(reference)[0])]
    assert len(norms[0]) == 2 and norms[0] == pytest.approx(norms[1], rel=1e-5)  # DeepSpeed's = Trainer's one-process


def test_self_check_measures_the_dp_divisor(runs, tmp_path):
    report = tmp_path / "self.json"
    p = subprocess.run([str(DIFF), "--self", str(runs["cb"]), "--json", str(report)], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stdout[-2000:]
    rows = json.loads(report.read_text())["self_params"]
    assert len(rows) == PARAMS and all(abs(r["divisor"] - 2.0) < 1e-5 for r in rows), rows


WHERE = {1: "gradients are partitioned by DeepSpeed ZeRO stage 1/2 (its optimizer moves them out of .grad into flat "
            "partitions)",
         2: "gradients are partitioned by DeepSpeed ZeRO stage 1/2 (its optimizer moves them out of .grad into flat "
            "partitions)",
         3: "gradients are partitioned by DeepSpeed ZeRO stage 3, never held in .grad"}


def test_a_capture_that_reads_grad_under_zero_says_so_and_inspect_marks_it(runs):
    lines = [x for x in runs["grad_stderr"].splitlines() if x.startswith("gradtrace: WARNING")]
    assert sorted(lines) == [f"gradtrace: WARNING: rank {r}: optimizer step 0 ended and no gradient was recorded (no "
                             f"PRE_REDUCE, POST_REDUCE or FINAL): {WHERE[runs['stage']]}: attach to the engine "
                             "(gradtrace.attach(engine, ...); gradtrace.attach of a Trainer or an Accelerator does)"
                             for r in (0, 1)]
    inspect = [str(BUILD / "bin" / "gradtrace-inspect")]
    marked = subprocess.run(inspect + [str(runs["grad"])], capture_output=True, text=True, timeout=60)
    assert marked.returncode == 0
    assert marked.stdout.count("gradients    NONE: ") == 2  # one per rank file
    assert "gradients    NONE" not in subprocess.run(inspect + [str(runs["cb"])], capture_output=True, text=True,
                                                     timeout=60).stdout
    assert "gradtrace: WARNING" not in runs["stderr"]
