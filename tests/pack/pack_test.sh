#!/usr/bin/env bash
# gradtrace-pack end to end: pack and read back (members byte for byte, read by
# Python's tarfile as a second implementation), the diff rerun from the
# archive reproducing the packed report.json byte for byte, diff from the
# archive == diff from the directories, inspect on an archive, the size limit
# with re-encoding (sketch and stats) keeping the factor, and damaged
# archives refused with exit 2 and one line naming the file.
# Usage: pack_test.sh GRADTRACE_PACK GRADTRACE_DIFF GRADTRACE_INSPECT GRADTRACE_SYNTH PYTHON
set -uo pipefail
pack="$1" diff_bin="$2" inspect_bin="$3" synth="$4" python="$5"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
source "$(dirname "$0")/../cli_helpers.sh"
expect_one_line_error() { expect_error "$@"; }  # PREFIX NEEDLE
py() { "$python" - "$@"; }
cd "$work"

"$synth" ref
"$synth" sp2 --sp 2 --zero-stage 2 --scaling ds-4530 --loss local-mean
echo '{"zero_optimization": {"stage": 2}}' >ds_config.json

# Pack and read back.
expect 0 "$pack" ref sp2 -o bug.gtpack --attach ds_config.json
grep -qF 'byte for byte as captured' out || fail "pack summary: $(cat out)"
grep -qF 'rerun: gradtrace-diff bug.gtpack' out || fail "pack summary lacks the rerun line: $(cat out)"
py bug.gtpack <<'PY' || fail "archive contents"
import sys, tarfile, os, json
t = tarfile.open(sys.argv[1])  # Python's own ustar reader
names = t.getnames()
want = ["a/rank-00000.gtrace", "b/rank-00000.gtrace", "b/rank-00001.gtrace", "report.json", "report.md",
        "report.html", "environment.json", "pack.json", "attached/ds_config.json", "README.md"]
assert names == want, names
for n in names:
    if n.endswith(".gtrace"):
        src = ("ref/" if n.startswith("a/") else "sp2/") + os.path.basename(n)
        assert t.extractfile(n).read() == open(src, "rb").read(), n
assert t.extractfile("attached/ds_config.json").read() == open("ds_config.json", "rb").read()
env = json.load(t.extractfile("environment.json"))
assert env["sets"]["b"]["config"]["sp"] == 2 and env["sets"]["b"]["world"] == 2, env["sets"]["b"]
assert env["sets"]["a"]["source"] == "ref" and env["pack"]["tool"] == "gradtrace-pack"
man = json.load(t.extractfile("pack.json"))
assert man["format"] == "gtpack 1" and man["diff"]["mode"] == "diff" and man["reencoded"] is False, man
readme = t.extractfile("README.md").read().decode()
assert "gradtrace-diff bug.gtpack" in readme and "byte for byte" in readme, readme
open("packed-report.json", "wb").write(t.extractfile("report.json").read())
open("packed-report.html", "wb").write(t.extractfile("report.html").read())
PY

# The rerun reproduces the packed report byte for byte; the archive diff equals the directory diff.
expect 1 "$diff_bin" bug.gtpack --json rerun.json
grep -qF 'B/A = 2.000 = sp(B) for all 14 parameters' out || fail "rerun explanation: $(tail -3 out)"
cmp -s rerun.json packed-report.json || fail "rerun report.json differs from the packed one"
expect 1 "$diff_bin" bug.gtpack:a bug.gtpack:b --json archive.json
cmp -s archive.json packed-report.json || fail "explicit a/b report differs from the packed one"
# The packed HTML draws both sides' bucket views, as the rerun with --html does (its JSON then carries them).
expect 1 "$diff_bin" bug.gtpack --html rerun.html
cmp -s rerun.html packed-report.html || fail "rerun --html differs from the packed report.html"
grep -q '<table id="bucket-view-b">' packed-report.html || fail "packed report.html lacks B's bucket view"
expect 1 "$diff_bin" ref sp2 --json dirs.json
py archive.json dirs.json <<'PY' || fail "archive diff != directory diff"
import sys, json
a, d = (json.load(open(p)) for p in sys.argv[1:3])
assert a["trace_a"]["dir"] == "bug.gtpack:a" and d["trace_a"]["dir"] == "ref"
for j in (a, d):
    for side in ("trace_a", "trace_b"): j[side].pop("dir")
assert a == d, "reports differ beyond the set names"
PY
# Packed elsewhere, rerun where the archive is: the same bytes.
mkdir elsewhere
expect 0 "$pack" ref sp2 -o elsewhere/nested.gtpack
(cd elsewhere && "$diff_bin" nested.gtpack --json nested-rerun.json >/dev/null 2>&1)
py elsewhere/nested.gtpack elsewhere/nested-rerun.json <<'PY' || fail "rerun beside the archive differs from its report.json"
import sys, tarfile
assert tarfile.open(sys.argv[1]).extractfile("report.json").read() == open(sys.argv[2], "rb").read()
PY
# Options given on the command line override the packed ones.
expect 0 "$diff_bin" bug.gtpack --rtol 0.75 --json loose.json
expect 2 "$diff_bin" bug.gtpack:b
expect_one_line_error gradtrace-diff "usage"

# --self: one set.
expect 0 "$pack" sp2 -o self.gtpack --limit 5M
expect 1 "$diff_bin" self.gtpack --json self-rerun.json
py self.gtpack self-rerun.json <<'PY' || fail "self rerun != packed self report"
import sys, tarfile
t = tarfile.open(sys.argv[1])
assert t.extractfile("report.json").read() == open(sys.argv[2], "rb").read()
assert b'"mode": "self"' in t.extractfile("pack.json").read()
PY

# inspect reads archives, a set, or one member, in place.
expect 0 "$inspect_bin" --verify bug.gtpack
[ "$(grep -c '^verify       ok' out)" = 3 ] || fail "inspect --verify of 3 members: $(grep -c verify out)"
grep -qF '== bug.gtpack:b/rank-00001.gtrace' out || fail "inspect names members: $(grep '^==' out)"
expect 0 "$inspect_bin" bug.gtpack:a
[ "$(grep -c '^== ' out)" = 1 ] || fail "inspect bug.gtpack:a shows $(grep -c '^== ' out) files"
expect 0 "$inspect_bin" bug.gtpack:b/rank-00001.gtrace
expect 2 "$inspect_bin" bug.gtpack:c
expect_one_line_error gradtrace-inspect "bug.gtpack:c"

# The limit: 10 MB of traces under 100 kB (about 76 kB of it reports, environment and README; report
# schema 1.2 made the reports larger than 1.1's 73 kB),
# re-encoded with sketch and stats; the factor holds.
"$synth" bigref --grow 48
"$synth" bigsp2 --grow 48 --sp 2 --zero-stage 2 --scaling ds-4530 --loss local-mean
big=$(du -cb bigref bigsp2 | tail -1 | cut -f1)
[ "$big" -gt 3000000 ] || fail "big sets are only $big bytes"
expect 0 "$pack" bigref bigsp2 -o big.gtpack --limit 100k
size=$(stat -c %s big.gtpack)
[ "$size" -le 100000 ] || fail "big.gtpack is $size bytes, over the 100k limit"
grep -qF 're-encoded from' out || fail "pack summary does not say it re-encoded: $(cat out)"
expect 1 "$diff_bin" big.gtpack --json big-rerun.json
py big.gtpack big-rerun.json <<'PY' || fail "re-encoded archive"
import sys, tarfile, json
t = tarfile.open(sys.argv[1])
assert t.extractfile("report.json").read() == open(sys.argv[2], "rb").read(), "rerun differs"
man = json.load(t.extractfile("pack.json"))
kept = {f["param"]: f["kept"] for f in man["fidelity"]}
assert man["reencoded"] and len(kept) == 14, man
assert any(k.startswith("sketch:") for k in kept.values()) and "stats" in kept.values(), kept
rep = json.load(t.extractfile("report.json"))
orig = json.load(t.extractfile("original-report.json"))
assert orig["verdict"] == rep["verdict"] == "scaled", (orig["verdict"], rep["verdict"])
bases = set()
for p in rep["params"]:
    bases.add(p["basis"])
    assert abs(p["scale"] - 2.0) < 1e-3 and p["verdict"] == "scaled", p
    want = "full" if kept[p["name"]] == "full" else kept[p["name"]].split(":")[0]
    assert p["basis"] == want, (p["name"], p["basis"], kept[p["name"]])
assert {"sketch", "stats"} <= bases, bases
assert [g["scale"] for g in rep["groups"]] == [2.0] or abs(rep["groups"][0]["scale"] - 2) < 1e-3, rep["groups"]
readme = t.extractfile("README.md").read().decode()
assert "| parameter | kept as | why |" in readme and "stats" in readme, readme
PY
ls | grep -q 'tmp\|reencode' && fail "temporary files left: $(ls)"

# Issue 20: Ctrl-C during a pack left sig.gtpack.tmp.PID behind (and .fit.PID, .reencode.PID/). SIGINT,
# SIGTERM and SIGHUP now remove every temporary; the pack ends with the signal's status, and an archive already
# at the output is untouched. The pack of the big sets re-encodes (a .reencode.PID directory of traces), then
# writes sig.gtpack.tmp.PID: the driver polls for that file, stops the pack there, sends the signal and lets it
# go on, so the signal lands while both temporaries exist.
echo keep >sig.gtpack
py "$pack" <<'PY' || fail "a signal during a pack: see above"
import os, signal, subprocess, sys, time
pack = sys.argv[1]
signal.signal(signal.SIGINT, signal.SIG_DFL)  # inherited by the pack, even if this test was started ignoring it
for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    # The driver can lose the race on a loaded machine: between seeing the temporary and stopping the pack, the
    # pack may finish (renaming it over sig.gtpack). Then it tries again: the signal must land with both
    # temporaries there, and the previous attempt's complete archive is replaced by "keep" first.
    for attempt in range(5):
        with open("sig.gtpack", "w") as f:
            f.write("keep\n")
        p = subprocess.Popen([pack, "bigref", "bigsp2", "-o", "sig.gtpack", "--limit", "100k", "--threads", "1"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        tmp, work = "sig.gtpack.tmp.%d" % p.pid, "sig.gtpack.reencode.%d" % p.pid
        deadline = time.monotonic() + 60
        while not os.path.exists(tmp) and p.poll() is None and time.monotonic() < deadline:
            pass
        os.kill(p.pid, signal.SIGSTOP)
        caught = os.path.exists(tmp) and os.path.isdir(work)
        if caught:
            break
        os.kill(p.pid, signal.SIGCONT)
        rc = p.wait(timeout=60)
        assert rc == 0, "%s: the pack exited %s before its temporaries were seen" % (sig.name, rc)
        print("%s: attempt %d: the pack finished before it was stopped; again" % (sig.name, attempt + 1),
              file=sys.stderr)
    assert caught, "%s: 5 packs ended before their temporaries were seen" % sig.name
    os.kill(p.pid, sig)
    os.kill(p.pid, signal.SIGCONT)
    rc = p.wait(timeout=60)
    assert rc == -sig, "%s: exit %s, want death by the signal" % (sig.name, rc)
    left = [f for f in os.listdir(".") if f.startswith("sig.gtpack.")]
    assert not left, "%s: temporaries left: %s" % (sig.name, left)
    assert open("sig.gtpack").read() == "keep\n", "%s: the archive already there changed" % sig.name
PY

# Issue 42: SIGKILL runs no handler, so it left sig.gtpack.tmp.PID (and .reencode.PID/) behind. Their names carry
# the dead process's id: the next pack to the same output removes them, says so on stderr, and leaves a live
# process's temporaries (this shell's pid) alone.
py "$pack" <<'PY' || fail "a SIGKILL during a pack: see above"
import os, signal, subprocess, sys
pack = sys.argv[1]
p = subprocess.Popen([pack, "bigref", "bigsp2", "-o", "sig.gtpack", "--limit", "100k", "--threads", "1"],
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
tmp, work = "sig.gtpack.tmp.%d" % p.pid, "sig.gtpack.reencode.%d" % p.pid
while not os.path.exists(tmp) and p.poll() is None:
    pass
os.kill(p.pid, signal.SIGKILL)
assert p.wait(timeout=60) == -signal.SIGKILL
left = sorted(f for f in os.listdir(".") if f.startswith("sig.gtpack."))
assert tmp in left, "the pack ended before its temporary was seen: %s" % left
live = "sig.gtpack.tmp.%d" % os.getpid()
open(live, "w").close()
q = subprocess.run([pack, "ref", "sp2", "-o", "sig.gtpack"], capture_output=True, text=True, timeout=120)
assert q.returncode == 0, (q.returncode, q.stderr)
for f in left:
    assert "gradtrace-pack: removed ./%s, left by an interrupted run" % f in q.stderr, (f, q.stderr)
now = sorted(f for f in os.listdir(".") if f.startswith("sig.gtpack."))
assert now == [live], now
os.remove(live)
PY

# Bad input: exit 2, one line naming the file, the output already there kept.
echo keep >kept.gtpack
expect 2 "$pack" bigref bigsp2 -o kept.gtpack --limit 20k
expect_one_line_error gradtrace-pack "kept.gtpack: cannot fit under --limit 20.0 kB"
[ "$(cat kept.gtpack)" = keep ] || fail "a failed pack destroyed its output"
expect 2 "$pack" ref missing -o kept.gtpack
expect_one_line_error gradtrace-pack "missing"
[ "$(cat kept.gtpack)" = keep ] || fail "a failed pack destroyed its output"
expect 2 "$pack" ref sp2 -o kept.gtpack --limit 25X
expect_one_line_error gradtrace-pack "--limit"
mkdir other && cp ds_config.json other/
expect 2 "$pack" ref sp2 -o kept.gtpack --attach ds_config.json --attach other/ds_config.json
expect_one_line_error gradtrace-pack "other/ds_config.json: cannot attach: another attachment is also named ds_config.json"
cp -r ref ref-copy
expect 2 "$pack" ref-copy sp2 -o ref-copy/rank-00000.gtrace
expect_one_line_error gradtrace-pack "ref-copy/rank-00000.gtrace: is one of the trace files to pack"
cmp -s ref/rank-00000.gtrace ref-copy/rank-00000.gtrace || fail "packing over an input trace changed it"
ls | grep -q 'tmp\|reencode' && fail "temporary files left: $(ls)"

# Issue 20: a set directory named with byte 0xFF aborted the pack (nlohmann type_error.316, exit 134) and
# left ff.gtpack.tmp.PID behind. Invalid bytes are written as U+FFFD; no temporary file is left.
ff="d"$'\xff'
cp -r ref "$ff"
expect 0 "$pack" "$ff" sp2 -o ff.gtpack
ls | grep -q 'tmp\|fit\|reencode' && fail "temporary files left: $(ls)"
py ff.gtpack <<'PY' || fail "0xFF in a set's path: not U+FFFD in the archive's JSON"
import json, sys, tarfile
t = tarfile.open(sys.argv[1])
assert json.load(t.extractfile("environment.json"))["sets"]["a"]["source"] == "d\ufffd"
assert json.load(t.extractfile("pack.json"))["sets"]["a"] == "d\ufffd"
PY
expect 1 "$diff_bin" ff.gtpack  # the packed comparison reruns: B is sp2, 2x the reference
# A FIFO in a set is refused at once, and leaves nothing behind.
mkdir fifo-set && cp sp2/rank-00000.gtrace fifo-set/ && mkfifo fifo-set/rank-00001.gtrace
expect 2 timeout 20 "$pack" ref fifo-set -o fifo.gtpack
[ "$(tail -1 err)" = "gradtrace-pack: fifo-set/rank-00001.gtrace: not a regular file (a FIFO)" ] \
  || fail "FIFO in a set: $(cat err)"
ls | grep -q 'tmp\|fit\|reencode\|fifo.gtpack' && fail "temporary files left: $(ls)"
# The README quotes the sets' paths: a backtick closed their code span, a newline and '|' ended the table
# row, and HTML went out raw.
hostile=$'h`x\n|<img src=x onerror=alert(1)>'
cp -r ref "$hostile"
expect 0 "$pack" "$hostile" sp2 -o hostile.gtpack
if "$python" -c 'import markdown_it' 2>/dev/null; then
  py hostile.gtpack <<'PY' || fail "README: renders a hostile path unsafely"
import html.parser, sys, tarfile
from markdown_it import MarkdownIt
readme = tarfile.open(sys.argv[1]).extractfile("README.md").read().decode()
rendered = MarkdownIt("commonmark", {"html": True}).enable("table").render(readme)
class Page(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags, self.code, self.in_code = set(), [], False
    def handle_starttag(self, tag, attrs):
        self.tags.add(tag)
        if tag == "code":
            self.in_code = True
            self.code.append("")
    def handle_endtag(self, tag):
        self.in_code = self.in_code and tag != "code"
    def handle_data(self, data):
        if self.in_code:
            self.code[-1] += data
page = Page()
page.feed(rendered)
assert not page.tags & {"img", "svg", "script"}, page.tags
shown = "h`x\\x0a|<img src=x onerror=alert(1)>"
assert page.code.count(shown) == 2, page.code  # the first line and the table row of set A
rows = rendered.count("<tr>")  # the header, then a row per member: a, b, the reports, environment, pack.json
assert rows == 6 and rendered.count("<td>") == 2 * (rows - 1), rendered
PY
fi

# Damaged archives.
damage() {  # NAME PYTHON-EDIT: copies bug.gtpack to NAME after the edit of bytes `b`
  py "$1" "$2" <<'PY'
import sys
b = bytearray(open("bug.gtpack", "rb").read())
def reseal(at):
    b[at + 148:at + 156] = b" " * 8
    b[at + 148:at + 155] = b"%06o\0" % sum(b[at:at + 512]) + b""
    b[at + 155] = 32
exec(sys.argv[2])
open(sys.argv[1], "wb").write(b)
PY
}
damage cut.gtpack 'del b[len(b) // 2:]'
damage sum.gtpack 'b[5] ^= 1'
damage size.gtpack 'b[124:136] = b"%011o\0" % (1 << 30); reseal(0)'
damage escape.gtpack 'b[0:100] = b"../../etc/rank-00000.gtrace".ljust(100, b"\0"); reseal(0)'
damage frame.gtpack 'b[512 + 40] ^= 0xff'
for bad in cut sum size escape; do
  expect 2 "$diff_bin" $bad.gtpack
  expect_one_line_error gradtrace-diff "$bad.gtpack: offset "
  expect 2 "$inspect_bin" $bad.gtpack
  expect_one_line_error gradtrace-inspect "$bad.gtpack: offset "
done
grep -qF 'runs past the end' <(2>&1 "$diff_bin" size.gtpack) || fail "size beyond EOF not named as such"
grep -qF 'climbs out' <(2>&1 "$diff_bin" escape.gtpack) || fail "../ not named as such"
expect 2 "$diff_bin" frame.gtpack
expect_one_line_error gradtrace-diff "frame.gtpack:a/rank-00000.gtrace: offset "
expect 2 "$diff_bin" bug.gtpack:c bug.gtpack:b
expect_one_line_error gradtrace-diff "bug.gtpack: archive holds no trace set 'c' (it holds a, b)"

finish pack_test
