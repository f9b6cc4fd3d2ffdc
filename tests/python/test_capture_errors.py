"""Issue 20 items 6 and 7: capture never takes training down, and re-capture is a choice.

Real processes, real gloo (tests/python/capture_error_run.py: 2 DDP ranks, gradtrace.ddp_adapter): with
the trace directory on a small filesystem that fills up mid-run (tiny_fs.py: a private tmpfs, or
RLIMIT_FSIZE where no mount namespace is allowed), the default ``on_error="warn"`` warns once per rank,
the run exits 0 with the very parameters of the same run on a big disk, and the traces read as
truncated up to the last complete frame; ``on_error="raise"`` fails the run with the TraceError.
A directory holding a finished run is refused without ``overwrite=True`` (one line naming the file and
the option) and replaced with it; a trace still being written is refused even with it.
"""

import json
import os
import re
import socket
import subprocess
import sys

import numpy as np
import pytest
import torch

import gradtrace
import tiny_fs
from conftest import ROOT, _binary, deepspeed_env
from write_error_in_process import tiny_model

SCRIPT = ROOT / "tests" / "python" / "capture_error_run.py"
# Each rank writes 754 bytes of header and RunInfo, then about 30 KB per step (PRE, POST, FINAL of 2632
# fp32 values that barely compress; measured): 128 KiB for both ranks (64 KiB per file under RLIMIT_FSIZE)
# holds steps 0 and 1 and fills up at step 2 of 6 (both ranks' files end at about 60 KB).
SMALL = 128 * 1024
STEPS = 6


def _run(out, params, *args, small=None, keep=None, timeout=240):
    argv = [sys.executable, str(SCRIPT), str(out), str(params), "--steps", str(STEPS), *args]
    if small is None:
        return subprocess.run(argv, env=deepspeed_env(), capture_output=True, text=True, timeout=timeout), None
    return tiny_fs.run_on_small_fs(argv, small, SMALL, keep, env=deepspeed_env(), timeout=timeout)


def _params(prefix, rank):
    return torch.load(f"{prefix}.rank{rank}")


def _same_params(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _inspect_verify(path):
    return subprocess.run([str(_binary("gradtrace-inspect")), "--verify", str(path)], capture_output=True, text=True,
                          timeout=60)


WRITE_ERROR = re.compile(r"(write|flush) failed: (No space left on device|File too large)")


def test_full_disk_warns_once_per_rank_and_training_goes_on(tmp_path):
    big, _ = _run(tmp_path / "big", tmp_path / "p-big")
    assert big.returncode == 0, big.stderr[-3000:]
    none, _ = _run(tmp_path / "none", tmp_path / "p-none", "--no-capture")
    assert none.returncode == 0, none.stderr[-3000:]

    p, method = _run(tmp_path / "mnt" / "run", tmp_path / "p-small", small=tmp_path / "mnt", keep=tmp_path / "kept")
    print(f"small filesystem: {method} ({SMALL} bytes{' for both ranks' if method == 'tmpfs' else ', half per file'})")
    warnings = [line for line in p.stderr.splitlines() if "capture disabled" in line]
    print("\n".join(warnings))
    assert p.returncode == 0, p.stderr[-3000:]
    assert "capture_error_run: rank exit codes [0, 0]" in p.stderr
    for r in (0, 1):
        mine = [w for w in warnings if w.startswith(f"gradtrace: WARNING: rank {r}: capture disabled after a write "
                                                    "error: ")]
        assert len(mine) == 1, warnings
        assert f"rank-0000{r}.gtrace" in mine[0] and WRITE_ERROR.search(mine[0]), mine[0]
        assert "training continues without capture" in mine[0]
    assert len(warnings) == 2, warnings
    assert "Traceback" not in p.stderr, p.stderr[-3000:]

    # Training really went on: every rank ends with the parameters of the run whose capture never failed
    # (and of the run without capture: the adapter's hook reduces as DDP's own does).
    for r in (0, 1):
        assert _same_params(_params(tmp_path / "p-small", r), _params(tmp_path / "p-big", 0))
        assert _same_params(_params(tmp_path / "p-none", r), _params(tmp_path / "p-big", 0))

    for r in (0, 1):
        path = tmp_path / "kept" / "run" / f"rank-0000{r}.gtrace"
        full = list(gradtrace.TraceReader(tmp_path / "big" / f"rank-0000{r}.gtrace").frames())
        v = _inspect_verify(path)
        print(f"gradtrace-inspect --verify rank {r}: exit {v.returncode}: {v.stderr.strip()}")
        assert v.returncode == 2, v.stdout + v.stderr
        assert v.stderr.strip() == (f"gradtrace-inspect: {path}: offset {os.path.getsize(path)}: file ends without "
                                    "index and footer: the writer did not finish (a crash, a write error such as a "
                                    "full disk, or a cut)")
        # Read in Python up to the cut: every frame written before the write error, equal to the big disk's.
        reader = gradtrace.TraceReader(path)
        frames = list(reader.frames())
        assert reader.truncated and reader.stop_offset == os.path.getsize(path)
        assert 3 <= len(frames) < len(full), (len(frames), len(full))
        assert [f for f in frames if f.get("phase") == "FINAL" and f["step"] == 0], "step 0 did not fit"
        for got, want in zip(frames, full):  # (offsets differ: RunInfo holds the output path and the time)
            assert (got["type"], got.get("step"), got.get("micro_step"), got.get("phase")) == \
                   (want["type"], want.get("step"), want.get("micro_step"), want.get("phase"))
            for a, b in zip(got.get("slices", []), want.get("slices", [])):
                assert np.array_equal(a["values"], b["values"])
        with pytest.raises(gradtrace.TraceError) as e:
            gradtrace.verify(path)
        assert e.value.code == "truncated"


def test_one_ranks_full_disk_does_not_stall_the_other(tmp_path):
    """Rank 0 writes to the small filesystem, rank 1 to a big disk: rank 0 stops capturing, rank 1 captures
    every step, and neither waits on the other (nothing collective depends on a rank's capture)."""
    big, _ = _run(tmp_path / "big", tmp_path / "p-big")
    assert big.returncode == 0, big.stderr[-3000:]
    p, method = _run(tmp_path / "mnt" / "run", tmp_path / "p-small", "--rank1-out", tmp_path / "rank1",
                     small=tmp_path / "mnt", keep=tmp_path / "kept", timeout=120)
    warnings = [line for line in p.stderr.splitlines() if "capture disabled" in line]
    print(f"small filesystem for rank 0 only: {method}; exit {p.returncode}; {warnings}")
    assert p.returncode == 0, p.stderr[-3000:]
    assert len(warnings) == 1 and warnings[0].startswith("gradtrace: WARNING: rank 0: "), warnings
    for r in (0, 1):
        assert _same_params(_params(tmp_path / "p-small", r), _params(tmp_path / "p-big", 0))
    gradtrace.verify(tmp_path / "rank1" / "rank-00001.gtrace")
    got = list(gradtrace.TraceReader(tmp_path / "rank1" / "rank-00001.gtrace").frames())
    want = list(gradtrace.TraceReader(tmp_path / "big" / "rank-00001.gtrace").frames())
    assert [(f["type"], f.get("step"), f.get("phase")) for f in got] == \
           [(f["type"], f.get("step"), f.get("phase")) for f in want]
    assert {f["step"] for f in got if f.get("phase") == "FINAL"} == set(range(STEPS))
    assert gradtrace.TraceReader(tmp_path / "kept" / "run" / "rank-00000.gtrace").run_info["rank"] == 0


def test_full_disk_with_on_error_raise_fails_the_run(tmp_path):
    p, method = _run(tmp_path / "mnt" / "run", tmp_path / "p", "--on-error", "raise", small=tmp_path / "mnt",
                     keep=tmp_path / "kept")
    print(f"small filesystem: {method}; exit {p.returncode}; "
          f"{[line for line in p.stderr.splitlines() if 'TraceError' in line][:2]}")
    assert p.returncode != 0
    assert re.search(r"gradtrace\.TraceError: .*rank-0000[01]\.gtrace: offset \d+: " + WRITE_ERROR.pattern, p.stderr), \
        p.stderr[-3000:]
    assert "capture disabled" not in p.stderr


def test_recapture_into_a_finished_directory_needs_overwrite(tmp_path):
    out = tmp_path / "run"
    p, _ = _run(out, tmp_path / "p1", "--run-id", "first")
    assert p.returncode == 0, p.stderr[-3000:]

    p, _ = _run(out, tmp_path / "p2", "--run-id", "second")
    print(p.stderr[-1500:])
    assert p.returncode != 0
    for r in (0, 1):
        path = out / f"rank-0000{r}.gtrace"
        lines = [line for line in p.stderr.splitlines() if str(path) in line]
        assert lines == [f"gradtrace.TraceError: {path}: exists (run 'first' of gradtrace adapter on "
                         f"{socket.gethostname()}): not replaced without overwrite (gradtrace-train --overwrite, "
                         "overwrite=True in Python); or write to a new directory"], lines
        assert gradtrace.TraceReader(path).run_info["run_id"] == "first"
        gradtrace.verify(path)  # the refused run left the finished trace as it was

    p, _ = _run(out, tmp_path / "p3", "--run-id", "second", "--overwrite")
    assert p.returncode == 0, p.stderr[-3000:]
    for r in (0, 1):
        gradtrace.verify(out / f"rank-0000{r}.gtrace")
        assert gradtrace.TraceReader(out / f"rank-0000{r}.gtrace").run_info["run_id"] == "second"


def test_a_live_trace_is_refused_even_with_overwrite_and_whatever_on_error(tmp_path):
    model = tiny_model()
    live = gradtrace.attach(model, tmp_path, run_id="live")
    try:
        for on_error in ("warn", "raise"):
            for overwrite in (False, True):
                with pytest.raises(gradtrace.TraceError) as e:
                    gradtrace.attach(tiny_model(), tmp_path, run_id="other", on_error=on_error,
                                     overwrite=overwrite)
                assert str(e.value).startswith(f"{tmp_path / 'rank-00000.gtrace'}: exists: another run is writing "
                                               "here now (run 'live'")
    finally:
        live.close()
    with pytest.raises(ValueError, match="on_error='ignore'"):
        gradtrace.attach(tiny_model(), tmp_path / "x", on_error="ignore")


IN_PROCESS = ROOT / "tests" / "python" / "write_error_in_process.py"


def _in_process(mode, out):
    """Runs write_error_in_process.py (RLIMIT_FSIZE is set there, never in pytest's own process)."""
    p = subprocess.run([sys.executable, str(IN_PROCESS), mode, str(out)], env=deepspeed_env(), capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.splitlines()[-1]), p.stderr


def test_in_process_write_error_warns_once_close_and_finalizer_do_not_raise(tmp_path):
    result, err = _in_process("warn", tmp_path)
    assert "File too large" in result["disabled"]
    path = tmp_path / "a" / "rank-00000.gtrace"
    reader = gradtrace.TraceReader(path)
    frames = list(reader.frames())
    assert reader.truncated and reader.stop_offset == os.path.getsize(path)
    assert len([f for f in frames if f["type"] == "bucket"]) == result["final"] >= 2

    # Never closed, and its index does not fit: the finalizer closes it, silently; the file ends at its
    # last complete frame.
    b = tmp_path / "b" / "rank-00000.gtrace"
    reader = gradtrace.TraceReader(b)
    assert len([f for f in reader.frames() if f["type"] == "bucket"]) == 2
    assert reader.truncated and reader.stop_offset == result["b_size"] == os.path.getsize(b)

    warnings = [line for line in err.splitlines() if "capture disabled" in line]
    assert len(warnings) == 1 and warnings[0].startswith(
        f"gradtrace: WARNING: rank 0: capture disabled after a write error: {path}: offset "), err
    assert "File too large; training continues without capture" in warnings[0], err
    assert "Exception ignored" not in err and "Traceback" not in err, err


def test_in_process_write_error_with_on_error_raise(tmp_path):
    result, _ = _in_process("raise", tmp_path)
    assert re.search("(write|flush) failed: File too large", result["train_error"]), result
    assert "close_error" in result, result
