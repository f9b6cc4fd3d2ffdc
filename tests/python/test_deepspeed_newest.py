"""The newest DeepSpeed (pinned in tools/constraints.txt), captured by
gradtrace.deepspeed_adapter, on CPU with gloo: the DeepSpeed #5248 loop at sp=2 (2 ranks, dp=1),
ZeRO-2, against a single-rank full-sequence reference with the same weights and data.

Measured on deepspeed 0.19.8 / torch 2.15.0 (tools/repro/ds5248/README.md), and asserted here:
- `backward(loss)`, loss = mean over the rank's own sub-sequence: FINAL = 2.000 x reference for every
  parameter. Why: with equal shards each SP rank's local mean covers T/2 tokens, so the sum over the 2
  SP ranks of grad(local mean) is 2 x grad(full-sequence mean); ZeRO-2 reduces over the
  sequence-data-parallel group (2 ranks) and divides by world(sdp) / sp = 1
  (stage_1_and_2.py average_tensor: `tensor.div_(world_size(dp_process_group) / sequence_parallel_size)`).
  The effective divisor (POST_REDUCE vs the sum of PRE_REDUCE) is therefore 1.
- `backward(loss / sp)`: 1.000. token-weighted with uneven shards (25% ignored labels): 1.000.
Tolerance: fp32 with at most a few thousand summands per element; the measured residuals are ~1e-7,
the asserted bound 1e-4 relative.
"""

import importlib.util
import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import gradtrace

from conftest import BUILD, ROOT, deepspeed_env  # $GRADTRACE_BUILD_DIR, default build/
RUNNER = ROOT / "tools" / "repro" / "ds5248" / "run.py"
sys.path.insert(0, str(RUNNER.parent))

# tools/setup installs the pinned DeepSpeed: its absence is a broken setup, not a reason to skip.
if importlib.util.find_spec("deepspeed") is None:
    raise ImportError("deepspeed is not installed in this Python: run ./tools/setup (tools/requirements.txt)")

from compare import final_grads, scales  # noqa: E402  (tools/repro/ds5248/compare.py)

RTOL = 1e-4


def _run(out, *args):
    env = deepspeed_env()
    cmd = [sys.executable, str(RUNNER), "--out", str(out), "--timeout", "240", *args]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("ds5248")
    common = ["--zero-stage", "2", "--steps", "1", "--seq-len", "16"]
    return {
        "ref": _run(d / "ref", "--sp", "1", *common),
        "loss": _run(d / "sp2-loss", "--sp", "2", "--loss", "loss", *common),
        "div": _run(d / "sp2-div", "--sp", "2", "--loss", "loss-div-sp", *common),
        "ref-ign": _run(d / "ref-ign", "--sp", "1", "--ignore-frac", "0.25", *common),
        "tw-ign": _run(d / "sp2-tw-ign", "--sp", "2", "--loss", "token-weighted", "--ignore-frac", "0.25", *common),
    }


def _scale_table(ref, run):
    a, spread_a = final_grads(ref)
    b, spread_b = final_grads(run)
    assert spread_a == 0.0 and spread_b < 1e-6, f"FINAL differs between ranks ({spread_a}, {spread_b})"
    assert set(a) == set(b) and len(a) > 0
    table = scales(ref, run)  # gradtrace-diff's params[] (compare.py runs it)
    assert set(table) == set(a)
    return table


def _assert_scale(table, expected):
    bad = {n: r for n, r in table.items() if abs(r["scale"] - expected) > RTOL * expected or r["residual"] > RTOL}
    assert not bad, f"expected FINAL scale {expected} for every parameter; off: {bad}"


def test_local_mean_loss_is_scaled_by_sp(runs):
    _assert_scale(_scale_table(runs["ref"], runs["loss"]), 2.0)


def test_loss_div_sp_matches_reference(runs):
    _assert_scale(_scale_table(runs["ref"], runs["div"]), 1.0)


def test_token_weighted_matches_reference_with_uneven_shards(runs):
    steps = [f for r in gradtrace.read_trace_set(runs["tw-ign"]) for f in r.frames() if f["type"] == "step"]
    assert len({s["valid_tokens"] for s in steps}) > 1, "the shards were meant to hold different token counts"
    _assert_scale(_scale_table(runs["ref-ign"], runs["tw-ign"]), 1.0)


def test_run_info_and_phases(runs):
    import deepspeed
    import torch
    readers = gradtrace.read_trace_set(runs["loss"])
    assert [r.rank for r in readers] == [0, 1]
    from model import build_model  # tools/repro/ds5248/model.py
    names = [n for n, _ in build_model(1234, 64, 32, 4, 2, 16).named_parameters()]
    for r in readers:
        ri = r.run_info
        assert ri["producer"] == "deepspeed via adapter"
        assert ri["producer_version"] == f"deepspeed {deepspeed.__version__} / torch {torch.__version__.split('+')[0]}"
        c = ri["config"]
        assert (c["world"], c["dp"], c["sp"], c["zero_stage"], c["gas"]) == (2, 1, 2, 2, 1)
        assert c["scaling"] == f"deepspeed@{deepspeed.__version__}" and c["loss"] == "local-mean"
        assert json.loads(ri["extra"]["ds_config"])["zero_optimization"]["stage"] == 2
        assert json.loads(ri["extra"]["adapter_unrecordable_phases"]) == {}
        assert {g["name"]: g["ranks"] for g in ri["groups"]} == {"world": [0, 1], "sp": [0, 1], "dp": [r.rank],
                                                                 "sdp": [0, 1]}
        assert ri["sp_rank"] == r.rank and ri["dp_rank"] == 0
        assert (ri["framework"], ri["framework_version"], ri["versions"]["deepspeed"]) == ("deepspeed",) + (
            deepspeed.__version__,) * 2
        assert {(p["kind"], p["grad_group"]) for p in ri["params"]} == {("DENSE", "sdp")}
        # engine.get_global_grad_norm() after the step: the norm of the averaged gradient, i.e. of FINAL
        frames = list(r.frames())
        final = [s for f in frames if f["type"] == "bucket" and f["phase"] == "FINAL" for s in f["slices"]]
        norm = np.sqrt(sum(np.sum(gradtrace.slice_values(s, np.float64) ** 2) for s in final))
        marks = [f for f in frames if f["type"] == "step" and f["optimizer_step"]]
        assert len(marks) == 1 and abs(marks[0]["reported_grad_norm"] - norm) <= 1e-5 * norm
        assert [p["name"] for p in ri["params"]] == names
        phases = {f["phase"] for f in r.frames() if f["type"] == "bucket"}
        assert phases == {"PRE_REDUCE", "POST_REDUCE", "FINAL"}


def test_post_reduce_partitions_and_divisor(runs):
    """POST_REDUCE: the two ranks' partitions tile every parameter exactly once, and
    POST = sum over ranks of PRE / d with d = 1 (world(sdp) / sp), per bucket."""
    readers = gradtrace.read_trace_set(runs["loss"])
    numel = {p["id"]: p["numel"] for p in readers[0].run_info["params"]}
    pre_sum, post, cover = {}, {}, {}
    for r in readers:
        for f in r.frames():
            if f["type"] != "bucket" or f["phase"] not in ("PRE_REDUCE", "POST_REDUCE"):
                continue
            held = 0
            for s in f["slices"]:
                v = gradtrace.slice_values(s, np.float64)
                pid, off = s["param_id"], s["offset"]
                if f["phase"] == "PRE_REDUCE":
                    acc = pre_sum.setdefault(pid, np.zeros(numel[pid]))
                    acc[off:off + v.size] += v
                else:
                    post.setdefault(pid, np.zeros(numel[pid]))[off:off + v.size] = v
                    cover.setdefault(pid, np.zeros(numel[pid], np.int64))[off:off + v.size] += 1
                    held += v.size
            if f["phase"] == "POST_REDUCE":
                assert f["partition_count"] == held
    assert set(cover) == set(numel)
    for pid, c in cover.items():
        assert (c == 1).all(), f"param {pid}: POST_REDUCE coverage {np.unique(c)}"
        s, p = pre_sum[pid], post[pid]
        d = float(s @ s) / float(s @ p)
        assert abs(d - 1.0) < RTOL, f"param {pid}: effective divisor {d}"


def test_traces_verify(runs):
    inspect = BUILD / "bin" / "gradtrace-inspect"
    for key in ("ref", "loss"):
        for path in sorted(pathlib.Path(runs[key]).glob("rank-*.gtrace")):
            gradtrace.verify(path)
            if inspect.exists():
                p = subprocess.run([str(inspect), "--verify", str(path)], capture_output=True, text=True)
                assert p.returncode == 0, p.stdout + p.stderr


def test_gradtrace_diff_agrees(runs):
    diff = BUILD / "bin" / "gradtrace-diff"
    if not diff.exists():
        pytest.skip(f"{diff} not built")
    out = pathlib.Path(runs["loss"]).parent / "diff.json"
    p = subprocess.run([str(diff), str(runs["ref"]), str(runs["loss"]), "--threads", "1", "--json", str(out)],
                       capture_output=True, text=True)
    assert p.returncode == 1, p.stdout + p.stderr  # differences found
    groups = json.loads(out.read_text())["groups"]
    assert len(groups) == 1 and abs(groups[0]["scale"] - 2.0) < RTOL
    p = subprocess.run([str(diff), str(runs["ref"]), str(runs["div"]), "--threads", "1"], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
