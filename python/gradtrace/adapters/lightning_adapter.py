"""Capture a PyTorch Lightning run: one Trainer callback, or one call after ``fabric.setup``.

    trainer = lightning.Trainer(strategy="ddp", accumulate_grad_batches=2)
    gradtrace.attach(trainer, "traces/run")   # adds a GradtraceCallback; it closes at the end of training
    trainer.fit(module, data)

    model, opt = fabric.setup(model, opt)
    cap = gradtrace.attach(model, "traces/run", optimizer=opt)

What the strategy runs decides the adapter (gradtrace.adapters.hf_backends.backend_of): DDP
(``strategy="ddp"``, any start method) ``ddp_adapter`` (PRE/POST per bucket on the micro-step that
synchronises), FSDP2 (``ModelParallelStrategy``, whose ``configure_model`` calls ``fully_shard``)
``fsdp2_adapter``, one device every ``.grad``; a DeepSpeed engine ``deepspeed_adapter`` (Lightning runs
DeepSpeed on CUDA only). FSDP1 (``strategy="fsdp"``) is refused in one line: gradtrace does not map its
flat shards. Parameter names are the LightningModule's (the module given to Fabric), whatever wraps it,
so a one-device run and a DDP run diff without renames.

FINAL: Lightning steps the optimizer with a closure (``optimizer.step(closure)``) that runs the last
micro-batch's forward, backward and gradient clipping; FINAL is taken right after that closure, i.e.
what the update uses (gradtrace.adapters.step_protocol). Micro-steps are counted at
``on_train_batch_start`` (Trainer; Lightning's one-device loop never calls the module's forward) or at
the forward (Fabric); each micro-step's StepInfo holds the loss Lightning passes to backward (divided by
``accumulate_grad_batches``), and gas is the Trainer's ``accumulate_grad_batches``.
"""

from __future__ import annotations

import sys

from . import deprecation
from .adapter_base import TorchCapture, check_callback_options, check_loss

__all__ = ["GradtraceCallback", "attach_fabric", "attach_trainer", "fabric_capture"]

PACKAGES = ("lightning", "pytorch-lightning")


def _lightning():
    """``lightning.pytorch`` (the unified package), else the standalone ``pytorch_lightning``."""
    try:
        import lightning.pytorch as pl
    except ImportError:
        import pytorch_lightning as pl
    return pl


def _lightning_version() -> str:
    return str(_lightning().__version__)


def _has_fsdp2(module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return any(isinstance(m, FSDPModule) for m in module.modules())


def _attach(wrapped, module, out_dir, optimizer, driven_by: str, **options):
    """The adapter for what a Lightning strategy made of ``module`` (``wrapped``: the strategy's model),
    attached with ``module``'s parameter names. ``optimizer``: the torch optimizer (or a wrapper of it)."""
    from . import hf_backends

    kind, target = hf_backends.backend_of(wrapped)
    if kind == "single" and _has_fsdp2(module):
        kind, target = "fsdp2", module
    extra = {"driven_by": driven_by, **(options.pop("extra", None) or {})}
    common = dict(extra=extra, packages=PACKAGES, **options)
    if kind == "fsdp1":
        raise ValueError("gradtrace: Lightning's FSDPStrategy runs FSDP1 (FullyShardedDataParallel), whose flat "
                         "shards gradtrace does not map: use ModelParallelStrategy with fully_shard (FSDP2), or DDP")
    if kind == "deepspeed":
        return hf_backends._attach_deepspeed(target, out_dir, extra, dict(options))
    if kind == "ddp":
        from .ddp_adapter import DDPCapture

        return DDPCapture(target, out_dir, optimizer, names_from=module, **common)
    if kind == "fsdp2":
        from .fsdp2_adapter import FSDP2Capture

        return FSDP2Capture(target, out_dir, optimizer, **common)
    from .manual_adapter import ManualCapture

    return ManualCapture(module, out_dir, optimizer, framework="lightning", framework_version=_lightning_version(),
                         **common)


def attach_trainer(trainer, pl_module, out_dir, **options):
    """Attach to a Lightning Trainer's run (from ``on_train_start`` or later: the strategy has wrapped the
    model and made the optimizer). One optimizer only. ``options`` as for the other adapters; gas
    defaults to ``trainer.accumulate_grad_batches``. Micro-steps are the caller's to count
    (:class:`GradtraceCallback` does)."""
    check_loss(options)
    optimizers = list(trainer.optimizers)
    if len(optimizers) != 1:
        raise ValueError(f"gradtrace: the LightningModule has {len(optimizers)} optimizers; gradtrace captures a "
                         "run with one (FINAL is what that optimizer's step uses)")
    options.setdefault("gas", int(trainer.accumulate_grad_batches))
    cap = _attach(trainer.strategy.model, pl_module, out_dir, optimizers[0], "lightning.Trainer", **options)
    if isinstance(cap, TorchCapture):
        cap.count_micro_steps_by_caller()
    return cap


def attach_fabric(fabric, model, optimizer, out_dir, **options):
    """Deprecated: use ``gradtrace.attach(model, out_dir, optimizer=optimizer)``."""
    deprecation.replaced_by_attach("gradtrace.lightning_adapter.attach_fabric",
                                   "gradtrace.attach(model, out_dir, optimizer=optimizer)")
    return fabric_capture(model, optimizer, out_dir, **options)


def fabric_capture(model, optimizer, out_dir, **options):
    """The capture of a module from ``model, optimizer = fabric.setup(model, optimizer)``: ``model`` the
    _FabricModule, ``optimizer`` the _FabricOptimizer (or the torch optimizer). FINAL is taken at the
    optimizer's step, after its closure when one is passed; micro-steps are counted at the model's forward.
    ``options`` as gradtrace.attach takes them (pass ``gas=`` when you accumulate)."""
    check_loss(options)
    module = getattr(model, "module", model)  # the user's module, under Fabric's wrappers
    wrapped = getattr(model, "_forward_module", model)  # what the strategy made of it (DDP, FSDP2, itself)
    return _attach(wrapped, module, out_dir, optimizer, "lightning.Fabric", **options)


def _callback_base():
    return _lightning().Callback


def _micro_batch_inputs(batch) -> tuple[tuple, dict]:
    """A batch as a forward's (args, kwargs), for the input moments of the optimizer-step StepInfo."""
    if isinstance(batch, dict):
        return (), batch
    if isinstance(batch, (list, tuple)):
        return tuple(batch), {}
    return (batch,), {}


class GradtraceCallback(_callback_base()):
    """``GradtraceCallback(out_dir, **options)``: options as for the other adapters (``mode``, ``steps``,
    ``params``, ``run_id``, ``loss``, ``loss_description``, ``config``, ``extra``, ``on_error`` ("warn" or
    "raise"), ``overwrite``, ``groups`` and layout overrides). The adapter attaches at ``on_train_start``
    (``capture`` then holds it) and closes at ``on_train_end`` or when training raises."""

    def __init__(self, out_dir, **options):
        self.options = check_callback_options(options)  # now, not at on_train_start
        self.out_dir = out_dir
        self.capture = None
        self._closed = False

    @property
    def recorder(self):
        """The capture's RankRecorder (None under DeepSpeed, or before training starts)."""
        return getattr(self.capture, "recorder", None)

    def on_train_start(self, trainer, pl_module):
        """Attaches the adapter for what the strategy made of the module."""
        self.capture = attach_trainer(trainer, pl_module, self.out_dir, **dict(self.options))

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        """Counts a micro-step (Lightning's one-device loop never calls the module's forward)."""
        if isinstance(self.capture, TorchCapture):
            self.capture.recorder.begin_micro_step(*_micro_batch_inputs(batch))

    def on_before_backward(self, trainer, pl_module, loss):
        """The micro-step's StepInfo: the loss Lightning passes to backward."""
        if isinstance(self.capture, TorchCapture):
            self.capture.record_step(loss)

    def on_train_end(self, trainer, pl_module):
        """Closes the capture at the end of training."""
        self.close()

    def on_exception(self, trainer, pl_module, exception):
        """Closes the capture when training raises: the frames written so far stay readable."""
        self.close()

    def close(self) -> None:
        """Closes the capture (at the end of training, when it raises, or earlier); idempotent."""
        if self.capture is not None and not self._closed:
            self._closed = True
            self.capture.close()
            sys.stderr.flush()
