"""gradtrace-matrix (issue 44) on a real trainer written the way torchtitan is (tests/python/matrix_trainer.py:
FSDP2 over dp, DTensor tensor parallelism, a torch.distributed.pipelining schedule, gradient accumulation, on
gloo). One grid of six layouts that run (every one must match the one-process reference, exit 0) and two that
are skipped (one declined by the script, one beyond --max-world), shared with the heatmap's screenshot; the
planted bug (the norms' gradients summed over tp again, only when tp > 1) through a torchrun launcher
template, which must flag exactly the layouts with tp = 2; --collect of that run, and the CI gate."""

import json
import os
import re
import shlex
import shutil
import subprocess
import sys

import pytest

from conftest import BUILD, ROOT

TRAINER = ROOT / "tests" / "python" / "matrix_trainer.py"
NORMS = {"layers.0.norm.weight", "layers.0.norm.bias", "layers.1.norm.weight", "layers.1.norm.bias", "norm.weight",
         "norm.bias"}


def matrix(*args, cwd=None, timeout=900):
    """The command, with this build's gradtrace-diff and .venv's torchrun first on PATH."""
    path = os.pathsep.join([str(BUILD / "bin"), os.path.dirname(sys.executable), os.environ["PATH"]])
    env = dict(os.environ, PATH=path, GRADTRACE_BUILD_DIR=str(BUILD))
    return subprocess.run([sys.executable, "-m", "gradtrace.matrix", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, cwd=cwd, env=env)


def readme_command():
    """The README's gradtrace-matrix line, as words."""
    text = (ROOT / "README.md").read_text()
    (block,) = [b for b in re.findall(r"^```sh\n(.*?)^```", text, re.S | re.M) if "gradtrace-matrix --script" in b]
    (line,) = [x.split("  #")[0].strip() for x in block.splitlines() if x.strip()]
    return shlex.split(line)


@pytest.fixture(scope="module")
def grid(tmp_path_factory):
    """The README's grid (dp=1,2 x tp=1,2 x gas=1,2) with its train.py this trainer, and three more layouts:
    pp 2; pp 2 with dp 2 (the trainer declines it); dp 4 x tp 4 (world 16 > --max-world 4)."""
    d = tmp_path_factory.mktemp("matrix")
    words = readme_command()
    assert words[:3] == ["gradtrace-matrix", "--script", "train.py"] and "--html" in words, words
    args = [TRAINER if w == "train.py" else d / "m.html" if w.endswith(".html") else w for w in words[1:]]
    p = matrix(*args, "--layout", "pp=2", "--layout", "pp=2,dp=2", "--layout", "dp=4,tp=4", "--max-world", "4",
               "--out", d / "runs", "--json", d / "m.json", "--markdown", d / "m.md", cwd=d)
    return d, p, json.loads((d / "m.json").read_text()) if (d / "m.json").exists() else None


def by_name(m):
    return {r["name"]: r for r in m["layouts"]}


GRID = ["dp1-tp1-gas1-pp1", "dp1-tp1-gas2-pp1", "dp1-tp2-gas1-pp1", "dp1-tp2-gas2-pp1", "dp2-tp1-gas1-pp1",
        "dp2-tp1-gas2-pp1", "dp2-tp2-gas1-pp1", "dp2-tp2-gas2-pp1", "dp1-tp1-gas1-pp2"]


def test_every_layout_of_a_correct_trainer_matches(grid):
    d, p, m = grid
    assert p.returncode == 0, p.stdout + p.stderr[-3000:]
    rows = by_name(m)
    assert list(rows) == GRID + ["dp2-tp1-gas1-pp2", "dp4-tp4-gas1-pp1"]
    assert m["reference"] == {"name": "dp1-tp1-gas1-pp1", "layout": {"dp": 1, "tp": 1, "gas": 1, "pp": 1}}
    ran = [rows[n] for n in GRID[1:]]
    assert [(r["world"], r["status"], r["verdict"], r["diff_exit"], r["worst_scale"]) for r in ran] == \
        [(w, "ran", "match", 0, None) for w in (1, 2, 2, 2, 2, 4, 4, 2)]
    for r in ran:  # every parameter of the model, each within the diff's tolerance of the reference's
        assert len(r["params"]) == 17 and {q["verdict"] for q in r["params"]} == {"match"}, r["name"]
        assert all(abs(q["scale"] - 1) < 1e-4 for q in r["params"]), r["name"]
    declined, too_big = rows["dp2-tp1-gas1-pp2"], rows["dp4-tp4-gas1-pp1"]
    assert (declined["status"], declined["run_exit"]) == ("skipped", 77)
    assert declined["reason"] == ("declined by the script (exit 77): matrix_trainer: pp=2 with dp=2, tp=1 is not "
                                  "built here")
    assert (too_big["status"], too_big["run_exit"], too_big["reason"]) == ("skipped", None,
                                                                          "world 16 > --max-world 4")
    assert m["summary"] == "10 layouts against dp1-tp1-gas1-pp1: 8 match, 2 skipped" and m["exit_code"] == 0
    assert p.stdout.splitlines()[0] == f"gradtrace-matrix: {m['summary']}"
    progress = [x for x in p.stderr.splitlines() if x.startswith("[gradtrace-matrix ")]
    assert len([x for x in progress if "running" in x]) == 10 and progress[-1].endswith("world 16 > --max-world 4")
    assert "| dp2-tp2-gas2-pp1 | 4 | match | 0 | 1.000 | - | gradients match |" in (d / "m.md").read_text()


@pytest.mark.skipif(shutil.which("chromium") is None, reason="chromium not installed (tools/setup --for-tests)")
def test_the_heatmap_renders_in_a_real_browser(grid):
    d, p, m = grid
    chromium = ["chromium", "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={d / 'chromium'}"]
    dom = subprocess.run(chromium + ["--dump-dom", (d / "m.html").as_uri()], capture_output=True, text=True,
                         timeout=120).stdout
    # 8 compared layouts x 17 parameters, each cell a link to that layout's own diff report
    assert dom.count('href="runs/reports/') == 8 * 17 + 8 + 8
    assert dom.count('background:#e6f4ea') == 8 * 17 + 1  # + the legend
    png = d / "m.png"
    subprocess.run(chromium + ["--hide-scrollbars", "--window-size=1000,1400", f"--screenshot={png}",
                               (d / "m.html").as_uri()], capture_output=True, timeout=120)
    assert png.stat().st_size > 20000  # a page with a drawn table, not a blank one
    for r in m["layouts"][1:9]:
        assert (d / "runs" / "reports" / f"{r['name']}.html").is_file(), r["name"]


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """The planted bug through the launcher template (local torchrun), and the expectation it writes."""
    d = tmp_path_factory.mktemp("planted")
    p = matrix("--script", TRAINER, "--args", "--bug tp-norm", "--grid", "dp=1,2", "tp=1,2", "--launcher",
               "torchrun --nproc-per-node {world} {script} {args}", "--out", d / "runs",
               "--json", d / "m.json", "--write-expect", d / "expect.json", cwd=d)
    return d, p, json.loads((d / "m.json").read_text()) if (d / "m.json").exists() else None


def test_a_bug_in_one_axis_flags_exactly_the_layouts_with_it(planted):
    d, p, m = planted
    assert p.returncode == 1, p.stdout + p.stderr[-3000:]
    rows = by_name(m)
    assert {n: r["verdict"] for n, r in rows.items()} == {"dp1-tp1": "reference", "dp1-tp2": "scaled",
                                                           "dp2-tp1": "match", "dp2-tp2": "scaled"}
    for name in ("dp1-tp2", "dp2-tp2"):
        r = rows[name]
        assert r["diff_exit"] == 1 and abs(r["worst_scale"] - 2.0) < 1e-4 and r["first_step"] == 0
        scaled = {q["name"] for q in r["params"] if q["verdict"] == "scaled"}
        assert scaled == NORMS, name  # exactly the norms, each 2.000 x the reference's
        assert all(abs(q["scale"] - 2) < 1e-4 for q in r["params"] if q["name"] in NORMS)
        assert "tp(B)" in r["cause"], r["cause"]
    assert m["summary"] == "3 layouts against dp1-tp1: 1 match, 2 differ (dp1-tp2, dp2-tp2)"
    log = (d / "runs" / "dp1-tp2.log").read_text()
    assert log.startswith(f"+ torchrun --nproc-per-node 2 {TRAINER} --bug tp-norm\n")


def test_collect_judges_trace_sets_captured_elsewhere_and_the_ci_gate(planted, tmp_path):
    d, _, m = planted
    p = matrix("--collect", d / "runs", "--json", tmp_path / "c.json", cwd=tmp_path)
    assert p.returncode == 1, p.stderr
    collected = json.loads((tmp_path / "c.json").read_text())
    assert [(r["name"], r["verdict"], r["worst_scale"]) for r in collected["layouts"]] == \
        [(r["name"], r["verdict"], r["worst_scale"]) for r in m["layouts"]]
    assert collected["collected_from"] == str(d / "runs") and collected["script"] is None
    # The expectation the planted run wrote accepts its factors: the gate holds (exit 0) ...
    expectation = json.loads((d / "expect.json").read_text())
    assert expectation["layouts"]["dp1-tp2"]["scales"] == {n: 2.0 for n in sorted(NORMS)}
    held = matrix("--collect", d / "runs", "--expect", d / "expect.json", cwd=tmp_path)
    assert held.returncode == 0, held.stdout + held.stderr
    assert held.stdout.rstrip().endswith("expectation " + str(d / "expect.json") + ": held")
    # ... and breaks on a divergence it did not accept (exit 1), naming it.
    expectation["layouts"]["dp1-tp2"] = {"verdict": "match", "scales": {}}
    (tmp_path / "strict.json").write_text(json.dumps(expectation))
    broken = matrix("--collect", d / "runs", "--expect", tmp_path / "strict.json", cwd=tmp_path)
    assert broken.returncode == 1
    assert "  dp1-tp2: verdict scaled, expected match" in broken.stdout.splitlines()


@pytest.mark.parametrize("args, message", [
    (["--grid", "dp=1,2"], "give --script (run the grid) or --collect DIR"),
    (["--script", "x.py"], "--script needs layouts"),
    (["--script", "x.py", "--grid", "dp=0,2"], "dp=0: a value must be a positive integer"),
    (["--script", "x.py", "--grid", "dp=1,2", "dp=1"], "--grid: an axis is given twice"),
    (["--script", "absent.py", "--grid", "dp=1,2"], "--script absent.py: no such file"),
    (["--script", TRAINER, "--grid", "dp=1,2", "--args", "--tp {tpp}"], "unknown placeholder {tpp}"),
    (["--collect", "absent"], "--collect absent: no such directory"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, message):
    p = matrix(*args, "--out", tmp_path / "out", cwd=tmp_path)
    assert p.returncode == 2, p.stdout + p.stderr
    assert message in p.stderr and len(p.stderr.strip().splitlines()) <= 2, p.stderr
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_hostile_folder_names_and_expectations(planted, tmp_path):
    """A folder name from --collect reaches the terminal escaped and the HTML escaped; a malformed expectation
    is one line and exit 2."""
    d, _, _ = planted
    grid_dir = tmp_path / "grid"
    grid_dir.mkdir()
    shutil.copytree(d / "runs" / "dp1-tp1", grid_dir / "dp1-tp1")
    shutil.copytree(d / "runs" / "dp2-tp1", grid_dir / "x\x1b[31m<b>")
    p = matrix("--collect", grid_dir, "--html", tmp_path / "m.html", cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "\x1b" not in p.stdout and "x\\x1b[31m<b>" in p.stdout
    page = (tmp_path / "m.html").read_text()
    assert "<b>" not in page and "x\x1b[31m&lt;b&gt;" in page
    (tmp_path / "bad.json").write_text(json.dumps({"schema_version": "1.0", "layouts": {"dp2-tp1": {
        "verdict": "match", "scales": {"norm.weight": "two"}}}}))
    bad = matrix("--collect", grid_dir, "--expect", tmp_path / "bad.json", cwd=tmp_path)
    assert bad.returncode == 2 and bad.stderr.strip().splitlines() == [
        f"gradtrace-matrix: {tmp_path / 'bad.json'}: layout 'dp2-tp1': expected "
        '{"verdict": ..., "scales": {name: number}}']


TINY = '''
import json, os, sys
import numpy as np
import gradtrace

layout = json.loads(os.environ["GRADTRACE_LAYOUT"])
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
if layout["tp"] == 2:
    print("tiny: tp 2 is broken here", file=sys.stderr)
    sys.exit(3)
if layout["tp"] == 4:
    sys.exit(0)  # trains, captures nothing
info = {"rank": rank, "params": [{"name": "w", "shape": [4], "dtype": "fp32"}]}
os.makedirs(os.environ["GRADTRACE_OUT_DIR"], exist_ok=True)
with gradtrace.TraceWriter(os.path.join(os.environ["GRADTRACE_OUT_DIR"], f"rank-{rank:05d}.gtrace"), info) as w:
    w.write_step({"step": 0, "loss": 1.0})
    w.write_bucket({"step": 0, "phase": "FINAL",
                    "slices": [{"param_id": 0, "values": np.arange(4, dtype=np.float32), "mode": "full"}]})
'''


def test_a_layout_that_fails_or_writes_nothing_is_listed_as_failed(tmp_path):
    """A script without torch (a trace written with gradtrace.TraceWriter): tp 2 exits 3, tp 4 exits 0 without a
    trace. Both rows say so, with the log; the matrix exits 1; the layout that ran matches."""
    script = tmp_path / "tiny.py"
    script.write_text(TINY)
    p = matrix("--script", script, "--grid", "tp=1,2,4", "--layout", "tp=8", "--max-world", "4", "--out",
               tmp_path / "runs", "--json", tmp_path / "m.json", cwd=tmp_path, timeout=300)
    assert p.returncode == 1, p.stdout + p.stderr
    rows = by_name(json.loads((tmp_path / "m.json").read_text()))
    assert [(n, r["status"], r["run_exit"]) for n, r in rows.items()] == [
        ("tp1", "ran", 0), ("tp2", "failed", 3), ("tp4", "failed", 0), ("tp8", "skipped", None)]
    assert rows["tp2"]["reason"] == f"exit 3: tiny: tp 2 is broken here (log: {tmp_path / 'runs' / 'tp2.log'})"
    assert rows["tp4"]["reason"] == f"the script exited 0 but wrote no trace into {tmp_path / 'runs' / 'tp4'}"
    assert rows["tp1"]["verdict"] == "reference" and rows["tp2"]["verdict"] == ""
    assert "1 layouts" not in p.stdout and p.stdout.splitlines()[0] == (
        "gradtrace-matrix: 3 layouts against tp1: 0 match, 2 failed (tp2, tp4), 1 skipped")


def test_a_reference_that_does_not_run_stops_the_matrix_in_one_line(tmp_path):
    script = tmp_path / "broken.py"
    script.write_text("import sys\nprint('broken: no model here', file=sys.stderr)\nsys.exit(1)\n")
    p = matrix("--script", script, "--grid", "dp=1,2", "--out", tmp_path / "runs", cwd=tmp_path, timeout=120)
    assert p.returncode == 2, p.stdout + p.stderr
    assert p.stderr.splitlines()[-1] == (
        f"gradtrace-matrix: the reference dp1 did not run (failed: exit 1: broken: no model here (log: "
        f"{tmp_path / 'runs' / 'dp1.log'})); nothing to compare")
    assert not (tmp_path / "runs" / "dp2.log").exists()  # nothing else was started
