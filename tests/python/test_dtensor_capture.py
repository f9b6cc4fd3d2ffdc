"""DTensor-native capture (tests/python/dtensor_runs.py: real torch DTensor tensor parallelism on CPU
gloo, several processes), each run diffed by gradtrace-diff against a single-rank unsharded run of
the same weights and data.

Expected numbers, and why:
- tp (parallelize_module ColwiseParallel up + RowwiseParallel down, 2 ranks):
  every tp rank sees the whole batch and computes the same loss, DTensor's autograd gives each
  rank its shard of the true gradient: the joined shards equal the reference, scale 1.000, exit 0.
- tp with the loss multiplied by 2 (a bug): 2.000 for every parameter, exit 1.
- tp-sp (Megatron TP + sequence parallel: norms under SequenceParallel): the norm gradients are
  Partial(sum) over tp; FINAL reduces them, so 1.000, exit 0. With the reduction taken out (the
  local shares written, as grad.to_local() would be) the four norm parameters are replicas that
  disagree: mismatch, exit 1.
- fsdp-tp (the tp-sp plan on a (dp 2, tp 2) mesh under fully_shard over dp, 4 ranks, the batch
  rows split over dp, local-mean loss, FSDP's mean reduce-scatter; each tp rank's 13 rows of up split
  7 + 6 over dp, _StridedShard): 1.000, exit 0.
- ddp-tp (the tp plan on a (dp 2, tp 2) mesh under DistributedDataParallel over dp, 4 ranks, the
  batch rows split over dp, DDP's mean all-reduce): 1.000, exit 0.
- megatron (hand-written column/row-parallel shards as plain tensors, uneven 14 + 12, declared with
  attach(shards=...)): 1.000, exit 0.
fp32 with a few dozen summands per element: residuals ~1e-7; scales within 1e-5 of 1 (2e-5 of 2).
"""

import json
import subprocess

import numpy as np
import pytest

import gradtrace

from conftest import BUILD, ROOT, script_runs

RUNS = ROOT / "tests" / "python" / "dtensor_runs.py"
DIFF = BUILD / "bin" / "gradtrace-diff"
RTOL = 1e-5
NAMES = {"embed.weight", "norm.weight", "norm.bias", "up.weight", "up.bias", "down.weight", "down.bias",
         "norm2.weight", "norm2.bias", "head.weight"}
WORLD = {"ref": 1, "tp": 2, "tp-bug": 2, "tp-sp": 2, "tp-sp-unreduced": 2, "fsdp-tp": 4, "ddp-tp": 4, "megatron": 2}
FLAGS = {"tp-bug": ("tp", ["--loss-scale", "2"]), "tp-sp-unreduced": ("tp-sp", ["--unreduced-partial"])}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """run(name) -> the trace directory of that run, made once per module."""
    def command(name, out):
        kind, flags = FLAGS.get(name, (name, []))
        return [RUNS, kind, WORLD[name], out, *flags]

    return script_runs(tmp_path_factory, "dtensor", command, timeout=240)


def _diff(run, name):
    if not DIFF.exists():
        pytest.fail(f"{DIFF} not built: cmake --build {BUILD} --target gradtrace-diff")
    a, b = run("ref"), run(name)
    report = run.root / f"{name}-vs-ref.json"
    p = subprocess.run([str(DIFF), str(a), str(b), "--json", str(report)], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode in (0, 1), f"gradtrace-diff exit {p.returncode}: {p.stdout[-2000:]} {p.stderr}"
    return p.returncode, json.loads(report.read_text())


def _scales(report):
    return {r["name"]: r["scale"] for r in report["params"]}


def _assert_matches(run, name):
    code, report = _diff(run, name)
    scales = _scales(report)
    assert code == 0, (report["summary"], scales)
    assert set(scales) == NAMES and all(abs(s - 1.0) < RTOL for s in scales.values()), scales
    return report


def _params(run_info):
    return {p["name"]: p for p in run_info["params"]}


def _finals(trace_dir, step=0):
    """rank -> {param name: [(offset, count)]} of FINAL at ``step``."""
    out = {}
    for r in gradtrace.read_trace_set(trace_dir):
        names = [p["name"] for p in r.run_info["params"]]
        mine = out.setdefault(r.rank, {})
        for f in r.frames():
            if f["type"] == "bucket" and f["phase"] == "FINAL" and f["step"] == step:
                for s in f["slices"]:
                    mine.setdefault(names[s["param_id"]], []).append((s["offset"], s["count"]))
    return out


def test_tp_colwise_rowwise_matches_the_single_rank_reference(run):
    _assert_matches(run, "tp")
    readers = gradtrace.read_trace_set(run("tp"))
    run_info = readers[1].run_info
    cfg = run_info["config"]
    assert (cfg["world"], cfg["tp"], cfg["dp"]) == (2, 2, 1)
    assert run_info["tp_rank"] == 1
    assert {g["name"]: g["ranks"] for g in run_info["groups"]} == {"world": [0, 1], "tp": [0, 1], "dp": [1]}
    params = _params(run_info)
    assert params["up.weight"]["shape"] == [26, 16] and params["down.weight"]["shape"] == [16, 26]  # full shapes
    kinds = {n: (p["kind"], p.get("partition_dim"), p["shard_count"], p["grad_group"]) for n, p in params.items()}
    assert kinds["up.weight"] == ("TP_SHARD", 0, 2, "dp") and kinds["up.bias"] == ("TP_SHARD", 0, 2, "dp")
    assert kinds["down.weight"] == ("TP_SHARD", 1, 2, "dp")
    assert kinds["down.bias"][:1] == ("REPLICATED",) and kinds["down.bias"][3] == "tp"
    assert kinds["embed.weight"][0] == "DENSE"  # a plain tensor: every tp rank's copy
    # up's 26 rows: 13 + 13, one slice each; down's 26 columns: 13 + 13, a slice per row.
    finals = _finals(run("tp"))
    assert finals[0]["up.weight"] == [(0, 13 * 16)] and finals[1]["up.weight"] == [(13 * 16, 13 * 16)]
    assert finals[0]["down.weight"] == [(26 * r, 13) for r in range(16)]
    assert finals[1]["down.weight"] == [(26 * r + 13, 13) for r in range(16)]
    assert finals[0]["down.bias"] == finals[1]["down.bias"] == [(0, 16)]


def test_tp_with_the_loss_doubled_is_measured_as_2x(run):
    code, report = _diff(run, "tp-bug")
    scales = _scales(report)
    assert code == 1
    assert set(scales) == NAMES and all(abs(s - 2.0) < 2 * RTOL for s in scales.values()), scales


def test_tp_with_sequence_parallel_norms_matches_the_reference(run):
    """The norms' gradients are Partial(sum) over tp: FINAL writes the reduced gradient, the same on
    both ranks (checked here element by element), never one rank's partial share."""
    _assert_matches(run, "tp-sp")
    readers = gradtrace.read_trace_set(run("tp-sp"))
    params = _params(readers[0].run_info)
    assert params["norm.weight"]["kind"] == "REPLICATED" and params["norm.weight"]["grad_group"] == "tp"
    assert params["embed.weight"]["kind"] == "TP_SHARD" and params["head.weight"]["partition_dim"] == 0
    values = {}
    for r in readers:
        names = [p["name"] for p in r.run_info["params"]]
        for f in r.frames():
            if f["type"] == "bucket" and f["phase"] == "FINAL" and f["step"] == 0:
                for s in f["slices"]:
                    if names[s["param_id"]] == "norm.weight":
                        values[r.rank] = s["values"]
    assert set(values) == {0, 1}
    np.testing.assert_array_equal(values[0], values[1])


def test_partial_norm_gradients_written_unreduced_are_replicas_that_disagree(run):
    """The same run with the Partial reduction taken out (each rank's local share written, as
    recording grad.to_local() would): the four norm parameters mismatch as replicas that disagree,
    exit 1; every other parameter still matches."""
    code, report = _diff(run, "tp-sp-unreduced")
    assert code == 1
    verdicts = {r["name"]: r["verdict"] for r in report["params"]}
    norms = {"norm.weight", "norm.bias", "norm2.weight", "norm2.bias"}
    assert {n for n, v in verdicts.items() if v != "match"} == norms, verdicts
    assert "replicas of 'norm.weight' disagree" in json.dumps(report)


def test_fsdp2_x_tp_on_a_2d_mesh_matches_the_reference(run):
    _assert_matches(run, "fsdp-tp")
    readers = gradtrace.read_trace_set(run("fsdp-tp"))
    run_info = readers[1].run_info  # mesh [[0, 1], [2, 3]]: rank 1 is dp 0, tp 1
    cfg = run_info["config"]
    assert (run_info["framework"], cfg["world"], cfg["dp"], cfg["tp"]) == ("pytorch-fsdp2", 4, 2, 2)
    groups = {g["name"]: g["ranks"] for g in run_info["groups"]}
    assert groups["dp"] == [1, 3] and groups["tp"] == [0, 1]
    params = _params(run_info)
    assert (params["up.weight"]["kind"], params["up.weight"]["grad_group"]) == ("TP_SHARD", "dp")
    assert (params["norm.weight"]["kind"], params["norm.weight"]["grad_group"]) == ("REPLICATED", "tp")
    # up.weight [26, 16]: tp 0 holds rows 0..12, tp 1 rows 13..25; FSDP (_StridedShard over dp) splits each
    # 7 + 6 (uneven, nested offsets). Rank = 2 dp + tp.
    finals = _finals(run("fsdp-tp"))
    assert finals[0]["up.weight"] == [(0, 7 * 16)] and finals[2]["up.weight"] == [(7 * 16, 6 * 16)]
    assert finals[1]["up.weight"] == [(13 * 16, 7 * 16)] and finals[3]["up.weight"] == [(20 * 16, 6 * 16)]
    # down.weight [16, 26]: TP Shard(1) (13 columns each), FSDP Shard(0) (8 rows each): a slice per row.
    assert finals[3]["down.weight"] == [(26 * r + 13, 13) for r in range(8, 16)]


def test_ddp_x_tp_on_a_2d_mesh_matches_the_reference(run):
    """DDP(device_mesh=...) swaps each DTensor parameter for its local tensor (the DTensorSpec in
    _st_info): the table still records the full shape, and PRE/POST/FINAL the tp rank's block."""
    _assert_matches(run, "ddp-tp")
    readers = gradtrace.read_trace_set(run("ddp-tp"))
    run_info = readers[3].run_info
    assert (run_info["config"]["dp"], run_info["config"]["tp"]) == (2, 2)
    assert {g["name"]: g["ranks"] for g in run_info["groups"]} == {"world": [0, 1, 2, 3], "tp": [2, 3], "dp": [1, 3]}
    params = _params(run_info)
    assert params["down.weight"]["shape"] == [16, 26] and params["down.weight"]["partition_dim"] == 1
    finals = _finals(run("ddp-tp"))
    assert finals[3]["down.weight"] == [(26 * r + 13, 13) for r in range(16)]
    pre = [s["offset"] for f in readers[3].frames() if f["type"] == "bucket" and f["phase"] == "PRE_REDUCE"
           for s in f["slices"] if s["param_id"] == list(params).index("up.weight")]
    assert pre and set(pre) == {13 * 16}


def test_hand_written_megatron_shards_match_the_reference(run):
    _assert_matches(run, "megatron")
    run_info = gradtrace.read_trace_set(run("megatron"))[0].run_info
    params = _params(run_info)
    assert params["up.weight"]["shape"] == [26, 16] and params["down.weight"]["shape"] == [16, 26]
    assert (params["down.weight"]["kind"], params["down.weight"]["partition_dim"]) == ("TP_SHARD", 1)
    finals = _finals(run("megatron"))
    assert finals[0]["up.weight"] == [(0, 14 * 16)] and finals[1]["up.weight"] == [(14 * 16, 12 * 16)]
    assert finals[1]["up.bias"] == [(14, 12)] and finals[1]["down.weight"] == [(26 * r + 14, 12) for r in range(16)]


def test_record_takes_offsets_of_hand_written_shards(tmp_path):
    """One process: record()/around() write a shard declared at attach, and offsets= places values."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)  # this rank's shard: columns 2..5 of a [3, 8] weight; bias rows 1..3 of [6]
    cap = gradtrace.attach(model, tmp_path, groups={"tp": [0]},
                           shards={"weight": (1, 2, 8), model.bias: (0, 1, 6)})
    w = torch.arange(12.0).reshape(3, 4)
    cap.record("POST_REDUCE", "tp", [model.weight, model.bias], tensors=[w, torch.ones(3)])
    cap.record("POST_REDUCE", "tp", [model.weight], tensors=[torch.full((3, 8), 7.0)], offsets={model.weight: (0, 0)})
    cap.record("PRE_REDUCE", "tp", [model.bias], tensors=[torch.ones(2)], offsets={"bias": 4})
    with pytest.raises(ValueError, match="does not fit"):
        cap.record("POST_REDUCE", "tp", [model.weight], tensors=[w], offsets={model.weight: (1, 6)})
    cap.step()  # no gradients: no FINAL, but the step ends
    cap.close()
    reader = gradtrace.TraceReader(str(tmp_path / "rank-00000.gtrace"))
    assert [p["shape"] for p in reader.run_info["params"]] == [[3, 8], [6]]
    assert reader.run_info["params"][0]["kind"] == "TP_SHARD" and reader.run_info["params"][0]["partition_dim"] == 1
    buckets = [f for f in reader.frames() if f["type"] == "bucket"]
    first = [(s["param_id"], s["offset"], s["count"]) for s in buckets[0]["slices"]]
    assert first == [(0, 2, 4), (0, 10, 4), (0, 18, 4), (1, 1, 3)]
    np.testing.assert_array_equal(buckets[0]["slices"][1]["values"], [4, 5, 6, 7])
    assert [(s["offset"], s["count"]) for s in buckets[1]["slices"]] == [(0, 24)]
    assert [(s["offset"], s["count"]) for s in buckets[2]["slices"]] == [(4, 2)]


def _self(run, name):
    report = run.root / f"self-{name}.json"
    p = subprocess.run([str(DIFF), "--self", str(run(name)), "--json", str(report)], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode in (0, 1), f"gradtrace-diff --self exit {p.returncode}: {p.stdout[-2000:]} {p.stderr}"
    return p.returncode, json.loads(report.read_text())


def test_self_check_passes_the_correct_tp_sp_run_and_flags_the_unreduced_norms(run):
    """Issue 19: --self on Megatron-style TP + SP. The correct run exits 0 (FINAL only: the replicas of
    each replicated norm agree); with the norm gradients left unreduced over tp it flags exactly the
    four norms as inconsistent replicas and claims no divisor for them."""
    code, report = _self(run, "tp-sp")
    assert code == 0, report["summary"]
    assert report["verdict"] == "ok" and not report["self_params"]
    assert "only the replicas of FINAL are checked" in json.dumps(report["findings"])
    code, report = _self(run, "tp-sp-unreduced")
    assert code == 1, report["summary"]
    bad = {p["name"] for p in report["self_params"] if p["verdict"] == "inconsistent"}
    assert bad == {"norm.weight", "norm.bias", "norm2.weight", "norm2.bias"}
    replica = [f["message"] for f in report["findings"] if f["kind"] == "replica"]
    assert len(replica) == 4 and all("not reduced over every rank that holds it" in m for m in replica)
    assert all(g["kind"] == "inconsistent" for g in report["groups"])
