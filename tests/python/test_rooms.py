"""The C++ rooms' direction (docs/dev/ARCHITECTURE.md): a room includes only headers of its own room or of the
rooms below it. Checked from the sources' #include lines, so a new back-edge fails here, not in a review.
capture/ is two rooms (issue 47, item 3): train/ (gradtrace-train) writes through recorder/, never back."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def headers(room):
    return {p.name for p in (ROOT / room).rglob("*.h")}


def includes(room):
    """{source file: [included project header names]} of every .h/.cc in `room`."""
    out = {}
    for p in sorted([*(ROOT / room).rglob("*.h"), *(ROOT / room).rglob("*.cc")]):
        out[p.relative_to(ROOT)] = [pathlib.PurePosixPath(h).name for h in INCLUDE.findall(p.read_text())]
    return out


def back_edges(lower, higher):
    """Includes of a header of room `higher` from a file of room `lower`."""
    names = headers(higher) - headers(lower)
    return [f"{f}: {h}" for f, hs in includes(lower).items() for h in hs if h in names]


def test_the_rules_catch_a_back_edge(tmp_path, monkeypatch):
    (tmp_path / "low").mkdir()
    (tmp_path / "high").mkdir()
    (tmp_path / "high" / "top.h").write_text("int top();\n")
    (tmp_path / "low" / "base.cc").write_text('#include "top.h"\n')
    monkeypatch.setattr(__import__(__name__), "ROOT", tmp_path)
    assert back_edges("low", "high") == ["low/base.cc: top.h"]


def test_capture_recorder_never_includes_the_training_binary():
    assert (ROOT / "capture" / "recorder" / "recorder.h").is_file() and (ROOT / "capture" / "train").is_dir()
    assert back_edges("capture/recorder", "capture/train") == []
    assert not list((ROOT / "capture").glob("*.cc")), "capture/ holds its two rooms, no sources of its own"


def test_lower_rooms_never_include_higher_ones():
    # proto/ <- semantics/ <- capture/, diff/ <- pack/, inspect/ (ARCHITECTURE.md's picture)
    for lower, higher in [("proto", "semantics"), ("proto", "capture"), ("proto", "diff"), ("proto", "pack"),
                          ("semantics", "capture"), ("semantics", "diff"), ("semantics", "pack"),
                          ("diff", "pack"), ("diff", "inspect"), ("capture", "diff")]:
        assert back_edges(lower, higher) == [], (lower, higher)
