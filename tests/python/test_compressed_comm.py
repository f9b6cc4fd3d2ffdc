"""Issue 19: torch's own DDP communication hooks against one fp32 rank (tests/python/adapter_runs.py,
gloo, 2 ranks, 3 steps). fp16/bf16 compression is a match within that dtype's rounding, named as such;
PowerSGD, correct for its first two iterations and a rank-1 approximation from the third, is caught by
the default diff (every common step) at step 2, named as lossy compression; its --self claims no divisor."""

import json
import subprocess

import pytest

import gradtrace
from conftest import BUILD
from test_pytorch_adapters import _run

DIFF = BUILD / "bin" / "gradtrace-diff"


def _gtdiff(*args):
    p = subprocess.run([str(DIFF), *map(str, args)], capture_output=True, text=True, timeout=120)
    assert p.returncode in (0, 1), f"gradtrace-diff exit {p.returncode}: {p.stderr}"
    return p


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("compressed")
    out = {"ref": _run(d / "ref", "ref-dense", 1, "--steps", "3")}
    for hook in ("fp16", "bf16", "powersgd"):
        out[hook] = _run(d / hook, "ddp", 2, "--steps", "3", "--hook", hook)
    for mp in ("bf16", "bf16-reduce"):
        out[f"fsdp2-{mp}"] = _run(d / f"fsdp2-{mp}", "fsdp2", 2, "--steps", "3", "--mp", mp)
    out["tmp"] = d
    return out


def _report(runs, name, *flags):
    path = runs["tmp"] / f"{name}{'-'.join(flags)}.json"
    p = _gtdiff(runs["ref"], runs[name], "--json", path, *flags)
    return p.returncode, json.loads(path.read_text()), p.stdout


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_compression_hook_is_recorded_and_matches_within_its_rounding(runs, dtype):
    (r0,) = [r for r in gradtrace.read_trace_set(runs[dtype]) if r.rank == 0]
    cfg = r0.run_info["config"]
    assert cfg["comm_dtype"] == dtype.upper() and cfg["comm_hook"] == f"{dtype}_compress_hook"
    assert all(p["comm_dtype"] == dtype.upper() and p["grad_dtype"] == "FP32" for p in r0.run_info["params"])
    rc, r, out = _report(runs, dtype)
    assert rc == 0, out
    assert r["verdict"] == "match" and len(r["steps"]) == 3
    d = dtype.upper()  # the canonical name (proto/dtype.h)
    assert r["summary"].endswith(f"match within {d} rounding (B communicates in {d} ({dtype}_compress_hook))")
    worst = max(p["residual"] for p in r["params"] if p["residual"] is not None)
    # The residual is the rounding the hook adds (far above fp32's bound, far below a factor's).
    assert 1e-5 < worst < r["tolerance"]["rtol"] < 0.05, (worst, r["tolerance"])
    print(f"{dtype}: worst residual {worst:.3g}, rtol {r['tolerance']['rtol']:.3g}")


def test_bf16_self_check_claims_the_mean_and_no_invented_divisor(runs):
    path = runs["tmp"] / "self-bf16.json"
    p = subprocess.run([str(DIFF), "--self", str(runs["bf16"]), "--json", str(path)], capture_output=True,
                       text=True, timeout=120)
    r = json.loads(path.read_text())
    assert p.returncode == 0, p.stdout
    divisors = [g for g in r["groups"] if g["kind"] == "divisor"]
    assert divisors and all(abs(g["scale"] - 2.0) < 0.02 for g in divisors), divisors
    assert all("the optimizer sees" not in g["explanation"] for g in r["groups"])


def test_powersgd_is_caught_by_the_default_diff_from_its_third_iteration(runs):
    rc, r, out = _report(runs, "powersgd")
    assert rc == 1, out
    assert [s["verdict"] for s in r["steps"]][:2] == ["match", "match"]
    assert r["step"] == 2 and r["verdict"] == "mismatch"
    (group,) = [g for g in r["groups"] if g["kind"] == "mismatch"]
    assert group["cause"] == "lossy-compression" and "powerSGD_hook" in group["explanation"]
    # Step 0 alone (what the default compared before) matches.
    rc0, r0, _ = _report(runs, "powersgd", "--step", "0")
    assert rc0 == 0 and r0["verdict"] == "match"


def test_powersgd_self_check_claims_no_divisor_for_a_non_multiple(runs):
    path = runs["tmp"] / "self-psgd.json"
    p = subprocess.run([str(DIFF), "--self", str(runs["powersgd"]), "--json", str(path)], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 1, p.stdout
    r = json.loads(path.read_text())
    assert r["step"] == 2 and r["verdict"] == "inconsistent"
    bad = {p["name"] for p in r["self_params"] if p["verdict"] == "inconsistent"}
    assert bad
    for g in r["groups"]:
        if g["kind"] == "divisor":
            assert not bad & set(g["params"]), g  # no divisor claimed for a parameter that is no multiple
    (inc,) = [g for g in r["groups"] if g["kind"] == "inconsistent"]
    assert inc["cause"] == "lossy-compression" and "no divisor is claimed" in inc["explanation"]
    assert r["summary"] == inc["explanation"]


@pytest.mark.parametrize("mp", ["bf16", "bf16-reduce"])
def test_fsdp2_mixed_precision_matches_within_bf16_rounding(runs, mp):
    """FSDP2's MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32 or bf16): the adapter records
    bf16 training (Config.dtype) and the reduce dtype; against the fp32 reference every step matches
    within bf16 rounding (exit 0). Unrecorded, the fp32 bound would call it a mismatch."""
    (r0,) = [r for r in gradtrace.read_trace_set(runs[f"fsdp2-{mp}"]) if r.rank == 0]
    cfg = r0.run_info["config"]
    assert cfg["dtype"] == "BF16" and cfg["comm_dtype"] == ("BF16" if mp == "bf16-reduce" else "FP32")
    assert all(p["grad_dtype"] == "BF16" and p["dtype"] == "FP32" for p in r0.run_info["params"])
    rc, r, out = _report(runs, f"fsdp2-{mp}")
    assert rc == 0, out
    assert r["summary"].endswith("match within BF16 rounding (B trains in BF16)"), r["summary"]
    worst = max(p["residual"] for p in r["params"] if p["residual"] is not None)
    assert 1e-4 < worst < r["tolerance"]["rtol"], (worst, r["tolerance"])
    print(f"fsdp2 {mp}: worst residual {worst:.3g}, rtol {r['tolerance']['rtol']:.3g}")
