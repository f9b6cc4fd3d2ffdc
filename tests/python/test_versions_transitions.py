"""gradtrace-versions --transitions (python/gradtrace/versions/transitions.py): the search over a release line with
several changes, on given gradients per release (the real-package run is in test_versions_command.py).

Asserted: every change is found, at the neighbours it sits between; the runs are about k x log2(n), fewer than a
sweep; a failed release is never a change and makes a range; a pair the diff refuses is "not compared"; ranges
judged by their ends alone are listed (a reverted change inside one is not seen, and the result says so); the
changelog and the Markdown report say the runs beside the sweep's."""

import json
import pathlib

import jsonschema

from gradtrace.versions import report, transitions

SCHEMA = json.loads((pathlib.Path(__file__).resolve().parents[2] / "python" / "gradtrace" / "versions" /
                     "result.schema.json").read_text())


def line(n):
    return [f"1.{i}.0" for i in range(n)]


def search(rels, gradient, fails=(), refuses=()):
    """find() over `rels` where release r's gradients are gradient(r); `fails` do not run; a pair holding a release
    of `refuses` is not comparable."""
    ran = []

    def run(r):
        ran.append(r)
        return r not in fails

    def compare(a, b):
        if a in refuses or b in refuses:
            return "not-compared"
        return "same" if gradient(a) == gradient(b) else "changed"

    return transitions.find(rels, run, compare), ran


def test_every_change_is_found_in_about_k_log_n_runs():
    rels = line(64)
    changed_at = {"1.11.0", "1.12.0", "1.40.0", "1.63.0"}  # four changes, two of them neighbours
    level = lambda r: sum(1 for c in changed_at if int(r.split(".")[1]) >= int(c.split(".")[1]))  # noqa: E731
    found, ran = search(rels, level)
    assert [(a, b, f) for a, b, f in found["changes"]] == [("1.10.0", "1.11.0", []), ("1.11.0", "1.12.0", []),
                                                           ("1.39.0", "1.40.0", []), ("1.62.0", "1.63.0", [])]
    # the ends, 15 grid probes (every 4th), 6 splitting the 4 changes' segments: 23 of the sweep's 64
    assert len(found["probed"]) == len(ran) + 2 == 23
    assert found["failed"] == [] and found["not_compared"] == []
    # the ranges the search did not enter (ends equal): where a reverted change would hide
    assert found["unentered"] and all(level(a) == level(b) for a, b in found["unentered"])


def test_a_change_next_to_failed_releases_is_a_range_and_never_a_change_of_its_own():
    rels = line(9)
    found, _ = search(rels, lambda r: r >= "1.5.0", fails={"1.4.0", "1.3.0"})
    assert found["changes"] == [("1.2.0", "1.5.0", ["1.3.0", "1.4.0"])]
    assert found["failed"] == ["1.3.0", "1.4.0"]


def test_a_change_reverted_a_few_releases_later_is_found_by_the_grid():
    rels = line(9)  # grid: 1.0.0, 1.4.0, 1.8.0
    found, _ = search(rels, lambda r: r in ("1.3.0", "1.4.0"))  # changed at 1.3.0, undone at 1.5.0
    assert [c[:2] for c in found["changes"]] == [("1.2.0", "1.3.0"), ("1.4.0", "1.5.0")]


def test_a_change_undone_between_two_probes_is_not_seen_and_said():
    rels = line(9)
    found, _ = search(rels, lambda r: r == "1.2.0")  # lives one release, between the probes 1.0.0 and 1.4.0
    assert found["changes"] == [] and found["unentered"] == [("1.0.0", "1.4.0"), ("1.4.0", "1.8.0")]
    t = {"good": "1.0.0", "bad": "1.8.0", "changes": [], "runs": 3, "sweep_runs": 9, "every": 4, "failed": [],
         "not_compared": [], "unentered": [list(p) for p in found["unentered"]]}
    text = report.changelog_text(t)
    assert "no release changed the gradients measurably" in text
    assert "3 of the 9 releases run (a sweep runs 9); probed every 4 releases, then each range whose ends differ " \
           "split." in text
    assert "Not seen: a change that a later release reverts inside a range whose ends agree; ranges judged by " \
           "their ends alone: 1.0.0..1.4.0, 1.4.0..1.8.0." in text


def test_a_pair_the_diff_refuses_is_not_compared():
    rels = line(5)
    found, _ = search(rels, lambda r: r >= "1.2.0", refuses={"1.2.0"})
    assert found["changes"] == [] and found["not_compared"][0][:2] in (("1.1.0", "1.2.0"), ("1.2.0", "1.3.0"))


def test_the_changelog_and_markdown_of_a_result():
    groups = [{"kind": "scale", "scale": 0.0625, "count": 2, "expression": "", "residual": 1e-15, "params": ["w", "b"],
               "cause": "unexplained", "explanation": "B/A = 0.0625"}]
    t = {"good": "1.0.0", "bad": "1.8.0", "candidates": line(9), "unrunnable_ends": [], "runs": 7, "sweep_runs": 9,
         "every": 4,
         "failed": ["1.3.0"], "not_compared": [], "unentered": [["1.4.0", "1.8.0"]],
         "changes": [{"before": "1.2.0", "after": "1.4.0", "failed_between": ["1.3.0"], "verdict": "scaled",
                      "summary": "B is 0.0625 x A", "groups": groups, "report": "r.json", "markdown": "# diff\n",
                      "command": "gradtrace-versions --package p --script s.py --releases 1.2.0,1.3.0,1.4.0"}]}
    result = {"rows": [{"release": "1.0.0", "status": "ok"}, {"release": "1.3.0", "status": "failed", "error": "x"}],
              "reference": "release 1.0.0", "transitions": t, "runs_executed": 7, "exit_code": 1,
              "setup": {"command": "gradtrace-versions --transitions 1.0.0 1.8.0", "package": "p", "entry": "--script s",
                        "sp": 1, "dp": 1, "loss": "loss", "config": None, "deps": "resolve",
                        "reference": "release 1.0.0"}}
    jsonschema.validate(result, SCHEMA)
    assert report.conclusion(result) == "1 release changed the gradients: **1.3.0 or 1.4.0** (after 1.2.0)."
    text = report.changelog_text(t)
    assert "1.3.0 or 1.4.0  1.2.0  0.0625 x2 (res 1.0e-15)" in text and "unexplained" in text
    assert "7 of the 9 releases run (a sweep runs 9); probed every 4 releases, then each range whose ends differ " \
           "split. Failed to run: 1.3.0 (never counted as changes)." in text
    md = report.markdown(result)
    assert "## Changelog of the gradients" in md
    assert ("| 1.3.0 or 1.4.0 | 1.2.0 | 0.0625 x2 (res 1.0e-15) | unexplained | `gradtrace-versions --package p "
            "--script s.py --releases 1.2.0,1.3.0,1.4.0` |") in md
    assert "## The transition 1.2.0 -> 1.4.0 (gradtrace-diff 1.2.0 1.4.0)" in md


def test_the_reproduce_command_replaces_the_range_and_drops_output_files():
    from gradtrace.versions.command import reproduce_command

    argv = ["--package", "torchmetrics", "--script", "my train.py", "--transitions", "1.0.0", "1.6.0", "--json",
            "r.json", "--markdown=r.md", "--probe-every", "2"]
    assert reproduce_command("gradtrace-versions", argv, ["1.3.2", "1.4.0"]) == \
        "gradtrace-versions --package torchmetrics --script 'my train.py' --releases 1.3.2,1.4.0"
