"""Capture a real DeepSpeed run into a gradtrace trace set, with one call.

    engine, *_ = deepspeed.initialize(model=model, optimizer=opt, config=cfg, mpu=mpu)
    cap = gradtrace.attach(engine, "traces/run", mpu=mpu, loss="local-mean")
    for batch in data:
        loss = engine(**batch)
        engine.backward(loss)
        cap.record_step(loss, valid_tokens)      # StepInfo of this micro-step
        engine.step()                            # FINAL is captured here, before the optimizer runs
    cap.close()

Nothing in DeepSpeed's files changes: the adapter replaces methods on the engine and on its ZeRO
optimizer *instance* (instance attributes shadow the class methods, and DeepSpeed calls them as
``self.method(...)``), and ``detach()`` puts them back.

Hook points, by the path a gradient takes (names as in DeepSpeed 0.19.8; a method that a version
lacks is reported, see ``DeepSpeedCapture.unrecordable``):

- ZeRO-1/2, ``contiguous_gradients: true`` (the CPU-runnable path):
  ``DeepSpeedZeroOptimizer.average_tensor(tensor, comm_dtype)`` receives the flat IPG bucket; the
  parameters in it, in bucket order, are ``ipg_buckets[comm_dtype].params`` (0.19.x) or
  ``params_in_ipg_bucket`` (older). It scales and reduce-scatters in place, so the bucket is cloned
  on entry (PRE_REDUCE) and the rank's own partition is read back on return (POST_REDUCE).
- ZeRO-1/2, ``contiguous_gradients: false``: ``buffered_reduce_fallback`` and
  ``_buffered_reduce_fallback_preserving_fp32`` receive the list of gradients (all-reduced in place).
- Stage 0: ``DeepSpeedEngine.allreduce_and_copy(small_bucket, dp_group, ...)`` receives a list of
  ``param.grad`` tensors, all-reduces a flattened copy and copies it back.
- ZeRO-3: ``gradtrace.adapters.deepspeed_zero3`` (stage 3's bucket reduction, both of its paths, and ``partition_grads``).
- FINAL: ``deepspeed.utils.safe_get_full_grad(param)`` for every parameter (a collective for ZeRO-1/2/3; for
  ZeRO-3 it all-gathers the fp32 gradient partitions; every rank calls it for every parameter in the same order)
  inside a wrapper of ``engine.step``, at gradient-accumulation boundaries, before the optimizer step consumes
  the gradients.

Older releases (measured with tools/repro/ds5248 on 0.11.1, 0.11.2, 0.13.0, 0.13.1, 0.14.5 and 0.19.8):
the same hook points exist under the same names; ``average_tensor(tensor)`` takes one argument and the
bucket's parameters are ``params_in_ipg_bucket`` as ``(group index, param, param_id)`` (up to 0.14.x);
``buffered_reduce_fallback(rank, grads, elements_per_buffer, log)`` has no communication dtype (the
ZeRO-1 path before 0.13 reaches it on CPU and reduces nothing there, which the records show as
POST_REDUCE == PRE_REDUCE); stage 0's ``allreduce_and_copy(small_bucket, dp_group)`` has no
``dp_world_size``. ``safe_get_full_grad`` exists in all of them, so every phase is recordable there.

POST_REDUCE records carry, per ZeRO partition, only the elements this rank owns; their slices'
offsets are parameter offsets, and ``partition_count`` is the number of elements held. They declare
``divisor``: what the installed release divides that bucket by, from the one semantics table
(``deepspeed_divisors``; 0 when the release or the bucket's arithmetic is not modelled), so that
``gradtrace-diff --self`` checks DeepSpeed against its own code.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

import torch

from . import deprecation
from . import deepspeed_pipe, deepspeed_zero3
from . import loss_recipes, no_gradient
from .attach_options import check_options, deepspeed_options
from .capture_protocol import Capture
from .deepspeed_divisors import declared_divisor
from .layout import Layout
from .rank_recorder import RankRecorder

log = logging.getLogger("gradtrace.deepspeed_adapter")

__all__ = ["attach", "DeepSpeedCapture", "LOSS_RECIPES"]

# CLI spellings of the #5248 loss recipes and every recipe name (semantics/loss_recipes.cc, through
# gradtrace.loss_recipes) -> the names gradtrace-train and gradtrace-diff use.
LOSS_RECIPES = {**loss_recipes.ALIASES, **{name: name for name in loss_recipes.known()}}


def _group_ranks(group) -> list[int]:
    import torch.distributed as tdist
    if group is None:
        return list(range(tdist.get_world_size()))
    try:
        return [int(r) for r in tdist.get_process_group_ranks(group)]
    except Exception:  # a DeepSpeed wrapper of a group
        from deepspeed import comm as dist
        return [int(r) for r in dist.get_all_ranks_from_group(group)]


def _call(obj, name, default=None):
    fn = getattr(obj, name, None)
    if fn is None:
        return default
    try:
        return fn()
    except Exception:
        return default


def _reduce_bucket_size(engine, stage) -> int:
    """The elements per reduction bucket: ZeRO's reduce_bucket_size, or stage 0's allreduce bucket."""
    if stage > 0:
        return int(getattr(engine.optimizer, "reduce_bucket_size", 0) or _call(engine, "zero_reduce_bucket_size", 0))
    # stage 0: DeepSpeedEngine.allreduce_gradients(bucket_size=MEMORY_OPT_ALLREDUCE_SIZE)
    import deepspeed.runtime.engine as ds_engine
    return int(getattr(ds_engine, "MEMORY_OPT_ALLREDUCE_SIZE", 0))


class DeepSpeedCapture(Capture):
    """What ``gradtrace.attach`` returns for a DeepSpeed engine. Not thread-safe; one per rank."""

    def __init__(self, engine, out_dir, mode: str = "full", mpu=None, *, loss_recipe: str = "",
                 config: dict | None = None, extra: dict | None = None, run_id: str | None = None,
                 phases=("PRE_REDUCE", "POST_REDUCE", "FINAL"), on_error: str = "warn", overwrite: bool = False,
                 packages=(), on_violation="warn", guard_every: int = 1, guard_timeout: float = 60.0,
                 reference=None):
        import deepspeed
        import torch.distributed as tdist

        loss_recipe = loss_recipes.check(loss_recipe, who="gradtrace.deepspeed_adapter", keyword="loss_recipe",
                                         aliases=True)
        self.engine = engine
        self.out_dir = os.fspath(out_dir)
        self.mpu = mpu
        self.mode = mode
        self.wanted = set(phases)
        self.step = 0
        self.micro = 0
        self._backwards = 0  # engine.backward calls since the last accumulation boundary
        self._checked_empty = False  # the first optimizer step was checked for gradient frames
        self._bucket_id = 0
        self._restore: list[tuple[Any, str, Any]] = []  # (object, attribute, previous value or _ABSENT)
        self.recorded: dict[str, int] = {"PRE_REDUCE": 0, "POST_REDUCE": 0, "FINAL": 0, "STEP": 0}
        self.unrecordable: dict[str, str] = {}  # phase -> why this DeepSpeed version cannot record it
        self.rank = tdist.get_rank() if tdist.is_initialized() else 0
        self.world = tdist.get_world_size() if tdist.is_initialized() else 1
        # PipelineEngine: one stage per rank, driven by train_batch's schedule (gradtrace.adapters.deepspeed_pipe)
        self.pipeline = deepspeed_pipe.pipeline_info(engine) if deepspeed_pipe.is_pipeline_engine(engine) else None
        self._forwards = 0  # PipelineEngine: forward passes (micro-batches) of this step so far
        self._index_params(engine)

        stage = int(_call(engine, "zero_optimization_stage", 0) or 0)
        self.zero_stage = stage
        self._install_hooks(stage)

        groups = self._groups(engine, mpu)
        if self.pipeline is not None:
            groups["pp"] = deepspeed_pipe.pipe_ranks(engine)
        sp, dp = len(groups["sp"]), len(groups["dp"])
        ds_version, torch_version = deepspeed.__version__, torch.__version__.split("+")[0]
        self.ds_version = ds_version
        gas = int(_call(engine, "gradient_accumulation_steps", 1) or 1)
        backend = tdist.get_backend() if tdist.is_initialized() else ""
        cfg = {"world": self.world, "dp": dp, "sp": sp, "zero_stage": stage, "gas": gas,
               "reduce_bucket_size": _reduce_bucket_size(engine, stage), "backend": str(backend),
               "scaling": f"deepspeed@{ds_version}", "capture_mode": mode,
               "loss": loss_recipe}
        cfg.update(config or {})
        expert_rule, expert_degrees = _expert_layout(engine.module.named_parameters(), groups)
        layout = Layout.infer(groups, dp=dp, sp=sp, gas=gas, default_group="sdp", **expert_degrees)
        if expert_rule:
            layout.add_rule(expert_rule, kind="EXPERT", grad_group="edp")
        self.recorder = RankRecorder(
            engine.module.named_parameters(), out_dir, framework="deepspeed", framework_version=ds_version,
            layout=layout, packages=("deepspeed", *packages), mode=mode, run_id=run_id, config=cfg,
            extra=self._run_extra(engine, ds_version, stage, extra),
            producer="deepspeed via adapter", producer_version=f"deepspeed {ds_version} / torch {torch_version}",
            shape_of=deepspeed_zero3.full_shape, on_error=on_error, overwrite=overwrite, pipeline=self.pipeline,
            on_violation=on_violation, guard_every=guard_every, guard_timeout=guard_timeout, reference=reference)
        if self.pipeline is not None:  # ids in the whole model's table, which every stage's trace names
            self.param_ids = dict(self.recorder.ids)
        self.path = self.recorder.path
        self.writer = self.recorder.writer
        for phase, why in self.unrecordable.items():
            log.warning("gradtrace: DeepSpeed %s: cannot record %s: %s", ds_version, phase, why)

    def _index_params(self, engine) -> None:
        """The parameter table's ids and names of the module's parameters that take gradients."""
        self.names: dict[int, str] = {}
        self.param_ids: dict[int, int] = {}  # id(Parameter) -> param table id
        self.params: list[torch.nn.Parameter] = []
        for name, p in engine.module.named_parameters():
            if not p.requires_grad:
                continue
            self.param_ids[id(p)] = len(self.params)
            self.names[id(p)] = name
            self.params.append(p)

    def _groups(self, engine, mpu) -> dict[str, list[int]]:
        """The ranks of this rank's groups: sdp (the group gradients are reduced over), sp and dp, from the
        engine and the mpu (one without get_data_parallel_group, or Ulysses': dp = sdp ranks at this sp offset)."""
        sdp_ranks = _group_ranks(getattr(engine, "seq_data_parallel_group", None))
        sp_ranks, dp_ranks = [self.rank], sdp_ranks
        if mpu is not None and hasattr(mpu, "get_sequence_parallel_group"):
            sp_ranks = _group_ranks(mpu.get_sequence_parallel_group())
        if mpu is not None and hasattr(mpu, "get_data_parallel_group") and \
                not hasattr(mpu, "initialize_sequence_parallel"):
            dp_ranks = _group_ranks(mpu.get_data_parallel_group())
        elif len(sp_ranks) > 1:
            dp_ranks = [r for r in sdp_ranks if (r - self.rank) % len(sp_ranks) == 0]
        return {"sp": sp_ranks, "dp": dp_ranks, "sdp": sdp_ranks}

    def _run_extra(self, engine, ds_version, stage, extra) -> dict:
        """RunInfo.extra: the DeepSpeed config and versions, the hooks installed, the phases that cannot be
        recorded, ZeRO's reduction-path settings, then the caller's ``extra``."""
        ds_config = getattr(getattr(engine, "_config", None), "_param_dict", None)
        run_extra = {
            "ds_config": json.dumps(ds_config, sort_keys=True, default=str) if ds_config is not None else "",
            "deepspeed_version": ds_version,
            "torch_version": torch.__version__,
            "adapter_hooks": json.dumps(self.hooks),
            "adapter_unrecordable_phases": json.dumps(self.unrecordable),
        }
        if stage > 0:
            # The settings that choose each bucket's reduction path (semantics/reduction_path.h), as the
            # optimizer holds them: gradtrace-diff predicts ZeRO-3's divisor from them.
            for key, attr in (("zero_reduce_scatter", "reduce_scatter"),
                              ("zero_contiguous_gradients", "contiguous_gradients")):
                value = getattr(engine.optimizer, attr, None)
                if not isinstance(value, bool):
                    value = _call(engine, key)  # DeepSpeedEngine.zero_reduce_scatter(), ...
                if isinstance(value, bool):
                    run_extra[key] = "true" if value else "false"
        run_extra.update({k: v if isinstance(v, str) else json.dumps(v) for k, v in (extra or {}).items()})
        return run_extra

    # ---- hook installation ---------------------------------------------------------------------

    def _patch(self, obj, attr, make):
        """Shadow obj.attr with make(original) as an instance attribute; undone by detach()."""
        original = getattr(obj, attr)
        prev = obj.__dict__.get(attr, _ABSENT) if hasattr(obj, "__dict__") else _ABSENT
        setattr(obj, attr, make(original))
        self._restore.append((obj, attr, prev))

    def _install_hooks(self, stage):
        self.hooks: list[str] = []
        eng, opt = self.engine, self.engine.optimizer
        if stage in (1, 2):
            zero = opt
            found = False
            if hasattr(zero, "average_tensor"):
                self._patch(zero, "average_tensor", self._wrap_average_tensor)
                self.hooks.append(type(zero).__name__ + ".average_tensor")
                found = True
            for name in ("buffered_reduce_fallback", "_buffered_reduce_fallback_preserving_fp32"):
                if hasattr(zero, name):
                    self._patch(zero, name, lambda orig, n=name: self._wrap_fallback(n, orig))
                    self.hooks.append(type(zero).__name__ + "." + name)
                    found = True
            if not found:
                why = f"{type(zero).__name__} has neither average_tensor nor buffered_reduce_fallback"
                self.unrecordable["PRE_REDUCE"] = why
                self.unrecordable["POST_REDUCE"] = why
        elif stage == 0:
            if hasattr(eng, "allreduce_and_copy"):
                self._patch(eng, "allreduce_and_copy", self._wrap_engine_allreduce_and_copy)
                self.hooks.append(type(eng).__name__ + ".allreduce_and_copy")
            else:
                why = f"{type(eng).__name__} has no allreduce_and_copy"
                self.unrecordable["PRE_REDUCE"] = why
                self.unrecordable["POST_REDUCE"] = why
        else:
            deepspeed_zero3.install(self, opt)
        try:
            from deepspeed.utils import safe_get_full_grad  # noqa: F401
        except ImportError:
            self.unrecordable["FINAL"] = "deepspeed.utils.safe_get_full_grad does not exist"
        if self.pipeline is not None:  # train_batch's schedule: engine.backward and engine.step are never called
            deepspeed_pipe.install(self, eng)
            return
        # Micro-steps are numbered by engine.backward: accelerate (Trainer) calls engine.step() only at
        # the accumulation boundary, so counting non-boundary step() calls would leave every micro-step 0.
        self._patch(eng, "backward", self._wrap_backward)
        self.hooks.append(type(eng).__name__ + ".backward")
        self._patch(eng, "step", self._wrap_step)
        if "FINAL" not in self.unrecordable:
            self.hooks.append(type(eng).__name__ + ".step")

    # ---- ZeRO-1/2 ------------------------------------------------------------------------------

    def _bucket_layout(self, zero, comm_dtype):
        """[(param, group index, param_id)] of the IPG bucket being reduced, in bucket order."""
        entries = None
        buckets = getattr(zero, "ipg_buckets", None)
        if isinstance(buckets, dict) and comm_dtype in buckets:
            entries = buckets[comm_dtype].params
        elif hasattr(zero, "params_in_ipg_bucket"):
            entries = zero.params_in_ipg_bucket
        if entries is None:
            return None
        out = []
        for i, p_or_idx, pid in entries:
            # (group, param, param_id) up to 0.14-ish; (group, index in group, param_id) later.
            p = p_or_idx if isinstance(p_or_idx, torch.Tensor) else zero.bit16_groups[i][p_or_idx]
            out.append((p, i, pid))
        return out

    def _owned_range(self, zero, i, pid, numel):
        """[start, end) of the parameter that this rank's ZeRO partition owns, or None."""
        import torch.distributed as tdist
        group = zero.real_dp_process_group[i]
        me = tdist.get_rank(group=group)
        parts = zero.param_to_partition_ids[i].get(pid, [])
        if me not in parts:
            return None
        offsets = sorted((zero.grad_start_offset[i][p][pid], p) for p in parts)
        for k, (off, p) in enumerate(offsets):
            if p == me:
                end = offsets[k + 1][0] if k + 1 < len(offsets) else numel
                return int(off), int(end)
        return None

    def _zero_divisor(self, layout, averaged):
        """The divisor this release's ZeRO-1/2 applies to the bucket (semantics/ table), 0 if unknown.
        averaged: the bucket went through average_tensor. With reduce_scatter false that path is
        gradient_reduction_w_predivide, whose gradient_predivide_factor the binding cannot express."""
        import torch.distributed as tdist
        zero = self.engine.optimizer
        group = getattr(zero, "dp_process_group", None)
        if group is None or not getattr(zero, "gradient_average", True):
            return 0.0
        if averaged and not getattr(zero, "reduce_scatter", True) and \
                float(getattr(zero, "gradient_predivide_factor", 1.0) or 1.0) != 1.0:
            return 0.0
        has_moe = any(getattr(p, "allreduce", True) is False for p, _, _ in layout)
        return declared_divisor(self.ds_version, "zero", tdist.get_world_size(group=group),
                                int(getattr(zero, "sequence_parallel_size", 1) or 1), has_moe)

    def _write_bucket_pair(self, layout, pre_flat, post_flat, bucket_id, group="sdp", averaged=True):
        """PRE_REDUCE (every parameter of the bucket) and POST_REDUCE (this rank's partition, with the
        divisor the release applies declared)."""
        zero = self.engine.optimizer
        if "PRE_REDUCE" in self.wanted and pre_flat is not None:
            slices, off = [], 0
            for p, _, _ in layout:
                n = p.numel()
                slices.append({"param_id": self.param_ids[id(p)], "offset": 0, "values": pre_flat[off:off + n]})
                off += n
            self.writer.write_bucket({"step": self.step, "micro_step": self.micro, "bucket_id": bucket_id,
                                      "phase": "PRE_REDUCE", "group": group, "bucket_numel": off, "slices": slices})
            self.recorded["PRE_REDUCE"] += 1
        if "POST_REDUCE" in self.wanted and post_flat is not None:
            slices, off, first, held = [], 0, None, 0
            for p, i, pid in layout:
                n = p.numel()
                rng = self._owned_range(zero, i, pid, n)
                if rng is not None and rng[1] > rng[0]:
                    a, b = rng
                    slices.append({"param_id": self.param_ids[id(p)], "offset": a, "values": post_flat[off + a:off + b]})
                    first = off + a if first is None else first
                    held += b - a
                off += n
            self.writer.write_bucket({"step": self.step, "micro_step": self.micro, "bucket_id": bucket_id,
                                      "phase": "POST_REDUCE", "group": group, "bucket_numel": off,
                                      "partition_offset": first or 0, "partition_count": held,
                                      "divisor": self._zero_divisor(layout, averaged), "slices": slices})
            self.recorded["POST_REDUCE"] += 1

    def _wrap_average_tensor(self, original):
        def average_tensor(tensor, *args, **kwargs):
            comm_dtype = args[0] if args else kwargs.get("communication_data_type", tensor.dtype)
            layout = self._bucket_layout(self.engine.optimizer, comm_dtype)
            ok = layout is not None and sum(p.numel() for p, _, _ in layout) == tensor.numel() \
                and all(id(p) in self.param_ids for p, _, _ in layout)
            if not ok:
                self._note_unmapped("average_tensor", tensor.numel())
                return original(tensor, *args, **kwargs)
            pre = tensor.detach().reshape(-1).clone()
            result = original(tensor, *args, **kwargs)
            self._write_bucket_pair(layout, pre, tensor.detach().reshape(-1), self._next_bucket())
            return result
        return average_tensor

    def _wrap_fallback(self, name, original):
        def fallback(*args, **kwargs):
            zero = self.engine.optimizer
            # buffered_reduce_fallback(rank, grads, comm_dtype, ...);
            # _buffered_reduce_fallback_preserving_fp32(grads, grad_params, comm_dtype, ...)
            if name == "buffered_reduce_fallback":
                grads = args[1] if len(args) > 1 else kwargs["grads"]
                comm_dtype = args[2] if len(args) > 2 else kwargs.get("communication_data_type")
                if not isinstance(comm_dtype, torch.dtype):  # 0.11-0.14: the third argument is elements_per_buffer
                    comm_dtype = None
                layout = self._bucket_layout(zero, comm_dtype)
            else:
                grads = args[0] if args else kwargs["grads"]
                entries = args[1] if len(args) > 1 else kwargs["grad_params"]
                layout = [(p if isinstance(p, torch.Tensor) else zero.bit16_groups[i][p], i, pid)
                          for i, p, pid in entries]
            ok = layout is not None and len(layout) == len(grads) and \
                all(g.numel() == p.numel() and id(p) in self.param_ids for g, (p, _, _) in zip(grads, layout))
            if not ok:
                self._note_unmapped(name, sum(g.numel() for g in grads))
                return original(*args, **kwargs)
            pre = torch.cat([g.detach().reshape(-1) for g in grads]) if grads else None
            result = original(*args, **kwargs)
            post = torch.cat([g.detach().reshape(-1) for g in grads]) if grads else None
            if grads:
                self._write_bucket_pair(layout, pre, post, self._next_bucket(), averaged=False)
            return result
        return fallback

    # ---- stage 0 -------------------------------------------------------------------------------

    def _wrap_engine_allreduce_and_copy(self, original):
        def allreduce_and_copy(small_bucket, *args, **kwargs):
            by_ptr = {}
            for p in self.params:
                if p.grad is not None:
                    by_ptr[p.grad.data_ptr()] = p
            layout = [by_ptr.get(t.data_ptr()) for t in small_bucket]
            if any(p is None or p.numel() != t.numel() for p, t in zip(layout, small_bucket)):
                self._note_unmapped("allreduce_and_copy", sum(t.numel() for t in small_bucket))
                return original(small_bucket, *args, **kwargs)
            pre = torch.cat([t.detach().reshape(-1).clone() for t in small_bucket])
            result = original(small_bucket, *args, **kwargs)
            post = torch.cat([t.detach().reshape(-1) for t in small_bucket])
            bucket_id = self._next_bucket()
            divisor = self._engine_divisor(layout, args[0] if args else kwargs.get("dp_group"))
            for phase, flat in (("PRE_REDUCE", pre), ("POST_REDUCE", post)):
                if phase not in self.wanted:
                    continue
                slices, off = [], 0
                for p in layout:
                    n = p.numel()
                    slices.append({"param_id": self.param_ids[id(p)], "offset": 0, "values": flat[off:off + n]})
                    off += n
                self.writer.write_bucket({"step": self.step, "micro_step": self.micro, "bucket_id": bucket_id,
                                          "phase": phase, "group": "sdp", "bucket_numel": off, "slices": slices,
                                          "divisor": divisor if phase == "POST_REDUCE" else 0.0})
                self.recorded[phase] += 1
            return result
        return allreduce_and_copy

    def _engine_divisor(self, layout, dp_group):
        """The divisor this release's engine all-reduce applies to a dense bucket over dp_group (semantics/
        table), 0 if unknown. Expert buckets (_reduce_expert_gradients) divide by the data-parallel size
        while reducing over the expert-data-parallel group, which the table's engine path does not model."""
        import torch.distributed as tdist
        if dp_group is None or any(getattr(p, "allreduce", True) is False for p in layout):
            return 0.0
        # _reduce_non_expert_gradients: with pipeline parallelism the mpu's dp group, divided by its size.
        sp = 1 if getattr(self.engine, "pipeline_parallelism", False) else \
            int(getattr(self.engine, "sequence_parallel_size", 1) or 1)
        return declared_divisor(self.ds_version, "engine", tdist.get_world_size(group=dp_group), sp)

    # ---- FINAL and step bookkeeping ------------------------------------------------------------

    def _capture_final(self):
        from deepspeed.utils import safe_get_full_grad
        import torch.distributed as tdist
        # safe_get_full_grad is a collective for ZeRO-1/2 parameters without .grad. A parameter that
        # holds .grad on some ranks and not on others would make the ranks call different
        # collectives, so agree on it first (one small all-reduce) and skip such parameters.
        has = torch.tensor([1 if p.grad is not None else 0 for p in self.params], dtype=torch.int32)
        lo, hi = has.clone(), has.clone()
        # The ranks that hold these parameters: all of them, or a pipeline stage's data-parallel replicas.
        group = self.engine.grid.get_data_parallel_group() if self.pipeline is not None else None
        if tdist.is_initialized() and tdist.get_world_size(group) > 1:
            tdist.all_reduce(lo, op=tdist.ReduceOp.MIN, group=group)
            tdist.all_reduce(hi, op=tdist.ReduceOp.MAX, group=group)
        slices, skipped = [], []
        for k, p in enumerate(self.params):
            if int(lo[k]) != int(hi[k]):
                skipped.append(self.names[id(p)])
                continue
            g = safe_get_full_grad(p)
            if g is None:
                skipped.append(self.names[id(p)])
                continue
            slices.append({"param_id": self.param_ids[id(p)], "offset": 0,
                           "values": g.detach().float().reshape(-1).cpu()})
        if skipped:
            log.warning("gradtrace: FINAL of step %d lacks %d parameters (no full gradient): %s", self.step,
                        len(skipped), ", ".join(skipped[:5]))
        if slices:
            self.writer.write_bucket({"step": self.step, "micro_step": self.micro, "bucket_id": 0,
                                      "phase": "FINAL", "group": "", "slices": slices})
            self.recorded["FINAL"] += 1

    def _wrap_step(self, original):
        def step(*args, **kwargs):
            boundary = bool(_call(self.engine, "is_gradient_accumulation_boundary", True))
            if boundary:
                self.final_if_wanted()
            result = original(*args, **kwargs)
            if boundary:
                self.end_optimizer_step()
            self._bucket_id = 0
            return result
        return step

    def final_if_wanted(self):
        """FINAL of the current step, unless not asked for or not recordable with this release."""
        if "FINAL" in self.wanted and "FINAL" not in self.unrecordable:
            self._capture_final()

    def end_optimizer_step(self):
        """After the optimizer step: its StepInfo (the engine's lr and grad norm), the first step's check for
        gradient frames, and the counters of the next step."""
        lrs = _call(self.engine, "get_lr", None) or [None]
        self.recorder.write_optimizer_step(_call(self.engine, "get_global_grad_norm"), lr=lrs[0], step=self.step,
                                           micro=self.micro)
        self._check_recorded()
        self.recorder.step_ended(self.step)
        self.step += 1
        self._backwards = self._forwards = 0
        self._bucket_id = 0

    # ---- PipelineEngine (gradtrace.adapters.deepspeed_pipe) ---------------------------------------

    def pipeline_forward_begins(self):
        """PipelineEngine: a micro-batch's forward starts; its buckets are numbered from 0."""
        self.micro = self._forwards
        self._bucket_id = 0

    def pipeline_forward_done(self):
        """After a micro-batch's forward: the last stage's loss (before DeepSpeed divides it by gas)."""
        self._forwards += 1
        loss = getattr(self.engine, "loss", None)
        if self.engine.is_last_stage() and isinstance(loss, torch.Tensor) and loss.numel() == 1:
            self.record_step(loss, 0)

    def _wrap_backward(self, original):
        def backward(*args, **kwargs):
            self.micro = self._backwards
            self._bucket_id = 0
            try:
                return original(*args, **kwargs)
            finally:
                self._backwards += 1
        return backward

    def _check_recorded(self):
        """At the end of the first optimizer step: one warning when no gradient frame was recorded."""
        if self._checked_empty or self.recorder.disabled is not None:
            return
        self._checked_empty = True

        def reason():
            why = "; ".join(f"{p}: {w}" for p, w in self.unrecordable.items()) or \
                f"no bucket reached the hooked reductions ({', '.join(self.hooks)}) and no parameter had a full gradient"
            return f"DeepSpeed {self.ds_version} ZeRO stage {self.zero_stage}: {why}"

        no_gradient.warn_if_none(self.recorded, self.wanted, self.rank, self.step, reason)

    def _next_bucket(self):
        b = self._bucket_id
        self._bucket_id += 1
        return b

    def _note_unmapped(self, where, numel):
        log.warning("gradtrace: %s: a bucket of %d elements could not be mapped to parameters; not recorded",
                    where, numel)

    # ---- public --------------------------------------------------------------------------------

    def begin_micro_step(self):
        """At a forward, before its backward: numbers the micro-step that forward starts, so that a
        ``record_step`` called from a forward hook (GradtraceCallback) is filed under it."""
        self.micro = self._backwards

    def report_grad_norm(self, norm) -> None:
        """Ignored: the engine's own norm (``get_global_grad_norm``) is recorded at each optimizer step."""

    def record_step(self, loss, valid_tokens, lr: float | None = None):
        """StepInfo of the current micro-step: this rank's loss as passed to backward, its valid tokens."""
        if isinstance(loss, torch.Tensor):
            loss = float(loss.detach().float().item())
        if isinstance(valid_tokens, torch.Tensor):
            valid_tokens = int(valid_tokens.item())
        if lr is None:
            try:
                lr = float(self.engine.get_lr()[0])
            except Exception:
                lr = 0.0
        self.writer.write_step({"step": self.step, "micro_step": self.micro, "loss": float(loss),
                                "valid_tokens": int(valid_tokens), "lr": lr})
        self.recorded["STEP"] += 1

    def detach(self):
        """Put every replaced method back."""
        for obj, attr, prev in reversed(self._restore):
            if prev is _ABSENT:
                try:
                    delattr(obj, attr)
                except AttributeError:
                    pass
            else:
                setattr(obj, attr, prev)
        self._restore.clear()

    def close(self):
        """Puts DeepSpeed's methods back, closes the guard (its summary) and finishes the trace; idempotent."""
        self.detach()
        if self.writer is not None:
            self.writer = None
            self.recorder.close()


def _expert_layout(named_parameters, groups: dict):
    """DeepSpeed MoE: expert parameters carry ``allreduce = False`` and the name of their expert
    group (``group_name``); their gradients are reduced over that group's expert-data-parallel ranks.
    Adds ``ep`` and ``edp`` to ``groups`` and returns (a regex matching the expert parameters' names,
    {"ep": .., "edp": ..}), or ("", {}) without experts."""
    import re

    experts = [(n, p) for n, p in named_parameters if p.requires_grad and getattr(p, "allreduce", True) is False]
    if not experts:
        return "", {}
    from deepspeed.utils import groups as ds_groups

    group_name = getattr(experts[0][1], "group_name", None)
    try:
        groups["ep"] = _group_ranks(ds_groups._get_expert_parallel_group(group_name))
        groups["edp"] = _group_ranks(ds_groups._get_expert_data_parallel_group(group_name))
    except Exception as e:  # an older release without these helpers: experts still marked, no groups
        log.warning("gradtrace: DeepSpeed expert groups of %r not found (%s); ep/edp not recorded", group_name, e)
        return "^(?:" + "|".join(re.escape(n) for n, _ in experts) + ")$", {}
    regex = "^(?:" + "|".join(re.escape(n) for n, _ in experts) + ")$"
    return regex, {"ep": len(groups["ep"]), "edp": len(groups["edp"])}


class _Absent:
    pass


_ABSENT = _Absent()


def capture_with_options(engine, out_dir, given: dict, what: str = "a DeepSpeed engine", **fixed) -> DeepSpeedCapture:
    """The capture of ``engine`` from ``gradtrace.attach``'s options (attach_options): an option the engine cannot
    honour is a ValueError naming ``what``, before anything is hooked; ``loss`` is ``loss_recipe``. ``fixed``:
    the caller's own keywords (a Trainer's ``extra`` and ``packages``)."""
    check_options(given, "deepspeed", what)
    options = deepspeed_options(given)
    # An engine keeps the mpu it was made with (Ulysses SP, ALST through accelerate): sp comes from it unless given.
    mpu = options.pop("mpu", getattr(engine, "mpu", None))
    return DeepSpeedCapture(engine, out_dir, mpu=mpu, **fixed, **options)


def attach(engine, out_dir, mode: str = "full", mpu=None, **kwargs) -> DeepSpeedCapture:
    """Deprecated: use :func:`gradtrace.attach`, which takes the same options.

    Attach a capture to a DeepSpeed engine (after deepspeed.initialize) and open this rank's trace
    file ``out_dir/rank-NNNNN.gtrace``. Keyword arguments: ``loss_recipe`` (a gradtrace recipe name, or an
    alias of ``gradtrace.loss_recipes.ALIASES``: ``loss``, ``loss-div-sp``, ``alst``, ``alst-div-sp``),
    ``config`` (extra Config fields: seed, seq_len, batch, layers, hidden, heads, vocab, ignore_frac,
    optimizer, lr, steps), ``extra``
    (RunInfo.extra), ``run_id`` (default $GRADTRACE_RUN_ID, else drawn by rank 0 and broadcast), ``phases``,
    ``on_error`` ("warn", the default: a write error such as a full disk disables capture on that rank with
    one warning and training goes on; "raise": TraceError) and ``overwrite`` (replace a finished trace)."""
    deprecation.replaced_by_attach("gradtrace.deepspeed_adapter.attach",
                                   "gradtrace.attach(engine, out_dir, loss=...) (loss= is loss_recipe=)")
    return DeepSpeedCapture(engine, out_dir, mode, mpu, **kwargs)
