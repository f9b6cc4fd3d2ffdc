"""Issue 43, item 3: the pages written for users (docs/user/) hold no lab notebook, and the doc indexes link
to files that exist.

- No commit hash: a word of 7 to 40 lowercase hex digits with at least one digit and one letter a-f,
  standing alone (not part of a longer word such as `0x68ee8fbb` or `rank-0001a`). Addresses of GitHub pull
  requests and issues are taken out first; any other URL is checked like prose.
- No work-log number: "stop N" or "issue N" (also "issues N", any case). An upstream reference is
  written with `#` ("DeepSpeed #5248", "issue #5248") or as a link, and is fine.
- Every relative Markdown link `[text](target)` in docs/user/*.md and the docs/dev and docs/studies
  indexes names an existing file (a `#fragment` is ignored; http(s) and mailto links are not checked).

README.md is held to the same rules.
"""

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
USER_PAGES = sorted(p for p in (ROOT / "docs" / "user").rglob("*.md")) + [ROOT / "README.md"]
INDEXES = [ROOT / "docs" / "dev" / "README.md", ROOT / "docs" / "studies" / "README.md"]
LINKED_PAGES = sorted((ROOT / "docs" / "user").glob("*.md")) + INDEXES + [ROOT / "README.md"]

GITHUB_THREAD = re.compile(r"https?://github\.com/[\w.-]+/[\w.-]+/(?:pull|issues)/\d+[\w#/-]*")
HEX_WORD = re.compile(r"(?<![0-9A-Za-z_])[0-9a-f]{7,40}(?![0-9A-Za-z_])")
WORK_LOG = re.compile(r"\b(?:stop|issues?)\s+\d+", re.IGNORECASE)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def commit_hashes(text):
    """The words of `text` that read as commit hashes."""
    text = GITHUB_THREAD.sub(" ", text)
    return [w for w in HEX_WORD.findall(text) if re.search(r"\d", w) and re.search(r"[a-f]", w)]


def work_log_numbers(text):
    """The "stop N" / "issue N" references of `text`."""
    return WORK_LOG.findall(text)


def broken_links(page):
    """The relative link targets of `page` that name no existing file."""
    out = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"(?:https?|mailto):", target) or target.startswith("#"):
            continue
        path = (page.parent / target.split("#", 1)[0]).resolve()
        if not path.is_file():
            out.append(target)
    return out


def test_the_rules_catch_what_they_are_for():
    # Flagged.
    assert commit_hashes("measured at commit beb668c on 2 cores") == ["beb668c"]
    full = "689d5a115d2e90f40b72205cd0fa3986ae734799"
    assert commit_hashes(f"see {full}.") == [full]
    assert commit_hashes("https://example.com/tree/60f5ee4/docs") == ["60f5ee4"]
    assert work_log_numbers("as of stop 12, and Issue 43 item 3; issues 7") == ["stop 12", "Issue 43", "issues 7"]
    # Not flagged.
    assert commit_hashes("0x68ee8fbb rank-0001a 1073741824 deadbeefcafe abc123 ABCDEF1234 sha_1234abcd") == []
    upstream = "https://github.com/microsoft/DeepSpeed"
    assert commit_hashes(f"{upstream}/pull/4530 and {upstream}/issues/5248#issuecomment-1a2b3c4d") == []
    assert work_log_numbers("DeepSpeed #5248, issue #5248, the issues it fixed, a stop-gap of 3") == []


@pytest.mark.parametrize("page", USER_PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_user_pages_hold_no_commit_hashes_or_work_log_numbers(page):
    text = page.read_text()
    assert commit_hashes(text) == [], f"{page.relative_to(ROOT)}: commit hashes"
    assert work_log_numbers(text) == [], f"{page.relative_to(ROOT)}: work-log references"


@pytest.mark.parametrize("page", LINKED_PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_name_existing_files(page):
    assert broken_links(page) == [], f"{page.relative_to(ROOT)}: links to nothing"


def test_a_missing_link_target_is_caught(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("[here](here.md) [gone](gone.md#x) [web](https://example.com/x) [top](#top)\n")
    (tmp_path / "here.md").write_text("")
    assert broken_links(page) == ["gone.md#x"]
