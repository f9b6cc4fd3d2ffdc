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
"""

from ._gtcodec import FORMAT_VERSION, TraceError
from .dtypes import bf16_to_float32, float_to_bf16, slice_values, to_torch
from .trace import TraceReader, TraceWriter, model_fingerprint, read_trace_set, sketch_positions, verify

__all__ = [
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
