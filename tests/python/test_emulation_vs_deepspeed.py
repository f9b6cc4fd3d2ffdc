"""gradtrace-train's emulation of DeepSpeed 0.19.8 against real DeepSpeed 0.19.8, trace against trace.

Both sides run gradtrace-train's model (capture/train/model.cc; on the DeepSpeed side model.py's GradtraceLM,
whose attention is DeepSpeed's DistributedAttention) from the same initial weights and global batch:
`gradtrace-train --export-init FILE` writes them, `run.py --model gradtrace --init FILE` loads them, so
there is one implementation of init and data. Parameter names are identical, so no --rename.

Cases, fp32, one step: sp=2 ZeRO-2 with `loss` (gradtrace local-mean) and with `loss / sp`
(local-mean-div-sp), stage 0 with `loss`, ZeRO-1 at dp=2 x sp=2 with token-weighted and a quarter of
the labels ignored (unequal shards), and ZeRO-2 with two accumulation micro-steps. For each,
`gradtrace-diff EMU REAL` on FINAL must exit 0 at its default fp32 tolerance (rtol = 16*u*sqrt(N) =
3.05e-5 here). Measured on deepspeed 0.19.8 / torch 2.15.0: scale 1.000 and residual <= 3.6e-7 per
parameter in every case (the two sides use different reduction orders and collectives, not different
math). And both sides give the same scale against one shared single-rank reference (gradtrace-train
--nproc 1 --scaling mean): 2.000 for `loss`, 1.000 for `loss / sp` (docs/studies/ds5248.md). The whole matrix,
every release: tools/repro/ds5248/repro.py --versions all (emulation.md).
"""

import importlib.util
import json
import subprocess
import sys

import pytest

from conftest import BUILD, ROOT, deepspeed_env  # $GRADTRACE_BUILD_DIR, default build/
RUNNER = ROOT / "tools" / "repro" / "ds5248" / "run.py"
TRAIN = BUILD / "bin" / "gradtrace-train"
DIFF = BUILD / "bin" / "gradtrace-diff"

if importlib.util.find_spec("deepspeed") is None:
    raise ImportError("deepspeed is not installed in this Python: run ./tools/setup (tools/requirements.txt)")

MODEL = ["--seq-len", "16", "--hidden", "32", "--vocab", "64", "--heads", "4", "--layers", "2", "--steps", "1",
         "--seed", "1234"]
BATCH = 2  # global rows = run.py's --batch at dp=1
SCALE_TOL = 1e-4
CASES = {  # name: (zero stage, run.py --loss, gradtrace-train --loss, FINAL scale vs the reference or None
    #          when the parameters' factors spread (unequal shards), dp, gas, ignore fraction); sp = 2
    "z2-loss": (2, "loss", "local-mean", 2.0, 1, 1, 0.0),
    "z2-div": (2, "loss-div-sp", "local-mean-div-sp", 1.0, 1, 1, 0.0),
    "z0-loss": (0, "loss", "local-mean", 2.0, 1, 1, 0.0),
    "z1-dp2-tw-ign": (1, "token-weighted", "token-weighted", None, 2, 1, 0.25),
    "z2-gas2-div": (2, "loss-div-sp", "local-mean-div-sp", 1.0, 1, 2, 0.0),
}


def _check(cmd, env=None, timeout=300):
    p = subprocess.run([str(c) for c in cmd], env=env, capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, \
        f"{' '.join(map(str, cmd))} failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return p


def _train(*args):
    return _check([TRAIN, *MODEL, "--batch", str(BATCH), *args])


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    for b in (TRAIN, DIFF):
        if not b.exists():
            pytest.fail(f"{b} not built: cmake --build {BUILD} --target gradtrace-train gradtrace-diff")
    return tmp_path_factory.mktemp("emu_vs_ds")


def _inputs(work, gas, ignore):
    """The init file (weights + global batches) and the single-rank reference for (gas, ignore); cached."""
    init, ref = work / f"init-gas{gas}-ign{ignore}.pt", work / f"ref-gas{gas}-ign{ignore}"
    data = ["--gas", str(gas), "--ignore-frac", str(ignore)]
    if not init.exists():
        _train(*data, "--export-init", init)
        _train(*data, "--nproc", "1", "--scaling", "mean", "--out", ref)
    return init, ref, data


def _real(work, name, init, stage, loss, dp, gas):
    env = deepspeed_env()
    out = work / f"real-{name}"
    _check([sys.executable, RUNNER, "--model", "gradtrace", "--init", init, *MODEL, "--batch", str(BATCH // dp),
            "--sp", "2", "--dp", str(dp), "--gas", str(gas), "--zero-stage", str(stage), "--loss", loss,
            "--out", out, "--timeout", "240"], env=env)
    return out


def _diff(a, b, json_path):
    p = subprocess.run([str(DIFF), str(a), str(b), "--threads", "1", "--json", str(json_path)], capture_output=True,
                       text=True, timeout=120)
    return p, json.loads(json_path.read_text())


@pytest.mark.parametrize("name", list(CASES))
def test_emulation_matches_real_deepspeed(work, name):
    stage, ds_loss, gt_loss, expected, dp, gas, ignore = CASES[name]
    init, ref, data = _inputs(work, gas, ignore)
    real = _real(work, name, init, stage, ds_loss, dp, gas)
    emu = work / f"emu-{name}"
    _train(*data, "--nproc", str(2 * dp), "--sp", "2", "--dp", str(dp), "--zero-stage", str(stage),
           "--scaling", "deepspeed@0.19.8", "--loss", gt_loss, "--reduce-bucket-size", "2000", "--out", emu)

    # Elementwise, same names, default fp32 tolerance (measured residual <= 3.6e-7 vs rtol 3.05e-5).
    p, report = _diff(emu, real, work / f"{name}-emu-real.json")
    assert p.returncode == 0, p.stdout + p.stderr
    assert len(report["groups"]) == 1 and abs(report["groups"][0]["scale"] - 1.0) < SCALE_TOL, report["groups"]
    assert max(q["residual"] for q in report["params"]) < 1e-5

    # Against the shared reference, both sides give the same factor for every parameter.
    factors = []
    for side in (emu, real):
        p, report = _diff(ref, side, work / f"{name}-ref-{side.name}.json")
        factors.append({q["name"]: q["scale"] for q in report["params"]})
        if expected is not None:
            assert p.returncode == (0 if expected == 1.0 else 1), p.stdout + p.stderr
            groups = report["groups"]
            assert len(groups) == 1 and abs(groups[0]["scale"] - expected) < SCALE_TOL * expected, (side.name, groups)
        else:  # dp=2, unequal shards: per-replica token means are not the global token mean
            assert p.returncode == 1, p.stdout + p.stderr
    assert factors[0].keys() == factors[1].keys()
    for k, v in factors[0].items():
        assert abs(v - factors[1][k]) < 1e-4 * abs(v), (k, v, factors[1][k])
