"""Capture a Hugging Face Trainer run with one callback.

    trainer = Trainer(model=model, args=args, train_dataset=data,
                      callbacks=[gradtrace.hf_adapter.GradtraceCallback("traces/run")])

On every rank: micro-steps are counted at the model's forward, whose output ``loss`` and the count
of ``labels != -100`` go into each micro-step's StepInfo; FINAL is every parameter's ``.grad`` at
``on_pre_optimizer_step`` (after Trainer's clipping: what the optimizer consumes); the grad norm
Trainer logs (``logs["grad_norm"]``, before clipping) goes into the optimizer-step StepInfo (set
``logging_steps=1`` to have it every step). Under DDP (several processes) the layout is dp = world.
PRE/POST_REDUCE are not recorded here: attach ``gradtrace.ddp_adapter`` to ``trainer.model_wrapped``
for those.
"""

from __future__ import annotations

from .adapter_base import check_loss, make_layout
from .rank_recorder import ON_ERROR, RankRecorder

__all__ = ["GradtraceCallback"]


def _callback_base():
    from transformers import TrainerCallback

    return TrainerCallback


class GradtraceCallback(_callback_base()):
    """``GradtraceCallback(out_dir, **options)``: options as for the other adapters (``mode``,
    ``steps``, ``params``, ``run_id``, ``loss``, ``loss_description``, ``config``, ``extra``,
    ``on_error`` ("warn" or "raise"), ``overwrite``, ``groups`` and layout overrides). The recorder
    opens at ``on_train_begin``."""

    def __init__(self, out_dir, *, groups=None, layout=None, **options):
        check_loss(options)  # now, not at on_train_begin
        if options.get("on_error", "warn") not in ON_ERROR:
            raise ValueError(f"on_error={options['on_error']!r}: expected one of {ON_ERROR}")
        self.out_dir = out_dir
        self.options = dict(options)
        self.groups, self.layout = groups, layout
        self.recorder: RankRecorder | None = None
        self._handles = []

    def on_train_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        import transformers

        options = dict(self.options)
        options.setdefault("gas", args.gradient_accumulation_steps)
        layout = make_layout(options, self.groups, self.layout, params=model.named_parameters())
        self.recorder = RankRecorder(model.named_parameters(), self.out_dir, framework="hf-trainer",
                                     framework_version=transformers.__version__,
                                     packages=("transformers", "accelerate"), layout=layout, optimizer=optimizer,
                                     **options)
        self._handles.append(model.register_forward_hook(self._forward, with_kwargs=True))

    def _forward(self, module, args, kwargs, output):
        rec = self.recorder
        if not module.training or rec is None:
            return
        rec.begin_micro_step()
        loss = getattr(output, "loss", None)
        if loss is None and isinstance(output, dict):
            loss = output.get("loss")
        labels = kwargs.get("labels")
        tokens = int((labels != -100).sum()) if labels is not None else 0
        if loss is not None:
            rec.record_step(loss, tokens)

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        self.recorder.write_final()

    def on_step_end(self, args, state, control, **kwargs):
        self.recorder.next_step()

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.recorder is not None and logs and "grad_norm" in logs:
            self.recorder.write_optimizer_step(logs["grad_norm"], lr=logs.get("learning_rate"),
                                               step=state.global_step - 1)

    def on_train_end(self, args, state, control, **kwargs):
        for h in self._handles:
            h.remove()
        self._handles.clear()
        if self.recorder is not None:
            self.recorder.warn_unfinished()
            self.recorder.close()
