"""Traces of earlier formats (tests/fixtures/format-1.0 to -1.6, written by
those writers) read through the Python package as they did; 1.1 files carry the
index catalogue, 1.2 files the parallel layout; 1.6's references read as values."""

import numpy as np

import gradtrace
from conftest import ROOT, train_small

FIXTURES = ROOT / "tests" / "fixtures" / "format-1.0"
FIXTURES_11 = ROOT / "tests" / "fixtures" / "format-1.1"
FIXTURES_12 = ROOT / "tests" / "fixtures" / "format-1.2"


def test_version_10_set_reads_with_its_index_but_no_catalogue():
    readers = gradtrace.read_trace_set(FIXTURES / "sp2")
    assert [r.rank for r in readers] == [0, 1]
    for r in readers:
        assert r.format_version == (1, 0)
        assert r.has_index and not r.catalogued
        buckets = [e for e in r.index() if e["type"] == "bucket"]
        assert buckets and all(e["param_ids"] == [] and e["raw_len"] == 0 for e in buckets)
        gradtrace.verify(r.path)
        frames = [f for f in r.frames() if f["type"] == "bucket"]
        assert len(frames) == len(buckets)
        assert all(f["slices"] for f in frames)


def test_version_11_index_catalogues_each_bucket_frame(tmp_path):
    run_info = {"producer": "pytest", "rank": 0, "config": {"world": 1, "dp": 1, "sp": 1},
                "params": [{"name": "a", "shape": [4], "dtype": "fp32"},
                           {"name": "b", "shape": [3], "dtype": "fp32"}]}
    path = tmp_path / "rank-00000.gtrace"
    with gradtrace.TraceWriter(path, run_info) as w:
        w.write_bucket({"step": 0, "phase": "POST_REDUCE", "group": "dp", "divisor": 2.0,
                        "slices": [{"param_id": 1, "values": np.ones(3, np.float32)},
                                   {"param_id": 0, "values": np.ones(4, np.float32)}]})
    r = gradtrace.TraceReader(path)
    assert r.format_version == gradtrace.FORMAT_VERSION and r.catalogued
    (entry,) = r.index()
    assert entry["param_ids"] == [0, 1]
    assert entry["group"] == "dp" and entry["divisor"] == 2.0 and entry["raw_len"] > 0


def test_version_11_set_reads_catalogued_without_layout():
    readers = gradtrace.read_trace_set(FIXTURES_11 / "sp2")
    assert [r.rank for r in readers] == [0, 1]
    for r in readers:
        assert r.format_version == (1, 1) and r.catalogued
        gradtrace.verify(r.path)
        assert all(p["kind"] == "PARAM_KIND_UNSPECIFIED" and p["grad_group"] == "" for p in r.run_info["params"])
        assert r.run_info["config"]["tp"] == 0 and r.run_info["framework"] == ""
        steps = [f for f in r.frames() if f["type"] == "step"]
        assert steps and all(f["reported_grad_norm"] is None and not f["optimizer_step"] for f in steps)


def test_version_12_set_reads_its_layout_without_replicate():
    readers = gradtrace.read_trace_set(FIXTURES_12 / "ep")
    assert [r.rank for r in readers] == [0, 1, 2, 3]
    for r in readers:
        assert r.format_version == (1, 2) and r.catalogued
        gradtrace.verify(r.path)
        config = r.run_info["config"]
        assert (config["dp"], config["ep_size"], config["replicate"]) == (4, 2, 0)
        kinds = {p["name"]: p["kind"] for p in r.run_info["params"]}
        assert kinds["layers.1.mlp.fc1.weight"] == "EXPERT" and kinds["embed.weight"] == "DENSE"


FIXTURES_15 = ROOT / "tests" / "fixtures" / "format-1.5"


def test_version_15_set_reads_whole_without_references():
    readers = gradtrace.read_trace_set(FIXTURES_15 / "sp2")
    assert [r.rank for r in readers] == [0, 1]
    for r in readers:
        assert r.format_version == (1, 5) and r.catalogued
        gradtrace.verify(r.path)
        buckets = [f for f in r.frames() if f["type"] == "bucket"]
        assert buckets and all(f["values_from"] == 0 and f["slices"] for f in buckets)


def test_version_16_references_read_as_the_values_they_name(tmp_path):
    """gradtrace-train on one rank: every POST_REDUCE and FINAL record is a reference to its PRE_REDUCE frame
    (format 1.6), read back holding PRE_REDUCE's values, array for array."""
    out = train_small(tmp_path / "t")
    (r,) = gradtrace.read_trace_set(out)
    assert r.format_version == (1, 6)
    pre = {}
    references = 0
    for f in r.frames():
        if f["type"] != "bucket":
            continue
        key = (f["step"], f["micro_step"], f["bucket_id"])
        if f["phase"] == "PRE_REDUCE":
            assert f["values_from"] == 0
            pre[key] = f
            continue
        assert f["values_from"] == pre[key]["offset"]
        references += 1
        assert len(f["slices"]) == len(pre[key]["slices"])
        for mine, theirs in zip(f["slices"], pre[key]["slices"]):
            assert mine["param_id"] == theirs["param_id"] and mine["offset"] == theirs["offset"]
            assert np.array_equal(mine["values"], theirs["values"])
    assert references == 2 * len(pre) > 0


FIXTURES_16 = ROOT / "tests" / "fixtures" / "format-1.6"


def test_version_16_fixture_references_read_as_the_values_they_name():
    """The committed gradtrace-train set of format 1.6: each POST_REDUCE and FINAL record is a reference to its
    step's PRE_REDUCE frame and reads back holding its values; the synthetic sets hold none."""
    (r,) = gradtrace.read_trace_set(FIXTURES_16 / "train")
    assert r.format_version == (1, 6) and r.catalogued
    gradtrace.verify(r.path)
    frames = [f for f in r.frames() if f["type"] == "bucket"]
    by_offset = {f["offset"]: f for f in frames}
    references = [f for f in frames if f["values_from"]]
    assert len(references) == 20 and {f["phase"] for f in references} == {"POST_REDUCE", "FINAL"}
    for f in references:
        target = by_offset[f["values_from"]]
        assert target["phase"] == "PRE_REDUCE" and target["values_from"] == 0
        for mine, theirs in zip(f["slices"], target["slices"]):
            assert np.array_equal(mine["values"], theirs["values"])
    for name in ("ref", "sp2", "sketch", "ep"):
        for reader in gradtrace.read_trace_set(FIXTURES_16 / name):
            assert reader.format_version == (1, 6)
            assert all(f["values_from"] == 0 for f in reader.frames() if f["type"] == "bucket")
