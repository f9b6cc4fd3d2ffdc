"""Element types at the Python boundary: numpy dtypes, bf16 bits, torch tensors.

numpy has no bfloat16, so bf16 values travel as their raw bits in an
``np.uint16`` array. :func:`bf16_to_float32` widens them exactly;
:func:`float_to_bf16` rounds to nearest even, like the C++ codec and torch.
torch is imported only when a tensor is handed in or asked for.
"""

from __future__ import annotations

import numpy as np

from .. import _gtcodec

# The one dtype table (proto/dtype.h, through _gtcodec): canonical name (the proto enum name) -> numpy
# dtype of a values array ("BF16": its raw bits, numpy having no bfloat16).
NUMPY_DTYPES = {row["name"]: np.dtype(row["numpy"]) for row in _gtcodec.dtypes()}
_FROM_NUMPY = {dt: name for name, dt in NUMPY_DTYPES.items() if dt.kind == "f"}


def dtype_name(dtype) -> str:
    """Canonical codec dtype name ("FP32", "FP16", "BF16", "FP64") for a name
    in any spelling the C++ table accepts ("fp32", "float32", "bfloat16", "half",
    any case) or a numpy floating dtype. Raises ValueError otherwise."""
    if isinstance(dtype, str):
        return _gtcodec.dtype_name(dtype)
    try:
        return _FROM_NUMPY[np.dtype(dtype)]
    except (KeyError, TypeError):
        raise ValueError(f"unsupported dtype {dtype!r}: expected float32, float16, float64 (or bf16 bits)") from None


def bf16_to_float32(bits) -> np.ndarray:
    """Exact widening of bf16 bit patterns (uint16) to float32."""
    bits = np.asarray(bits, dtype=np.uint16)
    return (bits.astype(np.uint32) << 16).view(np.float32)


def float_to_bf16(values) -> np.ndarray:
    """bf16 bit patterns (uint16) of float values, rounded to nearest even.

    float64 input is rounded to float32 first, as torch does for
    ``tensor.to(torch.bfloat16)`` from float64 (double rounding is possible
    there); use float32 input for the exact single rounding. NaNs stay NaN
    (quiet, sign kept); overflow goes to infinity."""
    f = np.ascontiguousarray(values, dtype=np.float32)
    u = f.view(np.uint32)
    rounded = ((u + np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1))) >> 16).astype(np.uint16)
    nan = np.isnan(f)
    if nan.any():
        rounded[nan] = ((u[nan] >> 16) | np.uint32(0x0040)).astype(np.uint16)
    return rounded


def is_tensor(x) -> bool:
    """True for a torch.Tensor, without importing torch."""
    return type(x).__module__.startswith("torch") and hasattr(x, "detach") and hasattr(x, "dtype")


def tensor_to_numpy(t):
    """(numpy array, codec dtype name or None) of a torch tensor's values,
    flattened. bf16 tensors come back as their uint16 bits with "BF16"."""
    import torch  # only reached when the caller already has torch

    t = t.detach().cpu().contiguous().reshape(-1)
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16), "BF16"
    return np.asarray(t), None


def slice_values(slice_dict: dict, dtype=None) -> np.ndarray:
    """The values of a full or sketch slice dict as numbers: bf16 bits are
    widened to float32; with ``dtype`` given, cast to it (e.g. np.float64)."""
    values = slice_dict["values"]
    if slice_dict.get("dtype") == "BF16" and slice_dict.get("mode") == "full":
        values = bf16_to_float32(values)
    return values if dtype is None else values.astype(dtype)


def to_torch(slice_dict: dict):
    """A full slice's values as a torch tensor of the slice's dtype (bf16
    included); a sketch slice's values as float64. Shares memory with the
    numpy array where torch allows."""
    import torch

    values = slice_dict["values"]
    if slice_dict.get("dtype") == "BF16" and slice_dict.get("mode") == "full":
        return torch.from_numpy(values.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(values)


def torch_dtype_name(dtype) -> str:
    """Codec dtype name of a torch dtype (float32 -> "FP32", bfloat16 -> "BF16", by the C++ table's
    aliases); other dtypes (integer buffers, fp8) are recorded as "FP32", the dtype their values are
    stored in."""
    try:
        return _gtcodec.dtype_name(str(dtype).rsplit(".", 1)[-1])
    except ValueError:
        return "FP32"
