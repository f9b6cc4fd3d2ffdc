"""The package's smaller entry points: trace sets, sketch positions, the model
fingerprint, argument checking, torch tensors."""

import os
import signal

import numpy as np
import pytest

import gradtrace

INFO = {"params": [{"name": "a.weight", "shape": [3, 5], "dtype": "fp32"},
                   {"name": "a.bias", "shape": [5], "dtype": "fp32"}]}


def _trace(path, rank, info=INFO):
    with gradtrace.TraceWriter(path, dict(info, rank=rank)) as w:
        w.write_step({"step": 0, "loss": float(rank)})


def test_read_trace_set_orders_by_rank(tmp_path):
    for rank in (2, 0, 10, 1):
        _trace(tmp_path / f"rank-{rank:05d}.gtrace", rank)
    (tmp_path / "notes.txt").write_text("not a trace")
    readers = gradtrace.read_trace_set(tmp_path)
    assert [r.rank for r in readers] == [0, 1, 2, 10]
    assert [next(r.frames())["loss"] for r in readers] == [0.0, 1.0, 2.0, 10.0]


def test_read_trace_set_errors(tmp_path):
    with pytest.raises(gradtrace.TraceError, match="no rank-NNNNN.gtrace"):
        gradtrace.read_trace_set(tmp_path)
    _trace(tmp_path / "rank-00001.gtrace", 0)
    with pytest.raises(gradtrace.TraceError, match="file name says rank 1, RunInfo says rank 0"):
        gradtrace.read_trace_set(tmp_path)
    with pytest.raises(gradtrace.TraceError):
        gradtrace.read_trace_set(tmp_path / "absent")


def test_read_trace_set_refuses_a_fifo_without_blocking(tmp_path):
    """Issue 20: a FIFO named rank-00001.gtrace blocked read_trace_set in open() until some process opened it
    for writing: forever."""
    _trace(tmp_path / "rank-00000.gtrace", 0)
    fifo = tmp_path / "rank-00001.gtrace"
    os.mkfifo(fifo)
    signal.alarm(20)  # a regression ends the run (SIGALRM) instead of hanging it
    try:
        with pytest.raises(gradtrace.TraceError) as e:
            gradtrace.read_trace_set(tmp_path)
    finally:
        signal.alarm(0)
    assert e.value.code == "io_error" and str(e.value) == f"{fifo}: not a regular file (a FIFO)"


def test_a_second_writer_of_a_file_is_refused(tmp_path):
    """Issue 20: two runs writing one trace file both succeeded, and their interleaved frames read as checksum
    mismatches with nothing pointing at the cause. A file is replaced only on purpose, and never while written."""
    path = tmp_path / "rank-00000.gtrace"
    first = gradtrace.TraceWriter(path, dict(INFO, run_id="first"))
    second = dict(INFO, run_id="second")
    for overwrite in (False, True):
        with pytest.raises(gradtrace.TraceError) as e:
            gradtrace.TraceWriter(path, second, overwrite=overwrite)
        assert e.value.code == "io_error"
        assert str(e.value) == f"{path}: exists: another run is writing here now (run 'first')"
    first.close()
    with pytest.raises(gradtrace.TraceError) as e:
        gradtrace.TraceWriter(path, second)
    assert str(e.value) == (f"{path}: exists (run 'first'): not replaced without overwrite (gradtrace-train "
                            "--overwrite, overwrite=True in Python); or write to a new directory")
    assert gradtrace.TraceReader(path).run_info["run_id"] == "first"
    gradtrace.TraceWriter(path, second, overwrite=True).close()
    assert gradtrace.TraceReader(path).run_info["run_id"] == "second"


def test_sketch_positions_match_written_sketch(tmp_path):
    path = tmp_path / "t.gtrace"
    pos = gradtrace.sketch_positions("a.weight", 15, 4)
    assert pos.dtype == np.int64 and len(pos) == 4 and np.all(np.diff(pos) > 0) and pos.max() < 15
    assert np.array_equal(gradtrace.sketch_positions("a.weight", 15, 100), np.arange(15))  # k >= numel: all
    assert not np.array_equal(pos, gradtrace.sketch_positions("a.bias", 15, 4))  # keyed by the name
    with gradtrace.TraceWriter(path, INFO) as w:
        w.write_bucket({"phase": "FINAL", "slices": [{"param_id": 0, "values": np.arange(15, dtype=np.float32),
                                                      "mode": "sketch:4"}]})
    (b,) = gradtrace.TraceReader(path).frames()
    assert np.array_equal(b["slices"][0]["positions"], pos)
    assert np.array_equal(b["slices"][0]["values"], pos.astype(np.float64))
    with pytest.raises(ValueError):
        gradtrace.sketch_positions("x", 10, 0)


def test_model_fingerprint(tmp_path):
    fp = gradtrace.model_fingerprint(INFO)
    assert len(fp) == 16 and int(fp, 16) >= 0
    path = tmp_path / "t.gtrace"
    _trace(path, 0)
    assert gradtrace.TraceReader(path).model_fingerprint == fp
    other = {"params": [dict(INFO["params"][0], shape=[5, 3]), INFO["params"][1]]}
    assert gradtrace.model_fingerprint(other) != fp


def test_bad_arguments_are_value_errors(tmp_path):
    path = tmp_path / "t.gtrace"
    with pytest.raises(ValueError, match="invalid run_info: parms"):
        gradtrace.TraceWriter(path, {"parms": []})  # misspelt key
    with pytest.raises(ValueError, match="capture mode"):
        gradtrace.TraceWriter(path, INFO, mode="sketch:0")
    with gradtrace.TraceWriter(path, INFO) as w:
        x = np.zeros(5, dtype=np.float32)
        with pytest.raises(ValueError, match="out of range"):
            w.write_bucket({"phase": "FINAL", "slices": [{"param_id": 2, "values": x}]})
        with pytest.raises(ValueError, match="outside parameter 'a.bias'"):
            w.write_bucket({"phase": "FINAL", "slices": [{"param_id": 1, "offset": 1, "values": x}]})
        with pytest.raises(ValueError, match="phase"):
            w.write_bucket({"phase": "LATER", "slices": []})
        with pytest.raises(ValueError, match="bf16"):
            w.write_bucket({"phase": "FINAL", "slices": [{"param_id": 1, "values": x.view(np.uint16)[:5]}]})
        with pytest.raises(ValueError, match="unsupported dtype"):
            w.write_bucket({"phase": "FINAL", "slices": [{"param_id": 1, "values": np.arange(5)}]})
        with pytest.raises(ValueError, match="unknown StepInfo keys"):
            w.write_step({"stepp": 1})
        w.write_step({"step": 1})
    with pytest.raises(ValueError, match="closed"):
        w.write_step({"step": 2})
    assert [f["step"] for f in gradtrace.TraceReader(path).frames()] == [1]  # nothing half-written


def test_strided_and_multidimensional_values(tmp_path):
    path = tmp_path / "t.gtrace"
    m = np.arange(30, dtype=np.float32).reshape(5, 6)
    with gradtrace.TraceWriter(path, INFO) as w:
        w.write_bucket({"phase": "FINAL", "slices": [{"param_id": 0, "values": m[:, ::2]},  # 5x3, not contiguous
                                                     {"param_id": 1, "values": m[0, :5]}]})
    (b,) = gradtrace.TraceReader(path).frames()
    assert b["slices"][0]["values"].tolist() == m[:, ::2].reshape(-1).tolist()


def test_bf16_helpers():
    x = np.array([0.0, -0.0, 1.0, -3.140625, np.inf, np.nan, 1e-39], dtype=np.float32)
    bits = gradtrace.float_to_bf16(x)
    back = gradtrace.bf16_to_float32(bits)
    assert back[:5].tolist() == [0.0, -0.0, 1.0, -3.140625, np.inf] and np.isnan(back[5])
    assert np.signbit(back[1])
    assert back[6] == gradtrace.bf16_to_float32(gradtrace.float_to_bf16(np.float32(1e-39)))


def test_torch_tensors(tmp_path):
    torch = pytest.importorskip("torch")
    path = tmp_path / "t.gtrace"
    info = {"params": [{"name": "w", "shape": [4, 4], "dtype": "bf16"}, {"name": "v", "shape": [4], "dtype": "fp16"}]}
    w_grad = torch.linspace(-2, 2, 16, dtype=torch.float32).reshape(4, 4).to(torch.bfloat16).requires_grad_()
    v_grad = torch.tensor([1.5, -0.25, 3.0, 0.0], dtype=torch.float16)
    with gradtrace.TraceWriter(path, info) as w:
        w.write_bucket({"phase": "FINAL", "slices": [{"param_id": 0, "values": w_grad.t()},  # transposed view
                                                     {"param_id": 1, "values": v_grad}]})
    (b,) = gradtrace.TraceReader(path).frames()
    a, v = b["slices"]
    assert a["dtype"] == "BF16" and a["values"].dtype == np.uint16
    got = gradtrace.to_torch(a)
    assert got.dtype == torch.bfloat16 and torch.equal(got, w_grad.detach().t().reshape(-1))
    assert torch.equal(gradtrace.to_torch(v), v_grad)
