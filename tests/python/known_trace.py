"""The known trace gradtrace-pytest-writer writes (tests/python/pytest_writer.cc
describes it; the two must change together), and a Python rendering of a
trace in that program's `dump` format, so both readers can be compared."""

import json
import struct
import subprocess

import numpy as np

import gradtrace

PARAMS = [("layer.w", [4, 8], "FP32"), ("layer.b", [16], "FP16"), ("emb", [5, 3], "BF16"), ("head.x", [7], "FP64")]
STEPS = 2
SKETCH_K = 5


def value(param: int, i, step: int) -> np.ndarray:
    """v(param, i, step) = (((7 i + 3 param + 5 step) mod 23) - 11) / 8, exact in every dtype."""
    i = np.asarray(i, dtype=np.int64)
    return (((7 * i + 3 * param + 5 * step) % 23) - 11) / 8.0


def numel(param: int) -> int:
    return int(np.prod(PARAMS[param][1]))


def stored(param: int, values: np.ndarray) -> np.ndarray:
    """`values` as the param's dtype would hold them (bf16 as bits)."""
    dtype = PARAMS[param][2]
    if dtype == "BF16":
        return gradtrace.float_to_bf16(values)
    return values.astype(gradtrace.codec.dtypes.NUMPY_DTYPES[dtype])


def _hex_f64(x) -> str:
    return struct.pack("<d", float(x)).hex()


def python_dump(path) -> list:
    """`gradtrace-pytest-writer dump PATH`'s records, produced by the Python reader."""
    reader = gradtrace.TraceReader(path)
    run = reader.run_info
    out = [{"run": {"producer": run["producer"], "model_fingerprint": run["model_fingerprint"],
                    "params": [p["name"] for p in run["params"]]}}]
    for f in reader.frames(merge_chunks=False):
        if f["type"] == "step":
            out.append({"type": "step", "step": f["step"], "micro_step": f["micro_step"], "loss": _hex_f64(f["loss"]),
                        "valid_tokens": f["valid_tokens"], "lr": _hex_f64(f["lr"])})
            continue
        rec = {k: f[k] for k in ("type", "step", "micro_step", "bucket_id", "phase", "group", "bucket_numel",
                                 "partition_offset", "partition_count", "chunk", "chunk_count")}
        rec["divisor"] = _hex_f64(f["divisor"])
        rec["slices"] = []
        for s in f["slices"]:
            d = {k: s[k] for k in ("param_id", "offset", "count", "dtype", "mode")}
            if s["mode"] == "full":
                d["data"] = s["values"].tobytes().hex()
            elif s["mode"] == "sketch":
                d["k"] = s["k"]
                d["positions"] = s["positions"].tolist()
                d["values"] = s["values"].astype("<f8").tobytes().hex()
            else:
                st = s["stats"]
                d["stats"] = {"count": st["count"], "sum": _hex_f64(st["sum"]), "sum_sq": _hex_f64(st["sum_sq"]),
                              "abs_max": _hex_f64(st["abs_max"]), "nonfinite": st["nonfinite"]}
            rec["slices"].append(d)
        out.append(rec)
    out.append({"end": reader.status_code, "message": reader.status, "stop_offset": reader.stop_offset})
    return out


def cpp_dump(cpp_writer, path) -> list:
    """The C++ reader's view of `path`."""
    proc = subprocess.run([str(cpp_writer), "dump", str(path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode in (0, 1), proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines()]
