"""gradtrace-versions (python/gradtrace/versions/command.py) on packages other than DeepSpeed, with their real
releases from PyPI, each in its own environment over this interpreter (built in the test's folder):

- pytorch-msssim (wheels of 5-8 kB, torch only): `--bisect 0.1.1 1.0.0` over PyPI's 8 releases names 0.2.0,
  where its README's "Updates" says MS-SSIM was recomputed "in the same way as tensorflow and skimage"
  (2020.04.30, v0.2; VainF/pytorch-msssim commit 0180eae);
- torchmetrics (wheels of ~0.5 MB; lightning-utilities resolved into each release's env): `--bisect 1.3.1
  1.4.1` names 1.4.0, whose CHANGELOG says "Fixed bug in computation of `ERGAS` metric (#2498)": the gradient
  through ERGAS is 1/ratio**2 = 1/16 of 1.3.x's, which gradtrace-diff measures as B/A = 0.0625;
- torchmetrics `--transitions 1.0.0 1.6.0` with a script through ERGAS and SSIM (torchmetrics_two_changes.py)
  names both changes, 1.4.0 (ERGAS 1/16) and 1.4.2 (SSIM), in 10 runs where a sweep runs 21; its JSON follows
  result.schema.json and each transition's command reproduces it from the cache;
- a second call runs nothing (the cache); bad input exits 2 with one line.

The scripts (tests/python/versions_scripts/) capture with gradtrace.manual_adapter into GRADTRACE_OUT_DIR.
Needs PyPI (the test downloads about 4 MB).
"""

import json
import re
import shlex
import subprocess
import sys

import jsonschema
import pytest

from conftest import BUILD, ROOT, deepspeed_env

SCRIPTS = ROOT / "tests" / "python" / "versions_scripts"


def command(tmp, *args, timeout=900):
    env = deepspeed_env()
    env["GRADTRACE_BUILD_DIR"] = str(BUILD)
    cmd = [sys.executable, "-m", "gradtrace.versions", "--cache-dir", str(tmp / "cache"), "--env-root",
           str(tmp / "envs"), *map(str, args)]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


def bisect_run(tmp, package, script, good, bad):
    p = command(tmp, "--package", package, "--script", SCRIPTS / script, "--bisect", good, bad,
                "--json", tmp / "b.json", "--markdown", tmp / "b.md")
    res = json.loads((tmp / "b.json").read_text()) if (tmp / "b.json").exists() else None
    return p, res


def row(res, release):
    return next(r for r in res["rows"] if r["release"] == release)


@pytest.fixture(scope="module")
def msssim(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("msssim")
    return (tmp, *bisect_run(tmp, "pytorch-msssim", "msssim_denoise.py", "0.1.1", "1.0.0"))


def readme_versions_line():
    """The README's gradtrace-versions example, as words: this module runs it with its train.py."""
    text = (ROOT / "README.md").read_text()
    (block,) = [b for b in re.findall(r"^```sh\n(.*?)^```", text, re.S | re.M) if "gradtrace-versions --package" in b]
    (line,) = [x.split("  #")[0].strip() for x in block.splitlines() if x.strip()]
    return shlex.split(line)


@pytest.fixture(scope="module")
def ergas(tmp_path_factory):
    """The README's example as written (its train.py: torchmetrics_ergas.py), with this module's cache."""
    tmp = tmp_path_factory.mktemp("torchmetrics")
    words = readme_versions_line()
    assert words[0] == "gradtrace-versions" and words[words.index("--script") + 1] == "train.py", words
    args = [SCRIPTS / "torchmetrics_ergas.py" if w == "train.py" else w for w in words[1:]]
    p = command(tmp, *args, "--json", tmp / "b.json", "--markdown", tmp / "b.md")
    res = json.loads((tmp / "b.json").read_text()) if (tmp / "b.json").exists() else None
    return tmp, p, res


def test_bisect_names_pytorch_msssim_0_2_0(msssim):
    _, p, res = msssim
    assert p.returncode == 0, p.stdout + p.stderr
    b = res["bisect"]
    assert b["candidates"] == ["0.1.1", "0.1.2", "0.1.3", "0.1.4", "0.1.5", "0.2.0", "0.2.1", "1.0.0"]
    assert b["first_bad"] == "0.2.0" and b["last_good"] == "0.1.5"
    assert len(b["visited"]) == 3  # a search over the 6 between, not a sweep
    assert "First bad release: 0.2.0 (last good 0.1.5" in p.stdout
    # the loss the script recorded: 1 - MS-SSIM, as each release computes it (measured)
    assert row(res, "0.1.1")["loss"] == pytest.approx(0.0331124, abs=1e-6)
    assert row(res, "0.2.0")["loss"] == pytest.approx(0.0214304, abs=1e-6)
    good, = row(res, "0.1.5")["vs_reference"]["groups"]  # float64: the same computation to ~1e-14
    assert good["kind"] == "scale" and good["scale"] == pytest.approx(1.0, abs=1e-9) and good["residual"] < 1e-12
    bad = row(res, "0.2.0")["vs_reference"]
    assert bad["verdict"] == "mismatch"
    kinds = {g["kind"]: g for g in bad["groups"]}
    assert kinds["mismatch"]["params"] == ["weight"]  # the 3x3 kernel's gradient is no multiple of 0.1.5's
    assert kinds["scale"]["params"] == ["bias"] and kinds["scale"]["scale"] == pytest.approx(0.2530, abs=1e-3)


def test_bisect_names_torchmetrics_1_4_0_and_measures_one_sixteenth(ergas):
    _, p, res = ergas
    assert p.returncode == 0, p.stdout + p.stderr
    b = res["bisect"]
    assert b["candidates"] == ["1.3.1", "1.3.2", "1.4.0", "1.4.0.post0", "1.4.1"]  # post releases are releases
    assert b["first_bad"] == "1.4.0" and b["last_good"] == "1.3.2"
    g, = row(res, "1.4.0")["vs_reference"]["groups"]
    assert g["kind"] == "scale" and g["scale"] == pytest.approx(1 / 16, rel=1e-4) and g["count"] == 2
    assert g["residual"] < 1e-5
    assert row(res, "1.3.1")["loss"] / row(res, "1.4.0")["loss"] == pytest.approx(16.0, rel=1e-5)
    assert "First bad release: 1.4.0 (last good 1.3.2" in p.stdout
    md = (res and (ergas[0] / "b.md").read_text())
    assert md.startswith("# torchmetrics versions compared with gradtrace")
    assert "## The transition 1.3.2 -> 1.4.0" in md and "0.0625" in md
    # A bisection compares every visited release with GOOD, and its table says so.
    assert "| vs good end (1.3.1) |" in md and "vs previous" not in md
    assert "vs good end (1.3.1)" in p.stdout


def test_release_envs_hold_only_what_the_base_lacks(ergas):
    tmp, _, res = ergas
    env = tmp / "envs" / "torchmetrics-1.4.0"
    site, = env.glob("lib/python3*/site-packages")
    assert (site / "torchmetrics").is_dir()
    # lightning-utilities, torchmetrics' dependency, only when the base lacks it (Lightning brings it since issue 41)
    import importlib.util

    assert (site / "lightning_utilities").is_dir() == (importlib.util.find_spec("lightning_utilities") is None)
    assert not (site / "torch").exists()  # the base's torch, held by the constraint
    assert (env / ".gradtrace-spec").read_text().startswith("torchmetrics==1.4.0\ndeps=resolve\n")


def test_second_call_runs_nothing(ergas):
    tmp, _, first = ergas
    p, res = bisect_run(tmp, "torchmetrics", "torchmetrics_ergas.py", "1.3.1", "1.4.1")
    assert p.returncode == 0, p.stdout + p.stderr
    assert res["runs_executed"] == 0 and all(r["cached"] for r in res["rows"])
    assert res["bisect"]["first_bad"] == "1.4.0" and res["bisect"]["visited"] == first["bisect"]["visited"]


@pytest.mark.parametrize("args,message", [
    (["--package", "bad name!", "--script", "x.py", "--releases", "1.0"], "not a PyPI distribution name"),
    (["--package", "torchmetrics", "--model", "ds5248", "--releases", "1.0"], "--model is DeepSpeed's"),
    (["--package", "deepspeed", "--emulation", "--releases", "0.11.1"], "--config: DeepSpeed needs its config"),
    (["--package", "torchmetrics", "--script", SCRIPTS / "torchmetrics_ergas.py", "--releases", "latest"],
     "'latest' is not a release number"),
    (["--package", "torchmetrics", "--script", SCRIPTS / "torchmetrics_ergas.py", "--bisect", "1.4.0", "1.3.0"],
     "GOOD must be older than BAD"),
    # issue 42: an empty list ended in a traceback (None reached version_key through the --from path)
    (["--package", "torchmetrics", "--script", SCRIPTS / "torchmetrics_ergas.py", "--releases", ""],
     "--releases '': no release given (e.g. --releases 1.3.1,1.4.0)"),
    (["--package", "torchmetrics", "--script", SCRIPTS / "torchmetrics_ergas.py", "--releases", " , "],
     "--releases ' , ': no release given"),
    (["--package", "torchmetrics", "--script", SCRIPTS / "torchmetrics_ergas.py", "--transitions", "1.4.0", "1.3.0"],
     "--transitions 1.4.0 1.3.0: GOOD must be older than BAD"),
    (["--package", "torchmetrics", "--script", SCRIPTS / "torchmetrics_ergas.py", "--transitions", "1.3.0", "1.4.0",
      "--probe-every", "0"], "--probe-every 0: expected an integer >= 1"),
])
def test_bad_input_exits_2_with_one_line(tmp_path, args, message):
    p = command(tmp_path, *args)
    assert p.returncode == 2 and message in p.stderr, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and p.stderr.startswith("gradtrace-versions: ")
    assert not (tmp_path / "envs").exists()


def test_a_failed_diff_is_never_a_change(tmp_path):
    # 0.1.5 trains one convolution, 0.2.0 and 0.2.1 two: 0.1.5 -> 0.2.0 cannot be compared (no parameter in common),
    # 0.2.0 -> 0.2.1 is the same computation (plain SSIM did not change: the module docstring above).
    p = command(tmp_path, "--package", "pytorch-msssim", "--script", SCRIPTS / "msssim_model_by_release.py",
                "--releases", "0.1.5,0.2.0,0.2.1", "--reference", "first", "--json", tmp_path / "s.json",
                "--markdown", tmp_path / "s.md")
    res = json.loads((tmp_path / "s.json").read_text())
    assert p.returncode == 1, p.stdout + p.stderr  # the reference diffs of 0.2.x failed: not all the same
    assert [r["status"] for r in res["rows"]] == ["ok", "ok", "ok"]
    failed = row(res, "0.2.0")["vs_previous"]
    assert failed["previous"] == "0.1.5" and "no parameter in common" in failed["error"]
    assert row(res, "0.2.1")["vs_previous"]["verdict"] == "match"
    assert "transition" not in res
    assert "First release at which anything changed" not in p.stdout
    assert "No change was measured. Not compared (the diff failed, so nothing was measured): 0.1.5 -> 0.2.0." \
        in p.stdout
    md = (tmp_path / "s.md").read_text()
    assert "NOT COMPARED with 0.1.5: diff failed" in md and "CHANGED" not in md


def test_a_bisect_whose_ends_cannot_be_compared_says_so(tmp_path):
    p = command(tmp_path, "--package", "pytorch-msssim", "--script", SCRIPTS / "msssim_model_by_release.py",
                "--bisect", "0.1.5", "0.2.1")
    assert p.returncode == 1, p.stdout + p.stderr  # RunFailed: as when BAD does not run
    last = p.stderr.strip().splitlines()[-1]
    assert "GOOD 0.1.5 and BAD 0.2.1 could not be compared (the diff failed:" in last and "no parameter in common" in last
    assert "First bad release" not in p.stdout


def test_a_change_next_to_failed_releases_is_given_as_a_range():
    # The committed DeepSpeed PipelineEngine sweep (tools/repro/ds_pipe/README.md): 0.18.3 and 0.18.4 fail to run,
    # so the change measured between 0.18.2 and 0.18.5 may belong to any of the three.
    from gradtrace.versions import report

    res = json.loads((ROOT / "tools" / "repro" / "ds_pipe" / "results" / "sweep-0.18.0-0.19.8.json").read_text())
    assert report.transitions(res["rows"]) == [("0.18.2", "0.18.5"), ("0.19.2", "0.19.3")]
    assert report.failed_between(res["rows"], "0.18.2", "0.18.5") == ["0.18.3", "0.18.4"]
    assert report.conclusion(res) == ("First release at which anything changed: **0.18.3, 0.18.4 or 0.18.5** (after "
                                      "0.18.2; 0.18.3 and 0.18.4 failed to run). Later changes: 0.19.2 -> 0.19.3.")


# ---- --transitions on real releases: torchmetrics 1.0.0..1.6.0, two changes ----------------------------------

@pytest.fixture(scope="module")
def two_changes(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("transitions")
    args = ["--package", "torchmetrics", "--script", SCRIPTS / "torchmetrics_two_changes.py"]
    p = command(tmp, *args, "--transitions", "1.0.0", "1.6.0", "--json", tmp / "t.json", "--markdown", tmp / "t.md")
    return tmp, args, p, json.loads((tmp / "t.json").read_text())


def test_transitions_finds_both_torchmetrics_changes_in_fewer_runs_than_a_sweep(two_changes):
    tmp, _, p, res = two_changes
    assert p.returncode == 1, p.stderr[-3000:]  # changes found
    t = res["transitions"]
    assert [(c["before"], c["after"], c["failed_between"]) for c in t["changes"]] == [("1.3.2", "1.4.0", []),
                                                                                      ("1.4.1", "1.4.2", [])]
    # 21 published releases from 1.0.0 to 1.6.0 (PyPI, yanked ones left out); 10 run: the ends, 4 on the grid of
    # every 4th release, 4 splitting the two segments whose ends differ
    assert (t["sweep_runs"], t["runs"], res["runs_executed"], t["every"]) == (21, 10, 10, 4)
    assert t["failed"] == [] and t["not_compared"] == []
    ergas, ssim = ({g["kind"]: g for g in c["groups"] if g["kind"] != "scale" or g["scale"] != 1.0}
                   for c in t["changes"])
    assert ergas["scale"]["scale"] == 0.0625 and set(ergas["scale"]["params"]) == {"ergas.weight", "ergas.bias"}
    assert ergas["scale"]["cause"] == "unexplained"
    assert set(ssim["mismatch"]["params"]) == {"ssim.weight", "ssim.bias"}
    assert t["unentered"] == [["1.0.0", "1.1.0"], ["1.1.0", "1.2.1"], ["1.2.1", "1.3.1"], ["1.4.0", "1.4.1"],
                              ["1.4.3", "1.6.0"]]
    jsonschema.validate(res, json.loads((ROOT / "python" / "gradtrace" / "versions" / "result.schema.json").read_text()))
    md = (tmp / "t.md").read_text()
    assert "2 releases changed the gradients: **1.4.0** (after 1.3.2), **1.4.2** (after 1.4.1)." in md
    assert "10 of the 21 releases run (a sweep runs 21); probed every 4 releases, then each range whose ends " \
           "differ split." in md
    assert "| 1.4.0 | 1.3.2 | 0.0625 x2 (res 0.0e+00); 1.0000 = 1 x2 (res 0.0e+00) | unexplained |" in md
    assert "## The transition 1.4.1 -> 1.4.2 (gradtrace-diff 1.4.1 1.4.2)" in md


def test_a_transitions_reproduce_command_reproduces_it_from_the_cache(two_changes):
    tmp, _, _, res = two_changes
    second = res["transitions"]["changes"][1]
    argv = shlex.split(second["command"])
    assert argv[0] == "gradtrace-versions" and argv[-2:] == ["--releases", "1.4.1,1.4.2"]
    p = command(tmp, *argv[1:], "--json", tmp / "r.json")  # the cache: nothing runs again
    again = json.loads((tmp / "r.json").read_text())
    assert p.returncode == 1 and again["runs_executed"] == 0
    assert again["transition"]["from"] == "1.4.1" and again["transition"]["to"] == "1.4.2"
