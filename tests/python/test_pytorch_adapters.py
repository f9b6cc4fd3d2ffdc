"""The PyTorch adapters (gradtrace.ddp_adapter, fsdp2_adapter, manual_adapter) on real multi-process
gloo runs (tests/python/adapter_runs.py: a tiny attention LM, the same weights and global batch at
every world size), each diffed by gradtrace-diff against a single-rank reference.

Expected numbers, and why:
- DDP, 2 ranks, gas 2 with no_sync, local-mean loss over equal token counts: DDP's allreduce hook
  divides the sum by 2, so FINAL = reference (scale 1.000, exit 0); POST_REDUCE = mean of the ranks'
  PRE_REDUCE; PRE only on the micro-step that communicates (micro 1).
- DDP with a hook that sums and forgets to divide: FINAL = 2.000 x reference, exit 1.
- Hand-written context parallel, 2 ranks, each half of the sequence, loss = CE sum / all-reduced
  token count, gradients summed over cp: FINAL = reference (exit 0).
- FSDP2 (fully_shard, 2 ranks): FINAL shards joined = reference (exit 0); a rank's POST_REDUCE
  shard = mean over ranks of that shard's PRE_REDUCE rows.
fp32 throughout with a few dozen summands per element: residuals ~1e-7, bound 1e-5 relative.
"""

import json
import subprocess
import sys

import numpy as np
import pytest

import gradtrace

from conftest import BUILD, ROOT, deepspeed_env

RUNS = ROOT / "tests" / "python" / "adapter_runs.py"
DIFF = BUILD / "bin" / "gradtrace-diff"
RTOL = 1e-5


def _run(out, kind, world, *flags):
    cmd = [sys.executable, str(RUNS), kind, str(world), str(out), *flags]
    p = subprocess.run(cmd, env=deepspeed_env(), capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return out


def _diff(a, b, tmp):
    if not DIFF.exists():
        pytest.fail(f"{DIFF} not built: cmake --build {BUILD} --target gradtrace-diff")
    report = tmp / f"{b.name}-vs-{a.name}.json"
    p = subprocess.run([str(DIFF), str(a), str(b), "--json", str(report)], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode in (0, 1), f"gradtrace-diff exit {p.returncode}: {p.stderr}"
    return p.returncode, json.loads(report.read_text())


def _scales(report):
    return {r["name"]: r["scale"] for r in report["params"]}


def _buckets(trace_dir, phase):
    """[(rank, frame)] of every bucket record of ``phase``."""
    return [(r.rank, f) for r in gradtrace.read_trace_set(trace_dir) for f in r.frames()
            if f["type"] == "bucket" and f["phase"] == phase]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("adapters")
    return {
        "ref-dense": _run(d / "ref-dense", "ref-dense", 1),
        "ref-seq": _run(d / "ref-seq", "ref-seq", 1),
        "ddp": _run(d / "ddp", "ddp", 2, "--gas", "2"),
        "ddp-bug": _run(d / "ddp-bug", "ddp", 2, "--bug"),
        "cp": _run(d / "cp", "cp", 2),
        "fsdp2": _run(d / "fsdp2", "fsdp2", 2),
        "hsdp": _run(d / "hsdp", "hsdp", 4),
        "tmp": d,
    }


def test_ddp_final_matches_single_rank_reference(runs):
    code, report = _diff(runs["ref-dense"], runs["ddp"], runs["tmp"])
    assert code == 0, report["summary"]
    scales = _scales(report)
    assert len(scales) == 8 and all(abs(s - 1.0) < RTOL for s in scales.values()), scales


def test_ddp_hook_that_sums_without_dividing_is_measured_as_2x(runs):
    code, report = _diff(runs["ref-dense"], runs["ddp-bug"], runs["tmp"])
    assert code == 1
    scales = _scales(report)
    assert all(abs(s - 2.0) < 2 * RTOL for s in scales.values()), scales
    # The user's hook ran inside the recording one: POST_REDUCE = the sum of PRE_REDUCE, divisor unknown (0).
    pre, post = _buckets(runs["ddp-bug"], "PRE_REDUCE"), _buckets(runs["ddp-bug"], "POST_REDUCE")
    assert len(post) == 4  # 2 ranks x 2 steps, one bucket
    for _, f in post:
        same = [g for _, g in pre if (g["step"], g["bucket_id"]) == (f["step"], f["bucket_id"])]
        assert f["divisor"] == 0.0 and len(same) == 2
        for k, s in enumerate(f["slices"]):
            total = same[0]["slices"][k]["values"].astype(np.float64) + same[1]["slices"][k]["values"]
            np.testing.assert_allclose(s["values"], total, rtol=1e-6, atol=1e-9)


def test_ddp_records_the_layout_and_one_run_id(runs):
    readers = gradtrace.read_trace_set(runs["ddp"])
    assert [r.rank for r in readers] == [0, 1]
    assert len({r.run_info["run_id"] for r in readers}) == 1 and readers[0].run_info["run_id"]
    run = readers[1].run_info
    assert run["framework"] == "pytorch-ddp" and run["framework_version"]
    assert set(run["versions"]) >= {"torch", "python"}
    cfg = run["config"]
    assert (cfg["world"], cfg["dp"], cfg["gas"], cfg["backend"], cfg["scaling"]) == (2, 2, 2, "gloo", "mean")
    assert cfg["loss"] == "local-mean" and cfg["loss_description"].startswith("mean CE")
    assert run["dp_rank"] == 1
    assert {g["name"]: g["ranks"] for g in run["groups"]} == {"world": [0, 1], "dp": [0, 1]}
    assert [p["name"] for p in run["params"]][:2] == ["embed.weight", "qkv.weight"]
    assert {(p["kind"], p["grad_group"], p["dtype"]) for p in run["params"]} == {("DENSE", "dp", "FP32")}


def test_ddp_post_reduce_is_the_mean_of_pre_reduce_on_the_communicating_micro_step(runs):
    pre, post = _buckets(runs["ddp"], "PRE_REDUCE"), _buckets(runs["ddp"], "POST_REDUCE")
    assert {f["micro_step"] for _, f in pre + post} == {1}  # micro 0 ran under no_sync
    assert {f["step"] for _, f in pre} == {0, 1}
    checked = 0
    for rank, f in post:
        assert f["divisor"] == 2.0 and f["group"] == "dp"
        same = [g for _, g in pre if (g["step"], g["bucket_id"]) == (f["step"], f["bucket_id"])]
        assert len(same) == 2
        for k, s in enumerate(f["slices"]):
            mean = (same[0]["slices"][k]["values"].astype(np.float64) + same[1]["slices"][k]["values"]) / 2
            np.testing.assert_allclose(s["values"], mean, rtol=1e-6, atol=1e-9)
            checked += s["values"].size
    assert checked > 0


def test_reported_grad_norm_is_the_norm_of_final(runs):
    reader = gradtrace.read_trace_set(runs["ddp"])[0]
    frames = list(reader.frames())
    for step in (0, 1):
        final = [f for f in frames if f["type"] == "bucket" and f["phase"] == "FINAL" and f["step"] == step]
        norm = np.sqrt(sum(float(np.sum(s["values"].astype(np.float64) ** 2)) for s in final[0]["slices"]))
        marks = [f for f in frames if f["type"] == "step" and f["optimizer_step"] and f["step"] == step]
        assert len(marks) == 1 and marks[0]["micro_step"] == 1
        assert abs(marks[0]["reported_grad_norm"] - norm) < 1e-5 * norm
        losses = [f for f in frames if f["type"] == "step" and not f["optimizer_step"] and f["step"] == step]
        assert [f["micro_step"] for f in losses] == [0, 1] and all(f["valid_tokens"] == SEQ for f in losses)


SEQ = 16  # tokens per rank and micro-step in the DDP run: one row of adapter_runs.SEQ, none ignored


def test_context_parallel_run_matches_single_rank_reference(runs):
    code, report = _diff(runs["ref-seq"], runs["cp"], runs["tmp"])
    assert code == 0, report["summary"]
    assert all(abs(s - 1.0) < RTOL for s in _scales(report).values())
    run = gradtrace.read_trace_set(runs["cp"])[1].run_info
    cfg = run["config"]
    assert (run["framework"], cfg["world"], cfg["dp"], cfg["cp"], cfg["cp_kind"]) == ("pytorch", 2, 1, 2, "all-gather")
    assert (cfg["loss"], cfg["scaling"]) == ("token-weighted", "sum")
    assert run["cp_rank"] == 1 and {g["name"] for g in run["groups"]} == {"world", "cp"}


def test_context_parallel_post_reduce_is_the_sum_of_pre_reduce(runs):
    pre, post = _buckets(runs["cp"], "PRE_REDUCE"), _buckets(runs["cp"], "POST_REDUCE")
    assert len(pre) == len(post) == 4  # 2 ranks x 2 steps
    for rank, f in post:
        same = [g for _, g in pre if g["step"] == f["step"]]
        for k, s in enumerate(f["slices"]):
            total = same[0]["slices"][k]["values"].astype(np.float64) + same[1]["slices"][k]["values"]
            np.testing.assert_allclose(s["values"], total, rtol=1e-6, atol=1e-9)


def test_self_check_of_the_context_parallel_run_expects_no_division(runs):
    """token-weighted over cp: the cp ranks' losses add up to the sequence's, so their gradients are
    summed undivided: expected divisor group size / cp = 1, measured 1 (gradtrace-diff --self)."""
    report = runs["tmp"] / "self-cp.json"
    p = subprocess.run([str(DIFF), "--self", str(runs["cp"]), "--json", str(report)], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stdout[-2000:]
    rows = json.loads(report.read_text())["self_params"]
    assert len(rows) == 8 and all(r["expected"] == 1.0 and abs(r["divisor"] - 1.0) < RTOL for r in rows), rows


def test_fsdp2_final_shards_match_single_rank_reference(runs):
    code, report = _diff(runs["ref-dense"], runs["fsdp2"], runs["tmp"])
    assert code == 0, report["summary"]
    assert all(abs(s - 1.0) < RTOL for s in _scales(report).values())
    run = gradtrace.read_trace_set(runs["fsdp2"])[0].run_info
    assert (run["framework"], run["config"]["dp"], run["config"]["zero_stage"]) == ("pytorch-fsdp2", 2, 3)
    finals = _buckets(runs["fsdp2"], "FINAL")
    # embed.weight [32, 16] in two dim-0 shards: rank r holds elements [256 r, 256 (r + 1)).
    embed = {rank: s for rank, f in finals if f["step"] == 0 for s in f["slices"] if s["param_id"] == 0}
    assert {r: (s["offset"], s["count"]) for r, s in embed.items()} == {0: (0, 256), 1: (256, 256)}


def test_hsdp_is_recorded_as_replicate_x_shard_and_reduces_right(runs):
    """FSDP2 HSDP on a (replicate 2, shard 2) mesh: format 1.3's layout, FINAL equal to the
    single-rank reference, and --self measuring the whole reduction (shard group and its replicas:
    4 ranks, divisor 4 = dp for a local-mean loss)."""
    code, report = _diff(runs["ref-dense"], runs["hsdp"], runs["tmp"])
    assert code == 0, report["summary"]
    scales = _scales(report)
    assert len(scales) == 8 and all(abs(s - 1.0) < RTOL for s in scales.values()), scales
    readers = gradtrace.read_trace_set(runs["hsdp"])
    run = readers[0].run_info
    assert (run["config"]["dp"], run["config"]["replicate"]) == (4, 2)
    assert {g["name"]: g["ranks"] for g in run["groups"]}.items() >= {"shard": [0, 1], "replicate": [0, 2]}.items()
    assert {p["grad_group"] for p in run["params"]} == {"shard"}
    out = runs["tmp"] / "self-hsdp.json"
    p = subprocess.run([str(DIFF), "--self", str(runs["hsdp"]), "--json", str(out)], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stdout[-2000:]
    rows = json.loads(out.read_text())["self_params"]
    assert len(rows) == 8, rows
    assert all(r["group_size"] == 4 and r["expected"] == 4.0 and abs(r["divisor"] - 4.0) < RTOL for r in rows), rows


def test_fsdp2_post_reduce_shard_is_the_mean_of_pre_reduce(runs):
    pre, post = _buckets(runs["fsdp2"], "PRE_REDUCE"), _buckets(runs["fsdp2"], "POST_REDUCE")
    assert pre and len(pre) == len(post)
    checked = 0
    for rank, f in post:
        assert f["divisor"] == 2.0
        same = [g for _, g in pre if (g["step"], g["bucket_id"]) == (f["step"], f["bucket_id"])]
        assert len(same) == 2
        for s in f["slices"]:
            rows = [x["values"].astype(np.float64) for g in same for x in g["slices"]
                    if (x["param_id"], x["offset"]) == (s["param_id"], s["offset"])]
            assert len(rows) == 2
            np.testing.assert_allclose(s["values"], (rows[0] + rows[1]) / 2, rtol=1e-6, atol=1e-9)
            checked += s["count"]
    assert checked > 0
