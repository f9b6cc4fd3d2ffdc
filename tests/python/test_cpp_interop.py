"""The Python package against the C++ programs: a trace the C++ writer made
reads back in Python with exactly the known values, and a trace Python made
passes `gradtrace-inspect --verify` and reads the same in the C++ reader."""

import subprocess

import numpy as np

import gradtrace
import known_trace as kt


def test_cpp_written_trace_has_the_known_values(tmp_path, cpp_writer):
    path = tmp_path / "rank-00000.gtrace"
    subprocess.run([str(cpp_writer), "write", str(path)], check=True, timeout=60)
    reader = gradtrace.TraceReader(path)
    run = reader.run_info
    assert [(p["name"], p["shape"], p["dtype"], p["numel"]) for p in run["params"]] == [
        (name, shape, dtype, int(np.prod(shape))) for name, shape, dtype in kt.PARAMS]
    assert run["config"]["seed"] == 12345678901234  # a 64-bit field, as an int
    assert run["config"]["reduce_bucket_size"] == 1 << 40
    assert run["model_fingerprint"] == gradtrace.model_fingerprint(run)

    frames = list(reader.frames())
    assert reader.ok and reader.has_index
    assert [(f["type"], f["step"], f.get("phase")) for f in frames] == [
        (t, s, p) for s in range(kt.STEPS)
        for t, p in [("step", None), ("bucket", "PRE_REDUCE"), ("bucket", "POST_REDUCE"), ("bucket", "FINAL")]]
    for s in range(kt.STEPS):
        step, pre, post, final = frames[4 * s:4 * s + 4]
        assert (step["loss"], step["valid_tokens"], step["lr"]) == (2.5 / (s + 1), 100 + s, 1e-3)

        assert [sl["param_id"] for sl in pre["slices"]] == [0, 1, 2, 3]
        for pid, sl in enumerate(pre["slices"]):
            expected = kt.stored(pid, kt.value(pid, np.arange(kt.numel(pid)), s))
            assert sl["mode"] == "full" and sl["dtype"] == kt.PARAMS[pid][2]
            assert sl["values"].dtype == expected.dtype and sl["values"].tobytes() == expected.tobytes()
            assert np.array_equal(gradtrace.slice_values(sl, np.float64), kt.value(pid, np.arange(kt.numel(pid)), s))

        assert (post["partition_offset"], post["partition_count"], post["bucket_numel"], post["divisor"]) == (8, 16, 32,
                                                                                                             2.0)
        (sl,) = post["slices"]
        assert (sl["offset"], sl["count"]) == (8, 16)
        assert sl["values"].tolist() == kt.value(0, np.arange(8, 24), s).tolist()

        sketches, stats = final["slices"][:4], final["slices"][4:]
        for pid, sl in enumerate(sketches):
            pos = gradtrace.sketch_positions(kt.PARAMS[pid][0], kt.numel(pid), kt.SKETCH_K)
            assert sl["mode"] == "sketch" and sl["k"] == kt.SKETCH_K
            assert np.array_equal(sl["positions"], pos)
            assert sl["values"].tolist() == kt.value(pid, pos, s).tolist()
        for pid, sl in enumerate(stats):
            x = kt.value(pid, np.arange(kt.numel(pid)), s)  # multiples of 1/8: every sum below is exact
            assert sl["stats"] == {"count": x.size, "sum": x.sum(), "sum_sq": (x * x).sum(),
                                   "abs_max": np.abs(x).max(), "nonfinite": 0}


def test_cpp_and_python_readers_agree_on_cpp_trace(tmp_path, cpp_writer):
    path = tmp_path / "k.gtrace"
    subprocess.run([str(cpp_writer), "write", str(path)], check=True, timeout=60)
    assert kt.python_dump(path) == kt.cpp_dump(cpp_writer, path)


def _python_known_trace(path):
    """The known trace again, written from Python."""
    run_info = {"producer": "gradtrace-pytest-writer", "producer_version": "1", "run_id": "pytest-known",
                "host": "localhost", "config": {"world": 1, "dp": 1, "sp": 1, "seed": 12345678901234,
                                                "capture_mode": "full", "reduce_bucket_size": 1 << 40,
                                                "extra": {"note": "known trace"}},
                "params": [{"name": n, "shape": sh, "dtype": dt} for n, sh, dt in kt.PARAMS]}
    with gradtrace.TraceWriter(path, run_info) as w:
        for s in range(kt.STEPS):
            w.write_step({"step": s, "loss": 2.5 / (s + 1), "valid_tokens": 100 + s, "lr": 1e-3})
            full = [{"param_id": p, "values": kt.stored(p, kt.value(p, np.arange(kt.numel(p)), s)),
                     "dtype": kt.PARAMS[p][2]} for p in range(len(kt.PARAMS))]
            w.write_bucket({"step": s, "bucket_id": 0, "phase": "PRE_REDUCE", "group": "sdp", "slices": full})
            w.write_bucket({"step": s, "bucket_id": 1, "phase": "POST_REDUCE", "group": "sdp", "bucket_numel": 32,
                            "partition_offset": 8, "partition_count": 16, "divisor": 2.0,
                            "slices": [{"param_id": 0, "offset": 8,
                                        "values": kt.value(0, np.arange(8, 24), s).astype(np.float32)}]})
            w.write_bucket({"step": s, "bucket_id": 2, "phase": "FINAL",
                            "slices": [dict(sl, mode=f"sketch:{kt.SKETCH_K}") for sl in full]
                            + [dict(sl, mode="stats") for sl in full]})
    return run_info


def test_python_written_trace_passes_cpp_verify(tmp_path, inspect_bin):
    path = tmp_path / "rank-00000.gtrace"
    _python_known_trace(path)
    proc = subprocess.run([str(inspect_bin), "--verify", str(path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    gradtrace.verify(path)


def test_python_written_trace_reads_the_same_in_cpp(tmp_path, cpp_writer):
    ours, theirs = tmp_path / "py.gtrace", tmp_path / "cpp.gtrace"
    _python_known_trace(ours)
    subprocess.run([str(cpp_writer), "write", str(theirs)], check=True, timeout=60)
    from_python = kt.cpp_dump(cpp_writer, ours)
    assert from_python[-1]["end"] == "ok"
    assert from_python == kt.python_dump(ours)
    # Same content as the C++ writer's file, as the C++ reader sees both.
    assert from_python[:-1] == kt.cpp_dump(cpp_writer, theirs)[:-1]
