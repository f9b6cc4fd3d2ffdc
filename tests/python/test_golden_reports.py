"""The diff's reports byte for byte (tests/golden/cases.json): a fixed set of trace sets made by gradtrace-synth,
diffed (and --self'd, and sharded then merged) into text, JSON, Markdown and HTML, each compared with the
committed file in tests/golden/expected/. A refactoring of diff/ or semantics/ must leave every byte the same; a
commit that changes a report on purpose refreshes them (GRADTRACE_GOLDEN_REFRESH=1) and says why."""

import json
import os
import subprocess

import pytest

from conftest import BUILD, ROOT

GOLDEN = ROOT / "tests" / "golden"
CASES = json.loads((GOLDEN / "cases.json").read_text())
REFRESH = os.environ.get("GRADTRACE_GOLDEN_REFRESH") == "1"
DIFF, SYNTH = BUILD / "bin" / "gradtrace-diff", BUILD / "bin" / "gradtrace-synth"


@pytest.fixture(scope="module")
def sets(tmp_path_factory):
    """The folder holding every set of cases.json, made once (each with the run id of its name)."""
    root = tmp_path_factory.mktemp("golden")
    for name, args in CASES["sets"].items():
        p = subprocess.run([str(SYNTH), name, "--run-id", name, *args], cwd=root, capture_output=True, text=True,
                           timeout=120)
        assert p.returncode == 0, p.stderr
    return root


def check(name: str, suffix: str, got: bytes) -> None:
    path = GOLDEN / "expected" / f"{name}.{suffix}"
    if REFRESH:
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(got)
        return
    assert path.exists(), f"{path} missing: make it with GRADTRACE_GOLDEN_REFRESH=1"
    want = path.read_bytes()
    if got != want:  # the first differing line, not two 20 kB blobs
        for k, (a, b) in enumerate(zip(want.splitlines(), got.splitlines()), 1):
            if a != b:
                pytest.fail(f"{path.name} line {k}:\n  expected {a[:300]!r}\n  got      {b[:300]!r}")
        pytest.fail(f"{path.name}: {len(want)} bytes expected, {len(got)} written")


def run_case(sets, name: str, args: list) -> None:
    out = sets / f"out-{name}"
    out.mkdir(exist_ok=True)
    p = subprocess.run([str(DIFF), *args, "--json", str(out / "r.json"), "--markdown", str(out / "r.md"), "--html",
                        str(out / "r.html")], cwd=sets, capture_output=True, timeout=120)
    assert p.returncode in (0, 1, 3), p.stderr.decode()
    check(name, "txt", p.stdout + f"exit {p.returncode}\n".encode())
    for suffix in ("json", "md", "html"):
        check(name, suffix, (out / f"r.{suffix}").read_bytes())


@pytest.mark.parametrize("name", sorted(CASES["cases"]))
def test_report_is_byte_identical(sets, name):
    run_case(sets, name, CASES["cases"][name])


def test_merged_shards_are_byte_identical(sets):
    parts = []
    for k in range(2):
        part = sets / f"shard-{k}.json"
        p = subprocess.run([str(DIFF), "ref", "sp2", "--shard", f"{k}/2", "--json", str(part)], cwd=sets,
                           capture_output=True, timeout=120)
        assert p.returncode in (0, 1), p.stderr.decode()
        parts.append(part.name)
    run_case(sets, "merge-sp2", ["--merge", *parts])
