"""Gradient bug or logging bug (diff/evidence/grad_norm.h): the diff compares the grad norm each trace reports
(StepInfo.reported_grad_norm, format 1.2) with the norm of its FINAL gradients.

Real autograd on a tiny MLP, data parallel over 2 ranks emulated in one process (each rank's local
gradient from its half of the batch; FINAL = their mean, what DDP hands the optimizer). The two
logging-only distractors of the bug zoo are rendered with their reported-norm arithmetic:
- ms-swift PR #8341: rank 0's local norm logged without reduction;
- MindSpore hyper-parallel #526: replicated gradients counted once per rank (norm x sqrt(world)).
Both must read "gradients match; the reported grad norm of B is off by X" with exit 0, X measured.
A real gradient bug (B's gradients and its honest norm 2x) stays `scaled` with a consistent norm.
"""

import json
import math
import subprocess

import pytest
import torch

import gradtrace
from conftest import BUILD

DIFF = BUILD / "bin" / "gradtrace-diff"


def _grads(rows):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(8, 8, generator=gen), torch.randn(8, 4, generator=gen)
    torch.nn.functional.mse_loss(model(x[rows]), y[rows]).backward()
    return {n: p.grad.detach().clone() for n, p in model.named_parameters()}


def _norm(grads):
    return math.sqrt(sum(float((g.double() ** 2).sum()) for g in grads.values()))


def _write(out, grads, reported, world=1):
    names = list(grads)
    run = {"producer": "pytest", "run_id": out.name, "framework": "pytorch-ddp",
           "config": {"world": world, "dp": world, "dtype": "fp32"},
           "params": [{"name": n, "shape": list(grads[n].shape), "dtype": "fp32"} for n in names]}
    out.mkdir()
    for rank in range(world):
        with gradtrace.TraceWriter(out / f"rank-{rank:05d}.gtrace", dict(run, rank=rank)) as w:
            w.write_step({"step": 0, "loss": 1.0, "valid_tokens": 8})
            w.write_bucket({"step": 0, "phase": "FINAL",
                            "slices": [{"param_id": i, "values": grads[n]} for i, n in enumerate(names)]})
            w.write_step({"step": 0, "optimizer_step": True, "reported_grad_norm": reported})
    return out


def _diff(a, b, tmp_path):
    if not DIFF.exists():
        pytest.fail(f"{DIFF} not built")
    report = tmp_path / "r.json"
    p = subprocess.run([str(DIFF), str(a), str(b), "--json", str(report)], capture_output=True, text=True,
                       timeout=60)
    return p.returncode, p.stdout + p.stderr, json.loads(report.read_text())


@pytest.fixture(scope="module")
def grads():
    whole = _grads(slice(0, 8))
    local = [_grads(slice(0, 4)), _grads(slice(4, 8))]
    mean = {n: (local[0][n] + local[1][n]) / 2 for n in whole}
    return whole, local, mean


def test_honest_norms_are_consistent(grads, tmp_path):
    whole, _, mean = grads
    a = _write(tmp_path / "a", whole, _norm(whole))
    b = _write(tmp_path / "b", mean, _norm(mean), world=2)
    rc, out, r = _diff(a, b, tmp_path)
    assert rc == 0, out
    assert r["grad_norm"]["verdict"] == "consistent"
    assert r["grad_norm"]["off_a"] == pytest.approx(1.0, abs=1e-6)
    assert r["grad_norm"]["off_b"] == pytest.approx(1.0, abs=1e-6)
    assert r["trace_b"]["reported_grad_norm"] == pytest.approx(_norm(mean))


@pytest.mark.parametrize("pattern", ["local-norm-unreduced", "replicas-counted-per-rank"])
def test_logging_only_bugs_say_gradients_match(grads, tmp_path, pattern):
    whole, local, mean = grads
    reported = _norm(local[0]) if pattern == "local-norm-unreduced" else math.sqrt(2) * _norm(mean)
    expected_off = reported / _norm(mean)
    assert abs(expected_off - 1) > 0.05  # the arithmetic really misreports
    a = _write(tmp_path / "a", whole, _norm(whole))
    b = _write(tmp_path / "b", mean, reported, world=2)
    rc, out, r = _diff(a, b, tmp_path)
    assert rc == 0, out
    assert r["verdict"] == "match"
    g = r["grad_norm"]
    assert g["verdict"] == "misreported"
    assert g["off_b"] == pytest.approx(expected_off, rel=1e-5)
    assert g["off_a"] == pytest.approx(1.0, abs=1e-6)
    assert r["summary"].startswith("gradients match; the reported grad norm of B is off by")
    assert any(f["kind"] == "grad-norm" for f in r["findings"])


def test_gradient_bug_with_an_honest_norm_is_not_a_logging_bug(grads, tmp_path):
    whole, _, mean = grads
    doubled = {n: 2 * g for n, g in mean.items()}
    a = _write(tmp_path / "a", whole, _norm(whole))
    b = _write(tmp_path / "b", doubled, _norm(doubled), world=2)
    rc, out, r = _diff(a, b, tmp_path)
    assert rc == 1, out
    assert r["verdict"] == "scaled"
    assert all(p["scale"] == pytest.approx(2.0, rel=1e-5) for p in r["params"])
    assert r["grad_norm"]["verdict"] == "consistent"
