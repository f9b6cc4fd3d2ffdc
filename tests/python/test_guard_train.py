"""gradtrace-train's live guard (--capture guard, capture/train/guard_sink.h) on real multi-process gloo runs of the
LibTorch binary: each checked step is recorded in sketch mode, gathered on the guard's own gloo group, and judged
by gradtrace-diff --self's own code on every rank.

Asserted: correct layouts (dp, Ulysses sp, ZeRO-2 with accumulation) stay silent; the #5248 loss (a local mean per
sp shard under DeepSpeed's dp_world/sp division) is flagged at step 0 with the words and cause of
`gradtrace-diff --self` on a trace of the very same run (sketch:16+guard writes both); --guard-on-violation raise
stops every rank at the violating step with exit 1; --guard-every samples; a rank that dies ends the run without
a hang and the survivor's log keeps its summary; bad options are usage errors (exit 2)."""

import json
import os
import re
import subprocess

from conftest import BUILD, ROOT, SMALL_TRAIN

TRAIN = BUILD / "bin" / "gradtrace-train"
DIFF = BUILD / "bin" / "gradtrace-diff"
BASE = [a for i, a in enumerate(SMALL_TRAIN) if "--steps" not in SMALL_TRAIN[max(i - 1, 0):i + 1]]  # steps are ours
SP2_5248 = ["--nproc", "2", "--dp", "1", "--sp", "2", "--scaling", "ds-4530"]


def _train(out, *args, env=None, timeout=240):
    """gradtrace-train into `out`, its TMPDIR (the guard's private files) beside it."""
    cmd = [str(TRAIN), *BASE, "--out", str(out), *map(str, args)]
    env = dict(env or os.environ, TMPDIR=str(out.parent))
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)


def _events(out, rank=0):
    return [json.loads(line) for line in (out / f"rank-{rank:05d}.guard.jsonl").read_text().splitlines()]


def _summary(out, rank=0):
    (s,) = [e for e in _events(out, rank) if e["event"] == "summary"]
    return s


def _lines(stderr):
    """The violation lines (--nproc prefixes each rank's lines with "[rank R] ")."""
    lines = [re.sub(r"^\[rank \d+\] ", "", line) for line in stderr.splitlines()]
    return [line for line in lines if line.startswith("gradtrace guard: rank 0: step ")]


def test_correct_layouts_are_silent(tmp_path):
    for name, args, world in [
        ("dp2", ["--nproc", "2", "--dp", "2", "--sp", "1"], 2),
        ("sp2-fixed", [*SP2_5248, "--loss", "local-mean-div-sp"], 2),
        ("dp2-sp2-zero2-gas2", ["--nproc", "4", "--dp", "2", "--sp", "2", "--zero-stage", "2", "--gas", "2",
                                "--scaling", "ds-4530", "--loss", "local-mean-div-sp"], 4),
    ]:
        out = tmp_path / name
        p = _train(out, "--capture", "guard", "--steps", "3", *args)
        assert p.returncode == 0, p.stderr
        assert _lines(p.stderr) == [], (name, p.stderr)
        assert "gradtrace guard: rank 0: 3 steps checked, 0 violations; log " in p.stderr, (name, p.stderr)
        assert "--capture guard: no trace written" in p.stderr
        assert not list(out.glob("*.gtrace")), "guard alone writes no trace"
        for rank in range(world):
            events = _events(out, rank)
            assert [e["event"] for e in events][0] == "attach" and events[0]["world"] == world
            s = _summary(out, rank)
            assert (s["steps_checked"], s["violations"], s["disabled"]) == (3, 0, None), (name, rank, s)
            assert 0 < s["bytes_sent_per_step"] < 200_000
        assert not list(tmp_path.glob("gradtrace-guard-*")), "the guard's private files are removed"


def test_5248_flagged_at_step_0_in_self_words(tmp_path):
    out = tmp_path / "bug"
    p = _train(out, "--capture", "sketch:16+guard", "--steps", "2", *SP2_5248, "--loss", "local-mean")
    assert p.returncode == 0, p.stderr  # warn: the run goes on
    lines = _lines(p.stderr)
    assert len(lines) == 1 and lines[0].startswith("gradtrace guard: rank 0: step 0: bucket"), p.stderr
    for rank in (0, 1):
        found = [e for e in _events(out, rank) if e["event"] == "violation"]
        assert [e["step"] for e in found] == [0, 1], found  # the repeat at step 1 is logged and counted, not said
        assert all(e["check"] == "divisor" and abs(e["divisor"] - 1.0) < 1e-6 for e in found)
        s = _summary(out, rank)
        assert (s["steps_checked"], s["violations"], s["by_check"]) == (2, 2, {"divisor": 2})
    # gradtrace-diff --self on the trace the same run wrote: the same group, cause and words
    j = tmp_path / "self.json"
    d = subprocess.run([str(DIFF), "--self", str(out), "--step", "0", "--json", str(j)], capture_output=True, text=True,
                       timeout=120)
    assert d.returncode == 1, d.stderr
    report = json.loads(j.read_text())
    (group,) = [g for g in report["groups"] if g["kind"] == "divisor"]
    first = [e for e in _events(out) if e["event"] == "violation"][0]
    assert (first["message"], first["cause"], first["params"]) == (group["explanation"], group["cause"],
                                                                   group["params"])
    assert group["cause"] != "" and abs(group["scale"] - 1.0) < 1e-6
    assert lines[0].endswith(group["explanation"])


def test_raise_stops_every_rank_at_the_violating_step(tmp_path):
    out = tmp_path / "raise"
    p = _train(out, "--capture", "guard", "--guard-on-violation", "raise", "--steps", "3", *SP2_5248, "--loss",
               "local-mean")
    assert p.returncode == 1, p.stderr
    assert len(_lines(p.stderr)) == 1
    for rank in (0, 1):
        assert f"rank {rank}: the guard found 1 violation at step 0 (--guard-on-violation raise)" in p.stderr
        s = _summary(out, rank)
        assert (s["steps_checked"], s["violations"]) == (1, 1)


def test_every_samples_after_the_first_steps(tmp_path):
    out = tmp_path / "every"
    p = _train(out, "--capture", "guard", "--guard-every", "3", "--steps", "10", "--nproc", "1", "--dp", "1")
    assert p.returncode == 0, p.stderr
    s = _summary(out)
    assert (s["steps_checked"], s["violations"], s["every"]) == (6, 0, 3)  # steps 0, 1, 2, 3, 6, 9
    scopes = {e["check"]: e["message"] for e in _events(out) if e["event"] == "scope"}
    assert scopes["sampling"] == "from step 4 on, one step in 3 is checked (those divisible by 3)"
    assert scopes["replicas"] == "replicas is not checked: one rank: no replica to compare"
    assert "gradtrace guard: note: replicas is not checked: one rank" in p.stderr


def test_a_dead_rank_ends_the_run_without_a_hang(tmp_path):
    out = tmp_path / "dies"
    env = dict(os.environ, GRADTRACE_TEST_KILL="1:2")
    p = _train(out, "--capture", "guard", "--steps", "4", "--nproc", "2", "--dp", "2", "--timeout", "30", env=env,
               timeout=200)
    assert p.returncode != 0 and "rank 1 was killed by signal" in p.stderr, p.stderr
    assert "step 2/4" in p.stderr and _lines(p.stderr) == []  # steps 0 and 1 were checked, silently
    # The launcher stops rank 0 (SIGTERM): its log keeps every line written, each whole, and no violation.
    events = _events(out, 0)
    assert [e["event"] for e in events][:1] == ["attach"] and not [e for e in events if e["event"] == "violation"]


def test_bad_guard_options_are_usage_errors(tmp_path):
    for args, says in [(["--capture", "guard"], "--out DIR is required"),
                       (["--capture", "guard", "--guard-on-violation", "stop"], "--guard-on-violation"),
                       (["--capture", "guard", "--guard-every", "0"], "--guard-every")]:
        cmd = [str(TRAIN), *BASE, *args] + ([] if "--out DIR" in says else ["--out", str(tmp_path / "x")])
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        assert p.returncode == 2 and says in p.stderr, (args, p.stderr)


def test_zoo_rows_1_to_3_under_the_guard(tmp_path):
    """The bug zoo's gradtrace-train rows (tests/zoo/cases.py TRAIN_RUNS: DeepSpeed #5248, PR #4530, PR #5555
    emulated) under --capture full+guard: each bug run is flagged at step 0 on every rank, its divisor violations
    naming exactly the parameters --self judges wrong with the causes of --self's groups holding them; the
    reference and the fixed runs are silent."""
    import sys

    sys.path.insert(0, str(ROOT / "tests" / "zoo"))
    from cases import TRAIN_MODEL, TRAIN_RUNS

    for name, args in TRAIN_RUNS.items():
        out = tmp_path / name
        cmd = [str(TRAIN), *args.split(), *TRAIN_MODEL, "--out", str(out), "--capture", "full+guard"]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=dict(os.environ, TMPDIR=str(tmp_path)))
        assert p.returncode == 0, (name, p.stderr)
        j = tmp_path / f"{name}.json"
        d = subprocess.run([str(DIFF), "--self", str(out), "--json", str(j)], capture_output=True, text=True,
                           timeout=120)
        report = json.loads(j.read_text())
        bad = {q["name"] for q in report["self_params"] if q["verdict"] in ("wrong-divisor", "inconsistent")}
        world = len(list(out.glob("rank-*.gtrace")))
        for rank in range(world):
            found = [e for e in _events(out, rank) if e["event"] == "violation"]
            if name.endswith("-bug"):
                assert d.returncode == 1 and bad, (name, report["summary"])
                assert {e["step"] for e in found} == {0} and {e["check"] for e in found} == {"divisor"}, found
                assert {n for e in found for n in e["params"]} == bad
                assert {e["cause"] for e in found} == {g["cause"] for g in report["groups"] if set(g["params"]) & bad}
            else:
                assert (d.returncode, found) == (0, []), (name, rank, report["summary"], found)
            assert _summary(out, rank)["steps_checked"] == 1
        assert (len(_lines(p.stderr)) > 0) == name.endswith("-bug"), (name, p.stderr)


def test_a_reference_run_is_compared_at_each_of_its_steps(tmp_path):
    """--guard-reference: the zoo's reference (dp 1, sp 1) as a stats trace of 2 steps; the #5248 bug differs at
    step 0 in gradtrace-diff's words (then the run has left the reference), the fixed run never differs."""
    import sys

    sys.path.insert(0, str(ROOT / "tests" / "zoo"))
    from cases import TRAIN_MODEL, TRAIN_RUNS

    model = [a for a in TRAIN_MODEL]
    model[model.index("--steps") + 1] = "2"
    ref = tmp_path / "ref"
    p = subprocess.run([str(TRAIN), *TRAIN_RUNS["train-ref"].split(), *model, "--out", str(ref), "--capture", "stats"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    model[model.index("--steps") + 1] = "3"
    for name in ("train-5248-bug", "train-5248-ok"):
        out = tmp_path / name
        p = subprocess.run([str(TRAIN), *TRAIN_RUNS[name].split(), *model, "--out", str(out), "--capture",
                            "full+guard", "--guard-reference", str(ref)], capture_output=True, text=True, timeout=240,
                           env=dict(os.environ, TMPDIR=str(tmp_path)))
        assert p.returncode == 0, p.stderr
        for rank in (0, 1):
            events = _events(out, rank)
            assert events[0]["checks"][-1] == "reference" and events[0]["reference_steps"] == [0, 1]
            against = [e for e in events if e["event"] == "violation" and e["check"] == "reference"]
            scopes = [e["message"] for e in events if e["event"] == "scope" and e["check"] == "reference"]
            if name.endswith("-ok"):
                assert against == [], against
                assert scopes == ["reference is not checked: the reference recorded FINAL at steps [0, 1]: later "
                                  "steps are not compared"]
                continue
            (v,) = against
            assert v["step"] == 0 and v["cause"] != ""
            j = tmp_path / f"{name}.json"
            subprocess.run([str(DIFF), str(ref), str(out), "--step", "0", "--json", str(j)], capture_output=True,
                           timeout=120)
            assert v["message"] == "against the reference run (A): " + json.loads(j.read_text())["groups"][0][
                "explanation"]
            assert v["message"].startswith("against the reference run (A): B/A = 2.000"), v["message"]
            assert scopes == ["reference is not checked: the run differs from the reference at step 0: later steps "
                              "start from other weights and are not compared"]


def test_a_reference_that_cannot_be_read_is_bad_input(tmp_path):
    p = _train(tmp_path / "g", "--capture", "guard", "--steps", "1", "--nproc", "1", "--dp", "1", "--guard-reference",
               str(tmp_path / "nowhere"))
    assert p.returncode == 2 and "--guard-reference: " in p.stderr and "nowhere" in p.stderr, p.stderr
    p = _train(tmp_path / "g2", "--capture", "stats", "--steps", "1", "--nproc", "1", "--dp", "1",
               "--guard-reference", str(tmp_path))
    assert p.returncode == 2 and "--guard-reference needs the guard" in p.stderr, p.stderr
