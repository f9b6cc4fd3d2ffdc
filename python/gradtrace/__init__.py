"""gradtrace: read and write per-rank gradient traces from Python.

The file format is implemented once, in C++ (proto/); this package reaches it
through the extension module ``gradtrace._gtcodec`` and returns plain dicts
and numpy arrays. See python/README.md.

    import gradtrace
    for reader in gradtrace.read_trace_set("traces/run-a"):
        for frame in reader.frames():
            ...

    with gradtrace.TraceWriter("rank-00000.gtrace", run_info) as w:
        w.write_step({"step": 0, "loss": 2.3, "valid_tokens": 512})
        w.write_bucket({"step": 0, "phase": "FINAL",
                        "slices": [{"param_id": 0, "values": grad, "mode": "sketch:64"}]})

Capturing live training (each imports torch only when used):
``gradtrace.ddp_adapter.attach``, ``gradtrace.fsdp2_adapter.attach``,
``gradtrace.manual_adapter.attach``, ``gradtrace.hf_adapter.GradtraceCallback``,
``gradtrace.deepspeed_adapter.attach``, ``gradtrace.lightning_adapter.GradtraceCallback`` and
``gradtrace.lightning_adapter.attach_fabric``; the shared writer ``gradtrace.RankRecorder`` and
``gradtrace.Layout``.

Subpackages: ``gradtrace.codec`` (the codec wrapper above), ``gradtrace.adapters`` (the adapters, which
the names above load), ``gradtrace.versions`` (the ``gradtrace-versions`` command: which release of a
package changed the gradients) and ``gradtrace.deepspeed_versions`` (DeepSpeed's part of it, the
``gradtrace-deepspeed-versions`` alias, and the DeepSpeed studies it runs).
"""

import importlib

from ._gtcodec import FORMAT_VERSION, TraceError
from .codec.dtypes import bf16_to_float32, float_to_bf16, slice_values, to_torch
from .codec.trace import TraceReader, TraceWriter, model_fingerprint, read_trace_set, sketch_positions, verify

# The adapters and their shared parts, by the names they are documented under: they live in gradtrace.adapters.
_ADAPTER_MODULES = ("ddp_adapter", "fsdp2_adapter", "manual_adapter", "hf_adapter", "deepspeed_adapter", "lightning_adapter",
                    "rank_recorder", "layout", "adapter_base", "loss_recipes")
_ADAPTER_NAMES = {"RankRecorder": "rank_recorder", "Layout": "layout"}


def __getattr__(name):
    """The adapters and their shared parts load on first use: importing gradtrace imports no torch."""
    if name in _ADAPTER_MODULES:
        return importlib.import_module(f".adapters.{name}", __name__)
    if name in _ADAPTER_NAMES:
        return getattr(importlib.import_module(f".adapters.{_ADAPTER_NAMES[name]}", __name__), name)
    raise AttributeError(f"module 'gradtrace' has no attribute {name!r}")


__all__ = [
    "Layout",
    "RankRecorder",
    "FORMAT_VERSION",
    "TraceError",
    "TraceReader",
    "TraceWriter",
    "bf16_to_float32",
    "float_to_bf16",
    "model_fingerprint",
    "read_trace_set",
    "sketch_positions",
    "slice_values",
    "to_torch",
    "verify",
]
