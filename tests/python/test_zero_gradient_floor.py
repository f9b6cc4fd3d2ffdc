"""The diff's absolute floor (diff/compare/tolerance.h) on a real attention whose key bias has a gradient
that is zero in exact arithmetic (softmax ignores a shift shared by all keys): its values are
rounding noise (RMS ~1e-10 against a step RMS ~1e-3) and differ between reduction orders by O(1)
relative to themselves. Before the floor, a correct sequence-split run was a `mismatch` there (in
diff and in --self); now it matches, and a real 2x bug in the same runs is still found.

The runs are real autograd (torch, fp32): a single pass over the whole batch (A) against two
sequence halves per sample whose gradients are summed (B, what a reduction over 2 sequence-parallel
ranks with a token-weighted loss produces). Both are written through gradtrace.TraceWriter.
"""

import json
import subprocess

import numpy as np
import pytest
import torch

import gradtrace
from conftest import BUILD, REPORT_SCHEMA_VERSION

DIFF = BUILD / "bin" / "gradtrace-diff"
H, T, V, BATCH = 32, 64, 50, 4


def _model():
    torch.manual_seed(0)
    mods = {"emb": torch.nn.Embedding(V, H), "q": torch.nn.Linear(H, H), "k": torch.nn.Linear(H, H),
            "v": torch.nn.Linear(H, H), "out": torch.nn.Linear(H, V)}
    params = {f"{m}.{n}": p for m, mod in mods.items() for n, p in mod.named_parameters()}
    return mods, params


def _grads(chunks, scale=1.0):
    """Gradients of the token-mean loss of the batch, summed over `chunks` (query-row ranges): each
    chunk attends to the whole sequence (as Ulysses does after its all-to-all) and backpropagates
    its share of the tokens."""
    mods, params = _model()
    gen = torch.Generator().manual_seed(1)
    x = torch.randint(0, V, (BATCH, T), generator=gen)
    y = torch.randint(0, V, (BATCH, T), generator=gen)
    per_chunk = []
    for rows in chunks:
        for p in params.values():
            p.grad = None
        h = mods["emb"](x)
        scores = mods["q"](h[:, rows]) @ mods["k"](h).transpose(1, 2) / H ** 0.5
        logits = mods["out"](torch.softmax(scores, -1) @ mods["v"](h))
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, V), y[:, rows].reshape(-1), reduction="sum")
        (scale * loss / y.numel()).backward()
        per_chunk.append({n: p.grad.detach().clone() for n, p in params.items()})
    return params, per_chunk


def _write(out, params, per_rank, post=None):
    names = list(params)
    run = {"producer": "pytest", "run_id": out.name, "config": {"world": len(per_rank), "dp": 1,
           "sp": len(per_rank), "batch": BATCH, "seq_len": T, "dtype": "fp32",
                                     "loss": "token-weighted"},
           "groups": [{"name": "sp", "ranks": list(range(len(per_rank)))}],
           "params": [{"name": n, "shape": list(params[n].shape), "dtype": "fp32"} for n in names]}
    out.mkdir()
    for rank, grads in enumerate(per_rank):
        with gradtrace.TraceWriter(out / f"rank-{rank:05d}.gtrace", dict(run, rank=rank)) as w:
            w.write_bucket({"step": 0, "phase": "PRE_REDUCE", "group": "sp",
                            "slices": [{"param_id": i, "values": grads[n]} for i, n in enumerate(names)]})
            final = post if post is not None else grads
            for phase in ("POST_REDUCE", "FINAL"):
                w.write_bucket({"step": 0, "phase": phase, "group": "sp" if phase == "POST_REDUCE" else "",
                                "slices": [{"param_id": i, "values": final[n]} for i, n in enumerate(names)]})
    return out


def _diff(*args):
    if not DIFF.exists():
        pytest.fail(f"{DIFF} not built")
    p = subprocess.run([str(DIFF), *map(str, args)], capture_output=True, text=True, timeout=60)
    return p.returncode, p.stdout + p.stderr


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("floor")
    params, (whole,) = _grads([slice(0, T)])
    halves = [slice(0, T // 2), slice(T // 2, T)]
    _, parts = _grads(halves)
    summed = {n: parts[0][n] + parts[1][n] for n in parts[0]}
    _, bug_parts = _grads(halves, scale=2.0)
    bug = {n: bug_parts[0][n] + bug_parts[1][n] for n in bug_parts[0]}
    return {"params": params, "whole": whole, "summed": summed, "tmp": tmp,
            "a": _write(tmp / "a", params, [whole]),
            "b": _write(tmp / "b", params, parts, post=summed),
            "bug": _write(tmp / "bug", params, bug_parts, post=bug)}


def test_key_bias_is_rounding_noise(runs):
    g, s = runs["whole"], runs["summed"]
    step_rms = float(torch.sqrt(sum((t.double() ** 2).sum() for t in g.values()) / sum(t.numel() for t in g.values())))
    kb, kb2 = g["k.bias"].double(), s["k.bias"].double()
    assert float(kb.pow(2).mean().sqrt()) < 1e-6 * step_rms
    assert float((kb2 - kb).norm() / kb2.norm()) > 1e-3  # far beyond any relative tolerance


def test_correct_split_matches_with_the_floor(runs, tmp_path):
    report = tmp_path / "r.json"
    rc, out = _diff(runs["a"], runs["b"], "--json", report)
    assert rc == 0, out
    r = json.loads(report.read_text())
    assert r["verdict"] == "match" and r["schema_version"] == REPORT_SCHEMA_VERSION
    assert r["tolerance"]["atol"] > 0
    kbias = next(p for p in r["params"] if p["name"] == "k.bias")
    assert "zero up to rounding" in kbias["note"]
    assert all("zero up to rounding" not in p["note"] for p in r["params"] if p["name"] != "k.bias")
    # Issue 19: its noise-over-noise B/A is no scale group of its own; one note names it.
    assert [g["kind"] for g in r["groups"]] == ["scale"] and "k.bias" not in r["groups"][0]["params"]
    assert abs(r["groups"][0]["scale"] - 1.0) < 1e-5
    notes = [f["message"] for f in r["findings"] if f["kind"] == "note"]
    assert any(n.startswith("1 parameter is zero up to rounding") and "k.bias" in n for n in notes), notes


def test_real_bug_is_still_found(runs, tmp_path):
    report = tmp_path / "r.json"
    rc, out = _diff(runs["a"], runs["bug"], "--json", report)
    assert rc == 1, out
    r = json.loads(report.read_text())
    assert r["verdict"] == "scaled"
    scales = {p["name"]: p["scale"] for p in r["params"] if p["name"] != "k.bias"}
    assert all(abs(s - 2.0) < 1e-5 for s in scales.values()), scales


def test_self_check_passes_the_zero_gradient(runs, tmp_path):
    report = tmp_path / "s.json"
    rc, out = _diff("--self", runs["b"], "--json", report)
    assert rc == 0, out
    r = json.loads(report.read_text())
    kbias = next(p for p in r["self_params"] if p["name"] == "k.bias")
    assert kbias["verdict"] == "ok" and kbias["divisor"] is None
    others = [p for p in r["self_params"] if p["name"] != "k.bias"]
    assert all(p["verdict"] == "ok" and abs(p["divisor"] - 1.0) < 1e-6 for p in others)
