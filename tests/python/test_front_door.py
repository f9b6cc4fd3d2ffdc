"""gradtrace.attach, the one capture call (issue 43): the public API held to tests/python/public_api.txt, its
docstrings, what attach recognises (real DDP, FSDP2, DTensor and plain modules on a one-rank gloo group; DeepSpeed,
Trainer, accelerate, Lightning and pipelines in their own suites, whose run scripts call gradtrace.attach), its
refusals (one line, nothing written, nothing left hooked) and the old entry points, which still work and say so."""

import ast
import inspect
import os
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

import gradtrace
from gradtrace.adapters import front_door

from conftest import ROOT

PUBLIC_API = ROOT / "tests" / "python" / "public_api.txt"
ADAPTERS = ROOT / "python" / "gradtrace" / "adapters"
CODEC = ROOT / "python" / "gradtrace" / "codec"


def _listed_api():
    return [line for line in PUBLIC_API.read_text().splitlines() if line and not line.startswith("#")]


def _described(name):
    obj = getattr(gradtrace, name)
    if name == "attach":
        params = list(inspect.signature(obj).parameters.values())
        star = next(i for i, p in enumerate(params) if p.kind is p.KEYWORD_ONLY)
        names = [p.name for p in params]
        return f"attach({', '.join(names[:star])}, *, {', '.join(names[star:])})"
    return name


def test_dir_shows_the_committed_public_api():
    assert dir(gradtrace) == sorted(gradtrace.__all__)
    assert [_described(n) for n in dir(gradtrace)] == _listed_api()


def test_import_gradtrace_imports_no_torch():
    p = subprocess.run([sys.executable, "-c", "import sys, gradtrace; gradtrace.attach; print('torch' in sys.modules)"],
                       capture_output=True, text=True, timeout=120)
    assert (p.returncode, p.stdout.strip()) == (0, "False"), p.stderr


def _public_definitions(tree):
    """(qualified name, node) of the module's public functions and classes and their public methods."""
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and not node.name.startswith("_"):
            yield node.name, node
            if isinstance(node, ast.ClassDef):
                for sub in node.body:
                    if isinstance(sub, ast.FunctionDef) and not sub.name.startswith("_"):
                        yield f"{node.name}.{sub.name}", sub


def test_every_public_definition_of_the_library_has_a_docstring():
    missing = []
    for path in sorted([*ADAPTERS.glob("*.py"), *CODEC.glob("*.py"), ROOT / "python" / "gradtrace" / "__init__.py"]):
        tree = ast.parse(path.read_text())
        if not ast.get_docstring(tree):
            missing.append(f"{path.name}: the module")
        missing += [f"{path.name}: {name}" for name, node in _public_definitions(tree) if not ast.get_docstring(node)]
    assert missing == []
    for name in dir(gradtrace):
        obj = getattr(gradtrace, name)
        if callable(obj):
            assert (obj.__doc__ or "").strip(), name


def test_the_attach_docstring_names_every_option():
    doc = gradtrace.attach.__doc__
    options = [p for p in inspect.signature(gradtrace.attach).parameters if p not in ("obj", "out_dir")]
    assert [o for o in options if f"``{o}``" not in doc] == []
    # every option is honoured by some capture, and every capture's options are attach's
    accepted = set().union(*front_door.ACCEPTS.values()) | {"model"}
    assert sorted(accepted) == sorted(options)


@pytest.mark.parametrize("obj, name", [(3, "builtins.int"), ({"model": 1}, "builtins.dict"),
                                       (torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1),
                                        "torch.optim.sgd.SGD")])
def test_attach_refuses_what_it_cannot_capture_in_one_line(tmp_path, obj, name):
    with pytest.raises(TypeError) as e:
        gradtrace.attach(obj, tmp_path / "out")
    assert str(e.value) == (f"gradtrace.attach: cannot capture a {name}; it accepts a torch.nn.Module (plain, "
                            "DistributedDataParallel, fully_shard'ed or DTensor-parallel), a "
                            "torch.distributed.pipelining schedule or PipelineStage, a DeepSpeed engine, an accelerate "
                            "Accelerator, a Hugging Face Trainer, a Lightning Trainer or a module from Lightning's "
                            "fabric.setup")
    assert not (tmp_path / "out").exists()


def test_an_option_the_capture_cannot_honour_is_an_error_before_anything_is_hooked(tmp_path):
    model = torch.nn.Linear(4, 2)
    for option in ({"mpu": object()}, {"model": model}, {"hook": print}, {"full_final": True}):
        with pytest.raises(ValueError) as e:
            gradtrace.attach(model, tmp_path / "out", **option)
        key = next(iter(option))
        assert str(e.value).startswith(f"gradtrace.attach: {key} cannot be honoured for a "
                                       "torch.nn.modules.linear.Linear; it accepts comm_dtype, config, cp, ")
        assert "\n" not in str(e.value)
    assert not (tmp_path / "out").exists() and model._forward_pre_hooks == {}


@pytest.fixture
def gloo(tmp_path):
    """A one-rank gloo default group over a FileStore, destroyed afterwards."""
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    yield dist.group.WORLD
    dist.destroy_process_group()


def _wrap(kind, model):
    if kind == "ddp":
        return torch.nn.parallel.DistributedDataParallel(model)
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (1,))
    if kind == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        return fully_shard(model, mesh=mesh)
    if kind == "dtensor":
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        return parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    return model


@pytest.mark.parametrize("kind, capture", [("plain", "ManualCapture"), ("ddp", "DDPCapture"),
                                           ("fsdp2", "FSDP2Capture"), ("dtensor", "ManualCapture")])
def test_attach_recognises_the_model_and_returns_one_kind_of_capture(tmp_path, gloo, kind, capture):
    torch.manual_seed(0)
    model = _wrap(kind, torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with gradtrace.attach(model, tmp_path / kind, optimizer=opt, loss="local-mean") as cap:
        assert type(cap).__name__ == capture and isinstance(cap, gradtrace.Capture)
        assert (cap.out_dir, cap.path) == (str(tmp_path / kind), str(tmp_path / kind / "rank-00000.gtrace"))
        for step in range(2):
            loss = model(torch.full((2, 4), 0.5 + step)).pow(2).mean()
            cap.record_step(loss)
            loss.backward()
            opt.step()
            opt.zero_grad()
        reduced = 2 if kind == "ddp" else 0  # DDP's comm hook runs on one rank too; FSDP2 skips a world of 1
        assert cap.recorded == {"PRE_REDUCE": reduced, "POST_REDUCE": reduced, "FINAL": 2, "STEP": 2}
        assert repr(cap).startswith(f"<gradtrace {capture} ")
    reader = gradtrace.TraceReader(tmp_path / kind / "rank-00000.gtrace")
    assert reader.run_info["config"]["loss"] == "local-mean"
    finals = [f for f in reader.frames() if f["type"] == "bucket" and f["phase"] == "FINAL"]
    assert len(finals) == 2


def test_the_old_entry_points_still_work_and_say_so_once(tmp_path):
    script = ("import torch, gradtrace\n"
              "for i in range(2):\n"
              "    cap = gradtrace.manual_adapter.attach(torch.nn.Linear(2, 2), 'OUT/' + str(i), None, steps=1)\n"
              "    cap.close()\n").replace("OUT", str(tmp_path))
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONWARNINGS=""))
    assert p.returncode == 0, p.stderr
    said = [line for line in p.stderr.splitlines() if "Warning" in line]
    assert said == ["<string>:3: FutureWarning: gradtrace.manual_adapter.attach is deprecated and will be removed in "
                    "the next release: use gradtrace.attach(model, out_dir, optimizer=...)"]
    assert sorted(os.listdir(tmp_path)) == ["0", "1"]
