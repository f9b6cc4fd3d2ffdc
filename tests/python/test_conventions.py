"""Issue 21, one owner per convention: the rank-file name and the dtype table live in proto/, the reduction-path
rule and the loss-recipe aliases in semantics/; Python reads each through _gtcodec and agrees with the C++ tools."""

import os
import subprocess

import numpy as np
import pytest

import gradtrace
from gradtrace import _gtcodec, loss_recipes
from gradtrace.adapters.rank_recorder import rank_file
from gradtrace.codec import dtypes

from conftest import BUILD

INFO = {"params": [{"name": "w", "shape": [4], "dtype": "fp32"}]}
MISNAMED = ("not a rank file name: a trace set's files are named rank-NNNNN.gtrace (the rank zero-padded to five "
            "digits, as every writer names them)")


def _trace(path, rank):
    with gradtrace.TraceWriter(path, dict(INFO, rank=rank)) as w:
        w.write_step({"step": 0, "loss": float(rank)})


@pytest.mark.parametrize("rank, name", [(0, "rank-00000.gtrace"), (10, "rank-00010.gtrace"),
                                        (99999, "rank-99999.gtrace"), (100000, "rank-100000.gtrace")])
def test_rank_file_names_round_trip(tmp_path, rank, name):
    assert os.path.basename(rank_file(tmp_path, rank)) == name == _gtcodec.rank_file_name(rank)
    assert _gtcodec.parse_rank_file_name(name) == rank


def test_other_spellings_are_no_rank_files():
    for name in ("rank-10.gtrace", "rank-000010.gtrace", "rank-0001a.gtrace", "rank-2147483648.gtrace", "x.gtrace"):
        assert _gtcodec.parse_rank_file_name(name) is None, name
    with pytest.raises(ValueError):
        _gtcodec.rank_file_name(-1)


def test_read_trace_set_lists_ranks_beyond_five_digits(tmp_path):
    for rank in (100000, 0, 10):
        _trace(rank_file(tmp_path, rank), rank)
    (tmp_path / "notes.txt").write_text("not a trace")
    assert [r.rank for r in gradtrace.read_trace_set(tmp_path)] == [0, 10, 100000]


def test_a_misnamed_rank_file_is_refused_alike_by_python_and_gradtrace_inspect(tmp_path):
    """Issue 21: read_trace_set read rank-1.gtrace as rank 1, gradtrace-inspect listed any rank-*.gtrace, the diff
    only names it could parse. One rule now, and a misnamed file is named instead of silently left out."""
    _trace(tmp_path / "rank-00000.gtrace", 0)
    _trace(tmp_path / "rank-1.gtrace", 1)
    with pytest.raises(gradtrace.TraceError) as e:
        gradtrace.read_trace_set(tmp_path)
    assert str(e.value) == f"{tmp_path / 'rank-1.gtrace'}: {MISNAMED}" and e.value.code == "invalid_argument"
    p = subprocess.run([str(BUILD / "bin" / "gradtrace-inspect"), str(tmp_path)], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 2
    assert p.stderr == f"gradtrace-inspect: {tmp_path / 'rank-1.gtrace'}: {MISNAMED}\n"
    assert "rank-00000.gtrace" in p.stdout  # the rest of the set is still shown


def test_every_dtype_spelling_gives_the_cpp_canonical_name():
    rows = _gtcodec.dtypes()
    assert [r["name"] for r in rows] == ["FP32", "FP16", "BF16", "FP64"]
    assert set(dtypes.NUMPY_DTYPES) == {r["name"] for r in rows}
    for row in rows:
        for spelling in [row["name"], row["name"].lower(), *row["aliases"], *(a.upper() for a in row["aliases"])]:
            assert dtypes.dtype_name(spelling) == row["name"], spelling
    # Python accepted half and double and C++ did not; both read the one list now.
    assert [dtypes.dtype_name(s) for s in ("half", "double", "bfloat16", "float32")] == ["FP16", "FP64", "BF16", "FP32"]
    assert dtypes.dtype_name(np.float16) == "FP16"
    with pytest.raises(ValueError, match="unknown dtype 'fp8': expected FP32, FP16, BF16 or FP64"):
        dtypes.dtype_name("fp8")


def test_torch_dtype_names_come_from_the_table():
    torch = pytest.importorskip("torch")
    assert [dtypes.torch_dtype_name(t) for t in (torch.float32, torch.half, torch.bfloat16, torch.double)] == \
        ["FP32", "FP16", "BF16", "FP64"]
    assert dtypes.torch_dtype_name(torch.int64) == "FP32"  # buffers: stored as fp32 values


def test_the_codec_stores_what_an_alias_names(tmp_path):
    path = tmp_path / "t.gtrace"
    info = {"params": [{"name": "a", "shape": [3], "dtype": "half"}, {"name": "b", "shape": [3], "dtype": "double"}]}
    with gradtrace.TraceWriter(path, info) as w:
        w.write_bucket({"phase": "FINAL", "slices": [{"param_id": 0, "values": np.ones(3), "dtype": "Half"},
                                                    {"param_id": 1, "values": np.ones(3), "dtype": "float64"}]})
    reader = gradtrace.TraceReader(path)
    assert [p["dtype"] for p in reader.run_info["params"]] == ["FP16", "FP64"]
    frame = [f for f in reader.frames() if f["type"] == "bucket"][0]
    assert [(s["dtype"], s["values"].dtype) for s in frame["slices"]] == [("FP16", np.float16), ("FP64", np.float64)]


def test_loss_aliases_are_the_cpp_list():
    assert loss_recipes.ALIASES == _gtcodec.loss_recipe_aliases()
    assert [loss_recipes.resolve(n) for n in ("loss", "loss-div-sp", "alst", "alst-div-sp", "token-weighted")] == \
        ["local-mean", "local-mean-div-sp", "alst-tutorial", "alst-tutorial-div-sp", "token-weighted"]
    with pytest.raises(ValueError, match="not a known loss recipe"):
        loss_recipes.resolve("mean")


@pytest.mark.parametrize("stage, elements, bucket, rs, contiguous, path", [
    (0, 10, 2000, False, True, "engine"),
    (2, 10, 2000, False, True, "zero"),
    (3, 2000, 2000, True, True, "zero3-reduce-scatter"),
    (3, 2000, 2000, False, True, "zero3-allreduce"),
    (3, 2001, 2000, False, True, "zero3-reduce-scatter"),
    (3, 10, 2000, False, False, "zero3-reduce-scatter"),
])
def test_the_reduction_path_rule(stage, elements, bucket, rs, contiguous, path):
    """stage3.py:1673 (0.19.8), through the one C++ function the adapter's declared divisor uses."""
    assert _gtcodec.reduction_path(stage, elements, bucket, rs, contiguous) == path


def test_reduction_path_names_are_semantics_own():
    """The DeepSpeed adapter's reduction paths are semantics/'s list (reduction_path.cc), not a copy, and each is
    a path the one rule can choose."""
    from gradtrace.adapters import deepspeed_divisors

    assert deepspeed_divisors.PATHS == tuple(_gtcodec.reduction_paths()) == \
        ("engine", "zero", "zero3-reduce-scatter", "zero3-allreduce")
    chosen = {_gtcodec.reduction_path(stage, 10, 100, reduce_scatter, True)
              for stage in range(4) for reduce_scatter in (True, False)}
    assert chosen == set(deepspeed_divisors.PATHS)
    with pytest.raises(ValueError, match="path: expected one of"):
        deepspeed_divisors.declared_divisor("0.19.8", "zero3", 2)
