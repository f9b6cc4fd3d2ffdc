"""The shared writer path (gradtrace.RankRecorder through the manual adapter) in one process, no
process group: the steps and params filters, the run id from $GRADTRACE_RUN_ID, layout rules and
overrides, the reported grad norm, and the one-line errors for a layout that cannot be right."""

import numpy as np
import pytest
import torch

import gradtrace
from gradtrace.adapters.layout import Layout


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.ReLU(), torch.nn.Linear(6, 3))


def _train(cap, model, steps):
    for step in range(steps):
        loss = model(torch.full((2, 4), float(step + 1))).pow(2).mean()
        loss.backward()
        cap.record_step(loss, 2)
        cap.step(grad_norm=10.0 + step)
        model.zero_grad()


def test_steps_and_params_filters_keep_the_whole_table(tmp_path, monkeypatch):
    monkeypatch.setenv("GRADTRACE_RUN_ID", "run-from-env")
    model = _model()
    cap = gradtrace.attach(model, tmp_path, steps=[1, 2], params=r"^2\.")
    _train(cap, model, 4)
    cap.close()
    reader = gradtrace.TraceReader(tmp_path / "rank-00000.gtrace")
    run = reader.run_info
    assert run["run_id"] == "run-from-env" and run["framework"] == "pytorch"
    assert [p["name"] for p in run["params"]] == ["0.weight", "0.bias", "2.weight", "2.bias"]
    assert [p["shape"] for p in run["params"]] == [[6, 4], [6], [3, 6], [3]]
    frames = list(reader.frames())
    finals = [f for f in frames if f["type"] == "bucket"]
    assert [(f["step"], [s["param_id"] for s in f["slices"]]) for f in finals] == [(1, [2, 3]), (2, [2, 3])]
    marks = [(f["step"], f["reported_grad_norm"]) for f in frames if f["type"] == "step" and f["optimizer_step"]]
    assert marks == [(1, 11.0), (2, 12.0)]
    fresh = _model()  # no optimizer ran: step 1's gradient is that of a fresh model on step 1's input
    fresh(torch.full((2, 4), 2.0)).pow(2).mean().backward()
    np.testing.assert_array_equal(finals[0]["slices"][1]["values"], fresh[2].bias.grad.numpy())


def test_layout_rules_and_overrides_fill_param_info_and_config(tmp_path):
    model = _model()
    cap = gradtrace.attach(
        model, tmp_path, tp=1, pp=1, gas=4, loss="local-mean", loss_description="mean of squares",
        rules=[(r"^0\.weight$", {"kind": "TP_SHARD", "partition_dim": 0, "shard_count": 2}),
(r"bias", {"kind": "REPLICATED", "grad_group": "tp"})])
    cap.close()
    run = gradtrace.TraceReader(tmp_path / "rank-00000.gtrace").run_info
    kinds = [(p["kind"], p["grad_group"], p.get("partition_dim"), p["shard_count"]) for p in run["params"]]
    assert kinds == [("TP_SHARD", "dp", 0, 2), ("REPLICATED", "tp", None, 0), ("DENSE", "dp", None, 0),
                     ("REPLICATED", "tp", None, 0)]
    cfg = run["config"]
    assert (cfg["world"], cfg["dp"], cfg["tp"], cfg["gas"], cfg["loss_description"]) == (1, 1, 1, 4, "mean of squares")


def test_a_layout_that_cannot_be_right_is_one_clear_error():
    with pytest.raises(ValueError, match=r"^cp > 1: say how the sequence is split"):
        Layout.infer(cp=2)
    with pytest.raises(ValueError, match=r"unknown layout keywords \['zp'\]"):
        Layout.infer(zp=2)
    with pytest.raises(ValueError, match=r"rule 'x': kind 'SHARD' is not one of"):
        Layout.infer(rules=[("x", {"kind": "SHARD"})])
