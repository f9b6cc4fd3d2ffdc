"""``gradtrace.attach``: one call that recognises what it is given and attaches the capture for it.

What each kind of object needs lives in its adapter (ddp_adapter, fsdp2_adapter, manual_adapter,
deepspeed_adapter, hf_adapter, lightning_adapter); this module only recognises the object, checks the
options against what that adapter can honour (an option it cannot honour is an error, before anything
is hooked), and calls it. Recognising needs no import: an object can only be a DeepSpeed engine or a
Trainer when the module defining that class is already loaded. Nothing here imports torch at import time.
"""

from __future__ import annotations

import sys

from .attach_options import ACCEPTS, check_options
from .capture_protocol import NO_FRAMES, Capture

ACCEPTED_OBJECTS = ("a torch.nn.Module (plain, DistributedDataParallel, fully_shard'ed or DTensor-parallel), a "
                    "torch.distributed.pipelining schedule or PipelineStage, a DeepSpeed engine, an accelerate "
                    "Accelerator, a Hugging Face Trainer, a Lightning Trainer or a module from Lightning's "
                    "fabric.setup")


def _instance_of(obj, module: str, name: str) -> bool:
    """isinstance(obj, module.name), without importing ``module``: unloaded, nothing can be an instance."""
    cls = getattr(sys.modules.get(module), name, None)
    return isinstance(cls, type) and isinstance(obj, cls)


def _lightning_trainer(obj) -> bool:
    return any(_instance_of(obj, m, "Trainer") for m in ("lightning.pytorch.trainer.trainer",
                                                         "pytorch_lightning.trainer.trainer"))


def _fabric_module(obj) -> bool:
    return any(_instance_of(obj, m, "_FabricModule") for m in ("lightning.fabric.wrappers",
                                                               "lightning_fabric.wrappers"))


def kind_of(obj) -> str:
    """What ``obj`` is, as attach sees it: "deepspeed", "accelerate", "hf-trainer", "lightning", "fabric",
    "pipeline", "ddp", "fsdp2", "fsdp1" or "module"; "" for anything else."""
    if _instance_of(obj, "deepspeed.runtime.engine", "DeepSpeedEngine"):
        return "deepspeed"
    if _instance_of(obj, "accelerate.accelerator", "Accelerator"):
        return "accelerate"
    if _instance_of(obj, "transformers.trainer", "Trainer"):
        return "hf-trainer"
    if _lightning_trainer(obj):
        return "lightning"
    if _fabric_module(obj):
        return "fabric"
    if "torch" not in sys.modules:
        return ""
    from . import pipeline as pp

    if pp.is_pipeline(obj):
        return "pipeline"
    import torch

    if not isinstance(obj, torch.nn.Module):
        return ""
    from . import hf_backends

    kind = hf_backends.backend_of(obj)[0]
    return "module" if kind == "single" else kind


def _pipeline_kind(obj) -> str:
    """A pipeline's adapter: the one of its stage modules (DDP, fully_shard'ed), else the plain one."""
    from . import pipeline as pp
    from . import hf_backends

    kinds = {hf_backends.backend_of(module)[0] for _, module in pp.resolve(obj).stages}
    return next((k for k in ("ddp", "fsdp2") if k in kinds), "module")


def attach(obj, out_dir, given: dict) -> Capture:
    """gradtrace.attach's work: ``given`` holds the options the caller set (those not None)."""
    kind = kind_of(obj)
    name = f"{type(obj).__module__}.{type(obj).__qualname__}"
    if kind == "":
        raise TypeError(f"gradtrace.attach: cannot capture a {name}; it accepts {ACCEPTED_OBJECTS}")
    if kind == "fsdp1":
        raise TypeError("gradtrace.attach: a FullyShardedDataParallel (FSDP1) model keeps its gradients in flat "
                        "shards that gradtrace does not map; use fully_shard (FSDP2)")
    if kind == "pipeline":
        kind = _pipeline_kind(obj)
    if kind == "deepspeed":
        from .deepspeed_adapter import capture_with_options

        return capture_with_options(obj, out_dir, given)
    if kind == "accelerate":
        return _accelerate(obj, out_dir, given)
    if kind == "hf-trainer":
        return _hf_trainer(obj, out_dir, given)
    if kind == "lightning":
        return _lightning_trainer_capture(obj, out_dir, given)
    if kind == "fabric":
        return _fabric(obj, out_dir, given)
    check_options(given, kind, f"a {name}")
    options = dict(given)
    optimizer = options.pop("optimizer", None)
    if kind == "ddp":
        from .ddp_adapter import DDPCapture

        return DDPCapture(obj, out_dir, optimizer, **options)
    if kind == "fsdp2":
        from .fsdp2_adapter import FSDP2Capture

        return FSDP2Capture(obj, out_dir, optimizer, **options)
    from .manual_adapter import ManualCapture

    return ManualCapture(obj, out_dir, optimizer, **options)


def _accelerate(accelerator, out_dir, given: dict) -> Capture:
    """The model ``accelerator.prepare`` made (``model=``, or the one it prepared), through its backend."""
    from . import hf_backends

    options = dict(given)
    model = options.pop("model", None)
    if model is None:
        model = _prepared_model(accelerator)
    backend = hf_backends.backend_of(model, accelerator)[0]
    if backend == "fsdp1":
        raise TypeError("gradtrace.attach: the Accelerator runs FSDP1, whose flat shards gradtrace does not map; "
                        "use fsdp_version 2")
    _check_wrapped(options, backend, f"an Accelerator running {backend}")
    if backend != "deepspeed":
        options.setdefault("gas", int(accelerator.gradient_accumulation_steps))
    optimizer = options.pop("optimizer", None)
    return hf_backends.attach(model, out_dir, accelerator=accelerator, optimizer=optimizer, driven_by="accelerate",
                              **options)


def _prepared_model(accelerator):
    """The model ``accelerator.prepare`` made, when the Accelerator can tell: its DeepSpeed engine, or its one
    model when that is what training runs (one process, FSDP2 in place). Under DDP it keeps the module, not
    the DistributedDataParallel it returned, so the caller must pass that as ``model=``."""
    from . import hf_backends

    wrapped = getattr(accelerator, "deepspeed_engine_wrapped", None)
    if wrapped is not None:
        return wrapped.engine
    models = list(getattr(accelerator, "_models", []))
    processes = int(getattr(accelerator, "num_processes", 1))
    if len(models) != 1 or (processes > 1 and hf_backends.backend_of(models[0])[0] == "single"):
        raise ValueError(f"gradtrace.attach: pass the model accelerator.prepare returned as model= (the Accelerator "
                         f"has prepared {len(models)} model(s) and keeps the module, not the wrapper it trains)")
    return models[0]


def _check_wrapped(given: dict, backend: str, what: str) -> None:
    """The options of a model a framework wrapped (accelerate, Fabric) against what its ``backend`` honours; the
    optimizer too under DeepSpeed, whose engine steps it inside ``engine.step``."""
    if backend == "deepspeed":
        check_options(given, "deepspeed", what, extra_ok=("optimizer",))
    else:
        check_options(given, "module", what, extra_ok=ACCEPTS.get(backend, ()))
        _plain_module_only(given, what)


def _plain_module_only(given: dict, what: str) -> None:
    """shards= and framework= describe a plain module the caller drives, not one a framework wraps."""
    for key in ("shards", "framework"):
        if key in given:
            raise ValueError(f"gradtrace.attach: {key}= is for a plain module, not {what}")


class CallbackCapture(Capture):
    """A Trainer's capture: the callback that ``attach`` added attaches the adapter when training starts
    and closes it when training ends; ``close()`` closes it earlier (idempotent). ``capture`` is the
    adapter's capture once training has started; ``callback`` the callback added to the Trainer."""

    def __init__(self, callback, out_dir):
        self.callback = callback
        self.out_dir = str(out_dir)

    @property
    def capture(self):
        """The adapter's capture once training has started, else None."""
        return self.callback.capture

    @property
    def path(self):
        """This rank's trace file once training has started, else None."""
        return getattr(self.capture, "path", None)

    @property
    def recorded(self) -> dict[str, int]:
        """Frames written so far, by phase (zeros before training starts)."""
        return dict(getattr(self.capture, "recorded", NO_FRAMES))

    def close(self) -> None:
        """Closes the capture now (the callback closes it at the end of training anyway); idempotent."""
        self.callback.close()


def _trainer_options(given: dict, deepspeed: bool, what: str, refuse_why: str) -> None:
    if "optimizer" in given or "model" in given:
        key = "optimizer" if "optimizer" in given else "model"
        raise ValueError(f"gradtrace.attach: {key}= cannot be honoured for {what}: {refuse_why}")
    check_options(given, "deepspeed" if deepspeed else "module", what)
    _plain_module_only(given, what)


def _hf_trainer(trainer, out_dir, given: dict) -> Capture:
    from .hf_adapter import GradtraceCallback

    deepspeed = bool(getattr(trainer, "is_deepspeed_enabled", False))
    _trainer_options(given, deepspeed, "a Hugging Face Trainer" + (" under DeepSpeed" if deepspeed else ""),
                     "the Trainer makes its own")
    callback = GradtraceCallback(out_dir, **given)
    trainer.add_callback(callback)
    return CallbackCapture(callback, out_dir)


def _lightning_trainer_capture(trainer, out_dir, given: dict) -> Capture:
    from .lightning_adapter import GradtraceCallback

    strategy = type(getattr(trainer, "strategy", None)).__name__
    if strategy == "FSDPStrategy":
        raise TypeError("gradtrace.attach: Lightning's FSDPStrategy runs FSDP1, whose flat shards gradtrace does not "
                        "map; use ModelParallelStrategy with fully_shard (FSDP2), or DDP")
    deepspeed = strategy == "DeepSpeedStrategy"
    _trainer_options(given, deepspeed, "a Lightning Trainer" + (" under DeepSpeed" if deepspeed else ""),
                     "the Trainer makes its own")
    callback = GradtraceCallback(out_dir, **given)
    trainer.callbacks.append(callback)
    return CallbackCapture(callback, out_dir)


def _fabric(model, out_dir, given: dict) -> Capture:
    from . import hf_backends
    from .lightning_adapter import fabric_capture

    wrapped = getattr(model, "_forward_module", model)
    backend = hf_backends.backend_of(wrapped)[0]
    _check_wrapped(given, backend, f"a Fabric module running {backend}")
    options = dict(given)
    optimizer = options.pop("optimizer", None)
    return fabric_capture(model, optimizer, out_dir, **options)
