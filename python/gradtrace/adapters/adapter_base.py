"""What every PyTorch adapter does the same way: count micro-steps at the model's forward, write
FINAL when the gradients the optimizer step uses are final (before the step, or after its closure's
first evaluation: gradtrace.adapters.step_protocol) and the optimizer-step StepInfo after it (or at an
explicit ``step()``), carry the grad norm the user reports, and undo its hooks on ``close()``."""

from __future__ import annotations

import os

from .capture_protocol import Capture
from .rank_recorder import RankRecorder
from .step_protocol import optimizer_hooks


class TorchCapture(Capture):
    """What ``gradtrace.attach`` returns for a PyTorch model (plain, DDP, FSDP2, DTensor, a pipeline);
    one per rank, not thread-safe.

    ``recorder``: the :class:`gradtrace.rank_recorder.RankRecorder` (its ``step``, ``micro``,
    ``recorded`` counts and ``path``). With ``optimizer`` given, FINAL and the step bookkeeping run
    inside ``optimizer.step()``; without one, call :meth:`step` after the gradients are final."""

    def __init__(self, recorder: RankRecorder, model=None, optimizer=None):
        self.recorder = recorder
        self.optimizer = optimizer
        self._handles = []
        self._grad_norm = None
        self._forward_handle = None
        if model is not None:
            self._forward_handle = model.register_forward_pre_hook(
                lambda _module, args, kwargs: recorder.begin_micro_step(args, kwargs), with_kwargs=True)
            self._handles.append(self._forward_handle)
        if optimizer is not None:
            recorder.optimizer = optimizer
            self._handles += optimizer_hooks(optimizer, self._before_optimizer, self._after_optimizer,
                                            recorder.reevaluation, recorder)

    def count_micro_steps_by_caller(self) -> None:
        """The caller numbers micro-steps (``recorder.begin_micro_step`` once per micro-batch) instead of
        the model's forward: for loops that run a micro-batch without calling the model's forward, as
        Lightning's single-device Trainer does (``training_step`` directly)."""
        if self._forward_handle is not None:
            self._forward_handle.remove()
            self._handles.remove(self._forward_handle)
            self._forward_handle = None

    @property
    def path(self) -> str:
        """This rank's trace file, ``out_dir/rank-NNNNN.gtrace``."""
        return self.recorder.path

    @property
    def out_dir(self) -> str:
        """The trace set's folder."""
        return os.path.dirname(self.recorder.path)

    @property
    def recorded(self) -> dict[str, int]:
        """Frames written so far, by phase."""
        return self.recorder.recorded

    def final(self) -> None:
        """Writes FINAL for the current step; adapters override it (FSDP2 writes shards)."""
        self.recorder.write_final()

    def _before_optimizer(self) -> None:
        self.final()

    def _after_optimizer(self) -> None:
        norm, self._grad_norm = self._grad_norm, None
        self.recorder.end_optimizer_step(norm)

    def report_grad_norm(self, norm) -> None:
        """The gradient norm the training reported for this step (e.g. ``clip_grad_norm_``'s
        result); written with the optimizer-step StepInfo."""
        self._grad_norm = norm

    def record_step(self, loss, valid_tokens=0, lr: float | None = None) -> None:
        """StepInfo of this micro-step: this rank's loss as passed to backward, its valid tokens."""
        self.recorder.record_step(loss, valid_tokens, lr)

    def step(self, grad_norm=None, lr: float | None = None) -> None:
        """Without an attached optimizer: FINAL now, then the optimizer-step StepInfo."""
        if self.optimizer is not None:
            raise RuntimeError("gradtrace: an optimizer is attached; its step() records FINAL already")
        self.final()
        self.recorder.end_optimizer_step(grad_norm if grad_norm is not None else self._grad_norm, lr)
        self._grad_norm = None

    def detach(self) -> None:
        """Removes gradtrace's hooks from the model and the optimizer; the file stays open."""
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def close(self) -> None:
        """Removes the hooks, warns about a run that recorded no FINAL, and finishes the trace; idempotent."""
        self.detach()
        self.recorder.warn_unfinished(stacklevel=3)
        self.recorder.close()


LAYOUT_KEYWORDS = {"dp", "sp", "cp", "tp", "pp", "ep", "edp", "replicate", "cp_kind", "gas", "rules",
                   "default_group", "default_kind"}


def check_loss(options: dict) -> None:
    """ValueError unless the recipe named by ``options`` (``config["loss"]`` over ``loss``) is a
    known one or unspecified (gradtrace.loss_recipes)."""
    from . import loss_recipes

    config = options.get("config") or {}
    if "loss" in config:
        loss_recipes.check(config["loss"], keyword='config["loss"]')
    loss_recipes.check(options.get("loss", ""))


def check_callback_options(options: dict) -> dict:
    """A framework callback's options, checked when the callback is made rather than when training starts
    (the loss recipe, ``on_error``); returns a copy to attach with later."""
    from .rank_recorder import ON_ERROR

    check_loss(options)
    if options.get("on_error", "warn") not in ON_ERROR:
        raise ValueError(f"on_error={options['on_error']!r}: expected one of {ON_ERROR}")
    return dict(options)


def make_layout(options: dict, groups: dict | None = None, layout=None, params=None):
    """A Layout from ``layout`` (kept as given) or inferred from ``groups`` and the layout keywords
    in ``options`` (removed from it, so that the rest goes to the RankRecorder). Checks the loss
    recipe first (``loss=`` or ``config={"loss": ...}``), before an adapter hooks anything.
    ``params``: the model's (name, parameter) pairs; DTensor parameters add their DeviceMesh dims as
    named groups (``tp``, ...) and a rule each (TP_SHARD / REPLICATED, gradtrace.adapters.dtensor.mesh_layout),
    after the given ``groups`` and ``rules``, which take precedence."""
    from .layout import Layout, group_ranks, world_and_rank

    check_loss(options)

    overrides = {k: options.pop(k) for k in list(options) if k in LAYOUT_KEYWORDS}
    if layout is not None:
        if overrides:
            raise ValueError(f"give either layout= or layout keywords {sorted(overrides)}, not both")
        return layout
    if params is None:
        return Layout.infer(groups, **overrides)
    from .dtensor import mesh_layout

    world, rank = world_and_rank()
    known = {name: group_ranks(g) for name, g in (groups or {}).items()}
    mesh_groups, mesh_rules = mesh_layout(params, known, world, rank)
    layout = Layout.infer({**mesh_groups, **(groups or {})}, **overrides)
    for pattern, fields in mesh_rules:
        layout.add_rule(pattern, **{**fields, "grad_group": fields["grad_group"] or layout.default_group})
    return layout
