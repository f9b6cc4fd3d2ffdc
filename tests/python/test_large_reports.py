"""Reports sized for people at 100,063 parameters (issue 42 item 2), end to end.

The sets: a simulated Megatron run (gradtrace-synth --llama70b, tests/diff/synth_cluster.h) of an MoE model of
10 layers x 3,333 experts (tiny shapes), one rank, stats mode, FINAL only: 3.2 MB a set. B's reduction divides
by 0.5 instead of 1, so every parameter is 2.000 x A's.

Before this issue the diff wrote a 62 MB HTML page and a 48 MB JSON report at 100,000 parameters, and
gradtrace-pack could not fit the archive under its default 25 MB ("reports, environment and README take about
213.83 MB") although the traces are 6.5 MB. Now: the text, Markdown and HTML show the worst rows and count the
rest, the chart aggregates, the JSON keeps every parameter, and the archive stores it zstd-compressed."""

import json
import os
import shutil
import subprocess
import tarfile

import pytest

from conftest import BUILD

BIN = BUILD / "bin"
PARAMS = 100063
LAYOUT = ["--llama70b", "--dp", "1", "--tp", "1", "--pp", "1", "--microbatches", "1", "--layers", "10",
          "--experts-per-layer", "3333", "--hidden", "4", "--intermediate", "4", "--kv", "4", "--vocab", "8",
          "--capture", "stats", "--no-world-group", "--final-only"]


def run(cmd, cwd, want):
    p = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, timeout=600)
    assert p.returncode == want, (p.returncode, p.stdout[-2000:], p.stderr[-2000:])
    return p


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    root = tmp_path_factory.mktemp("large-reports")
    run([BIN / "gradtrace-synth", "a"] + LAYOUT + ["--run-id", "a"], root, 0)
    run([BIN / "gradtrace-synth", "b"] + LAYOUT + ["--run-id", "b", "--planted-stage", "0", "--planted-divisor",
                                                   "0.5"], root, 0)
    run([BIN / "gradtrace-diff", "a", "b", "--json", "r.json", "--html", "r.html", "--markdown", "r.md"], root, 1)
    return root


def test_the_reports_people_read_stay_small_and_the_json_keeps_everything(work):
    report = json.loads((work / "r.json").read_text())
    assert len(report["params"]) == PARAMS
    assert all(p["verdict"] == "scaled" and abs(p["scale"] - 2.0) < 1e-9 for p in report["params"])
    html, md = (work / "r.html").read_text(), (work / "r.md").read_text()
    assert len(html.encode()) < 5 << 20, len(html)
    assert html.count('<tr><td class="v"') == 500
    assert "100,063 parameters" in html or "100,063," in html
    assert "99,563 more: 99,563 scaled (the table shows the worst parameters" in html
    # at most 400 columns: ceil(100,063 / 400) = 251 parameters each, so 399 of them
    assert html.count('class="bin scale"') == 399 and 'class="mark ' not in html
    assert "each column spans 251: hover it for its range" in html
    assert md.count("| scaled | ") == 50 and "100,013 more: 100,013 scaled" in md
    assert len(md.encode()) < 64 << 10
    text = run([BIN / "gradtrace-diff", "a", "b"], work, 1).stdout
    assert text.count("\nscaled ") == 50 and "... 100,013 more: 100,013 scaled (--top N shows more" in text


@pytest.mark.skipif(shutil.which("chromium") is None, reason="chromium not installed (tools/setup --for-tests)")
def test_the_page_opens_in_a_browser_and_draws_its_chart(work):
    # The page is parsed and laid out: Chromium's DOM dump holds its 399 chart columns and the table's rows.
    env = dict(os.environ, HOME=str(work))
    dom = subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--user-data-dir=" +
                          str(work / "profile"), "--dump-dom", "file://" + str(work / "r.html")],
                         capture_output=True, text=True, timeout=120, env=env).stdout
    assert dom.count('class="bin scale"') == 399, len(dom)
    assert dom.count('<tr><td class="v"') == 500
    subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    "--window-size=1000,700", "--user-data-dir=" + str(work / "profile"),
                    "--screenshot=" + str(work / "shot.png"), "file://" + str(work / "r.html")],
                   capture_output=True, timeout=120, env=env)
    png = (work / "shot.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10000


def test_pack_fits_the_default_limit_and_its_json_is_the_diffs(work):
    p = run([BIN / "gradtrace-pack", "a", "b", "-o", "bug.gtpack"], work, 0)
    size = (work / "bug.gtpack").stat().st_size
    assert size < 25 * 10**6, (size, p.stderr[-1000:])
    with tarfile.open(work / "bug.gtpack") as t:
        names = t.getnames()
        assert "report.json.zst" in names and "report.json" not in names, names
        packed = t.extractfile("report.json.zst").read()
        readme = t.extractfile("README.md").read().decode()
    assert "zstd -d report.json.zst" in readme
    (work / "packed.json.zst").write_bytes(packed)
    subprocess.run(["zstd", "-q", "-d", "-f", str(work / "packed.json.zst"), "-o", str(work / "packed.json")],
                   check=True)
    run([BIN / "gradtrace-diff", "bug.gtpack", "--json", "rerun.json"], work, 1)
    assert (work / "packed.json").read_bytes() == (work / "rerun.json").read_bytes()
    assert len(json.loads((work / "rerun.json").read_text())["params"]) == PARAMS
