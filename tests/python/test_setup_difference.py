"""Issue 19: a setup mistake is named as such, not as a gradient bug (format 1.4's initial-weight
sketches and input moments; diff exit 3). Real runs: tests/python/adapter_runs.py (DDP on 2 gloo
ranks against one rank, 2 steps) and gradtrace-train (the C++ capture)."""

import json
import subprocess

import pytest

import gradtrace
from conftest import BUILD
from test_pytorch_adapters import _run

DIFF = BUILD / "bin" / "gradtrace-diff"
TRAIN = BUILD / "bin" / "gradtrace-train"


def _gtdiff(a, b, report):
    p = subprocess.run([str(DIFF), str(a), str(b), "--json", str(report)], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode in (0, 1, 3), f"gradtrace-diff exit {p.returncode}: {p.stderr}"
    return p.returncode, json.loads(report.read_text()), p.stdout


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("setup")
    return {
        "ref": _run(d / "ref", "ref-dense", 1),
        "same": _run(d / "same", "ddp", 2),
        "seed": _run(d / "seed", "ddp", 2, "--seed", "99"),
        "data": _run(d / "data", "ddp", 2, "--data-from", "1"),
        "tmp": d,
    }


def test_the_trace_records_initial_values_and_input_moments(runs):
    for r in gradtrace.read_trace_set(runs["same"]):
        assert all(len(p["init_sketch"]) == min(16, p["numel"]) for p in r.run_info["params"])
        opt = [f for f in r.frames() if f["type"] == "step" and f["optimizer_step"]]
        # each rank's 2 of the 4 sequences of 16 tokens, per step
        assert [f["input_count"] for f in opt] == [32, 32] and all(f["input_sum"] > 0 for f in opt)


def test_the_same_setup_matches(runs):
    rc, r, out = _gtdiff(runs["ref"], runs["same"], runs["tmp"] / "same.json")
    assert rc == 0 and r["verdict"] == "match", out
    assert not [f for f in r["findings"] if f["kind"] == "setup"]


def test_another_init_seed_is_a_different_start(runs):
    rc, r, out = _gtdiff(runs["ref"], runs["seed"], runs["tmp"] / "seed.json")
    assert rc == 3, out
    assert r["verdict"] == "different-start" and r["exit_code"] == 3
    # LayerNorm starts at ones and zeros whatever the seed: 6 of the 8 parameters differ
    assert r["summary"].startswith("A and B start from different weights (6 of 8 parameters"), r["summary"]


def test_other_data_from_step_1_is_named_with_the_step(runs):
    rc, r, out = _gtdiff(runs["ref"], runs["data"], runs["tmp"] / "data.json")
    assert rc == 3, out
    assert r["verdict"] == "different-data" and r["step"] == 1
    assert r["summary"].startswith("A and B saw different data from step 1"), r["summary"]
    assert [s["verdict"] for s in r["steps"]] == ["match", "different-data"]


def test_gradtrace_train_with_another_seed_is_a_different_start(tmp_path):
    common = ["--nproc", "1", "--dp", "1", "--sp", "1", "--zero-stage", "2", "--scaling", "mean", "--loss",
              "local-mean", "--steps", "1", "--layers", "1", "--hidden", "16", "--heads", "2", "--vocab", "32",
              "--seq-len", "16", "--batch", "2"]
    for seed in (1, 2):
        p = subprocess.run([str(TRAIN), *common, "--seed", str(seed), "--out", str(tmp_path / f"s{seed}")],
                           capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr[-2000:]
    rc, r, out = _gtdiff(tmp_path / "s1", tmp_path / "s2", tmp_path / "r.json")
    assert rc == 3 and r["verdict"] == "different-start", out
