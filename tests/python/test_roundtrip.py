"""Python writes, Python reads: every dtype in every capture mode comes back
exactly (full: byte for byte; sketch: the exact widening at the positions the
codec draws; stats: what numpy computes)."""

import math

import numpy as np
import pytest

import gradtrace

N = 1000  # elements per parameter; written in two slices, [0, 400) and [400, 1000)
DTYPES = ["fp32", "fp16", "fp64", "bf16"]
MODES = ["full", "sketch:37", "stats"]


def _values(dtype: str, seed: int) -> np.ndarray:
    """Random values with the awkward cases mixed in, as stored (bf16 as bits)."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(N) * 10.0 ** rng.integers(-6, 4, N)).astype(np.float32)
    x[:6] = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-40]  # 1e-40: an fp32 subnormal
    if dtype == "bf16":
        return gradtrace.float_to_bf16(x)
    return x.astype({"fp32": np.float32, "fp16": np.float16, "fp64": np.float64}[dtype])


def _as_float64(dtype: str, stored: np.ndarray) -> np.ndarray:
    return gradtrace.bf16_to_float32(stored).astype(np.float64) if dtype == "bf16" else stored.astype(np.float64)


def _run_info(dtype: str) -> dict:
    return {"producer": "pytest", "run_id": "roundtrip", "rank": 0,
            "config": {"world": 1, "dtype": dtype, "extra": {"nested": {"a": 1}}},
            "params": [{"name": f"p.{mode}", "shape": [10, 100], "dtype": dtype} for mode in MODES]}


def _write(path, dtype: str) -> dict:
    written = {}
    with gradtrace.TraceWriter(path, _run_info(dtype)) as w:
        w.write_step({"step": 0, "micro_step": 1, "loss": 2.75, "valid_tokens": 4096, "lr": 3e-4})
        slices = []
        for pid, mode in enumerate(MODES):
            values = _values(dtype, seed=pid)
            written[pid] = values
            for lo, hi in [(0, 400), (400, N)]:
                slices.append({"param_id": pid, "offset": lo, "values": values[lo:hi], "mode": mode,
                               "dtype": dtype})
        w.write_bucket({"step": 0, "micro_step": 1, "bucket_id": 7, "phase": "post_reduce", "group": "sdp",
                        "bucket_numel": 3 * N, "partition_offset": 0, "partition_count": 3 * N, "divisor": 4.0,
                        "slices": slices})
    return written


@pytest.mark.parametrize("dtype", DTYPES)
def test_round_trip_every_mode(tmp_path, dtype):
    path = tmp_path / "rank-00000.gtrace"
    written = _write(path, dtype)
    reader = gradtrace.TraceReader(path)
    assert reader.run_info["params"][0]["dtype"] == dtype.upper()
    assert reader.run_info["params"][0]["numel"] == N
    assert reader.run_info["config"]["extra"] == {"nested": '{"a": 1}'}
    assert reader.has_index

    frames = list(reader.frames())
    assert reader.ok and not reader.truncated and reader.status == ""
    assert [f["type"] for f in frames] == ["step", "bucket"]
    step, bucket = frames
    assert (step["step"], step["micro_step"], step["loss"], step["valid_tokens"], step["lr"]) == (0, 1, 2.75, 4096,
                                                                                                  3e-4)
    assert (bucket["bucket_id"], bucket["phase"], bucket["group"], bucket["divisor"]) == (7, "POST_REDUCE", "sdp", 4.0)
    assert (bucket["bucket_numel"], bucket["partition_count"], bucket["chunk_count"]) == (3 * N, 3 * N, 0)

    slices = bucket["slices"]
    assert [(s["param_id"], s["offset"], s["count"], s["mode"]) for s in slices] == [
        (pid, lo, hi - lo, mode.split(":")[0]) for pid, mode in enumerate(MODES) for lo, hi in [(0, 400), (400, N)]]
    assert all(s["dtype"] == dtype.upper() for s in slices)

    # full: byte-exact, NaN, -0.0 and subnormals included.
    full = [s for s in slices if s["mode"] == "full"]
    got = np.concatenate([s["values"] for s in full])
    assert got.dtype == written[0].dtype
    assert got.tobytes() == written[0].tobytes()

    # sketch: the positions sketch_positions draws, split between the slices,
    # and the exact widening of the stored values there.
    sk = [s for s in slices if s["mode"] == "sketch"]
    expected_pos = gradtrace.sketch_positions("p.sketch:37", N, 37)
    assert len(expected_pos) == 37
    assert np.array_equal(np.concatenate([s["positions"] for s in sk]), expected_pos)
    assert all(s["k"] == 37 for s in sk)
    for s in sk:
        assert s["positions"].dtype == np.int64 and s["values"].dtype == np.float64
        assert np.all((s["positions"] >= s["offset"]) & (s["positions"] < s["offset"] + s["count"]))
    widened = _as_float64(dtype, written[1])[expected_pos]
    got = np.concatenate([s["values"] for s in sk])
    assert got.tobytes() == widened.tobytes()

    # stats: finite elements only; non-finite ones counted.
    for s in (s for s in slices if s["mode"] == "stats"):
        x = _as_float64(dtype, written[2][s["offset"]:s["offset"] + s["count"]])
        finite = x[np.isfinite(x)]
        st = s["stats"]
        assert st["count"] == finite.size and st["nonfinite"] == x.size - finite.size
        assert st["abs_max"] == np.abs(finite).max()
        assert math.isclose(st["sum"], math.fsum(finite), rel_tol=1e-12, abs_tol=1e-300)
        assert math.isclose(st["sum_sq"], math.fsum(finite * finite), rel_tol=1e-12)


def test_iterations_are_independent(tmp_path):
    path = tmp_path / "t.gtrace"
    _write(path, "fp32")
    reader = gradtrace.TraceReader(path)
    first = reader.frames()
    a = next(first)
    b = list(reader.frames())  # a second pass from the start while the first is open
    assert a["type"] == "step" and [f["type"] for f in b] == ["step", "bucket"]
    assert [f["type"] for f in first] == ["bucket"]
    assert [f["offset"] for f in reader] == [f["offset"] for f in b]


def test_index_and_frame_at(tmp_path):
    path = tmp_path / "t.gtrace"
    _write(path, "fp16")
    reader = gradtrace.TraceReader(path)
    frames = list(reader.frames())
    index = reader.index()
    assert [(e["offset"], e["type"]) for e in index] == [(f["offset"], f["type"]) for f in frames]
    again = reader.frame_at(index[1]["offset"])
    assert again["slices"][0]["values"].tobytes() == frames[1]["slices"][0]["values"].tobytes()
    with pytest.raises(ValueError):
        reader.frame_at(3)  # inside the file header


def test_file_without_index_is_scanned(tmp_path):
    path = tmp_path / "t.gtrace"
    with gradtrace.TraceWriter(path, _run_info("fp32"), write_index=False) as w:
        w.write_step({"step": 3})
    reader = gradtrace.TraceReader(path)
    assert not reader.has_index and reader.index() == []
    assert [f["step"] for f in reader.frames()] == [3]
    assert reader.ok
    gradtrace.verify(path)


def test_writer_default_mode(tmp_path):
    path = tmp_path / "t.gtrace"
    values = np.linspace(-1, 1, N, dtype=np.float32)
    with gradtrace.TraceWriter(path, _run_info("fp32"), mode="sketch:3") as w:
        w.write_bucket({"phase": "FINAL", "slices": [{"param_id": 0, "values": values},
                                                     {"param_id": 1, "values": values, "mode": "stats"}]})
    (bucket,) = gradtrace.TraceReader(path).frames()
    assert [s["mode"] for s in bucket["slices"]] == ["sketch", "stats"]
    assert bucket["slices"][0]["values"].tolist() == values[gradtrace.sketch_positions("p.full", N, 3)].tolist()


def test_dtype_conversion_on_write(tmp_path):
    """A `dtype` other than the array's converts, rounding to nearest even."""
    path = tmp_path / "t.gtrace"
    x = np.array([1.0, 1.00390625, 1.01171875, 3.4e38, -2.5], dtype=np.float64)  # two ties, an overflow
    info = {"params": [{"name": "a", "shape": [5], "dtype": "bf16"}, {"name": "b", "shape": [5], "dtype": "fp16"}]}
    with gradtrace.TraceWriter(path, info) as w, np.errstate(over="ignore"):
        w.write_bucket({"phase": "FINAL", "slices": [{"param_id": 0, "values": x, "dtype": "bf16"},
                                                     {"param_id": 1, "values": x, "dtype": "float16"}]})
    (bucket,) = gradtrace.TraceReader(path).frames()
    a, b = bucket["slices"]
    assert a["values"].dtype == np.uint16
    assert gradtrace.slice_values(a).tolist() == [1.0, 1.0, 1.015625, np.inf, -2.5]
    with np.errstate(over="ignore"):
        assert b["values"].tobytes() == x.astype(np.float16).tobytes()


def test_large_record_is_chunked_and_merged(tmp_path):
    """A record above the codec's chunk target (4 MiB raw) is split across
    frames; frames() joins it back unless asked not to."""
    path = tmp_path / "big.gtrace"
    n = 13_000_000  # 52 MB of fp32
    values = np.arange(n, dtype=np.float32)
    info = {"params": [{"name": "big", "shape": [n], "dtype": "fp32"}]}
    with gradtrace.TraceWriter(path, info, zstd_level=1) as w:
        w.write_bucket({"step": 1, "phase": "PRE_REDUCE", "slices": [{"param_id": 0, "values": values}]})
    reader = gradtrace.TraceReader(path)
    (merged,) = reader.frames()
    assert [(s["offset"], s["count"]) for s in merged["slices"]] == [(0, n)]
    assert merged["slices"][0]["values"].tobytes() == values.tobytes()
    chunks = list(reader.frames(merge_chunks=False))
    assert len(chunks) >= 2 and [c["chunk"] for c in chunks] == list(range(len(chunks)))
    assert all(c["chunk_count"] == len(chunks) for c in chunks)
    assert sum(s["count"] for c in chunks for s in c["slices"]) == n
