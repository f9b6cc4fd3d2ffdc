"""Capture a Hugging Face Trainer run, or an Accelerate loop, with one call.

    trainer = Trainer(model=model, args=args, train_dataset=data)
    gradtrace.attach(trainer, "traces/run")   # adds a GradtraceCallback; it closes at the end of training
    trainer.train()

At ``on_train_begin`` the callback takes what Trainer actually runs (``trainer.model_wrapped``) and
attaches the matching adapter (gradtrace.adapters.hf_backends): a DeepSpeed engine (ZeRO 0-3)
``deepspeed_adapter`` (PRE/POST per bucket, FINAL as ``safe_get_full_grad`` gives it inside
``engine.step``, before DeepSpeed clips; the engine's grad norm, which is what Trainer logs; sp from
the engine's mpu), FSDP2 ``fsdp2_adapter``, DDP ``ddp_adapter`` (PRE/POST per bucket on the
micro-step that synchronises), one process every ``.grad``. Under FSDP2, DDP and one process, FINAL is
taken at ``on_pre_optimizer_step`` (after Trainer's clipping: what the optimizer consumes) and the grad
norm Trainer logs (``logs["grad_norm"]``, before clipping) goes into the optimizer-step StepInfo
(``logging_steps=1`` to have it every step). Every micro-step's StepInfo holds the model's output
``loss`` and the count of ``labels != -100``.

Accelerate without Trainer, after ``accelerator.prepare``:

    cap = gradtrace.attach(accelerator, "traces/run", model=model, optimizer=opt)
    for batch in data:
        with accelerator.accumulate(model):
            loss = model(**batch).loss
            accelerator.backward(loss)
            cap.record_step(loss, valid_tokens)
            opt.step(); opt.zero_grad()
    cap.close()
"""

from __future__ import annotations

import sys

from . import deprecation, hf_backends
from .adapter_base import TorchCapture, check_callback_options, check_loss

__all__ = ["GradtraceCallback", "attach_accelerate"]


def attach_accelerate(accelerator, model, out_dir, optimizer=None, **options):
    """Attach the adapter for what ``accelerator.prepare`` made of ``model`` (a DeepSpeed engine, an
    FSDP2 or DDP model, or the model itself) and open this rank's trace. ``optimizer``: the prepared one
    (FINAL at its real step, once per accumulation; a DeepSpeed engine captures inside ``engine.step``).
    ``options``: as for the other adapters; gas defaults to the accelerator's. Deprecated: use
    ``gradtrace.attach(accelerator, out_dir, model=model, optimizer=optimizer)``."""
    deprecation.replaced_by_attach("gradtrace.hf_adapter.attach_accelerate",
                                   "gradtrace.attach(accelerator, out_dir, optimizer=optimizer)")
    check_loss(options)
    if "gas" not in options and getattr(accelerator, "deepspeed_engine_wrapped", None) is None:
        options["gas"] = int(accelerator.gradient_accumulation_steps)
    return hf_backends.attach(model, out_dir, accelerator=accelerator, optimizer=optimizer, driven_by="accelerate",
                              **options)


def _callback_base():
    from transformers import TrainerCallback

    return TrainerCallback


def _calling_trainer():
    """The Trainer whose training loop is calling: callbacks are handed ``model`` (the unwrapped one) but
    not ``model_wrapped`` or the accelerator, so the callback finds the Trainer on the call stack."""
    from transformers import Trainer

    frame = sys._getframe(1)
    while frame is not None:
        obj = frame.f_locals.get("self")
        if isinstance(obj, Trainer):
            return obj
        frame = frame.f_back
    return None


class GradtraceCallback(_callback_base()):
    """``GradtraceCallback(out_dir, **options)``: options as for the other adapters (``mode``,
    ``steps``, ``params``, ``run_id``, ``loss``, ``loss_description``, ``config``, ``extra``,
    ``on_error`` ("warn" or "raise"), ``overwrite``, ``groups`` and layout overrides; under DeepSpeed
    the layout comes from the engine and ``steps``, ``params`` and layout overrides are ignored, with a
    warning). The adapter attaches at ``on_train_begin``; ``backend`` then names it."""

    def __init__(self, out_dir, **options):
        self.options = check_callback_options(options)  # now, not at on_train_begin
        self.out_dir = out_dir
        self.capture = None
        self.backend: str | None = None
        self._handles = []
        self._closed = False

    @property
    def recorder(self):
        """The capture's RankRecorder (None under DeepSpeed, or before training starts)."""
        return getattr(self.capture, "recorder", None)

    def on_train_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        """Attaches the adapter for what the Trainer runs (``model_wrapped``): DeepSpeed, FSDP2, DDP or one process."""
        trainer = _calling_trainer()
        wrapped = trainer.model_wrapped if trainer is not None else model
        accelerator = getattr(trainer, "accelerator", None)
        self.backend = hf_backends.backend_of(wrapped, accelerator)[0]
        options = dict(self.options)
        if self.backend != "deepspeed":
            options.setdefault("gas", args.gradient_accumulation_steps)
        self.capture = hf_backends.attach(wrapped, self.out_dir, accelerator=accelerator,
                                          driven_by="transformers.Trainer", **options)
        if self._drives_steps:
            self.capture.recorder.optimizer = optimizer  # the learning rate of each StepInfo
        self._handles.append(model.register_forward_hook(self._forward, with_kwargs=True))

    @property
    def _drives_steps(self) -> bool:
        """Torch adapters are attached without the optimizer: FINAL and the steps follow Trainer's events.
        A DeepSpeed engine does both inside ``engine.step``."""
        return isinstance(self.capture, TorchCapture)

    def _forward(self, module, args, kwargs, output):
        cap = self.capture
        if not module.training or cap is None:
            return
        if not self._drives_steps:
            cap.begin_micro_step()  # the adapter numbers micro-steps at backward, which comes later
        loss = getattr(output, "loss", None)
        if loss is None and isinstance(output, dict):
            loss = output.get("loss")
        labels = kwargs.get("labels")
        tokens = int((labels != -100).sum()) if labels is not None else 0
        if loss is not None:
            cap.record_step(loss, tokens)

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        """FINAL: the gradients the optimizer is about to use (after the Trainer's clipping)."""
        if self.capture is not None and self._drives_steps:
            self.capture.final()

    def on_step_end(self, args, state, control, **kwargs):
        """Counts the optimizer step."""
        if self.capture is not None and self._drives_steps:
            self.capture.recorder.next_step()

    def on_log(self, args, state, control, logs=None, **kwargs):
        """The grad norm and learning rate the Trainer logged, into the optimizer-step StepInfo."""
        if self.capture is not None and self._drives_steps and logs and "grad_norm" in logs:
            self.capture.recorder.write_optimizer_step(logs["grad_norm"], lr=logs.get("learning_rate"),
                                                       step=state.global_step - 1)

    def on_train_end(self, args, state, control, **kwargs):
        """Closes the capture at the end of training."""
        self.close()

    def close(self) -> None:
        """Removes the forward hook and closes the capture (at the end of training, or earlier); idempotent."""
        for h in self._handles:
            h.remove()
        self._handles.clear()
        if self.capture is not None and not self._closed:
            self._closed = True
            self.capture.close()
