"""The upstream reproductions (tools/repro/upstream/, issue 23 item 2) on the installed DeepSpeed: they
import torch and deepspeed only, and print the numbers that answer the report. Here they run as a
maintainer would (a fresh process, CPU, gloo) and their numbers are held to the measured answer of
docs/studies/ds5248.md: ZeRO-1/2 sum the SP ranks' gradients (backward(loss) gives sp x the full-sequence
gradient, backward(loss / sp) exactly it), ZeRO-3 on its default reduce-scatter path averages them
(1 and 1/sp). ds7718.py and ds7749.py hold the fixed releases' answer (docs/studies/deepspeed-versions.md): under
gradient accumulation the optimizer receives exactly the gradient of the mean loss over all ranks and micro-steps
(factor 1, every micro-step weighted 1, whatever the model returns and however backward is scaled)."""

import re
import subprocess
import sys
import warnings

import pytest

from conftest import ROOT

UPSTREAM = ROOT / "tools" / "repro" / "upstream"
LINE = re.compile(r"^ZeRO-(\d) sp=(\d) (backward\(loss(?: / sp)?\))\s+(\S+)\s+grad = ([0-9.]+) x full-sequence$")


FACTOR_7718 = re.compile(r"^ZeRO-(\d) gas=(\d+) grad = ([0-9.]+) x the all-micro-step gradient, residual ([0-9.]+)$")
WEIGHT_7718 = re.compile(r"^ZeRO-(\d) gas=(\d+) micro-step (\d+) weight = (-?[0-9.]+)$")
LINE_7749 = re.compile(r"^ZeRO-(\d) gas=(\d+) returns (logits|loss|dict)\s+(backward\(.*?\))\s+"
                       r"grad = ([0-9.]+) x the all-micro-step gradient, residual ([0-9.]+)$")


# torch's gloo worker thread freeing a finished collective's Python-owned tensors while a rank's interpreter
# finalizes: std::terminate in that rank, SIGABRT, after every line was printed (README "Exit aborts").
TEARDOWN_ABORT = re.compile(r"terminate called without an active exception\n(?:.*\n)*?.*ProcessExitedException: "
                            r"process \d+ terminated with signal SIGABRT\s*$")


def _run(script, args, home):
    """The lines script prints with args, run as a maintainer would: a fresh isolated interpreter, no gradtrace.
    Exit 0, or the documented teardown abort (a warning; the callers still require every line)."""
    env = {"PATH": "/usr/bin:/bin", "DS_ACCELERATOR": "cpu", "HOME": str(home), "PYTHONNOUSERSITE": "1"}
    p = subprocess.run([sys.executable, "-I", str(UPSTREAM / script), *map(str, args)], env=env,
                       capture_output=True, text=True, timeout=300)
    if p.returncode == 1 and TEARDOWN_ABORT.search(p.stderr):
        warnings.warn(f"{script} {args}: a rank aborted at interpreter teardown (gloo; README 'Exit aborts')")
    else:
        assert p.returncode == 0, p.stderr[-3000:]
    return p.stdout.splitlines()


def _ds5248(stage, sp, home):
    """{(loss, parameter): factor} printed by ds5248.py STAGE SP, run without gradtrace on the path."""
    found = [LINE.match(line) for line in _run("ds5248.py", (stage, sp), home)]
    rows = {(m[3], m[4]): float(m[5]) for m in found if m and (int(m[1]), int(m[2])) == (stage, sp)}
    assert len(rows) == 6, found  # 2 losses x 3 parameters
    return rows


@pytest.mark.parametrize("stage,sp,loss_factor", [(2, 2, 2.0), (3, 2, 1.0)])
def test_ds5248_repro_prints_the_measured_factors(stage, sp, loss_factor, tmp_path):
    rows = _ds5248(stage, sp, tmp_path)
    for (loss, param), factor in rows.items():
        want = loss_factor if loss == "backward(loss)" else loss_factor / sp
        assert factor == pytest.approx(want, abs=1e-4), (loss, param, rows)


def test_ds7718_repro_counts_every_micro_step(tmp_path):
    """ZeRO-2, gas 4: the boundary's gradient is the all-micro-step one (0.18.2 printed 0.2686, residual 0.8528,
    weights 0 0 0 1: only the last micro-step)."""
    lines = _run("ds7718.py", (2, 4), tmp_path)
    factors = [m for m in map(FACTOR_7718.match, lines) if m]
    weights = {int(m[3]): float(m[4]) for m in map(WEIGHT_7718.match, lines) if m}
    assert len(factors) == 1 and (factors[0][1], factors[0][2]) == ("2", "4"), lines
    assert float(factors[0][3]) == pytest.approx(1.0, abs=1e-4), lines
    assert float(factors[0][4]) == pytest.approx(0.0, abs=1e-4), lines
    assert sorted(weights) == [0, 1, 2, 3], lines
    assert all(w == pytest.approx(1.0, abs=1e-4) for w in weights.values()), weights


@pytest.mark.parametrize("stage", [2, 3])
def test_ds7749_repro_divides_by_gas_once(stage, tmp_path):
    """gas 4, the model returning logits, loss or {loss, logits}, backward(loss) or backward(loss / gas,
    scale_wrt_gas=False): factor 1 everywhere (0.18.3 printed 0.0625 for ZeRO-2's dict + Trainer's convention)."""
    lines = _run("ds7749.py", (stage, 4), tmp_path)
    rows = {(m[3], m[4]): (float(m[5]), float(m[6])) for m in map(LINE_7749.match, lines)
            if m and (int(m[1]), int(m[2])) == (stage, 4)}
    assert len(rows) == 6, lines  # 3 outputs x 2 backward conventions
    for key, (factor, residual) in rows.items():
        assert factor == pytest.approx(1.0, abs=1e-4), (key, rows)
        assert residual == pytest.approx(0.0, abs=1e-4), (key, rows)


LINE_PIPE = re.compile(r"^deepspeed \S+ gas=(\d+) stage (\d) (\S+)\s+grad = ([0-9.]+) x the one-process gradient, "
                       r"residual ([0-9.]+)$")


def test_ds_pipe_repro_averages_over_micro_batches_on_every_stage(tmp_path):
    """Two stages, gas 4: every parameter of both stages gets the one-process mean-loss gradient (0.18.0 printed
    4.0000 everywhere, 0.18.5-0.19.2 0.2500 on stage 0: tools/repro/ds_pipe/README.md)."""
    rows = {m[3]: (int(m[2]), float(m[4]), float(m[5])) for m in map(LINE_PIPE.match, _run("ds_pipe.py", (4,), tmp_path))
            if m and m[1] == "4"}
    assert {n: s for n, (s, _, _) in rows.items()} == {"0.weight": 0, "0.bias": 0, "2.weight": 0, "2.bias": 0,
                                                       "4.weight": 1, "4.bias": 1}, rows
    for name, (_, factor, residual) in rows.items():
        assert factor == pytest.approx(1.0, abs=1e-4) and residual == pytest.approx(0.0, abs=1e-4), (name, rows)


def test_upstream_repros_import_no_gradtrace():
    for path in UPSTREAM.glob("*.py"):
        assert not re.search(r"^\s*(import|from)\s+gradtrace", path.read_text(), re.M), path
