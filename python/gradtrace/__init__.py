"""gradtrace: capture the gradients of distributed training, and read and write trace files.

Capture, one call for any training loop (it recognises what it is given; see :func:`attach`)::

    import gradtrace
    cap = gradtrace.attach(model, "traces/run", optimizer=opt)   # DDP, FSDP2, DTensor, a plain module,
    ...train...                                                # a DeepSpeed engine, a Trainer, ...
    cap.close()

then ``gradtrace-diff traces/reference traces/run`` reports a scale factor per parameter and its cause.

Read and write traces: the file format is implemented once, in C++ (proto/); this package reaches it
through the extension module ``gradtrace._gtcodec`` and returns plain dicts and numpy arrays::

    for reader in gradtrace.read_trace_set("traces/run"):
        for frame in reader.frames():
            ...

Importing gradtrace imports no torch: :func:`attach` and the adapters load it when used. The adapter
modules (``gradtrace.adapters.ddp_adapter``, ...) stay importable; their own ``attach`` functions and
``gradtrace.ddp_adapter``-style names are deprecated in favour of :func:`attach`. See docs/user/capture.md.
"""

import importlib

from ._gtcodec import FORMAT_VERSION, TraceError
from .codec.dtypes import bf16_to_float32, float_to_bf16, slice_values, to_torch
from .codec.trace import TraceReader, TraceWriter, model_fingerprint, read_trace_set, sketch_positions, verify

from .adapters.capture_protocol import Capture
from .guard import GuardViolation

# The adapters and their shared parts under their old top-level names (gradtrace.ddp_adapter, ...): they live in
# gradtrace.adapters. Loaded on first use; the capture modules among them say they are deprecated.
_ADAPTER_MODULES = ("ddp_adapter", "fsdp2_adapter", "manual_adapter", "hf_adapter", "deepspeed_adapter",
                    "lightning_adapter", "rank_recorder", "layout", "adapter_base", "loss_recipes")
_ADAPTER_NAMES = {"RankRecorder": "rank_recorder", "Layout": "layout"}


def __getattr__(name):
    """The adapters and their shared parts load on first use: importing gradtrace imports no torch."""
    if name in _ADAPTER_MODULES:
        return importlib.import_module(f".adapters.{name}", __name__)
    if name in _ADAPTER_NAMES:
        return getattr(importlib.import_module(f".adapters.{_ADAPTER_NAMES[name]}", __name__), name)
    raise AttributeError(f"module 'gradtrace' has no attribute {name!r}")


def __dir__():
    return sorted(__all__)


def attach(obj, out_dir, *, optimizer=None, mode: str = "full", steps=None, params=None, loss=None,
           loss_description=None, on_error: str = "warn", overwrite: bool = False, run_id=None, config=None,
           extra=None, phases=None, model=None, groups=None, layout=None, dp=None, sp=None, cp=None, tp=None, pp=None,
           ep=None, edp=None, replicate=None, cp_kind=None, gas=None, rules=None, default_group=None,
           default_kind=None, comm_dtype=None, hook=None, hook_state=None, divisor=None, names_from=None,
           full_final=None, shards=None, framework=None, mpu=None, on_violation=None, guard_every=None,
           guard_timeout=None, reference=None) -> Capture:
    """Capture this rank's training into ``out_dir/rank-NNNNN.gtrace`` and return its :class:`Capture`.

    ``obj`` is what you train with; attach recognises it and attaches the matching capture, or raises
    TypeError naming what it was given:

    - a ``DistributedDataParallel`` model, a ``fully_shard``'ed (FSDP2) model, a DTensor-parallel or plain
      ``torch.nn.Module``, or a ``torch.distributed.pipelining`` schedule, stage or list of stages;
      attach before the first backward. With ``optimizer``, FINAL (the gradients the update uses) and the
      step count follow its ``step()``; without one call ``cap.step()`` after the gradients are final;
    - a DeepSpeed engine (after ``deepspeed.initialize``, also a PipelineEngine): FINAL inside ``engine.step``;
    - an accelerate ``Accelerator`` after ``prepare`` (``model``: the model ``prepare`` returned, needed under
      DDP and with several models; ``optimizer`` the prepared one);
    - a Hugging Face ``Trainer`` or a Lightning ``Trainer`` before ``train()``/``fit()``: a callback is added
      that captures from the start of training to its end;
    - a module returned by Lightning's ``fabric.setup`` (``optimizer`` the one it returned).

    Options every capture takes: ``mode`` ("full", "stats" or "sketch:K": what each gradient record
    holds; "guard": no trace, every step checked in the training process, see below; "stats+guard" and the
    like: both), ``loss`` (the loss recipe's name, e.g. "local-mean", "local-mean-div-sp", "token-weighted";
    ``gradtrace.adapters.loss_recipes.known()`` lists them: the report judges causes against it),
    ``loss_description`` (in words), ``on_error`` ("warn": a write error disables capture on that rank
    with one warning and training goes on; "raise": TraceError), ``overwrite`` (replace a finished trace),
    ``run_id`` (default: drawn by rank 0), ``config`` and ``extra`` (more recorded fields), ``phases``
    (which of "PRE_REDUCE", "POST_REDUCE", "FINAL" to record). PyTorch captures also take ``steps``
    (None: all; N: the first N optimizer steps; or a list) and ``params`` (a regex of parameter names to
    record); a DeepSpeed engine records every step and parameter.

    Layout (PyTorch models; DeepSpeed takes it from the engine): ``groups`` (name -> ProcessGroup or global
    ranks), the degrees ``dp``, ``sp``, ``cp``, ``tp``, ``pp``, ``ep``, ``edp``, ``replicate``, ``cp_kind``,
    ``gas`` (micro-batches per optimizer step), ``rules`` ([(name regex, {"kind", "grad_group",
    "partition_dim", "shard_count"})]), ``default_group``, ``default_kind``, or a whole ``layout`` (a gradtrace.Layout);
    ``comm_dtype`` (the dtype gradients are communicated in).

    Per framework: DDP ``hook``, ``hook_state`` (your comm hook, run inside the recording one), ``divisor``
    (what your hook divides by), ``names_from`` (the module whose parameter names the trace uses); FSDP2
    ``full_final`` (FINAL as full gradients, not shards); a plain module ``shards`` ({param or name: (dim,
    start, full_size)} for hand-written tensor-parallel shards) and ``framework`` (the name recorded);
    DeepSpeed ``mpu`` (default: the engine's). An option the capture cannot honour is a ValueError, raised
    before anything is hooked.

    The live guard (``mode="guard"``, gradtrace.guard): each optimizer step, each recorded reduction's
    divisor against what the layout predicts, the replicas of FINAL, the reported grad norm, non-finite
    values and a rank that skipped the step are judged as ``gradtrace-diff --self`` judges a trace; a
    violation is a line on stderr and an event in ``out_dir/rank-NNNNN.guard.jsonl``. ``on_violation``:
    "warn" (default), "raise" (GuardViolation out of the optimizer step that violated) or a callable
    ``f(step, violations)``; ``guard_every`` (check every k-th step after the first 4; default 1);
    ``guard_timeout`` (seconds the guard's exchange waits for a rank, default 60); ``reference`` (a trusted
    run's trace directory, "stats" mode suffices: each step it recorded is compared with this run's FINAL with
    the diff's tolerance and words).
    """
    given = {k: v for k, v in locals().items() if k not in ("obj", "out_dir") and v is not None}
    from .adapters import front_door

    return front_door.attach(obj, out_dir, given)


__all__ = [
    "Capture",
    "Layout",
    "RankRecorder",
    "FORMAT_VERSION",
    "GuardViolation",
    "TraceError",
    "TraceReader",
    "TraceWriter",
    "attach",
    "bf16_to_float32",
    "float_to_bf16",
    "model_fingerprint",
    "read_trace_set",
    "sketch_positions",
    "slice_values",
    "to_torch",
    "verify",
]
