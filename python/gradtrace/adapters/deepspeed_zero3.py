"""ZeRO-3 hook points for gradtrace.deepspeed_adapter (DeepSpeedZeroOptimizer_Stage3, names as in 0.19.8).

Stage 3 reduces per IPG bucket in the private ``__reduce_and_partition_ipg_grads(comm_dtype)``
(``deepspeed/runtime/zero/stage3.py``). It picks one of two paths per bucket:

- ``contiguous_gradients and bucket.elements <= reduce_bucket_size and not reduce_scatter``:
  ``__avg_scatter_contiguous_grads`` divides the flat bucket by ``world(group) / sp`` and all-reduces it;
- otherwise (``reduce_scatter: true`` is the default): ``__avg_scatter_grads`` ->
  ``coalesced_collectives.reduce_scatter_coalesced``, which divides by ``world(group)`` and
  reduce-scatters; no ``/ sp``.

Either way ``partition_grads(params, partitions)`` then receives every parameter of the bucket with the
rank's reduced partition of it, before it is accumulated into the optimizer's gradient buffer. So:

- PRE_REDUCE: on entry to ``__reduce_and_partition_ipg_grads``, each ``param.grad`` of
  ``ipg_buckets[comm_dtype].params`` (full size: stage 3 checks ``grad.numel() == ds_numel``), in bucket order;
- POST_REDUCE: in ``partition_grads``, rank r's partition of each parameter, elements
  ``[r * c, min((r + 1) * c, ds_numel))`` with ``c = partition_numel()`` (the padding is dropped);
- FINAL: the adapter's ``safe_get_full_grad``, which for stage 3 all-gathers the fp32 gradient partitions
  (a collective; every rank calls it for every parameter).

Name-mangled methods are shadowed on the optimizer instance under their mangled name
(``_<DefiningClass>__name``), which is what ``self.__name(...)`` inside the class looks up.
Which of the two paths ran is counted per bucket in ``capture.zero3_paths``.
"""

from __future__ import annotations

import torch

__all__ = ["install", "PATHS"]

# private method -> the name the study uses for the path it implements
PATHS = {"__avg_scatter_grads": "reduce-scatter", "__avg_scatter_contiguous_grads": "all-reduce-contiguous"}


def _mangled(obj, name):
    """The instance-visible name of the private method `name` (e.g. "__avg_scatter_grads"), or None."""
    for cls in type(obj).__mro__:
        attr = f"_{cls.__name__.lstrip('_')}{name}"
        if attr in vars(cls):
            return attr
    return None


def install(capture, opt) -> None:
    """Install the stage-3 hooks on ZeRO-3 optimizer `opt` through `capture._patch`; record what was hooked
    in `capture.hooks` and what cannot be recorded in `capture.unrecordable`."""
    capture.zero3_paths = {v: 0 for v in PATHS.values()}
    reduce_name = _mangled(opt, "__reduce_and_partition_ipg_grads")
    missing = [n for n, ok in (("__reduce_and_partition_ipg_grads", reduce_name),
                               ("partition_grads", hasattr(opt, "partition_grads")),
                               ("ipg_buckets", hasattr(opt, "ipg_buckets") or hasattr(opt, "params_in_ipg_bucket")))
               if not ok]
    if missing:
        why = f"{type(opt).__name__} has no {', '.join(missing)}"
        capture.unrecordable["PRE_REDUCE"] = why
        capture.unrecordable["POST_REDUCE"] = why
        return
    state = {"bucket": None}  # (bucket id, [(param, bucket offset)]) while a bucket is being reduced
    capture._patch(opt, reduce_name, lambda orig: _wrap_reduce(capture, opt, orig, state))
    capture._patch(opt, "partition_grads", lambda orig: _wrap_partition(capture, opt, orig, state))
    capture.hooks += [f"{type(opt).__name__}.{reduce_name}", f"{type(opt).__name__}.partition_grads"]
    for private, path in PATHS.items():
        name = _mangled(opt, private)
        if name is not None:
            capture._patch(opt, name, lambda orig, p=path: _counting(capture, p, orig))


def _bucket_params(opt, comm_dtype):
    buckets = getattr(opt, "ipg_buckets", None)
    if isinstance(buckets, dict):
        bucket = buckets.get(comm_dtype)
        return list(bucket.params) if bucket is not None else []
    return list(opt.params_in_ipg_bucket)  # releases before per-dtype buckets


def _wrap_reduce(capture, opt, original, state):
    def reduce_and_partition(*args, **kwargs):
        # Releases before per-dtype buckets (<= 0.14.x measured) call it without comm_dtype.
        comm_dtype = args[0] if args else kwargs.get("comm_dtype")
        params = _bucket_params(opt, comm_dtype)
        if not params or not all(id(p) in capture.param_ids and p.grad is not None for p in params):
            if params:
                capture._note_unmapped("stage3 __reduce_and_partition_ipg_grads", sum(p.ds_numel for p in params))
            return original(*args, **kwargs)
        bucket_id = capture._next_bucket()
        offsets, off, slices = {}, 0, []
        for p in params:
            offsets[id(p)] = off
            slices.append({"param_id": capture.param_ids[id(p)], "offset": 0,
                           "values": p.grad.detach().reshape(-1).clone()})
            off += p.ds_numel
        if "PRE_REDUCE" in capture.wanted:
            capture.writer.write_bucket({"step": capture.step, "micro_step": capture.micro, "bucket_id": bucket_id,
                                         "phase": "PRE_REDUCE", "group": "sdp", "bucket_numel": off, "slices": slices})
            capture.recorded["PRE_REDUCE"] += 1
        state["bucket"] = (bucket_id, offsets, off)
        try:
            return original(*args, **kwargs)
        finally:
            state["bucket"] = None
    return reduce_and_partition


def _wrap_partition(capture, opt, original, state):
    def partition_grads(params, partitions, *args, **kwargs):
        if state["bucket"] is not None and "POST_REDUCE" in capture.wanted:
            _write_post(capture, opt, state["bucket"], params, partitions)
        return original(params, partitions, *args, **kwargs)
    return partition_grads


def _write_post(capture, opt, bucket, params, partitions):
    bucket_id, offsets, numel = bucket
    slices, first, held = [], None, 0
    for p, part in zip(params, partitions):
        r, c = _partition_rank(opt, p), p.partition_numel()
        start, n = r * c, max(0, min(c, p.ds_numel - r * c))
        if n == 0:
            continue
        slices.append({"param_id": capture.param_ids[id(p)], "offset": start,
                       "values": part.detach().reshape(-1)[:n].clone()})
        pos = offsets.get(id(p), 0) + start
        first = pos if first is None else min(first, pos)
        held += n
    from .deepspeed_divisors import zero3_bucket_divisor  # the divisor the release applies (semantics/ table)
    capture.writer.write_bucket({"step": capture.step, "micro_step": capture.micro, "bucket_id": bucket_id,
                                 "phase": "POST_REDUCE", "group": "sdp", "bucket_numel": numel,
                                 "partition_offset": first or 0, "partition_count": held,
                                 "divisor": zero3_bucket_divisor(capture.ds_version, opt, params, numel),
                                 "slices": slices})
    capture.recorded["POST_REDUCE"] += 1


def _partition_rank(opt, p):
    """This rank's index in the group `p` is partitioned over. Releases before per-parameter partition groups
    (0.14.5 and older: no _get_param_partition_rank) partition every parameter over dp_process_group and
    use its rank there (0.14.5 runtime/zero/stage3.py:1425, read)."""
    if hasattr(opt, "_get_param_partition_rank"):
        return opt._get_param_partition_rank(p)
    import torch.distributed as tdist
    return tdist.get_rank(group=opt.dp_process_group)


def _counting(capture, path, original):
    def reduce_path(*args, **kwargs):
        capture.zero3_paths[path] += 1
        return original(*args, **kwargs)
    return reduce_path


def full_shape(p: torch.nn.Parameter) -> list[int]:
    """The parameter's shape; a ZeRO-3 parameter's own .shape is that of its empty placeholder."""
    return list(getattr(p, "ds_shape", p.shape))
