"""Where FINAL is taken for each way an optimizer is stepped (gradtrace.adapters.step_protocol), on real torch
optimizers in one process: ``step()``, ``step(closure)`` whose closure runs the forward and backward (Lightning's,
Fabric's and LBFGS's protocol), and LBFGS's several evaluations per step. FINAL must be the gradient the update
used: issue 41 (taken in the step pre-hook, a closure step recorded the previous micro-batch's gradient, or
none at all at step 0)."""

import warnings

import numpy as np
import pytest
import torch

import gradtrace

STEPS = 3


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))


def data(step):
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(6, 4, generator=g), torch.randn(6, 1, generator=g)


def make_closure(net, opt, x, y, cap=None):
    """What optimizer.step(closure) evaluates: zero the gradients, the forward and backward of (x, y)."""
    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(net(x), y)
        loss.backward()
        if cap is not None:
            cap.record_step(loss)
        return loss

    return closure


def finals(out):
    """[(step, micro, {param id: values})] of the FINAL records of a one-rank trace."""
    (reader,) = gradtrace.read_trace_set(out)
    return [(f["step"], f["micro_step"], {s["param_id"]: np.asarray(s["values"]) for s in f["slices"]})
            for f in reader.frames() if f.get("phase") == "FINAL"]


def expected_grads(optimizer_cls, **kw):
    """Each step's gradient at the parameters the step starts from, by hand (no gradtrace)."""
    net = model()
    opt = optimizer_cls(net.parameters(), **kw)
    out = []
    for step in range(STEPS):
        closure = make_closure(net, opt, *data(step))
        closure()
        out.append({k: p.grad.detach().clone().reshape(-1).numpy() for k, p in enumerate(net.parameters())})
        opt.step(closure)
    return out


def train(out, optimizer_cls, use_closure, **kw):
    net = model()
    opt = optimizer_cls(net.parameters(), **kw)
    cap = gradtrace.attach(net, out, optimizer=opt, loss="local-mean")
    for step in range(STEPS):
        closure = make_closure(net, opt, *data(step), cap)
        if use_closure:
            opt.step(closure)
        else:
            closure()
            opt.step()
    cap.close()
    return cap


@pytest.mark.parametrize("optimizer_cls,kw", [(torch.optim.SGD, {"lr": 0.1}), (torch.optim.AdamW, {"lr": 0.01})])
def test_a_closure_step_records_the_gradient_the_update_used(tmp_path, optimizer_cls, kw):
    want = expected_grads(optimizer_cls, **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "no gradient recorded" warning: step 0 has its FINAL
        train(tmp_path / "closure", optimizer_cls, True, **kw)
    train(tmp_path / "plain", optimizer_cls, False, **kw)
    for name in ("closure", "plain"):
        got = finals(tmp_path / name)
        assert [(s, m) for s, m, _ in got] == [(s, 0) for s in range(STEPS)]
        for (_, _, values), expected in zip(got, want):
            assert sorted(values) == sorted(expected)
            for pid, v in values.items():
                np.testing.assert_array_equal(v, expected[pid])


def test_lbfgs_records_its_first_evaluation_once_and_says_so(tmp_path):
    want = expected_grads(torch.optim.LBFGS, lr=0.5, max_iter=4)
    with pytest.warns(UserWarning, match=r"gradtrace: LBFGS evaluated its closure \d+ times in step 0: FINAL holds "
                                         r"the first evaluation's gradient \(at the step's starting point\)") as caught:
        cap = train(tmp_path / "lbfgs", torch.optim.LBFGS, True, lr=0.5, max_iter=4)
    assert sum("evaluated its closure" in str(w.message) for w in caught) == 1  # once per run, not per step
    got = finals(tmp_path / "lbfgs")
    assert [(s, m) for s, m, _ in got] == [(s, 0) for s in range(STEPS)]
    for (_, _, values), expected in zip(got, want):
        for pid, v in values.items():
            np.testing.assert_array_equal(v, expected[pid])
    # the later evaluations counted no micro-step and wrote no StepInfo: one forward and one loss per step
    assert cap.recorder.micro_steps == [1] * STEPS
    (reader,) = gradtrace.read_trace_set(tmp_path / "lbfgs")
    losses = [f["step"] for f in reader.frames() if f.get("type") == "step" and not f["optimizer_step"]]
    assert losses == list(range(STEPS))


def test_something_that_is_no_optimizer_is_refused_in_one_line(tmp_path):
    net = model()

    class NotAnOptimizer:
        def step(self):
            pass

    with pytest.raises(TypeError, match=r"^gradtrace: NotAnOptimizer is not a torch.optim.Optimizer \(nor a wrapper "
                                        r"of one\): FINAL is taken at the optimizer's step, so pass the torch optimizer$"):
        gradtrace.attach(net, tmp_path / "x", optimizer=NotAnOptimizer())


def test_a_step_the_grad_scaler_skips_gets_no_final_and_keeps_the_numbering(tmp_path):
    # torch.amp.GradScaler on CPU; step 1's loss is made inf, so scaler.step skips optimizer.step (its update
    # lowers the scale). Without the skip seen, step 1's micro-step would be filed under step 1 together with
    # step 2's, and step 2's FINAL named step 1.
    net = model()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 4)
    cap = gradtrace.attach(net, tmp_path / "amp", optimizer=opt, loss="local-mean")
    stepped = []
    with pytest.warns(UserWarning, match=r"gradtrace: rank 0: the optimizer did not step in step 1 \(zero_grad came "
                                         r"after 1 micro-step\(s\) with no optimizer.step, e.g. a GradScaler"):
        for step in range(STEPS):
            opt.zero_grad()
            x, y = data(step)
            loss = torch.nn.functional.mse_loss(net(x), y) * (float("inf") if step == 1 else 1.0)
            scaler.scale(loss).backward()
            before = [p.detach().clone() for p in net.parameters()]
            scaler.step(opt)
            scaler.update()
            stepped.append(not all(torch.equal(a, p) for a, p in zip(before, net.parameters())))
        opt.zero_grad()
    cap.close()
    assert stepped == [True, False, True]  # the scaler really skipped step 1
    assert [s for s, _, _ in finals(tmp_path / "amp")] == [0, 2]
    assert cap.recorder.step == STEPS and cap.recorder.micro_steps == [1, 1, 1]
    assert "zero_grad" not in vars(opt)  # close() took the watch away
