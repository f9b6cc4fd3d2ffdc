"""The codec wrapper: trace files read and written through the one C++ codec (``gradtrace._gtcodec``).

``trace`` holds TraceReader, TraceWriter, read_trace_set and the other file-level calls; ``dtypes`` turns
slices into numbers and tensors (bf16 included). numpy only: torch is imported when a tensor is handed in
or asked for. The top-level ``gradtrace`` package re-exports the public names.
"""
