"""What Hugging Face Trainer or Accelerate actually runs, and the adapter that captures it.

``accelerator.prepare`` turns a model into a DeepSpeed engine (any ZeRO stage), an FSDP2 module, a
DDP model, or leaves it as it is (one process). Each keeps its gradients somewhere else (ZeRO in flat
partitions, FSDP2 in DTensor shards, DDP in ``.grad`` after its bucketed all-reduce), so each needs
its own adapter; :func:`attach` picks it. FSDP1 (``FullyShardedDataParallel``) has no adapter: its
trace holds losses only, and attaching says so.
"""

from __future__ import annotations

import sys

from .adapter_base import TorchCapture, make_layout
from .rank_recorder import RankRecorder

PACKAGES = ("transformers", "accelerate")


def backend_of(model, accelerator=None) -> tuple[str, object]:
    """(kind, object to attach to): ("deepspeed", engine), ("fsdp2", model), ("fsdp1", model),
    ("ddp", model) or ("single", model): the last for anything else, e.g. one process."""
    wrapped = getattr(accelerator, "deepspeed_engine_wrapped", None)
    if wrapped is not None:
        return "deepspeed", wrapped.engine
    ds = sys.modules.get("deepspeed")  # imported by whoever made an engine
    if ds is not None and isinstance(model, ds.DeepSpeedEngine):
        return "deepspeed", model
    from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel
    from torch.nn.parallel import DistributedDataParallel

    if isinstance(model, FSDPModule):
        return "fsdp2", model
    if isinstance(model, FullyShardedDataParallel):
        return "fsdp1", model
    if isinstance(model, DistributedDataParallel):
        return "ddp", model
    return "single", model


def attach(model, out_dir, *, accelerator=None, optimizer=None, driven_by: str = "accelerate", **options):
    """The adapter for what ``model`` is (:func:`backend_of`), attached: a DeepSpeedCapture or a
    :class:`gradtrace.adapters.adapter_base.TorchCapture`. ``optimizer``: as for the torch adapters (FINAL at its
    ``step()``; None: the caller drives FINAL and the step count). ``options``: the torch adapters'
    keywords; under DeepSpeed an option it cannot honour (``steps``, ``params``, layout overrides) is a
    ValueError."""
    kind, target = backend_of(model, accelerator)
    extra = {"driven_by": driven_by, **(options.pop("extra", None) or {})}
    if kind == "deepspeed":
        return _attach_deepspeed(target, out_dir, extra, options)
    if kind == "ddp":
        from .ddp_adapter import DDPCapture

        return DDPCapture(target, out_dir, optimizer, extra=extra, packages=PACKAGES, **options)
    if kind == "fsdp2":
        from .fsdp2_adapter import FSDP2Capture

        return FSDP2Capture(target, out_dir, optimizer, extra=extra, packages=PACKAGES, **options)
    return _attach_single(target, out_dir, optimizer, kind, extra, options)


def _attach_deepspeed(engine, out_dir, extra, options):
    """A DeepSpeed engine under Trainer, accelerate or Lightning: ``options`` as gradtrace.attach takes them; one
    it cannot honour (``steps``, ``params``, layout overrides) is a ValueError before anything is hooked."""
    from .deepspeed_adapter import capture_with_options

    return capture_with_options(engine, out_dir, options, extra=extra, packages=PACKAGES)


def _attach_single(model, out_dir, optimizer, kind, extra, options):
    """One process (or a wrapper gradtrace does not know, reading ``.grad``): every parameter's ``.grad`` as
    FINAL. FSDP1: losses only, said once now."""
    import transformers

    if kind == "fsdp1":
        sys.stderr.write("gradtrace: WARNING: FSDP1 (FullyShardedDataParallel) keeps gradients in flat shards that "
                         "gradtrace does not map, so no gradient is recorded: use FSDP2 (fsdp_version 2)\n")
        options["phases"] = ()
    groups, layout = options.pop("groups", None), options.pop("layout", None)
    layout = make_layout(options, groups, layout, params=model.named_parameters())
    recorder = RankRecorder(model.named_parameters(), out_dir, framework="hf-trainer",
                            framework_version=transformers.__version__, packages=PACKAGES, layout=layout,
                            optimizer=optimizer, extra=extra, **options)
    return TorchCapture(recorder, model, optimizer)
