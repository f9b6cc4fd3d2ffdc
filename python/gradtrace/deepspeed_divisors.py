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

from . import _gtcodec

# The adapters' reduction paths -> the table's (semantics/scaling_policy.h ReductionPath).
PATHS = ("engine", "zero", "zero3-reduce-scatter", "zero3-allreduce")


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
