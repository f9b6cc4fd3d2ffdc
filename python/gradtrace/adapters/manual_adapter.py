"""Capture hand-written parallel training (your own SP/CP/EP/TP collectives, Megatron-like code).

    cap = gradtrace.attach(model, "traces/cp2", optimizer=opt, groups={"cp": cp_group}, cp_kind="all-gather",
                           loss="global-token-weighted")
    loss.backward()
    with cap.around("cp", params):            # PRE_REDUCE before, POST_REDUCE after your collective
        for p in params:
            dist.all_reduce(p.grad, group=cp_group)
    opt.step()                                # FINAL: every parameter's .grad, before the step

FINAL comes from attaching to the optimizer (or ``cap.step()`` without one). PRE/POST come
from :meth:`ManualCapture.around` or :meth:`ManualCapture.record`, which take the parameters (their
``.grad``), explicit tensors, or one flat bucket tensor laid out as the parameters in order.

A pipeline (torch.distributed.pipelining): pass the schedule (or the PipelineStage) as the model;
the trace names the whole model with each parameter's stage, and records the schedule's micro-batches
and scale_grads (gradtrace.adapters.pipeline):

    schedule = ScheduleGPipe(stage, n_microbatches=4, loss_fn=loss_fn)
    cap = gradtrace.attach(schedule, "traces/pp", optimizer=opt, groups={"dp": dp_group})
"""

from __future__ import annotations

import math
import re
from contextlib import contextmanager

from . import deprecation
from .adapter_base import TorchCapture, make_layout
from .rank_recorder import RankRecorder

__all__ = ["attach", "ManualCapture"]


class ManualCapture(TorchCapture):
    """A plain, DTensor-parallel or hand-sharded module's capture, or a pipeline's: FINAL from ``.grad``;
    PRE/POST_REDUCE where your own collectives call ``record()``/``around()``."""
    def __init__(self, model, out_dir, optimizer=None, *, groups=None, layout=None, framework: str = "pytorch",
                 framework_version: str | None = None, shards=None, **options):
        import torch

        from . import pipeline as pp

        info = pp.of(model)
        if info is not None:
            groups = pp.layout_groups(info, groups)
            model = info  # its named_parameters(): every stage this rank runs
        given_layout = layout is not None
        specs = _shard_specs(model, shards)
        layout = make_layout(options, groups, layout, params=model.named_parameters())
        if not given_layout:
            for name, dim, _, _ in specs.values():
                layout.add_rule(f"^{re.escape(name)}$", kind="TP_SHARD", partition_dim=dim)
        version = torch.__version__.split("+")[0] if framework_version is None else framework_version

        def shape_of(p):
            if id(p) not in specs:
                return list(p.shape)
            _, dim, _, full = specs[id(p)]
            return [full if d == dim else int(n) for d, n in enumerate(p.shape)]

        recorder = RankRecorder(model.named_parameters(), out_dir, framework=framework, framework_version=version,
                                layout=layout, optimizer=optimizer, shape_of=shape_of if specs else None,
                                pipeline=info, **options)
        for key, (_, dim, start, _) in specs.items():
            pid = recorder.ids.get(key)
            if pid is not None:
                p = recorder.params[pid]
                recorder.blocks[pid] = [range(start, start + int(n)) if d == dim else range(int(n))
                                        for d, n in enumerate(p.shape)]
        super().__init__(recorder, info.module if info is not None else model, optimizer)
        self._bucket_key = None
        self._bucket_next = 0

    def _bucket_id(self, given):
        if given is not None:
            return given
        key = (self.recorder.step, self.recorder.micro)
        if key != self._bucket_key:
            self._bucket_key, self._bucket_next = key, 0
        self._bucket_next += 1
        return self._bucket_next - 1

    def _pieces(self, params, tensors, flat, offsets=None):
        rec = self.recorder
        where = self._offsets(offsets)
        out, off = [], 0
        for k, p in enumerate(params):
            pid = rec.param_id(p)
            if pid is None:
                raise ValueError(f"gradtrace: parameter {k} of the record is not a parameter of the attached model")
            if flat is not None:
                n = _local_numel(p)
                values = flat.detach().reshape(-1)[off:off + n].reshape(_local_shape(p))
                off += n
            else:
                values = (tensors[k] if tensors is not None else p.grad)
                if values is None:
                    continue
            out += self._param_pieces(pid, p, values, where.get(pid))
        if flat is not None and off != flat.numel():
            raise ValueError(f"gradtrace: flat bucket has {flat.numel()} elements, the parameters {off}")
        return out

    def _offsets(self, offsets) -> dict:
        """``offsets`` of record()/around() by param id: keys are parameters or their names."""
        rec = self.recorder
        out = {}
        for key, where in (offsets or {}).items():
            pid = rec.names.index(key) if isinstance(key, str) and key in rec.names else rec.param_id(key)
            if pid is None:
                raise ValueError(f"gradtrace: offsets= names {key if isinstance(key, str) else 'a tensor'} that is not "
                                 f"a parameter of the attached model")
            out[pid] = where
        return out

    def _param_pieces(self, pid: int, p, values, where) -> list:
        """The pieces of ``values`` (parameter ``p``'s gradient, or a part of it) at their offsets in
        the full parameter: ``where`` from offsets=, else the DTensor's placements, the shard declared
        with shards=, or the whole parameter."""
        from . import dtensor

        rec = self.recorder
        full = rec.shapes[pid]
        if where is not None:
            if dtensor.is_dtensor(values):
                values = values.to_local()
            values = values.detach()
            if not isinstance(where, (tuple, list)):  # a flat element offset
                where = int(where)
                if where < 0 or where + values.numel() > math.prod(full):
                    raise ValueError(f"gradtrace: offsets= {where} + {values.numel()} elements runs outside "
                                     f"{rec.names[pid]!r} of shape {full}")
                return [(pid, where, values.reshape(-1))]
            dim, start = (int(x) for x in where)
            dim = dim % max(len(full), 1)
            shape = list(values.shape)
            if len(shape) != len(full) or any(shape[d] != full[d] for d in range(len(full)) if d != dim) \
                    or start < 0 or start + shape[dim] > full[dim]:
                raise ValueError(f"gradtrace: offsets= (dim {dim}, start {start}) for a tensor of shape {shape} does "
                                 f"not fit {rec.names[pid]!r} of shape {full}")
            index = [range(start, start + n) if d == dim else range(n) for d, n in enumerate(shape)]
            return dtensor.block_pieces(pid, values, full, index)
        return rec.grad_pieces(pid, values)  # a DTensor parameter's plain values: at the local block's offsets

    def _check_group(self, phase: str, group: str) -> None:
        """A record names a group the layout declares (``groups=`` of attach, or ``layout=``); FINAL
        may name none (""). Else ``gradtrace-diff --self`` would find no reductions to check."""
        declared = list(self.recorder.layout.groups)
        if group in declared or (group == "" and phase.upper() == "FINAL"):
            return
        raise ValueError(f"gradtrace.manual_adapter: group {group!r} was never declared: pass it to attach() as "
                         f"groups={{{group!r}: <ProcessGroup or ranks>}} (declared groups: {', '.join(declared)})")

    def record(self, phase: str, group: str, params, *, tensors=None, flat=None, bucket_id=None,
               divisor: float = 0.0, offsets=None) -> None:
        """One BucketRecord now: ``phase`` ("PRE_REDUCE", "POST_REDUCE", "FINAL"), ``group`` (the
        name of the group reduced over, as in ``groups``), ``params`` (parameters of the model);
        values are their ``.grad``, or ``tensors`` (one per parameter), or ``flat`` (one tensor, the
        parameters' local elements in order). ``divisor``: what the reduction divided by, if known.

        Where the values sit in the full parameter: a DTensor's own placements (its local tensor;
        Partial values as the rank holds them), a shard declared with ``attach(shards=...)``, or
        ``offsets={param or name: (dim, start)}`` (the values are the block starting at ``start``
        along ``dim`` of the full parameter, all of every other dim) or ``{param: element_offset}``
        (a contiguous piece of the flattened full parameter); otherwise the whole parameter."""
        self._check_group(phase, group)
        params = list(params)
        pieces = self._pieces(params, tensors, flat, offsets)
        self.recorder.write_bucket(phase.upper(), pieces, group=group, bucket_id=self._bucket_id(bucket_id),
                                   bucket_numel=sum(_local_numel(p) for p in params), divisor=divisor)

    @contextmanager
    def around(self, group: str, params, *, tensors=None, flat=None, bucket_id=None, divisor: float = 0.0,
               offsets=None):
        """PRE_REDUCE on entry and POST_REDUCE on exit, of the same values (reduced in place by the
        collective the block runs), with one bucket id; ``offsets`` as for :meth:`record`."""
        self._check_group("PRE_REDUCE", group)
        params = list(params)
        bucket_id = self._bucket_id(bucket_id)
        self.record("PRE_REDUCE", group, params, tensors=tensors, flat=flat, bucket_id=bucket_id, offsets=offsets)
        yield self
        self.record("POST_REDUCE", group, params, tensors=tensors, flat=flat, bucket_id=bucket_id, divisor=divisor,
                    offsets=offsets)


def _local_numel(p) -> int:
    from .dtensor import is_dtensor

    return p.to_local().numel() if is_dtensor(p) else p.numel()


def _local_shape(p):
    from .dtensor import is_dtensor

    return tuple(p.to_local().shape) if is_dtensor(p) else tuple(p.shape)


def _shard_specs(model, shards) -> dict:
    """``shards`` of attach() by id(parameter): (name, dim, start, full size along dim), checked."""
    if not shards:
        return {}
    named = {name: p for name, p in model.named_parameters()}
    by_id = {id(p): name for name, p in named.items()}
    out = {}
    for key, spec in shards.items():
        name = key if isinstance(key, str) else by_id.get(id(key))
        if name not in named:
            raise ValueError(f"gradtrace: shards= names {key if isinstance(key, str) else 'a tensor'} that is not a "
                             f"parameter of the model")
        p = named[name]
        try:
            dim, start, full = (int(x) for x in spec)
        except (TypeError, ValueError):
            raise ValueError(f"gradtrace: shards[{name!r}] = {spec!r}: expected (dim, start, full size along dim)") \
                from None
        if p.dim() == 0 or not -p.dim() <= dim < p.dim():
            raise ValueError(f"gradtrace: shards[{name!r}]: dim {dim} outside the parameter's {p.dim()} dims")
        dim %= p.dim()
        if start < 0 or start + p.shape[dim] > full:
            raise ValueError(f"gradtrace: shards[{name!r}]: rows [{start}, {start + p.shape[dim]}) of dim {dim} do "
                             f"not fit a full size of {full}")
        out[id(p)] = (name, dim, start, full)
    return out


def attach(model, out_dir, optimizer=None, **options) -> ManualCapture:
    """Deprecated: use :func:`gradtrace.attach`, which takes the same options.

    Attach to any ``torch.nn.Module`` and open this rank's ``out_dir/rank-NNNNN.gtrace``.
    ``optimizer``: FINAL and the step count follow its ``step()`` (else call ``cap.step()``).
    Keywords: ``groups`` (name -> ProcessGroup or global ranks: "dp", "cp", "tp", ... set the
    degrees and this rank's coordinates), layout overrides (``dp``, ``cp``, ``cp_kind``, ``tp``,
    ``gas``, ``rules`` = [(regex, {"kind", "grad_group", "partition_dim", "shard_count"})],
    ``default_group``, or ``layout=``), ``framework`` (default "pytorch"), and the RankRecorder's
    options (``mode``, ``steps``, ``params``, ``run_id``, ``loss``, ``loss_description``,
    ``config``, ``extra``, ``on_error``: "warn" or "raise", ``overwrite``).

    Sharded parameters. DTensor parameters (``parallelize_module``'s ColwiseParallel,
    RowwiseParallel, SequenceParallel; any Shard/Replicate placements on a 1-D or 2-D DeviceMesh)
    need nothing: the table records their full shape, the mesh dims become named groups ("tp", ...)
    with the degrees, each parameter is TP_SHARD (partition_dim, shard_count) or REPLICATED, and
    FINAL writes each rank's local piece at its offsets (gradtrace.adapters.dtensor); a Partial gradient
    (a norm under SequenceParallel) is reduced first, an all-reduce over its mesh dims inside
    ``optimizer.step()``'s pre-hook that every rank runs. Hand-written (Megatron-style) shards,
    plain tensors holding part of a parameter: ``shards={param or name: (dim, start, full_size)}``
    (this rank's tensor is rows ``[start, start + local size)`` of dim ``dim`` of a parameter whose
    full size along ``dim`` is ``full_size``): the table records the full shape, the parameter is
    TP_SHARD along ``dim`` (unless ``rules=`` says otherwise), and FINAL and record()/around()
    write the shard at its offsets, so the diff joins the ranks' shards.

    Pipelines: ``model`` may be a torch.distributed.pipelining schedule (ScheduleGPipe, Schedule1F1B,
    ScheduleInterleaved1F1B, ...), a PipelineStage or a list of this rank's stages. The table names
    every stage's parameters (gathered over the pipeline group at attach, a collective) with their
    stages; the groups ``pp`` (the stage's group) and ``dp`` (unless given: the ranks at this rank's
    position in their pipeline group) are recorded, and from a schedule its micro-batches and
    ``scale_grads``. Micro-steps count micro-batches (forwards of this rank's first stage)."""
    deprecation.replaced_by_attach("gradtrace.manual_adapter.attach", "gradtrace.attach(model, out_dir, optimizer=...)")
    return ManualCapture(model, out_dir, optimizer, **options)
