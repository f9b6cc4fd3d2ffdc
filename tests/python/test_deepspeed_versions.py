"""gradtrace-deepspeed-versions (gradtrace-versions --package deepspeed by DeepSpeed's description,
python/gradtrace/versions/packages/deepspeed.json) on real traces, with the DeepSpeed
release installed in this interpreter only (tools/constraints.txt: 0.19.8; no environment is built, CI
never downloads other releases; the multi-release runs are python/README.md's acceptance commands):

- the #5248 loop (sp=2, `loss`, ZeRO-2) on real DeepSpeed against the single-rank reference: 2.000 for
  every parameter; the cache (a second call runs nothing: runs_executed, cached rows); the Markdown report;
- a user script under the script contract (dp=2, ZeRO-2, a real DeepSpeed engine): 1.000;
- the table, the first change and --bisect over a release list where each release is gradtrace-train's
  emulation `--scaling deepspeed@RELEASE` (real captures; a release the emulation does not know fails to
  run and is skipped as in git bisect skip);
- exit codes: 2 with one line for bad input; a built-in loop outside a source checkout is bad input too;
- the old `python -m gradtrace.deepspeed_versions` still runs the command and says it is deprecated.
"""

import importlib.util
import json
import subprocess
import sys

import pytest

from conftest import BUILD, deepspeed_env

if importlib.util.find_spec("deepspeed") is None:  # tools/setup installs it: its absence is a broken setup
    pytest.fail("deepspeed is not installed in this interpreter (tools/setup installs tools/constraints.txt)",
                pytrace=False)
from importlib.metadata import version  # noqa: E402

INSTALLED = version("deepspeed")


def command(tmp_path, *args, cache="cache", timeout=600):
    env = deepspeed_env()
    env["GRADTRACE_BUILD_DIR"] = str(BUILD)
    # What pip's console script for [project.scripts] does, under the alias' name (the package is found by it).
    alias = tmp_path / "bin" / "gradtrace-deepspeed-versions"
    alias.parent.mkdir(exist_ok=True)
    alias.write_text("import sys\nfrom gradtrace.versions.command import alias_main\nsys.exit(alias_main())\n")
    cmd = [sys.executable, str(alias), "--cache-dir", str(tmp_path / cache),
           "--env-root", str(tmp_path / "envs"), "--no-build", *map(str, args)]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


def config(tmp_path, stage, name=None):
    path = tmp_path / (name or f"z{stage}.json")
    path.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
                                "zero_optimization": {"stage": stage}}))
    return path


def scale_of(row):
    groups = row["vs_reference"]["groups"]
    assert len(groups) == 1 and groups[0]["kind"] == "scale", row["vs_reference"]
    return groups[0]


@pytest.fixture(scope="module")
def ds5248(tmp_path_factory):
    """Two calls of the real #5248 loop on the installed release; the second must come from the cache."""
    tmp = tmp_path_factory.mktemp("dsversions")
    cfg = config(tmp, 2)
    calls = []
    for i in range(2):
        p = command(tmp, "--config", cfg, "--model", "ds5248", "--sp", "2", "--loss", "loss",
                    "--releases", INSTALLED, "--json", tmp / f"r{i}.json", "--markdown", tmp / f"r{i}.md")
        calls.append((p, json.loads((tmp / f"r{i}.json").read_text()) if (tmp / f"r{i}.json").exists() else None,
                      tmp / f"r{i}.md"))
    return calls


def test_ds5248_loop_zero2_is_sp_times_the_single_rank_reference(ds5248):
    p, res, _ = ds5248[0]
    assert p.returncode == 1, p.stdout + p.stderr  # differs from the reference
    row, = res["rows"]
    assert row["release"] == INSTALLED and row["status"] == "ok" and not row["cached"]
    g = scale_of(row)
    assert g["scale"] == pytest.approx(2.0, abs=1e-4) and g["count"] == 29 and g["residual"] < 1e-5
    assert g["expression"] == "sp(B)"
    assert row["vs_reference"]["verdict"] == "scaled"
    assert row["loss"] > 0 and row["grad_norm"] > 0  # the norm DeepSpeed reported (get_global_grad_norm)
    assert res["runs_executed"] == 2  # the release and the single-rank reference
    assert INSTALLED in p.stdout and "2.0000 = sp(B) x29" in p.stdout


def test_second_call_comes_from_the_cache(ds5248):
    (p0, r0, _), (p1, r1, _) = ds5248
    assert p1.returncode == p0.returncode == 1
    assert r1["runs_executed"] == 0 and r1["rows"][0]["cached"] is True
    assert r1["rows"][0]["vs_reference"]["groups"] == r0["rows"][0]["vs_reference"]["groups"]
    assert "0 runs executed" in p1.stderr


def test_markdown_report(ds5248):
    _, res, md = ds5248[0]
    text = md.read_text()
    assert text.startswith("# DeepSpeed versions compared with gradtrace")
    assert f"| {INSTALLED} | 2.0000 = sp(B) x29" in text
    assert '"stage": 2' in text and "single rank" in text


USER_SCRIPT = '''
import os
import deepspeed
import torch
import gradtrace

deepspeed.init_distributed(dist_backend="gloo")
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
engine, _, _, _ = deepspeed.initialize(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                                       config=os.environ["GRADTRACE_DS_CONFIG"])
cap = gradtrace.attach(engine, os.environ["GRADTRACE_OUT_DIR"])
dp, rank = int(os.environ["GRADTRACE_DP"]), int(os.environ["RANK"])
g = torch.Generator().manual_seed(1)
x, y = torch.randn(4, 8, generator=g), torch.randn(4, 1, generator=g)  # the global batch
rows = slice(rank * 4 // dp, (rank + 1) * 4 // dp)
loss = torch.nn.functional.mse_loss(engine(x[rows]), y[rows])
engine.backward(loss)
cap.record_step(loss, rows.stop - rows.start)
engine.step()
cap.close()
'''


def test_user_script_contract(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(USER_SCRIPT)
    cfg = tmp_path / "ds.json"
    cfg.write_text(json.dumps({"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 2},
                               "zero_allow_untested_optimizer": True, "steps_per_print": 1000}))
    p = command(tmp_path, "--config", cfg, "--script", script, "--dp", "2", "--sp", "1", "--releases", INSTALLED,
                "--json", tmp_path / "r.json")
    assert p.returncode == 0, p.stdout + p.stderr  # mean loss, mean reduction: equal to one rank
    row, = json.loads((tmp_path / "r.json").read_text())["rows"]
    g = scale_of(row)
    assert g["scale"] == pytest.approx(1.0, abs=1e-5) and g["count"] == 4
    assert row["vs_reference"]["verdict"] == "match"


PROBE_SCRIPT = '''
import json, os, sys
import deepspeed.comm.torch  # the module script_main patches when the package is deepspeed
m = sys.modules["deepspeed.comm.torch"]
json.dump({"argv": sys.argv, "path0": sys.path[0], "name": __name__, "file": __file__,
           "build_shm_op": m.build_shm_op.__name__, "built": repr(m.build_shm_op()) if m.build_shm_op.__name__ ==
           "<lambda>" else "not called"}, open(sys.argv[1], "w"))
'''


@pytest.mark.parametrize("package,patched", [("deepspeed", True), ("torchmetrics", False)])
def test_script_main_runs_a_script_as_python_does_and_skips_deepspeeds_shm_build(tmp_path, package, patched):
    """A user script's ranks start as `python -m gradtrace.versions.script_main SCRIPT ARGS`: the script sees the
    argv, sys.path[0], __name__ and __file__ that `python SCRIPT ARGS` gives it; under a DeepSpeed study its
    deepspeed.comm.torch has build_shm_op replaced (two minutes of g++ for an inference-only op), else not."""
    (tmp_path / "scripts").mkdir()
    script = tmp_path / "scripts" / "probe.py"
    script.write_text(PROBE_SCRIPT)
    env = deepspeed_env()
    env["GRADTRACE_PACKAGE"] = package
    p = subprocess.run([sys.executable, "-m", "gradtrace.versions.script_main", str(script), str(tmp_path / "o.json")],
                       env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    seen = json.loads((tmp_path / "o.json").read_text())
    assert seen["argv"] == [str(script), str(tmp_path / "o.json")]
    assert seen["path0"] == str(script.parent) and seen["name"] == "__main__" and seen["file"] == str(script)
    assert seen["build_shm_op"] == ("<lambda>" if patched else "build_shm_op")
    assert seen["built"] == ("None" if patched else "not called")


EMULATED = "0.11.1,0.11.2,0.12.0,0.12.2,0.13.0,0.14.0,0.14.4,0.15.0,0.19.8"  # 0.12.0: not in its table


def test_emulated_releases_table_and_first_change(tmp_path):
    p = command(tmp_path, "--config", config(tmp_path, 2), "--emulation", "--sp", "2",
                "--releases", "0.11.1,0.11.2,0.13.0", "--json", tmp_path / "r.json", "--markdown", tmp_path / "r.md")
    assert p.returncode == 1, p.stdout + p.stderr
    res = json.loads((tmp_path / "r.json").read_text())
    scales = [scale_of(r)["scale"] for r in res["rows"]]
    assert scales == [pytest.approx(1.0, abs=1e-5), pytest.approx(2.0, abs=1e-5), pytest.approx(2.0, abs=1e-5)]
    assert [r.get("vs_previous", {}).get("verdict") for r in res["rows"]] == [None, "scaled", "match"]
    assert res["transition"]["from"] == "0.11.1" and res["transition"]["to"] == "0.11.2"
    assert "First release at which anything changed: 0.11.2 (after 0.11.1)." in p.stdout
    md = (tmp_path / "r.md").read_text()
    assert "## The transition 0.11.1 -> 0.11.2" in md and "B/A = 2.000 = sp(B)" in md


@pytest.mark.parametrize("stage,good,first_bad", [(2, "0.11.1", "0.11.2"), (0, "0.11.2", "0.14.4")])
def test_bisect_over_emulated_releases(tmp_path, stage, good, first_bad):
    p = command(tmp_path, "--config", config(tmp_path, stage), "--emulation", "--sp", "2",
                "--bisect", good, "0.19.8", "--release-list", EMULATED, "--json", tmp_path / "b.json")
    assert p.returncode == 0, p.stdout + p.stderr
    b = json.loads((tmp_path / "b.json").read_text())["bisect"]
    assert b["first_bad"] == first_bad
    visited = dict(map(tuple, b["visited"]))
    assert len(visited) < len(b["candidates"]) - 2  # a search, not a sweep
    assert all(v in ("good", "bad", "skip") for v in visited.values())
    assert f"First bad release: {first_bad}" in p.stdout


def test_bisect_skips_a_release_that_does_not_run(tmp_path):
    # Between 0.11.2 and 0.14.4 only 0.12.0 (unknown to the emulation: its run fails): the answer is a range.
    p = command(tmp_path, "--config", config(tmp_path, 0), "--emulation", "--sp", "2", "--bisect", "0.11.2",
                "0.14.4", "--release-list", "0.11.2,0.12.0,0.14.4", "--json", tmp_path / "b.json")
    assert p.returncode == 1, p.stdout + p.stderr
    b = json.loads((tmp_path / "b.json").read_text())["bisect"]
    assert b["first_bad"] is None and b["skipped_between"] == ["0.12.0"] and b["first_bad_or_skipped"] == "0.14.4"
    assert b["visited"] == [["0.12.0", "skip"]]


def test_bad_input_exits_2_with_one_line(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    p = command(tmp_path, "--config", bad, "--emulation", "--releases", "0.11.1")
    assert p.returncode == 2 and str(bad) in p.stderr and len(p.stderr.strip().splitlines()) == 1
    p = command(tmp_path, "--config", config(tmp_path, 2), "--emulation", "--releases", "latest")
    assert p.returncode == 2 and "'latest' is not a release number" in p.stderr
    p = command(tmp_path, "--config", config(tmp_path, 2), "--script", tmp_path / "none.py", "--releases", "0.11.1")
    assert p.returncode == 2 and "none.py: no such script" in p.stderr
    p = command(tmp_path, "--config", config(tmp_path, 2), "--emulation", "--bisect", "0.14.0", "0.11.1")
    assert p.returncode == 2 and "GOOD must be older than BAD" in p.stderr


def test_no_build_refuses_to_create_an_environment(tmp_path):
    p = command(tmp_path, "--config", config(tmp_path, 2), "--model", "ds5248", "--releases", "0.11.1")
    assert p.returncode == 1
    row = [line for line in p.stdout.splitlines() if line.startswith("0.11.1")]
    assert row and "building is off (--no-build)" in row[0]
    assert not (tmp_path / "envs").exists()


def test_bisect_moves_past_a_good_end_that_does_not_run(tmp_path):
    p = command(tmp_path, "--config", config(tmp_path, 0), "--emulation", "--sp", "2", "--bisect", "0.12.0",
                "0.19.8", "--release-list", "0.12.0,0.12.2,0.13.0,0.14.0,0.14.4,0.19.8", "--json", tmp_path / "b.json")
    assert p.returncode == 0, p.stdout + p.stderr
    b = json.loads((tmp_path / "b.json").read_text())["bisect"]
    assert b["unrunnable_before_good"] == ["0.12.0"] and b["good"] == "0.12.2" and b["first_bad"] == "0.14.4"
    assert "GOOD 0.12.0 did not run; trying 0.12.2 as GOOD" in p.stderr


def test_a_builtin_loop_outside_a_checkout_is_bad_input(tmp_path):
    """The loops are studies (tools/repro), not the wheel: where none is found the command says so."""
    p = command(tmp_path, "--config", config(tmp_path, 2), "--model", "ds5248", "--releases", INSTALLED,
                "--checkout", tmp_path)
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert p.stderr.startswith("gradtrace-deepspeed-versions: --model ds5248: DeepSpeed's built-in loop is "
                               "tools/repro/ds5248/run.py in a gradtrace source checkout"), p.stderr


def test_the_old_module_path_still_runs_and_says_it_is_deprecated(tmp_path):
    p = subprocess.run([sys.executable, "-m", "gradtrace.deepspeed_versions", "--config", config(tmp_path, 2),
                        "--emulation", "--releases", "latest"], capture_output=True, text=True, timeout=300)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 2, p.stderr
    assert "python -m gradtrace.deepspeed_versions is deprecated" in lines[0]
    assert lines[1] == "gradtrace-deepspeed-versions: --releases: 'latest' is not a release number (e.g. 0.14.3)"
