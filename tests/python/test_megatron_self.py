"""Hand-written Megatron-style tensor + sequence parallelism under `gradtrace-diff --self` (issue 19,
item 3): tests/python/megatron_runs.py, real torch and gloo on CPU, several processes, the same
weights and data as a single-rank reference.

Expected numbers, and why:
- tp 2 with sequence parallelism (norm, norm2 and down.bias replicated on both tp ranks, each rank's
  gradient of them the partial sum over its half of the sequence, all-reduced with SUM over tp, as
  Megatron's _allreduce_layernorm_grads does): --self measures divisor 1.000 over group 'tp', which
  is what partial sums need (semantics::ExpectedDivisorOver), exit 0; before the fix it expected the
  data-parallel divisor, "which needs 2.000", exit 1. Against the reference: 1.000, exit 0.
- dp 2 x tp 2, the same plus an all-reduce over dp divided by dp: each of the five is reduced twice
  per step, over tp (1.000, needs 1) and over dp (2.000, needs 2), judged as two entries; exit 0.
  Before, the two reductions were accumulated as one (divisor ~1.45, residual 0.33: inconsistent).
- the tp all-reduce left out: the five are replicas of FINAL that disagree (relative difference ~1):
  inconsistent, a `replica` finding each, exit 1.
- the tp all-reduce averaging instead of summing: 2.000 where 1 is needed, wrong-divisor, exit 1 (the
  optimizer sees 0.5 x; the reference diff measures 0.500).
- tp without sequence parallelism (every tp rank computes the whole gradient of the five) and their
  copies summed over tp: --self sees identical inputs, needs 2.000, measures 1.000: wrong-divisor,
  exit 1 (the reference diff measures 2.000).
- the five left DENSE over dp (no rules=: the adapter's default) and summed over 'tp': still 1.000
  over 'tp', exit 0 (a reduction over the tp group adds partial sums whatever the recorded kind).
fp32 with a few dozen summands per element: residuals ~1e-7; divisors and scales within 1e-5.
"""

import json
import subprocess

import pytest

from conftest import BUILD, ROOT, script_runs

RUNS = ROOT / "tests" / "python" / "megatron_runs.py"
DIFF = BUILD / "bin" / "gradtrace-diff"
RTOL = 1e-5
NAMES = {"embed.weight", "norm.weight", "norm.bias", "up.weight", "up.bias", "down.weight", "down.bias",
         "norm2.weight", "norm2.bias", "head.weight"}
SP_PARAMS = {"norm.weight", "norm.bias", "down.bias", "norm2.weight", "norm2.bias"}
RUN_ARGS = {
    "ref": ["ref"],
    "tp": ["megatron", "--tp", "2"],
    "dp-tp": ["megatron", "--dp", "2", "--tp", "2"],
    "tp-unreduced": ["megatron", "--tp", "2", "--tp-reduce", "none"],
    "tp-averaged": ["megatron", "--tp", "2", "--tp-reduce", "avg"],
    "no-sp-summed": ["megatron", "--tp", "2", "--no-sp", "--tp-reduce", "sum"],
    "tp-no-rules": ["megatron", "--tp", "2", "--no-rules"],
}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """run(name) -> the trace directory of that run, made once per module."""
    return script_runs(tmp_path_factory, "megatron",
                       lambda name, out: [RUNS, RUN_ARGS[name][0], out, *RUN_ARGS[name][1:]], timeout=120)


def _gradtrace_diff(run, args, report):
    if not DIFF.exists():
        pytest.fail(f"{DIFF} not built: cmake --build {BUILD} --target gradtrace-diff")
    p = subprocess.run([str(DIFF), *map(str, args), "--json", str(report)], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode in (0, 1), f"gradtrace-diff exit {p.returncode}: {p.stdout[-2000:]} {p.stderr}"
    return p.returncode, json.loads(report.read_text())


def _self(run, name):
    return _gradtrace_diff(run, ["--self", run(name)], run.root / f"{name}-self.json")


def _diff(run, name):
    return _gradtrace_diff(run, [run("ref"), run(name)], run.root / f"{name}-vs-ref.json")


def _entries(report):
    """(name, group) -> self_params entry."""
    out = {}
    for p in report["self_params"]:
        key = (p["name"], p["group"])
        assert key not in out, f"two entries for {key}"
        out[key] = p
    return out


def _scales(report):
    return {r["name"]: r["scale"] for r in report["params"]}


def _assert_matches_reference(run, name):
    code, report = _diff(run, name)
    scales = _scales(report)
    assert code == 0, (report["summary"], scales)
    assert set(scales) == NAMES and all(abs(s - 1.0) < RTOL for s in scales.values()), scales


def test_tp_sp_sum_over_tp_passes_self(run):
    code, report = _self(run, "tp")
    entries = _entries(report)
    assert code == 0, report["summary"]
    assert report["verdict"] == "ok"
    assert {n for n, _ in entries} == SP_PARAMS  # dp = 1: only the tp reduction is recorded
    for name in SP_PARAMS:
        p = entries[(name, "tp")]
        assert (p["param_kind"], p["group_size"], p["expected"], p["verdict"]) == ("replicated", 2, 1.0, "ok"), p
        assert abs(p["divisor"] - 1.0) < RTOL, p
    assert "wrong-divisor" not in json.dumps(report["self_params"])
    assert "hold partial sums of the gradient" in report["summary"], report["summary"]


def test_tp_sp_matches_the_single_rank_reference(run):
    _assert_matches_reference(run, "tp")


def test_dp_x_tp_judges_each_group_of_a_parameter_separately(run):
    """Each norm parameter is reduced over tp (summed) and then over dp (averaged) in one step: two
    entries, each with its own divisor and expectation, never one mixed measure."""
    code, report = _self(run, "dp-tp")
    entries = _entries(report)
    assert code == 0, report["summary"]
    assert set(entries) == {(n, "dp") for n in NAMES} | {(n, "tp") for n in SP_PARAMS}
    for (name, group), p in entries.items():
        want = 1.0 if group == "tp" else 2.0
        assert p["expected"] == want and abs(p["divisor"] - want) < RTOL * want and p["verdict"] == "ok", p
        assert p["residual"] < 1e-5, p
    assert entries[("norm.weight", "dp")]["param_kind"] == "replicated"
    assert entries[("up.weight", "dp")]["param_kind"] == "tp-shard"
    # One divisor group per (kind, group): replicated over tp (1), replicated over dp (2), tp-shard over dp (2).
    scales = sorted((g["scale"], g["count"]) for g in report["groups"] if g["kind"] == "divisor")
    assert [(round(s, 3), c) for s, c in scales] == [(1.0, 5), (2.0, 5), (2.0, 5)], report["groups"]
    _assert_matches_reference(run, "dp-tp")


def test_omitted_tp_all_reduce_flags_the_norm_replicas(run):
    code, report = _self(run, "tp-unreduced")
    assert code == 1 and report["verdict"] == "inconsistent", report["summary"]
    bad = {p["name"] for p in report["self_params"] if p["verdict"] != "ok"}
    assert bad == SP_PARAMS, report["self_params"]
    replica = [f["message"] for f in report["findings"] if f["kind"] == "replica"]
    assert len(replica) == len(SP_PARAMS), report["findings"]
    for name in SP_PARAMS:
        assert any(f"replicas of '{name}' disagree in FINAL" in m for m in replica), replica


def test_tp_all_reduce_that_averages_partial_sums_is_a_wrong_divisor(run):
    code, report = _self(run, "tp-averaged")
    entries = _entries(report)
    assert code == 1 and report["verdict"] == "wrong-divisor", report["summary"]
    for name in SP_PARAMS:
        p = entries[(name, "tp")]
        assert p["verdict"] == "wrong-divisor" and p["expected"] == 1.0 and abs(p["divisor"] - 2.0) < 2 * RTOL, p
    assert "averages the group's partial sums" in report["summary"], report["summary"]
    code, diff = _diff(run, "tp-averaged")
    scales = _scales(diff)
    assert code == 1
    assert all(abs(scales[n] - 0.5) < RTOL for n in SP_PARAMS), scales


def test_summing_identical_copies_over_tp_without_sp_is_a_wrong_divisor(run):
    """Without sequence parallelism every tp rank computes the whole norm gradient: the replicas of
    FINAL agree, but the tp sum doubled them, and --self sees that its inputs were identical copies."""
    code, report = _self(run, "no-sp-summed")
    entries = _entries(report)
    assert code == 1 and report["verdict"] == "wrong-divisor", report["summary"]
    for name in SP_PARAMS:
        p = entries[(name, "tp")]
        assert p["verdict"] == "wrong-divisor" and p["expected"] == 2.0 and abs(p["divisor"] - 1.0) < RTOL, p
    assert "identical copies" in report["summary"], report["summary"]
    assert not [f for f in report["findings"] if f["kind"] == "replica"]
    code, diff = _diff(run, "no-sp-summed")
    scales = _scales(diff)
    assert code == 1
    assert all(abs(scales[n] - 2.0) < 2 * RTOL for n in SP_PARAMS), scales


def test_a_tp_sum_of_parameters_left_dense_needs_divisor_one_too(run):
    code, report = _self(run, "tp-no-rules")
    entries = _entries(report)
    assert code == 0, report["summary"]
    for name in SP_PARAMS:
        p = entries[(name, "tp")]
        assert (p["param_kind"], p["expected"], p["verdict"]) == ("dense", 1.0, "ok"), p
