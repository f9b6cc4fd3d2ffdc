"""Damaged files, made by cutting and bumping real bytes: a truncated file
gives back every complete frame and says where it was cut; a corrupt one
raises TraceError naming the file and the offset of the bad frame."""

import os

import numpy as np
import pytest

import gradtrace

FRAME_HEADER = 16


def _write(path, frames=6, index=True):
    info = {"params": [{"name": "w", "shape": [64], "dtype": "fp32"}]}
    with gradtrace.TraceWriter(path, info, write_index=index) as w:
        for step in range(frames // 2):
            w.write_step({"step": step, "loss": float(step)})
            w.write_bucket({"step": step, "phase": "FINAL",
                            "slices": [{"param_id": 0, "values": np.full(64, step, dtype=np.float32)}]})
    return [f["offset"] for f in gradtrace.TraceReader(path).frames()]


def _cut(path, size):
    with open(path, "r+b") as f:
        f.truncate(size)


def _bump(path, offset):
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([b ^ 0x01]))


@pytest.mark.parametrize("index", [True, False])
@pytest.mark.parametrize("into", ["header", "payload"])
def test_truncated_in_a_data_frame(tmp_path, index, into):
    path = tmp_path / "t.gtrace"
    offsets = _write(path, index=index)
    last = offsets[-1]
    cut = last + (FRAME_HEADER // 2 if into == "header" else FRAME_HEADER + 3)
    _cut(path, cut)

    reader = gradtrace.TraceReader(path)
    frames = list(reader.frames())  # no exception: truncation is recovered from
    assert [f["offset"] for f in frames] == offsets[:-1]
    assert reader.truncated and not reader.ok and reader.status_code == "truncated"
    assert str(path) in reader.status and f"offset {last}" in reader.status
    assert reader.stop_offset == last
    with pytest.raises(gradtrace.TraceError) as e:
        gradtrace.verify(path)
    assert e.value.code == "truncated"


def test_truncated_in_the_index_keeps_every_data_frame(tmp_path):
    path = tmp_path / "t.gtrace"
    offsets = _write(path)
    _cut(path, os.path.getsize(path) - 5)  # inside the footer
    reader = gradtrace.TraceReader(path)
    assert [f["offset"] for f in reader.frames()] == offsets
    assert reader.truncated and str(path) in reader.status


def test_truncated_inside_run_info_cannot_open(tmp_path):
    path = tmp_path / "t.gtrace"
    offsets = _write(path)
    _cut(path, offsets[0] - 1)
    with pytest.raises(gradtrace.TraceError) as e:
        gradtrace.TraceReader(path)
    assert e.value.code == "truncated" and str(path) in str(e.value)


@pytest.mark.parametrize("strict", [True, False])
def test_corrupt_payload_raises_with_path_and_offset(tmp_path, strict):
    path = tmp_path / "t.gtrace"
    offsets = _write(path, index=False)
    bad = offsets[3]
    _bump(path, bad + FRAME_HEADER + 2)  # a payload byte: the CRC no longer matches

    reader = gradtrace.TraceReader(path)
    got = []
    if strict:
        with pytest.raises(gradtrace.TraceError) as e:
            for f in reader.frames():
                got.append(f["offset"])
        message = str(e.value)
        assert e.value.code == "corruption"
    else:
        got = [f["offset"] for f in reader.frames(strict=False)]
        message = reader.status
        assert reader.status_code == "corruption"
    assert got == offsets[:3]  # every good frame before the bad one
    assert str(path) in message and f"offset {bad}" in message and "checksum" in message
    assert "\n" not in message
    assert reader.stop_offset == bad


def test_corrupt_magic(tmp_path):
    path = tmp_path / "t.gtrace"
    _write(path)
    _bump(path, 0)
    with pytest.raises(gradtrace.TraceError) as e:
        gradtrace.TraceReader(path)
    assert e.value.code == "corruption"
    assert str(e.value) == f"{path}: offset 0: bad magic: not a gradtrace file"


def test_missing_file(tmp_path):
    path = tmp_path / "absent.gtrace"
    with pytest.raises(gradtrace.TraceError) as e:
        gradtrace.TraceReader(path)
    assert e.value.code == "io_error" and str(path) in str(e.value)


def test_unwritable_path(tmp_path):
    with pytest.raises(gradtrace.TraceError) as e:
        gradtrace.TraceWriter(tmp_path / "no" / "such" / "dir.gtrace", {"params": []})
    assert e.value.code == "io_error"


def test_writer_killed_mid_run_reads_as_truncated(tmp_path):
    """A process that dies without closing its writer: every frame it wrote
    reads back, and the reader says the file was cut short."""
    import subprocess
    import sys
    import textwrap

    path = tmp_path / "rank-00000.gtrace"
    script = textwrap.dedent(f"""
        import os, sys
        sys.path[:0] = {sys.path!r}
        import gradtrace
        w = gradtrace.TraceWriter({str(path)!r}, {{"params": [{{"name": "w", "shape": [4], "dtype": "fp32"}}]}})
        for step in range(3):
            w.write_step({{"step": step}})
        os._exit(0)  # no close, no finalizers: as if killed
    """)
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)
    reader = gradtrace.TraceReader(path)
    assert [f["step"] for f in reader.frames()] == [0, 1, 2]
    assert reader.truncated and str(path) in reader.status


def test_writer_dropped_unclosed_is_closed(tmp_path):
    path = tmp_path / "t.gtrace"
    w = gradtrace.TraceWriter(path, {"params": []})
    w.write_step({"step": 5})
    del w
    reader = gradtrace.TraceReader(path)
    assert reader.has_index and [f["step"] for f in reader.frames()] == [5] and reader.ok
