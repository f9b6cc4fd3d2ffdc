"""Capture an FSDP2 (``torch.distributed.fsdp.fully_shard``) run, in one call.

    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters())
    cap = gradtrace.attach(model, "traces/fsdp", optimizer=opt)

PRE_REDUCE / POST_REDUCE: every FSDP module (each ``fully_shard`` call) gets a custom
reduce-scatter (``FSDPModule.set_custom_reduce_scatter``, the public hook FSDP2 offers) that runs
torch's own ``reduce_scatter_single`` and records around it. PRE_REDUCE is the reduce-scatter
input: this rank's unsharded gradients, each cut into the world's dim-0 shards, as FSDP lays them
out (after FSDP's pre-division, which fp32/bf16 reductions do not apply); under FSDP2 x TP the
unsharded gradient is this tp rank's block, written at its offsets in the global parameter.
POST_REDUCE is this rank's shard of the output, read once FSDP has finished with it (its
post-division included): at the next reduce-scatter, the next forward, or the optimizer step,
whichever comes first. Gradient clipping between backward and the step would show in POST_REDUCE;
FINAL is after it by definition.

FINAL: this rank's shard of each gradient (the DTensor's local tensor) at its offset in the full
parameter, before ``optimizer.step()``; the diff joins the ranks' shards. ``full_final=True``
writes each rank's ``full_tensor()`` instead (an all-gather per parameter). FSDP2 x TP (a 2-D
``(dp, tp)`` mesh after ``parallelize_module``): each rank's local block at its global offsets
(gradtrace.adapters.dtensor: ``_StridedShard`` included, one slice per contiguous run), a Partial placement
reduced first; the layout records the mesh's ``tp`` group and each parameter's TP_SHARD /
REPLICATED kind.

HSDP (``fully_shard(..., mesh=init_device_mesh(..., (replicate, shard)))``): recorded as trace format
1.3's hybrid layout: ``Config.replicate``, groups ``shard`` and ``replicate``, PRE/POST of group
``shard``; POST_REDUCE is read after FSDP's all-reduce over the replicas, so ``--self`` measures the
whole reduction (shard x replicate).

On CPU with gloo (torch 2.15) the whole path runs, measured: see python/README.md for what does not.
"""

from __future__ import annotations

import logging
import math

from . import deprecation
from .adapter_base import TorchCapture, make_layout
from .dtensor import block_pieces, local_index
from ..codec.dtypes import torch_dtype_name
from .rank_recorder import RankRecorder

log = logging.getLogger("gradtrace")

__all__ = ["attach", "FSDP2Capture"]


def _shard_rows(numel: int, shape, world: int):
    """(rows per shard c, elements per row) of torch.chunk's dim-0 split into ``world`` shards."""
    dim0 = int(shape[0]) if len(shape) else 1
    row = numel // dim0 if dim0 else 0
    return -(-dim0 // world), row, dim0


def _rank_piece(fp_numel: int, shape, world: int, r: int):
    """(element offset in the flattened parameter, element count) of shard ``r``."""
    c, row, dim0 = _shard_rows(fp_numel, shape, world)
    first = min(r * c, dim0)
    last = min((r + 1) * c, dim0)
    return first * row, (last - first) * row


def _fsdp_block(fp, world: int, r: int):
    """(global shape, index, numel) of FSDP shard ``r`` of this rank's unsharded parameter ``fp``: per
    dim, the global indices the reduce-scatter input's row ``r`` holds of it (torch.chunk's split of
    the TP-local tensor along FSDP's shard dim; without TP the TP-local tensor is the whole one)."""
    shape = tuple(int(n) for n in fp.sharded_param.shape)  # a DTensor's shape is the global one
    spec = getattr(fp, "_unsharded_dtensor_spec", None)
    if spec is None:
        index = [range(n) for n in shape]
    else:  # FSDP2 x TP: the TP placements of this rank's coordinate
        _, index = local_index(shape, spec.mesh, spec.placements)
    dim = int(getattr(getattr(fp, "fsdp_placement", None), "dim", 0)) if shape else 0
    if shape:
        c = -(-len(index[dim]) // world)
        index[dim] = index[dim][r * c:(r + 1) * c]
    return shape, index, math.prod(len(ix) for ix in index)


class FSDP2Capture(TorchCapture):
    """A fully_shard'ed (FSDP2) model's capture: PRE/POST_REDUCE around FSDP's reduce-scatter, FINAL as
    this rank's shards (or full gradients with ``full_final``)."""
    def __init__(self, model, out_dir, optimizer=None, *, full_final: bool = False, groups=None, layout=None,
                 **options):
        import torch
        from torch.distributed.fsdp import FSDPModule

        from . import pipeline as pp

        info = pp.of(model)
        if info is not None:  # a pipeline whose stage module is fully_shard'ed (PipelineStage runs its no-sync)
            model = info.only_stage("fsdp2_adapter")
        self.full_final = full_final
        self.param_groups = []  # (FSDPModule, FSDPParamGroup)
        for m in model.modules():
            if isinstance(m, FSDPModule):
                state = m._get_fsdp_state()
                for pg in getattr(state, "_fsdp_param_groups", None) or [state._fsdp_param_group]:
                    if pg is not None:
                        self.param_groups.append((m, pg))
        if not self.param_groups:
            raise ValueError("gradtrace.fsdp2_adapter: the model has no fully_shard'ed module with parameters")
        mesh_info = self.param_groups[0][1].mesh_info
        shard_group = mesh_info.shard_process_group
        # HSDP (a 2-D mesh, replicate x shard): format 1.3's layout. The reduce-scatter runs over the shard
        # group, FSDP's all-reduce over the replicate group follows, and POST_REDUCE is read after both.
        replicate_group = getattr(mesh_info, "replicate_process_group", None)
        self.group = "dp" if replicate_group is None else "shard"
        found = {self.group: shard_group}
        if replicate_group is not None:
            found["replicate"] = replicate_group
            if layout is None:
                options.setdefault("default_group", "shard")
        groups = {**found, **(groups or {})}
        layout = make_layout(options, pp.layout_groups(info, groups) if info else groups, layout,
                             params=model.named_parameters())
        self._pending = []  # POST_REDUCE records whose values FSDP is still finishing
        # Registered before the base class's micro-step counter: pending POSTs belong to the micro-step that made them.
        self._flush_handle = model.register_forward_pre_hook(lambda *_: self.flush())
        # MixedPrecisionPolicy: gradients computed in param_dtype and reduced in reduce_dtype (format 1.4's chain).
        compute, reduce = self._mixed_precision()
        precision = {"dtype": torch_dtype_name(compute)} if compute is not None else {}
        options.setdefault("comm_dtype", reduce)
        # FSDP2's own divide factor (set_gradient_divide_factor): what its reductions divide by instead of the
        # group size; 1.0 makes them sums (a loss weighted by the global batch's tokens: loss="global-token-sum").
        factors = sorted({float(pg.gradient_divide_factor) for _, pg in self.param_groups
                          if getattr(pg, "gradient_divide_factor", None) is not None})
        extra = {**({"fsdp2_gradient_divide_factor": ",".join(f"{f:g}" for f in factors)} if factors else {}),
                 **(options.pop("extra", None) or {})}
        recorder = RankRecorder(model.named_parameters(), out_dir, framework="pytorch-fsdp2",
                                framework_version=torch.__version__.split("+")[0], layout=layout,
                                optimizer=optimizer, grad_dtype=compute,
                                config={"scaling": "mean" if not factors else "sum" if factors == [1.0] else "",
                                        "zero_stage": 3, **precision, **options.pop("config", {})},
                                extra=extra, pipeline=info, **options)
        super().__init__(recorder, model, optimizer)
        if info is not None:  # POST_REDUCE as the reduce-scatter left it, before the schedule divides by n
            self._handles += pp.before_scale_grads(info, self.flush)
        self._handles.append(self._flush_handle)
        self.unrecordable: dict[str, str] = {}
        self._bucket = 0
        for m, pg in self.param_groups:
            try:
                m.set_custom_reduce_scatter(_RecordingReduceScatter(self, pg))
            except (ValueError, AttributeError) as e:
                self.unrecordable.setdefault("PRE_REDUCE", str(e))
                self.unrecordable.setdefault("POST_REDUCE", str(e))
        for phase, why in self.unrecordable.items():
            log.warning("gradtrace: FSDP2: cannot record %s: %s", phase, why)

    # ---- PRE/POST around the reduce-scatter ----------------------------------------------------

    def _layout(self, pg, input_numel: int, world: int):
        """[(param id, FSDPParam, offset of its shard within a rank's row)], or None when the
        reduce-scatter input is not every parameter of the group (some had no gradient)."""
        out, off = [], 0
        for fp in pg.fsdp_params:
            pid = self.recorder.param_id(fp.sharded_param)
            if pid is None:
                return None
            out.append((pid, fp, off))
            off += fp.padded_sharded_param_size.numel()
        return out if off * world == input_numel else None

    def reduce_scatter(self, pg, output_tensor, input_tensor, group, op, async_op):
        """FSDP's reduce-scatter of one parameter group, recorded: the input as PRE_REDUCE, the output as
        POST_REDUCE once FSDP has finished it."""
        import torch.distributed as dist

        self.flush()
        rec = self.recorder
        world = dist.get_world_size(group)
        layout = self._layout(pg, input_tensor.numel(), world) if rec.capturing else None
        if layout is None:
            if rec.capturing:
                log.warning("gradtrace: FSDP2: a reduce-scatter of %d elements does not map onto its parameter "
                            "group; not recorded", input_tensor.numel())
            return dist.reduce_scatter_single(output=output_tensor, input=input_tensor, group=group, op=op,
                                              async_op=async_op)
        bucket_id, self._bucket = self._bucket, self._bucket + 1
        rows = input_tensor.view(world, -1)
        blocks = {pid: [_fsdp_block(fp, world, r) for r in range(world)] for pid, fp, _ in layout}
        numel = sum(n for b in blocks.values() for _, _, n in b)
        pieces = []
        for r in range(world):
            for pid, fp, seg in layout:
                shape, index, n = blocks[pid][r]
                pieces += block_pieces(pid, rows[r, seg:seg + n], shape, index)
        pieces.sort(key=lambda x: (x[0], x[1]))
        rec.write_bucket("PRE_REDUCE", pieces, group=self.group, bucket_id=bucket_id, bucket_numel=numel)
        work = dist.reduce_scatter_single(output=output_tensor, input=input_tensor, group=group, op=op,
                                          async_op=async_op)
        me = dist.get_rank(group)
        mine = []
        for pid, fp, seg in layout:
            shape, index, n = blocks[pid][me]
            mine.append((pid, shape, index, output_tensor, seg, n))
        # An AVG reduce-scatter divides by the shard group; under HSDP the replicas' all-reduce divides again
        # by a factor this hook does not see, so nothing is declared there (--self measures it). A divide factor
        # set on the module (set_gradient_divide_factor) is the whole reduction's divisor, HSDP's included.
        factor = getattr(pg, "gradient_divide_factor", None)
        divisor = float(factor) if factor is not None else float(world) if _is_avg(op) and self.group == "dp" else 0.0
        self._pending.append((self.recorder.micro, bucket_id, mine, numel, divisor))
        return work

    def _mixed_precision(self):
        """(compute dtype, reduce dtype) of the model's MixedPrecisionPolicy: the coarsest param_dtype and
        reduce_dtype over its FSDP parameters (None where the policy leaves the parameter's own)."""
        import torch

        def coarsest(dtypes):
            dtypes = [d for d in dtypes if d is not None]
            return max(dtypes, key=lambda d: torch.finfo(d).eps) if dtypes else None

        # The modules' policies (FSDPParam copies them only at the lazy init of the first forward).
        policies = [getattr(m._get_fsdp_state(), "_mp_policy", None) for m, _ in self.param_groups]
        policies = [p for p in policies if p is not None]
        return (coarsest(p.param_dtype for p in policies), coarsest(p.reduce_dtype for p in policies))

    def flush(self) -> None:
        """Writes the POST_REDUCE records whose reduce-scatter FSDP has finished."""
        pending, self._pending = self._pending, []
        for micro, bucket_id, mine, numel, divisor in pending:
            pieces = [x for pid, shape, index, out, seg, n in mine
                      for x in block_pieces(pid, out[seg:seg + n], shape, index)]
            held = sum(n for *_, n in mine)
            # The micro-step that made it: a caller counting micro-steps (Lightning's on_train_batch_start) may
            # have begun the next one before this forward's flush.
            self.recorder.write_bucket("POST_REDUCE", pieces, group=self.group, bucket_id=bucket_id, bucket_numel=numel,
                                       partition_count=held, divisor=divisor, micro=micro)

    # ---- FINAL ---------------------------------------------------------------------------------

    def final(self) -> None:
        """FINAL: each parameter's local shard at its offsets (the full gradient with ``full_final``)."""
        from torch.distributed.tensor import DTensor, Shard

        self.flush()
        self._bucket = 0
        rec = self.recorder
        if not rec.wants("FINAL"):
            return
        pieces = []
        for pid, p in enumerate(rec.params):
            g = p.grad if p is not None else None  # None: another pipeline stage's parameter
            if g is None:
                continue
            if not isinstance(g, DTensor):
                pieces.append((pid, 0, g.detach()))
            elif not self.full_final and tuple(g.placements)[-1:] == (Shard(0),) and all(
                    pl.is_replicate() for pl in tuple(g.placements)[:-1]):
                # A 1-D mesh, or HSDP's (Replicate(), Shard(0)): this rank's shard along the last mesh dim.
                dim = g.device_mesh.ndim - 1
                world = g.device_mesh.size(dim)
                off, n = _rank_piece(p.numel(), tuple(p.shape), world, g.device_mesh.get_local_rank(dim))
                local = g.to_local().detach().reshape(-1)
                pieces.append((pid, off, local[:n]))
            elif self.full_final:
                pieces.append((pid, 0, g.full_tensor().detach()))
            else:
                # FSDP2 x TP (a 2-D mesh: Shard(0) or _StridedShard(0) on dp, TP's placement on tp), or any other
                # placements: this rank's local block at its global offsets, Partial dims reduced first.
                pieces += rec.grad_pieces(pid, g, reduce=True)
        rec.write_bucket("FINAL", pieces, group="", bucket_id=0)

    def close(self) -> None:
        """Writes POST_REDUCE records still pending, then closes as every capture does."""
        self.flush()
        super().close()


def _is_avg(op) -> bool:
    import torch.distributed as dist

    try:
        return op == dist.ReduceOp.AVG
    except TypeError:
        return False


def _recording_reduce_scatter_class():
    from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter

    class RecordingReduceScatter(ReduceScatter):
        """torch's default reduce-scatter (fresh buffers, ``reduce_scatter_single``), recorded."""

        def __init__(self, capture, param_group):
            self.capture, self.param_group = capture, param_group

        def allocate(self, size, *, dtype, device):
            import torch

            return torch.empty(*size, dtype=dtype, device=device)

        def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
            return self.capture.reduce_scatter(self.param_group, output_tensor, input_tensor, group, op, async_op)

    return RecordingReduceScatter


def _RecordingReduceScatter(capture, param_group):
    return _recording_reduce_scatter_class()(capture, param_group)


def attach(model, out_dir, optimizer=None, **options) -> FSDP2Capture:
    """Deprecated: use :func:`gradtrace.attach`, which takes the same options.

    Attach to a model after ``fully_shard`` (before its first backward) and open this rank's
    ``out_dir/rank-NNNNN.gtrace``. ``optimizer``: FINAL and the step count follow its ``step()``
    (else call ``cap.step()``). Keywords: ``full_final`` (write full gradients, not shards),
    ``groups``, layout overrides (``dp``, ``gas``, ``rules``, ... or ``layout=``), and the
    RankRecorder's options (``mode``, ``steps``, ``params``, ``run_id``, ``loss``,
    ``loss_description``, ``config``, ``extra``, ``on_error``: "warn" or "raise", ``overwrite``).
    ``model`` may also be a torch.distributed.pipelining schedule or PipelineStage whose one stage per rank
    is fully_shard'ed: the trace then names the whole model with each parameter's stage (gradtrace.attach,
    Pipelines)."""
    deprecation.replaced_by_attach("gradtrace.fsdp2_adapter.attach", "gradtrace.attach(model, out_dir, optimizer=...)")
    return FSDP2Capture(model, out_dir, optimizer, **options)
