"""The divisor a DeepSpeed release applies to one reduction bucket, as the adapters declare it in
``BucketRecord.divisor``.

The value comes from the one table of DeepSpeed reduction semantics (semantics/, reached through
``_gtcodec.bucket_divisor``), never from a copy here: ``gradtrace-diff --self`` then checks the
declaration against the effective divisor it measures and reports a finding when they differ. A
release the table does not hold, or a bucket whose arithmetic the binding cannot express, declares
0 ("unknown"), so the diff falls back to its own reconstruction.
"""

from __future__ import annotations

from functools import lru_cache

from .. import _gtcodec

# The reduction paths' names, from semantics/ (reduction_path.h ReductionPathName) through the binding: one list.
PATHS = tuple(_gtcodec.reduction_paths())


@lru_cache(maxsize=None)
def _known(version: str) -> bool:
    return any(r["version"] == version for r in _gtcodec.deepspeed_releases())


@lru_cache(maxsize=None)
def declared_divisor(version: str, path: str, group_size: int, sp: int = 1, has_moe: bool = False) -> float:
    """What DeepSpeed ``version`` divides a bucket by on ``path`` over a group of ``group_size`` ranks
    with sequence-parallel degree ``sp``; 0.0 when the table does not model the release."""
    if path not in PATHS:
        raise ValueError(f"path: expected one of {PATHS}, got {path!r}")
    version = version.split("+")[0]
    if not _known(version) or group_size < 1:
        return 0.0
    return float(_gtcodec.bucket_divisor(f"deepspeed@{version}", path, int(group_size), max(1, int(sp)),
                                         bool(has_moe)))


@lru_cache(maxsize=None)
def _zero3_modelled(version: str) -> bool:
    """The table holds the release's stage3.py reading (an unread one has no zero3_cite)."""
    return any(r["version"] == version and r["zero3_cite"] for r in _gtcodec.deepspeed_releases())


def zero3_bucket_divisor(version: str, opt, params, bucket_elements: int) -> float:
    """What ZeRO-3 optimizer ``opt`` of DeepSpeed ``version`` divides the bucket of ``params``
    (``bucket_elements`` elements) by, on the path stage3.py's __reduce_and_partition_ipg_grads picks
    for it; 0.0 when not modelled (an unread release, expert parameters, a predivide factor)."""
    import torch.distributed as tdist
    version = version.split("+")[0]
    group = getattr(opt, "dp_process_group", None)
    if group is None or not _zero3_modelled(version) or \
            float(getattr(opt, "gradient_predivide_factor", 1.0) or 1.0) != 1.0 or \
            any(getattr(p, "allreduce", True) is False for p in params):
        return 0.0
    # The path stage3.py's __reduce_and_partition_ipg_grads takes, by the one rule (semantics/reduction_path.h)
    # on the optimizer's own settings; a release without __avg_scatter_contiguous_grads only reduce-scatters.
    path = _gtcodec.reduction_path(3, int(bucket_elements), int(getattr(opt, "reduce_bucket_size", 0) or 0),
                                   bool(getattr(opt, "reduce_scatter", True)),
                                   bool(getattr(opt, "contiguous_gradients", False)))
    if not any(n.endswith("__avg_scatter_contiguous_grads") for n in dir(type(opt))):
        path = "zero3-reduce-scatter"
    return declared_divisor(version, path, tdist.get_world_size(group=group),
                            int(getattr(opt, "sequence_parallel_size", 1) or 1))
