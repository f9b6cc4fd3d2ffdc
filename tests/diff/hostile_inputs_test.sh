#!/usr/bin/env bash
# Issue 20, "done when": every hostile input the issue lists ends in a clean
# error (exit 2, one line naming the file) or a correct verdict (exit 0/1),
# each command run under a 1 GiB address-space cap and a 30 s timeout. The
# other command-line tests check the same cases in more detail without the cap;
# this is the one place that runs them all capped.
# Usage: hostile_inputs_test.sh GRADTRACE_DIFF GRADTRACE_PACK GRADTRACE_INSPECT GRADTRACE_SYNTH PYTHON CAP_BYTES
# CAP_BYTES 0: no address-space cap (sanitizer builds reserve terabytes of address space they never use).
set -uo pipefail
diff_bin="$1" pack="$2" inspect_bin="$3" synth="$4" python="$5" cap="$6"
[ -x "$python" ] || python=python3
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
source "$(dirname "$0")/../cli_helpers.sh"
cd "$work"

# glibc reserves 64 MiB of address space per thread's malloc arena, memory never touched; with one arena
# per core the reservations alone would pass the cap on a large machine.
export MALLOC_ARENA_MAX=2
# capped CMD...: CMD under the cap and the timeout (exit 124 when it runs past 30 s).
capped() {
  (
    [ "$cap" = 0 ] || ulimit -v $((cap / 1024)) || exit 125
    exec timeout 30 "$@"
  )
}
# expect_capped CODE CMD...: expect, capped.
expect_capped() {
  local want="$1"; shift
  expect "$want" capped "$@"
}
py() { "$python" - "$@"; }
repack() {  # FROM NAME PYTHON-EDIT-OF-d: archive FROM copied to NAME with pack.json's "diff" object edited
  py "$@" <<'PY'
import io, json, sys, tarfile
src = tarfile.open(sys.argv[1])
out = tarfile.open(sys.argv[2], "w", format=tarfile.USTAR_FORMAT)
for m in src.getmembers():
    data = src.extractfile(m).read()
    if m.name == "pack.json":
        j = json.loads(data)
        d = j["diff"]
        exec(sys.argv[3])
        data = json.dumps(j).encode()
        m.size = len(data)
    out.addfile(m, io.BytesIO(data))
out.close()
PY
}

"$synth" ref >/dev/null
"$synth" sp2 --sp 2 --zero-stage 2 --scaling ds-4530 --loss local-mean >/dev/null
expect_capped 1 "$diff_bin" ref sp2  # the inputs are sound: B/A = 2 = sp(B)
expect 0 "$pack" ref sp2 -o bug.gtpack

# Invalid UTF-8: a trace directory named with byte 0xFF aborted the JSON output (nlohmann type_error.316) and
# the pack, which left its temporary behind.
ff=$'d\xff'
cp -r ref "$ff"
expect_capped 0 "$diff_bin" --self "$ff" --json ff-self.json
expect_capped 1 "$diff_bin" "$ff" sp2 --json ff.json
grep -qF $'"dir": "d\xef\xbf\xbd"' ff.json || fail "0xFF in a path: not U+FFFD in the JSON"
expect_capped 0 "$pack" "$ff" sp2 -o ff.gtpack
expect_capped 1 "$diff_bin" ff.gtpack --json ff-rerun.json

# A rename that cut a two-byte character ('^(.).*$=$1' on 'été...'): RE2 matches characters, so every name
# becomes 'é' and the collision is the error.
"$synth" ete --prefix 'été.' >/dev/null
"$synth" ete2 --prefix 'été.' --sp 2 --zero-stage 2 --scaling ds-4530 --loss local-mean >/dev/null
expect_capped 2 "$diff_bin" ete ete2 --rename '^(.).*$=$1' --json ete.json
expect_error gradtrace-diff "ete2: two parameters are both named 'é' after renaming"
expect_capped 2 "$pack" ete ete2 -o ete.gtpack --rename '^(.).*$=$1'
expect_error gradtrace-pack "two parameters are both named 'é' after renaming"
expect 0 "$pack" ete ete2 -o ete.gtpack
repack ete.gtpack ete-rename.gtpack 'd["renames"] = ["^(.).*$=$1"]'
expect_capped 2 "$diff_bin" ete-rename.gtpack --json ete-rename.json
expect_error gradtrace-diff "ete-rename.gtpack:b: two parameters are both named 'é' after renaming"

# Markdown injection: names, the recorded scaling and the run id went out as raw HTML, a backtick closed a code
# span, a carriage return ended a table row, '@name' pinged a user and 'owner/repo#1' cross-referenced an issue.
hostile=$'@octocat/x#1`b\r|<img src=x onerror=alert(1)>\x1b[2J.'
"$synth" inj --prefix "$hostile" >/dev/null
"$synth" inj2 --prefix "$hostile" --sp 2 --zero-stage 2 --scaling ds-4530 --loss local-mean \
  --recorded-scaling '@octocat <svg onload=alert(1)> owner/repo#123' --run-id $'r\x1b]0;title\x07' >/dev/null
expect_capped 1 "$diff_bin" inj inj2 --markdown inj.md
grep -q $'[\033\r\a]' out && fail "a control byte from a trace reached the terminal"
grep -q $'[\033\r]' inj.md && fail "a control byte from a trace reached the Markdown"
grep -qF '<svg' inj.md && fail "raw HTML from a trace in the Markdown"
grep -qF '| scaling | mean | &#64;&#8203;octocat &lt;svg onload=alert(1)&gt; owner/repo&#35;&#8203;123 |' inj.md \
  || fail "the recorded scaling is not escaped: $(grep scaling inj.md)"
[ "$(grep -c '^| scaled | ``@octocat/x#1`b\\x0d\\|<img src=x onerror=alert(1)>\\x1b\[2J\.' inj.md)" = 14 ] \
  || fail "a hostile name is not one code span in one table row: $(grep -a '^| scaled' inj.md | head -2)"
hostile_dir="${hostile//\//_}"  # a directory name holds no '/'
cp -r inj "$hostile_dir"
expect_capped 0 "$pack" "$hostile_dir" inj2 -o inj.gtpack
py inj.gtpack <<'PY' || fail "the packed README and report: hostile strings not escaped"
import sys, tarfile
t = tarfile.open(sys.argv[1])
for member in ("README.md", "report.md"):
    md = t.extractfile(member).read().decode()
    assert "\r" not in md and "\x1b" not in md and "<svg" not in md, member
    assert "&#64;&#8203;octocat" in md or member == "README.md", member
PY

# --merge on crafted partial reports: 50,000 nested arrays overflowed the stack; shard.n = 2^31-1 and
# param_count = 1e9 sized vectors from the file; a 190 MB string cost 1.37 GB.
expect_capped 0 "$diff_bin" ref sp2 --shard 0/1 --json part.json
head -c 50000 /dev/zero | tr '\0' '[' >deep.json
expect_capped 2 "$diff_bin" --merge deep.json
expect_error gradtrace-diff "deep.json: nested deeper than 64 arrays and objects"
sed 's/^    "n": 1$/    "n": 2147483647/' part.json >huge-n.json
expect_capped 2 "$diff_bin" --merge huge-n.json
expect_error gradtrace-diff "shard 1/2147483647 missing (parts given: huge-n.json)"
sed 's/^  "param_count": [0-9]*,$/  "param_count": 1000000000,/' part.json >huge-count.json
expect_capped 2 "$diff_bin" --merge huge-count.json
expect_error gradtrace-diff "huge-count.json"
{ printf '{"format": "'; head -c 190000000 /dev/zero | tr '\0' a; printf '"}'; } >huge-string.json
expect_capped 2 "$diff_bin" --merge huge-string.json
expect_error gradtrace-diff "huge-string.json: string longer than"
rm huge-string.json

# A FIFO named like a trace blocked every reader in open() forever.
mkdir fifo && cp sp2/rank-00000.gtrace fifo/ && mkfifo fifo/rank-00001.gtrace
for cmd in "$diff_bin --self fifo" "$diff_bin ref fifo" "$inspect_bin --verify fifo" "$pack ref fifo -o fifo.gtpack"; do
  tool=$(basename "${cmd%% *}")
  expect_capped 2 $cmd
  expect_error "$tool" "fifo/rank-00001.gtrace: not a regular file (a FIFO)"
done
ls | grep -q 'fifo.gtpack' && fail "a refused pack left files: $(ls)"

# Two writers into one directory corrupted each other: the second is refused at the start, naming the file and
# the run in it, and the first run's traces stay whole.
expect_capped 2 "$synth" sp2 --sp 2 --zero-stage 2 --scaling ds-4530 --loss local-mean
expect_error gradtrace-synth "sp2/rank-00000.gtrace: exists (run "
expect_capped 0 "$inspect_bin" --verify sp2

# pack.json options skipped the command line's checks: rtol -1 or 0 made every parameter a mismatch, an invalid
# phase became final. They are refused as the command line refuses them, naming the archive's member.
repack bug.gtpack rtol-neg.gtpack 'd["rtol"] = -1'
repack bug.gtpack rtol-zero.gtpack 'd["rtol"] = 0'
repack bug.gtpack phase.gtpack 'd["phase"] = "sideways"'
expect_capped 2 "$diff_bin" rtol-neg.gtpack
expect_error gradtrace-diff "rtol-neg.gtpack:pack.json: diff.rtol: expected a positive number, got -1"
expect_capped 2 "$diff_bin" rtol-zero.gtpack
expect_error gradtrace-diff "rtol-zero.gtpack:pack.json: diff.rtol: expected a positive number, got 0"
expect_capped 2 "$diff_bin" phase.gtpack
expect_error gradtrace-diff "phase.gtpack:pack.json: diff.phase: expected final, post or pre, got 'sideways'"
for opt in "--rtol -1" "--rtol 0" "--phase sideways"; do  # the same checks on both command lines
  expect_capped 2 "$diff_bin" ref sp2 $opt
  expect_error gradtrace-diff "${opt%% *}: expected"
  expect_capped 2 "$pack" ref sp2 -o opt.gtpack $opt
  expect_error gradtrace-pack "${opt%% *}: expected"
done

# Negative ranks were written and read, and a group of 1M ranks in a world of 2 accepted. The writer refuses
# them (proto/validate.cc); these files are made byte by byte, as a hostile producer would.
raw_trace() {  # PATH RANK GROUP_SIZE: a format 1.4 file of one RunInfo frame (uncompressed), world 2
  py "$@" <<'PY'
import struct, sys
path, rank, group = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def varint(v):
    v &= (1 << 64) - 1
    out = b""
    while True:
        b, v = v & 0x7F, v >> 7
        out += bytes([b | (0x80 if v else 0)])
        if not v:
            return out
def field(n, wire, payload):
    key = varint(n << 3 | wire)
    return key + (varint(payload) if wire == 0 else varint(len(payload)) + payload)
ranks = b"".join(varint(r) for r in range(group))
run = (field(1, 2, b"hostile") + field(3, 2, b"run-x") + field(4, 2, field(1, 0, 2) + field(2, 0, 2)) +
       field(5, 0, rank) + field(9, 2, field(1, 2, b"dp") + field(2, 2, ranks)))
table = []
for i in range(256):
    c = i
    for _ in range(8):
        c = (c >> 1) ^ (0x82F63B78 if c & 1 else 0)
    table.append(c)
def crc32c(data, crc=0):
    crc ^= 0xFFFFFFFF
    for b in data:
        crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF
tail = bytes([1, 0, 0, 0])  # type RunInfo, codec none, reserved
crc = crc32c(run, crc32c(tail))
masked = (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF
with open(path, "wb") as f:
    f.write(b"GRDTRACE" + struct.pack("<HHI", 1, 4, 0))
    f.write(struct.pack("<III", len(run), len(run), masked) + tail + run)
PY
}
mkdir neg big ok
raw_trace ok/rank-00000.gtrace 0 2 && raw_trace ok/rank-00001.gtrace 1 2
expect_capped 0 "$inspect_bin" --verify ok  # the byte-by-byte writer writes what the reader reads
raw_trace neg/rank-00000.gtrace -1 2 && raw_trace neg/rank-00001.gtrace 1 2
raw_trace big/rank-00000.gtrace 0 1000000 && raw_trace big/rank-00001.gtrace 1 2
for set in neg big; do
  [ $set = neg ] && what="rank -1 is negative" || what="group 'dp': rank 2 outside world 2"
  expect_capped 2 "$inspect_bin" --verify $set/rank-00000.gtrace
  expect_error gradtrace-inspect "$set/rank-00000.gtrace: offset 16: $what"
  expect_capped 2 "$diff_bin" --self $set
  expect_error gradtrace-diff "$set/rank-00000.gtrace: offset 16: $what"
  expect_capped 2 "$pack" $set -o $set.gtpack
  expect_error gradtrace-pack "$set/rank-00000.gtrace: offset 16: $what"
done

# The exponential rename '(.|.)*#=x' on a ~40-character name took days with std::regex, from --rename and from
# an archive's diff.renames; RE2 matches in linear time, the rule matches nothing and the verdict stands.
long=$(printf 'p%.0s' {1..40})
"$synth" long --prefix "$long." >/dev/null
"$synth" long2 --prefix "$long." --sp 2 --zero-stage 2 --scaling ds-4530 --loss local-mean >/dev/null
expect_capped 1 "$diff_bin" long long2 --rename '(.|.)*#=x'
grep -qF 'B/A = 2.000 = sp(B) for all 14 parameters' out || fail "slow rename: $(tail -3 out)"
expect 0 "$pack" long long2 -o long.gtpack
repack long.gtpack slow-rename.gtpack 'd["renames"] = ["(.|.)*#=x"]'
expect_capped 1 "$diff_bin" slow-rename.gtpack
grep -qF 'B/A = 2.000 = sp(B) for all 14 parameters' out || fail "slow rename from pack.json: $(tail -3 out)"

ls | grep -q '\.tmp\.\|\.fit\.\|\.reencode\.' && fail "temporary files left: $(ls)"
finish hostile_inputs_test
