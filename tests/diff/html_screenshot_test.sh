#!/usr/bin/env bash
# The HTML report renders in headless Chromium and its chart is drawn: one
# screenshot, then a pixel count of the verdict colours inside the chart, and
# each side's per-rank x per-bucket view below it: its cells drawn, and the
# divisors and norms it shows are those of the JSON's trace_a/trace_b
# bucket_view; then the same for a --self report's view and its bucket_view.
# Skips (exit 77) when chromium or numpy is unavailable.
# Usage: html_screenshot_test.sh GRADTRACE_DIFF GRADTRACE_SYNTH PYTHON
set -euo pipefail
diff_bin="$1" synth="$2" python="$3"
command -v chromium >/dev/null || { echo "chromium not installed: skipped"; exit 77; }
"$python" -c 'import numpy' 2>/dev/null || { echo "numpy not available: skipped"; exit 77; }
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"$synth" "$work/ref"
"$synth" "$work/b" --sp 2 --scaling ds-4530 --scramble head.weight
set +e
"$diff_bin" "$work/ref" "$work/b" --html "$work/report.html" --json "$work/report.json" >/dev/null
[ $? = 1 ] || { echo "FAIL: gradtrace-diff exit code"; exit 1; }
set -e
# HOME: chromium wants a writable profile; the timeout keeps a hung browser from hanging ctest.
# 1800 high: the chart, then both sides' bucket views below it.
HOME="$work" timeout 60 chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1000,1800 \
  --user-data-dir="$work/profile" --screenshot="$work/shot.png" "file://$work/report.html" >/dev/null 2>&1 || true
[ -s "$work/shot.png" ] || { echo "FAIL: no screenshot"; exit 1; }
"$python" - "$work/shot.png" "$work/report.json" "$work/report.html" <<'PY'
import json, re, struct, sys, zlib
import numpy as np

def read_png(path):
    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, w = 8, b"", None
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            w, h, depth, ctype = struct.unpack(">IIBB", body[:10])
            assert depth == 8 and ctype in (2, 6), (depth, ctype)
            ch = 3 if ctype == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    raw = np.frombuffer(zlib.decompress(idat), dtype=np.uint8).reshape(h, 1 + w * ch)
    out = np.zeros((h, w * ch), dtype=np.int32)
    prev = np.zeros(w * ch, dtype=np.int32)
    for y in range(h):
        f, line = raw[y, 0], raw[y, 1:].astype(np.int32)
        cur = np.zeros_like(line)
        if f == 0:
            cur = line
        elif f == 2:
            cur = (line + prev) & 255
        else:
            for x in range(w * ch):
                a = cur[x - ch] if x >= ch else 0
                b, c = prev[x], (prev[x - ch] if x >= ch else 0)
                if f == 1:
                    p = a
                elif f == 3:
                    p = (a + b) // 2
                else:
                    pa, pb, pc = abs(b - c), abs(a - c), abs(a + b - 2 * c)
                    p = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
                cur[x] = (line[x] + p) & 255
        out[y], prev = cur, cur
    return out.reshape(h, w, ch)[:, :, :3]

# The chart sits between the configuration table and the bucket views at this
# window width; text elsewhere uses the same verdict colours, so count inside it only.
full = read_png(sys.argv[1])
img = full[250:800]
def count(rgb, tol=40):
    return int((np.abs(img - np.array(rgb)).sum(axis=2) < tol).sum())
scaled = count((0xE6, 0x51, 0x00))  # orange: the 13 scaled parameters' marks
mismatch = count((0xC6, 0x28, 0x28))  # red: the mismatching one (and the tolerance line)
print(f"scaled-colour pixels {scaled}, mismatch-colour pixels {mismatch}")
assert scaled > 13 * 40, "scaled marks not drawn"
assert mismatch > 2 * 40, "mismatch marks not drawn"

# Each side's bucket view: A (world 1) divides by its group of 1 as needed (green cells); B (sp 2,
# ds-4530) by 2 / sp = 1 where its group of 2 needs 2 (orange). The numbers drawn are the JSON's.
report, html = json.load(open(sys.argv[2])), open(sys.argv[3]).read()
assert report["bucket_view"] == [], "the top-level view is --self's"
fmt = lambda v: "-" if v is None else "%.5g" % v
for side, table, divisor, expected, verdict in (("trace_a", "bucket-view-a", 1, 1, "ok"),
                                                 ("trace_b", "bucket-view-b", 1, 2, "wrong-divisor")):
    cells = report[side]["bucket_view"]
    assert cells, side + ": no bucket_view"
    assert all(abs(c["divisor"] - divisor) < 1e-4 and c["expected"] == expected and c["verdict"] == verdict
               for c in cells), (side, cells[0])
    body = html.split('<table id="%s">' % table, 1)[1].split("</table>", 1)[0]
    shown = re.findall(r'<span class="divisor">([^<]*)</span>(?: \(([^)]*)\))?', body)
    assert shown == [(fmt(c["divisor"]), fmt(c["expected"]) if c["expected"] else "") for c in cells], (side, shown)
    assert re.findall(r'<span class="pre">([^<]*)</span>', body) == [fmt(c["pre_norm"]) for c in cells], side
    assert re.findall(r'<span class="post">([^<]*)</span>', body) == [fmt(c["post_norm"]) for c in cells], side
a_cells, b_cells = len(report["trace_a"]["bucket_view"]), len(report["trace_b"]["bucket_view"])
below = full[800:]
def cells_drawn(rgb):
    return int((np.abs(below - np.array(rgb)).sum(axis=2) < 12).sum())
ok, wrong = cells_drawn((0xC8, 0xE6, 0xC9)), cells_drawn((0xFF, 0xE0, 0xB2))
print(f"bucket-view cells A {a_cells} ({ok} ok-colour pixels), B {b_cells} ({wrong} wrong-divisor-colour pixels)")
assert ok > a_cells * 1000, "A's bucket-view cells not drawn"
assert wrong > b_cells * 1000, "B's bucket-view cells not drawn"
PY

# --self: the per-rank x per-bucket view is drawn (ds-4530 on dp 2 x sp 2: every reduction divides
# by 2 where 4 is needed, so every cell is orange), and its numbers are the JSON's.
"$synth" "$work/self" --dp 2 --sp 2 --zero-stage 2 --scaling ds-4530
set +e
"$diff_bin" --self "$work/self" --html "$work/self.html" --json "$work/self.json" >/dev/null
[ $? = 1 ] || { echo "FAIL: --self exit code"; exit 1; }
set -e
HOME="$work" timeout 60 chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1000,1400 \
  --user-data-dir="$work/profile" --screenshot="$work/self.png" "file://$work/self.html" >/dev/null 2>&1 || true
[ -s "$work/self.png" ] || { echo "FAIL: no --self screenshot"; exit 1; }
"$python" - "$work/self.png" "$work/self.json" "$work/self.html" <<'PY'
import json, re, struct, sys, zlib
import numpy as np

def read_png(path):  # 8-bit RGB(A), filters 0-4
    data = open(path, "rb").read()
    pos, idat = 8, b""
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            w, h, _, ctype = struct.unpack(">IIBB", body[:10])
            ch = 3 if ctype == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    raw = np.frombuffer(zlib.decompress(idat), dtype=np.uint8).reshape(h, 1 + w * ch)
    out, prev = np.zeros((h, w * ch), dtype=np.int32), np.zeros(w * ch, dtype=np.int32)
    for y in range(h):
        f, line, cur = raw[y, 0], raw[y, 1:].astype(np.int32), np.zeros(w * ch, dtype=np.int32)
        for x in range(w * ch):
            a = cur[x - ch] if x >= ch else 0
            b, c = prev[x], (prev[x - ch] if x >= ch else 0)
            pa, pb, pc = abs(b - c), abs(a - c), abs(a + b - 2 * c)
            p = [0, a, b, (a + b) // 2, a if pa <= pb and pa <= pc else (b if pb <= pc else c)][f]
            cur[x] = (line[x] + p) & 255
        out[y], prev = cur, cur
    return out.reshape(h, w, ch)[:, :, :3]

report, html = json.load(open(sys.argv[2])), open(sys.argv[3]).read()
cells = report["bucket_view"]
assert len(cells) == 4 * len({c["bucket_id"] for c in cells}), len(cells)
assert all(abs(c["divisor"] - 2) < 1e-4 and c["expected"] == 4 and c["verdict"] == "wrong-divisor" for c in cells)
shown = re.findall(r'<span class="divisor">([^<]*)</span> \(([^)]*)\)', html)
assert shown == [("%.5g" % c["divisor"], "%.5g" % c["expected"]) for c in cells], shown  # rank-major, as the JSON
for c in cells:
    assert '<span class="pre">%.5g</span>' % c["pre_norm"] in html and '<span class="post">%.5g</span>' % c["post_norm"] in html
img = read_png(sys.argv[1])
orange = int((np.abs(img - np.array((0xFF, 0xE0, 0xB2))).sum(axis=2) < 12).sum())
print(f"bucket-view cells {len(cells)}, wrong-divisor cell pixels {orange}")
assert orange > len(cells) * 1000, "bucket-view cells not drawn"
PY
echo "html_screenshot_test: passed"
