"""Why a capture recorded no gradient: the one warning an adapter prints when its first captured
optimizer step ends without a PRE_REDUCE, POST_REDUCE or FINAL frame (issue 26: a Trainer run under
ZeRO finished with exit 0 and traces that held losses and grad norms but no gradient)."""

from __future__ import annotations

import sys

ATTACH_DEEPSPEED = ("attach to the engine (gradtrace.attach(engine, ...); gradtrace.attach of a Trainer or an "
                    "Accelerator does)")


def reason(params, written=None) -> str:
    """Where the gradients of ``params`` (a model's parameters, in table order) are, if not in ``.grad``:
    ZeRO-3 partitions (``ds_id``), the ZeRO-1/2 optimizer's partitions (``param_idx_in_group``, which
    stage_1_and_2.py sets on each parameter it manages), or a ``params=`` filter that left nothing
    (``written``: per parameter, whether the filter keeps it)."""
    params = list(params)
    if written is not None and params and not any(written):
        return f"params= matches none of the model's {len(params)} parameters"
    if any(hasattr(p, "ds_id") for p in params):
        return "gradients are partitioned by DeepSpeed ZeRO stage 3, never held in .grad: " + ATTACH_DEEPSPEED
    if any(hasattr(p, "param_idx_in_group") for p in params):
        return ("gradients are partitioned by DeepSpeed ZeRO stage 1/2 (its optimizer moves them out of .grad "
                "into flat partitions): " + ATTACH_DEEPSPEED)
    return ("no parameter had a .grad at the optimizer step (all frozen, or a wrapper keeps the gradients "
            "elsewhere)")


GRADIENT_PHASES = ("PRE_REDUCE", "POST_REDUCE", "FINAL")


def warn_if_none(recorded: dict, wanted, rank: int, step: int, reason) -> None:
    """The check every adapter runs at the end of its first captured optimizer step: when it wanted a
    gradient phase and ``recorded`` (phase -> frames written) holds none, one warning with ``reason()``
    (called only then)."""
    if not set(wanted) & set(GRADIENT_PHASES) or any(recorded[p] for p in GRADIENT_PHASES):
        return
    warn(rank, step, reason())


def warn(rank: int, step: int, why: str) -> None:
    """One line on stderr, written at once so that ranks' lines never interleave."""
    sys.stderr.write(f"gradtrace: WARNING: rank {rank}: optimizer step {step} ended and no gradient was recorded "
                     f"(no PRE_REDUCE, POST_REDUCE or FINAL): {why}\n")
    sys.stderr.flush()
