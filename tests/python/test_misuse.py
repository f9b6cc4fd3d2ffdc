"""Misuse of the capture adapters is one clear error or warning, at capture time (issue 19, items 5
and 8): an unknown loss recipe, a record of a group never declared, the DDP adapter on a model that
is not DDP-wrapped, a run that records no FINAL, requested steps never reached, and a gas not given
that the micro-steps contradict. Real torch, real gloo process groups (one rank, a FileStore in
tmp_path); the DeepSpeed case runs a real one-rank engine in a subprocess."""

import os
import re
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch
import torch.distributed as dist

import gradtrace
from gradtrace import ddp_adapter, loss_recipes, manual_adapter
from gradtrace.adapters.rank_recorder import NO_FINAL_WARNING

from conftest import ROOT, deepspeed_env

KNOWN = ("local-mean, alst-tutorial, local-mean-div-sp, token-weighted, full-sequence, global-token-weighted, "
         "alst-tutorial-div-sp, global-token-sum")


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a = torch.nn.Linear(4, 3)
        self.b = torch.nn.Linear(3, 2)

    def forward(self, x):
        return self.b(torch.tanh(self.a(x)))


@pytest.fixture
def gloo(tmp_path):
    """A one-rank gloo default group over a FileStore, destroyed afterwards."""
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    yield dist.group.WORLD
    dist.destroy_process_group()


def _train(model, opt=None, cap=None, steps=2, micro=1):
    """``steps`` optimizer steps of ``micro`` forwards each; cap.step() when no optimizer is attached."""
    for step in range(steps):
        for m in range(micro):
            x = torch.full((2, 4), 0.5 + step + 0.25 * m)
            loss = model(x).pow(2).mean()
            loss.backward()
            if cap is not None:
                cap.record_step(loss, 2)
        if opt is not None:
            opt.step()
            opt.zero_grad()


def _gradtrace_warnings(record):
    return [str(w.message) for w in record if str(w.message).startswith("gradtrace")]


def _frames(out):
    return [f for r in gradtrace.read_trace_set(out) for f in r.frames()]


# ---- (a) loss recipes: the one C++ list ----------------------------------------------------------------------

def _cpp_recipes():
    """The names semantics/loss_recipes.cc lists (kSplitTimes, then kSplitOnce, as KnownLossRecipes)."""
    text = (ROOT / "semantics" / "loss_recipes.cc").read_text()
    out = []
    for array in ("kSplitTimes", "kSplitOnce"):
        body = re.search(array + r"\[\] = \{(.*?)\};", text, re.S).group(1)
        out += re.findall(r'"([^"]+)"', body)
    return out


def test_python_reads_the_cpp_list_of_loss_recipes():
    assert loss_recipes.known() == _cpp_recipes()
    assert ", ".join(loss_recipes.known()) == KNOWN
    assert loss_recipes.ALIASES == {"loss": "local-mean", "loss-div-sp": "local-mean-div-sp", "alst": "alst-tutorial",
                                    "alst-div-sp": "alst-tutorial-div-sp"}
    assert set(loss_recipes.ALIASES.values()) <= set(loss_recipes.known())


def test_an_unknown_loss_recipe_is_refused_before_anything_is_written(tmp_path, gloo):
    message = (f"gradtrace: loss='global-token-mean' is not a known loss recipe; known: {KNOWN} "
               f"(\"\" leaves it unspecified)")
    model = Tiny()
    with pytest.raises(ValueError) as e:
        gradtrace.attach(model, tmp_path / "manual", loss="global-token-mean")
    assert str(e.value) == message
    ddp = torch.nn.parallel.DistributedDataParallel(Tiny())
    with pytest.raises(ValueError) as e:
        gradtrace.attach(ddp, tmp_path / "ddp", loss="global-token-mean")
    assert str(e.value) == message
    with pytest.raises(ValueError) as e:
        gradtrace.attach(model, tmp_path / "cfg", config={"loss": "mean"})
    assert str(e.value) == (f"gradtrace: config[\"loss\"]='mean' is not a known loss recipe; known: {KNOWN} "
                            f"(\"\" leaves it unspecified)")
    with pytest.raises(ValueError) as e:  # the CLI aliases are the DeepSpeed adapter's only
        gradtrace.RankRecorder(model.named_parameters(), tmp_path / "rec", framework="pytorch", loss="loss")
    assert str(e.value) == message.replace("'global-token-mean'", "'loss'")
    assert not any((tmp_path / d).exists() for d in ("manual", "ddp", "cfg", "rec"))
    assert model._forward_pre_hooks == {} and ddp._forward_pre_hooks == {}  # nothing was hooked

    # "" (unspecified) and every known name are accepted and written as given.
    for name in ["", *loss_recipes.known()]:
        out = tmp_path / f"ok-{name or 'unspecified'}"
        cap = gradtrace.attach(model, out, loss=name)
        cap.close()
        assert gradtrace.TraceReader(out / "rank-00000.gtrace").run_info["config"]["loss"] == name


def test_hf_callback_refuses_an_unknown_recipe_when_constructed(tmp_path):
    from gradtrace import hf_adapter

    with pytest.raises(ValueError) as e:
        hf_adapter.GradtraceCallback(tmp_path, loss="global-token-mean")
    assert str(e.value) == (f"gradtrace: loss='global-token-mean' is not a known loss recipe; known: {KNOWN} "
                            f"(\"\" leaves it unspecified)")
    assert hf_adapter.GradtraceCallback(tmp_path, loss="global-token-weighted").options["loss"] == "global-token-weighted"


DEEPSPEED_SCRIPT = textwrap.dedent("""
    import os, sys
    os.environ["DS_ACCELERATOR"] = "cpu"
    import torch, deepspeed
    import gradtrace
    from gradtrace import deepspeed_adapter
    from gradtrace.versions.packages.deepspeed_hooks import disable_shm_comm_op
    disable_shm_comm_op()
    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                                           config={"train_micro_batch_size_per_gpu": 1, "steps_per_print": 1 << 30,
                                                   "zero_optimization": {"stage": 0}})
    for options in ({"loss": "global-token-mean"}, {"steps": 2, "params": "weight"}):
        try:
            gradtrace.attach(engine, sys.argv[1] + "/bad", **options)
        except ValueError as e:
            print("ERROR", e)
    print("WROTE", os.path.exists(sys.argv[1] + "/bad"))
    cap = gradtrace.attach(engine, sys.argv[1] + "/alias", loss="loss-div-sp")
    cap.close()
    cap = deepspeed_adapter.attach(engine, sys.argv[1] + "/old", "stats", loss_recipe="loss-div-sp")  # the old name
    cap.close()
    cap = deepspeed_adapter.attach(engine, sys.argv[1] + "/old2", loss_recipe="loss")  # said once
    cap.close()
""")


def test_deepspeed_adapter_refuses_an_unknown_recipe_and_maps_the_aliases(tmp_path):
    env = dict(deepspeed_env(), RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(29500 + os.getpid() % 1000))
    p = subprocess.run([sys.executable, "-c", DEEPSPEED_SCRIPT, str(tmp_path)], env=env, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    lines = [line for line in p.stdout.splitlines() if line.startswith(("ERROR", "WROTE"))]
    assert lines == [f"ERROR gradtrace.attach: loss='global-token-mean' is not a known loss recipe; "
                     f"known: {KNOWN}, or the aliases loss, loss-div-sp, alst, alst-div-sp "
                     f"(\"\" leaves it unspecified)",
                     "ERROR gradtrace.attach: params, steps cannot be honoured for a DeepSpeed engine: a DeepSpeed "
                     "engine records every step and parameter, and its layout comes from the engine (and its mpu); "
                     "it accepts config, extra, guard_every, guard_timeout, loss, loss_description, mode, mpu, on_error, "
                     "on_violation, overwrite, phases, reference, run_id",
                     "WROTE False"]
    cfg = gradtrace.TraceReader(tmp_path / "alias" / "rank-00000.gtrace").run_info["config"]
    assert cfg["loss"] == "local-mean-div-sp"
    old = gradtrace.TraceReader(tmp_path / "old" / "rank-00000.gtrace").run_info["config"]
    assert (old["loss"], old["capture_mode"]) == ("local-mean-div-sp", "stats")  # the old positional mode
    assert gradtrace.TraceReader(tmp_path / "old2" / "rank-00000.gtrace").run_info["config"]["loss"] == "local-mean"
    said = [line for line in p.stderr.splitlines() if "FutureWarning" in line]
    assert said == [f"<string>:{DEEPSPEED_SCRIPT.splitlines().index(line) + 1}: FutureWarning: "
                    "gradtrace.deepspeed_adapter.attach is deprecated and will be removed in the next release: use "
                    "gradtrace.attach(engine, out_dir, loss=...) (loss= is loss_recipe=)"
                    for line in DEEPSPEED_SCRIPT.splitlines() if "/old\"" in line], p.stderr[-3000:]


def test_the_examples_name_real_recipes():
    for path in ("python/README.md", "python/gradtrace/adapters/manual_adapter.py", "tests/python/hf_runs.py"):
        text = (ROOT / path).read_text()
        assert "global-token-mean" not in text, path
        assert 'loss="global-token-weighted"' in text, path


# ---- (b) a record of a group that was never declared -------------------------------------------------------

def test_a_group_never_declared_is_refused_at_capture_time(tmp_path, gloo):
    model = Tiny()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    cp = dist.new_group([0])
    cap = gradtrace.attach(model, tmp_path, optimizer=opt, groups={"cp": cp}, cp_kind="all-gather",
                           loss="token-weighted")
    params = list(model.parameters())
    model(torch.ones(2, 4)).sum().backward()
    with pytest.raises(ValueError) as e:
        with cap.around("sp", params):
            raise AssertionError("the block must not run")
    assert str(e.value) == ("gradtrace.manual_adapter: group 'sp' was never declared: pass it to attach() as "
                            "groups={'sp': <ProcessGroup or ranks>} (declared groups: world, cp, dp)")
    with pytest.raises(ValueError) as e:
        cap.record("POST_REDUCE", "", params)
    assert str(e.value) == ("gradtrace.manual_adapter: group '' was never declared: pass it to attach() as "
                            "groups={'': <ProcessGroup or ranks>} (declared groups: world, cp, dp)")
    with cap.around("cp", params, divisor=1):
        for p in params:
            dist.all_reduce(p.grad, group=cp)
    cap.record("FINAL", "", params)  # FINAL may name no group
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        cap.close()
    assert _gradtrace_warnings(record) == []  # a FINAL recorded by hand is a FINAL
    buckets = [(f["phase"], f["group"]) for f in _frames(tmp_path) if f["type"] == "bucket"]
    assert buckets == [("PRE_REDUCE", "cp"), ("POST_REDUCE", "cp"), ("FINAL", "")]


# ---- (c) the DDP adapter on a model not wrapped in DDP -----------------------------------------------------

def test_ddp_adapter_on_an_unwrapped_model_says_wrap_it_first(tmp_path, gloo):
    net = Tiny()
    from gradtrace.adapters import deprecation

    deprecation._SAID.discard("gradtrace.ddp_adapter.attach")  # said once per process: say it here
    with pytest.raises(TypeError) as e, pytest.warns(FutureWarning, match="gradtrace.ddp_adapter.attach is deprecated"):
        ddp_adapter.attach(net, tmp_path, optimizer=torch.optim.SGD(net.parameters(), lr=0.1))
    assert str(e.value) == ("gradtrace: expected a DistributedDataParallel model (wrap the model "
                            "with DDP first), got Tiny")
    assert not tmp_path.joinpath("rank-00000.gtrace").exists() and net._forward_pre_hooks == {}


# ---- (d) no FINAL; a normal run does not warn --------------------------------------------------------------

def test_a_run_without_optimizer_steps_warns_that_it_has_no_final(tmp_path, gloo):
    model = Tiny()
    cap = gradtrace.attach(model, tmp_path / "nofinal", groups={"cp": [0]}, cp_kind="all-gather")
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        for _ in range(2):  # an optimizer stepped by hand, never told to gradtrace
            model(torch.ones(2, 4)).sum().backward()
        cap.close()
        cap.close()  # once
    assert _gradtrace_warnings(record) == [NO_FINAL_WARNING]
    assert NO_FINAL_WARNING == ("gradtrace: no FINAL gradients were recorded: pass optimizer= to attach() or call "
                                "cap.step() after each optimizer step")
    assert [w.filename for w in record if str(w.message).startswith("gradtrace")] == [__file__]  # the caller's close()
    assert [f for f in _frames(tmp_path / "nofinal") if f["type"] == "bucket"] == []


def test_a_normal_run_does_not_warn(tmp_path, gloo):
    net = Tiny()
    model = torch.nn.parallel.DistributedDataParallel(net)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        cap = gradtrace.attach(model, tmp_path / "ddp", optimizer=opt, loss="local-mean")
        _train(model, opt, cap, steps=2)
        cap.close()
        manual = Tiny()
        cap = gradtrace.attach(manual, tmp_path / "manual", steps=[1])  # cap.step() instead of optimizer=
        for step in range(2):
            manual(torch.ones(2, 4)).sum().backward()
            cap.step()
        cap.close()
        cap = gradtrace.attach(Tiny(), tmp_path / "untrained")  # opened and closed: nothing to say
        cap.close()
    assert _gradtrace_warnings(record) == []
    finals = [f["step"] for f in _frames(tmp_path / "ddp") if f["type"] == "bucket" and f["phase"] == "FINAL"]
    assert finals == [0, 1]
    finals = [f["step"] for f in _frames(tmp_path / "manual") if f["type"] == "bucket" and f["phase"] == "FINAL"]
    assert finals == [1]


# ---- (e) requested steps never reached ---------------------------------------------------------------------

def test_requested_steps_never_reached_are_named_at_close(tmp_path, gloo):
    model = Tiny()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    cap = gradtrace.attach(model, tmp_path / "five", optimizer=opt, steps=[5])
    _train(model, opt, cap, steps=2)
    with pytest.warns(UserWarning) as record:
        cap.close()
    assert _gradtrace_warnings(record) == ["gradtrace: steps [5] (of steps=[5]) were never reached: the last step "
                                           "trained was 1 (steps count from 0); the trace holds nothing of them"]
    assert _frames(tmp_path / "five") == []

    model = Tiny()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    cap = gradtrace.attach(model, tmp_path / "some", optimizer=opt, steps=[7, 1, 2])
    _train(model, opt, cap, steps=2)
    with pytest.warns(UserWarning) as record:
        cap.close()
    assert _gradtrace_warnings(record) == ["gradtrace: steps [2, 7] (of steps=[1, 2, 7]) were never reached: the "
                                           "last step trained was 1 (steps count from 0); the trace holds nothing of "
                                           "them"]
    assert [f["step"] for f in _frames(tmp_path / "some") if f["type"] == "bucket"] == [1]

    # steps=N is an upper bound: fewer steps trained is no misuse
    model = Tiny()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    cap = gradtrace.attach(model, tmp_path / "bound", optimizer=opt, steps=10)
    _train(model, opt, cap, steps=2)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        cap.close()
    assert _gradtrace_warnings(record) == []


# ---- (f) gas: counted per optimizer step; the trace's RunInfo cannot take it later -------------------------

def test_micro_steps_are_counted_and_a_missing_gas_is_named(tmp_path, gloo):
    model = torch.nn.parallel.DistributedDataParallel(Tiny())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    cap = gradtrace.attach(model, tmp_path / "nogas", optimizer=opt)
    _train(model, opt, cap, steps=2, micro=2)
    assert cap.recorder.micro_steps == [2, 2] and cap.recorder.inferred_gas == 2
    with pytest.warns(UserWarning) as record:
        cap.close()
    assert _gradtrace_warnings(record) == ["gradtrace: gas was not given, so the trace records gas 1, but every "
                                           "optimizer step ran 2 micro-steps (forwards of the model): pass gas=2 to "
                                           "attach()"]
    # RunInfo (Config.gas) is written when the file opens; the micro-step count per optimizer step is in the
    # trace all the same: the optimizer-step StepInfo carries its last micro-step.
    reader = gradtrace.TraceReader(tmp_path / "nogas" / "rank-00000.gtrace")
    assert reader.run_info["config"]["gas"] == 1
    marks = [(f["step"], f["micro_step"]) for f in reader.frames() if f["type"] == "step" and f["optimizer_step"]]
    assert marks == [(0, 1), (1, 1)]

    model = torch.nn.parallel.DistributedDataParallel(Tiny())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    cap = gradtrace.attach(model, tmp_path / "gas2", optimizer=opt, gas=2)
    _train(model, opt, cap, steps=2, micro=2)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        cap.close()
    assert _gradtrace_warnings(record) == []
    assert gradtrace.TraceReader(tmp_path / "gas2" / "rank-00000.gtrace").run_info["config"]["gas"] == 2

    # micro-step counts that differ between optimizer steps give no gas
    model = Tiny()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    cap = gradtrace.attach(model, tmp_path / "uneven", optimizer=opt)
    _train(model, opt, cap, steps=1, micro=3)
    _train(model, opt, cap, steps=1, micro=1)
    assert cap.recorder.micro_steps == [3, 1] and cap.recorder.inferred_gas is None
    cap.close()
