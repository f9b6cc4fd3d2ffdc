#!/usr/bin/env bash
# Command-line contract of gradtrace-diff: exit codes 0/1/2, one-line errors
# naming the file, output files (JSON validated against its schema), outputs
# never destroyed by a later error.
# Usage: cli_test.sh GRADTRACE_DIFF GRADTRACE_SYNTH PYTHON SCHEMA
set -uo pipefail
diff_bin="$1" synth="$2" python="$3" schema="$4" inspect_bin="$5"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
source "$(dirname "$0")/../cli_helpers.sh"
expect_one_line_error() { expect_error gradtrace-diff "$1"; }  # NEEDLE

"$synth" "$work/ref"
"$synth" "$work/sp2" --sp 2 --zero-stage 2 --scaling ds-4530 --loss local-mean
"$synth" "$work/sp4" --dp 2 --sp 4 --zero-stage 2 --scaling ds-4530 --loss local-mean
"$synth" "$work/divsp" --dp 2 --sp 2 --zero-stage 2 --scaling ds-4530 --loss local-mean-div-sp
"$synth" "$work/mean" --dp 2 --sp 2 --zero-stage 2 --scaling mean --loss local-mean
"$synth" "$work/bad" --dp 2 --scramble head.weight
"$synth" "$work/prefixed" --sp 2 --scaling ds-4530 --prefix module.
"$synth" "$work/sketch" --sp 2 --zero-stage 2 --scaling ds-4530 --capture sketch:64

# Differences and matches.
expect 1 "$diff_bin" "$work/ref" "$work/sp2"
grep -qF 'B/A = 2.000 = sp(B) for all 14 parameters: the per-rank loss is a local mean and the reduction divides by dp only (DeepSpeed ZeRO-1/2 since #4530)' "$work/out" \
  || fail "sp2 explanation missing: $(tail -3 "$work/out")"
grep -q $'\033' "$work/out" && fail "colour written to a pipe"
expect 1 "$diff_bin" "$work/ref" "$work/sp4"
grep -qF 'B/A = 4.000 = sp(B) for all 14 parameters' "$work/out" || fail "sp4 explanation missing"
expect 0 "$diff_bin" "$work/ref" "$work/divsp"
expect 0 "$diff_bin" "$work/ref" "$work/mean"
expect 1 "$diff_bin" "$work/ref" "$work/bad"
grep -q '^mismatch *head.weight' "$work/out" || fail "mismatch not listed first: $(sed -n 6,8p "$work/out")"
expect 1 "$diff_bin" "$work/ref" "$work/sketch"
grep -qF '= sp(B) for all 14 parameters' "$work/out" || fail "sketch scale"
expect 1 "$diff_bin" "$work/ref" "$work/prefixed" --rename 'module\.='
grep -qF '= sp(B) for all 14 parameters' "$work/out" || fail "rename"
expect 1 "$diff_bin" "$work/ref" "$work/sp2" --phase post
expect 0 "$diff_bin" "$work/ref" "$work/sp2" --rtol 1.5

# --self.
expect 1 "$diff_bin" --self "$work/sp4"
grep -qF 'effective divisor 2.000 = dp' "$work/out" || fail "self ds-4530 divisor: $(tail -2 "$work/out")"
expect 0 "$diff_bin" --self "$work/mean"
grep -qF 'effective divisor 4.000 = group size' "$work/out" || fail "self mean divisor"

# Outputs: JSON against the schema, Markdown, HTML.
expect 1 "$diff_bin" "$work/ref" "$work/sp2" --json "$work/r.json" --markdown "$work/r.md" --html "$work/r.html"
expect 1 "$diff_bin" --self "$work/sp4" --json "$work/self.json"
for j in "$work/r.json" "$work/self.json"; do
  if "$python" -c 'import jsonschema' 2>/dev/null; then
    "$python" - "$schema" "$j" <<'PY' || fail "schema validation of $j"
import json, sys, jsonschema
schema = json.load(open(sys.argv[1]))
jsonschema.Draft202012Validator.check_schema(schema)
jsonschema.validate(json.load(open(sys.argv[2])), schema, cls=jsonschema.Draft202012Validator)
PY
  else
    echo "note: jsonschema not installed in $python; structural check only" >&2
    grep -q '"verdict": ' "$j" || fail "no verdict in $j"
  fi
done
grep -q '^| scaled | `' "$work/r.md" || fail "markdown rows"
[ "$(grep -o 'class="mark scale' "$work/r.html" | wc -l)" = 14 ] || fail "html marks"

# --shard K/N + --merge: the merged report is the single-process report, byte for byte, with its exit code.
expect 1 "$diff_bin" "$work/ref" "$work/bad" --json "$work/single.json" --markdown "$work/single.md"
for n in 1 2 3 5; do
  mkdir -p "$work/parts$n"
  for k in $(seq 0 $((n - 1))); do
    expect 0 "$diff_bin" "$work/ref" "$work/bad" --shard "$k/$n" --json "$work/parts$n/part-$k.json"
    grep -q "^shard $k/$n: " "$work/out" || fail "shard $k/$n summary: $(cat "$work/out")"
  done
  expect 1 "$diff_bin" --merge "$work/parts$n"/part-*.json --json "$work/merged$n.json" --markdown "$work/merged$n.md"
  cmp -s "$work/single.json" "$work/merged$n.json" || fail "N=$n: merged JSON differs from the single-process report"
  cmp -s "$work/single.md" "$work/merged$n.md" || fail "N=$n: merged Markdown differs"
  grep -q '^mismatch *head.weight' "$work/out" || fail "N=$n: merged table"
done
# --html adds each side's bucket view (a full --self pass per side) to the HTML and to trace_a/trace_b in
# the JSON; shard 0's part carries them, so the merge that writes HTML gives the same bytes too.
expect 1 "$diff_bin" "$work/ref" "$work/bad" --json "$work/single-h.json" --html "$work/single.html"
if ! "$python" -c 'import json' 2>/dev/null; then
  echo "note: no $python; bucket views checked by grep only" >&2
  grep -q '"bucket_id"' "$work/single-h.json" || fail "no bucket views in the --html diff's JSON"
  grep -q '"bucket_id"' "$work/single.json" && fail "bucket views in a diff without --html"
elif ! "$python" - "$work/single-h.json" "$work/single.json" <<'PY'; then
import json, sys
with_html, plain = (json.load(open(p)) for p in sys.argv[1:3])
for side, ranks in (("trace_a", 1), ("trace_b", 2)):
    cells = with_html[side]["bucket_view"]
    assert cells and {c["rank"] for c in cells} == set(range(ranks)), (side, cells[:2])
    assert all(abs(c["divisor"] - ranks) < 1e-4 * ranks and c["verdict"] == "ok" for c in cells), side
    assert plain[side]["bucket_view"] == [], side  # no --html: not computed
PY
  fail "bucket views in the --html diff's JSON"
fi
grep -q '<table id="bucket-view-a">' "$work/single.html" && grep -q '<table id="bucket-view-b">' "$work/single.html" \
  || fail "bucket views missing from the --html diff"
# The views cost a --self pass per side, so shards measure them only with --bucket-views (shard 0 alone does).
for n in 1 3; do
  mkdir -p "$work/parts$n-h"
  for k in $(seq 0 $((n - 1))); do
    expect 0 "$diff_bin" "$work/ref" "$work/bad" --shard "$k/$n" --bucket-views --json "$work/parts$n-h/part-$k.json"
  done
  grep -q '"bucket_id"' "$work/parts$n-h/part-0.json" || fail "N=$n: shard 0 --bucket-views carries no views"
  if ((n > 1)); then grep -q '"bucket_id"' "$work/parts$n-h/part-1.json" && fail "N=$n: shard 1 measured views"; fi
  expect 1 "$diff_bin" --merge "$work/parts$n-h"/part-*.json --json "$work/merged$n-h.json" --html "$work/merged$n.html"
  cmp -s "$work/single-h.json" "$work/merged$n-h.json" || fail "N=$n: merged JSON (--html) differs"
  cmp -s "$work/single.html" "$work/merged$n.html" || fail "N=$n: merged HTML differs"
done
# Parts without the views: the merge writes HTML without them and says why on stderr.
grep -q '"bucket_id"' "$work/parts3/part-0.json" && fail "shard 0 measured views without --bucket-views"
"$diff_bin" --merge "$work/parts3"/part-*.json --html "$work/merged-noviews.html" >"$work/out" 2>"$work/err"
[ $? = 1 ] || fail "merge of parts without views: exit"
grep -q "shard 0 measures them with --bucket-views" "$work/err" || fail "merge without views: no note ($(cat "$work/err"))"
grep -q 'id="bucket-view-a"' "$work/merged-noviews.html" && fail "merge without views drew views"
expect 2 "$diff_bin" "$work/ref" "$work/bad" --bucket-views --json "$work/x.json"
expect_one_line_error "--bucket-views goes with --shard"
# The parts against diff/partial.schema.json (which borrows the trace and config definitions of the report's).
if "$python" -c 'import jsonschema, referencing' 2>/dev/null; then
  "$python" - "$schema" "$(dirname "$schema")/partial.schema.json" "$work"/parts*/part-*.json <<'PY' || fail "partial schema validation"
import json, sys, jsonschema
from referencing import Registry, Resource
report, partial = (json.load(open(p)) for p in sys.argv[1:3])
jsonschema.Draft202012Validator.check_schema(partial)
registry = Registry().with_resources([(s["$id"], Resource.from_contents(s)) for s in (report, partial)])
validator = jsonschema.Draft202012Validator(partial, registry=registry)
for path in sys.argv[3:]:
    validator.validate(json.load(open(path)))
PY
fi
expect 0 "$diff_bin" "$work/ref" "$work/mean" --shard 0/1 --json "$work/mean-part.json"
expect 0 "$diff_bin" --merge "$work/mean-part.json"
p="$work/parts3"
expect 2 "$diff_bin" "$work/ref" "$work/bad" --shard 3/3 --json "$work/x.json"
expect_one_line_error "--shard 3/3: K must be below N"
expect 2 "$diff_bin" "$work/ref" "$work/bad" --shard 1of3 --json "$work/x.json"
expect_one_line_error "--shard 1of3: not K/N"
expect 2 "$diff_bin" "$work/ref" "$work/bad" --shard 1/3
expect_one_line_error "--shard needs --json"
expect 2 "$diff_bin" --self "$work/sp4" --shard 0/2 --json "$work/x.json"
expect_one_line_error "--self does not take --shard"
expect 2 "$diff_bin" --merge "$p/part-0.json" "$p/part-2.json"
expect_one_line_error "shard 1/3 missing"
expect 2 "$diff_bin" --merge "$p/part-0.json" "$p/part-1.json" "$p/part-1.json" "$p/part-2.json"
expect_one_line_error "$p/part-1.json: shard 1/3 given twice"
"$diff_bin" "$work/ref" "$work/sp2" --shard 1/3 --json "$work/other-1.json" >/dev/null
expect 2 "$diff_bin" --merge "$p/part-0.json" "$work/other-1.json" "$p/part-2.json"
expect_one_line_error "$work/other-1.json: a part of a different diff"
head -c 200 "$p/part-2.json" >"$work/cut.json"
expect 2 "$diff_bin" --merge "$p/part-0.json" "$p/part-1.json" "$work/cut.json"
expect_one_line_error "$work/cut.json: not JSON"
expect 2 "$diff_bin" --merge "$work/single.json"
expect_one_line_error "$work/single.json: not a gradtrace-diff partial report"
expect 2 "$diff_bin" --merge "$p/part-0.json" "$p/part-1.json" "$p/part-2.json" --rtol 0.1
expect_one_line_error "--merge takes --rtol from the parts"

# Bad input and usage: exit 2, one line naming the file; outputs already there survive.
echo 'previous report' >"$work/keep.json"
expect 2 "$diff_bin" "$work/ref" "$work/nope" --json "$work/keep.json"
expect_one_line_error "$work/nope: no such directory"
grep -q 'previous report' "$work/keep.json" || fail "existing output destroyed"
expect 2 "$diff_bin"
expect_one_line_error "usage"
expect 2 "$diff_bin" "$work/ref" "$work/sp2" --phase sideways
expect_one_line_error "--phase"
expect 2 "$diff_bin" "$work/ref" "$work/prefixed"
expect_one_line_error "no parameter in common"
expect 2 "$diff_bin" "$work/ref" "$work/sp2" --step 9
expect_one_line_error "no final records for step 9"

cp -r "$work/sp4" "$work/missing" && rm "$work/missing/rank-00005.gtrace"
expect 2 "$diff_bin" "$work/ref" "$work/missing"
expect_one_line_error "$work/missing/rank-00005.gtrace: missing (rank 5 of world 8)"

cp -r "$work/divsp" "$work/mixed" && cp "$work/mean/rank-00003.gtrace" "$work/mixed/rank-00003.gtrace"
expect 2 "$diff_bin" "$work/ref" "$work/mixed"
expect_one_line_error "$work/mixed/rank-00003.gtrace"

# A damaged frame that the comparison reads (rank 1's first FINAL frame): exit 2 naming the file.
# (The diff reads only the frames it compares; `gradtrace-inspect --verify` checks all of them.)
cp -r "$work/sp2" "$work/corrupt"
f="$work/corrupt/rank-00001.gtrace"
at=$("$inspect_bin" --frames "$f" | awk '$2 == "bucket" && / FINAL / { print $1; exit }')
[ -n "$at" ] || fail "no FINAL frame listed by gradtrace-inspect --frames"
printf '\xff\xff\xff\xff' | dd of="$f" bs=1 seek=$((at + 40)) conv=notrunc status=none
expect 2 "$diff_bin" "$work/ref" "$work/corrupt"
expect_one_line_error "$f"

cp -r "$work/sp2" "$work/trunc"
truncate -s $(($(stat -c %s "$work/trunc/rank-00001.gtrace") - 200)) "$work/trunc/rank-00001.gtrace"
expect 1 "$diff_bin" "$work/ref" "$work/trunc"
grep -qF '[truncated]' "$work/out" || fail "truncation not reported"

# --step all: a row per step; exit 1 when any step differs, 0 when all match, 2 for a bad --step.
"$synth" "$work/ref3" --steps 3
"$synth" "$work/sp2_3" --steps 3 --sp 2 --zero-stage 2 --scaling ds-4530 --loss local-mean
expect 1 "$diff_bin" "$work/ref3" "$work/sp2_3" --step all --json "$work/steps.json"
[ "$(grep -c '^ *[0-9]\+  scaled ' "$work/out")" = 3 ] || fail "--step all: 3 scaled rows expected: $(cat "$work/out")"
grep -q '"mode": "steps"' "$work/steps.json" || fail "--step all JSON mode"
expect 0 "$diff_bin" "$work/ref3" "$work/ref3" --step all
expect 2 "$diff_bin" "$work/ref3" "$work/ref3" --step -1
expect_one_line_error "--step: expected a step number or 'all'"
expect 0 "$diff_bin" --self "$work/ref3" --step all --json "$work/self_steps.json"
grep -q "Verdict over 3 steps: ok" "$work/out" || fail "--self --step all: no verdict over 3 steps"
grep -q '"mode": "self-steps"' "$work/self_steps.json" || fail "--self --step all: JSON mode is not self-steps"
expect 2 "$diff_bin" "$work/ref3" "$work/ref3" --step all --shard 0/2 --json "$work/part.json"
expect_one_line_error "--step all does not take --shard"
# gas left unrecorded (issue 19): inspect shows the micro-steps and the inference, the diff states it.
"$synth" "$work/gas4" --gas 4 --recorded-gas 1
"$inspect_bin" "$work/gas4/rank-00000.gtrace" > "$work/inspect_gas4.txt" || fail "inspect gas4: exit $?"
grep -q "gas          4 micro-steps in every optimizer step, Config.gas records 1: gradtrace-diff infers gas 4" \
  "$work/inspect_gas4.txt" || fail "inspect: no gas inference line"
expect 0 "$diff_bin" "$work/ref" "$work/gas4" --json "$work/gas4.json"
grep -q "B: gas 4 inferred from the 4 micro-steps" "$work/gas4.json" || fail "diff: the gas inference is not said"
# Without --step every common step is compared (issue 19): the 3-step pair gets a row per step.
expect 0 "$diff_bin" "$work/ref3" "$work/ref3" --json "$work/default_steps.json"
grep -q "Step 0, the first" "$work/out" || fail "default diff: no step table"

# Issue 20: nothing received can hang, crash or inject. Errors are exit 2 and exactly one line.
expect_stderr() {  # LINE: stderr is exactly LINE
  [ "$(cat "$work/err")" = "$1" ] || fail "stderr is '$(cat "$work/err")', want '$1'"
}
# A FIFO named like a trace (or given directly) blocked every reader in open() forever.
mkdir "$work/fifo" && cp "$work/sp2/rank-00000.gtrace" "$work/fifo/" && mkfifo "$work/fifo/rank-00001.gtrace"
expect 2 timeout 20 "$diff_bin" --self "$work/fifo"
expect_stderr "gradtrace-diff: $work/fifo/rank-00001.gtrace: not a regular file (a FIFO)"
expect 2 timeout 20 "$diff_bin" "$work/ref" "$work/fifo"
expect_stderr "gradtrace-diff: $work/fifo/rank-00001.gtrace: not a regular file (a FIFO)"
expect 2 timeout 20 "$inspect_bin" --verify "$work/fifo"
expect_stderr "gradtrace-inspect: $work/fifo/rank-00001.gtrace: not a regular file (a FIFO)"
grep -q '^verify       ok' "$work/out" || fail "inspect --verify: the regular rank beside the FIFO was not verified"
expect 2 timeout 20 "$inspect_bin" "$work/fifo/rank-00001.gtrace"
expect_stderr "gradtrace-inspect: $work/fifo/rank-00001.gtrace: not a regular file (a FIFO)"

# Issue 42: inspect --verify exited 0 on a set the diff refuses (ranks of two runs, a rank twice, a rank missing):
# after every file, it now checks the set with the diff's own loader, one line naming the file, exit 2.
expect 0 "$inspect_bin" --verify "$work/sp2"
grep -qF "set          ok: $work/sp2: 2 ranks of run '" "$work/out" || fail "inspect --verify: no set line: $(tail -2 "$work/out")"
"$synth" "$work/sp2-other" --sp 2 --zero-stage 2 --scaling ds-4530 --loss local-mean --run-id other
mkdir "$work/two-runs" && cp "$work/sp2/rank-00000.gtrace" "$work/two-runs/" && cp "$work/sp2-other/rank-00001.gtrace" "$work/two-runs/"
expect 2 "$inspect_bin" --verify "$work/two-runs"
expect_stderr "gradtrace-inspect: $work/two-runs/rank-00001.gtrace: run_id 'other' differs from '$(sed -n "s/^run id *//p" "$work/out" | head -1)' of $work/two-runs/rank-00000.gtrace (mixed runs in one directory)"
[ "$(grep -c '^verify       ok' "$work/out")" = 2 ] || fail "inspect --verify: each file is still verified"
mkdir "$work/rank-twice" && cp "$work/sp2/rank-00000.gtrace" "$work/rank-twice/" && cp "$work/sp2/rank-00000.gtrace" "$work/rank-twice/rank-00001.gtrace"
expect 2 "$inspect_bin" --verify "$work/rank-twice"
expect_stderr "gradtrace-inspect: $work/rank-twice/rank-00001.gtrace: file name says rank 1 but RunInfo says rank 0"
mkdir "$work/rank-gap" && cp "$work/sp2/rank-00001.gtrace" "$work/rank-gap/"
expect 2 "$inspect_bin" --verify "$work/rank-gap"
expect_stderr "gradtrace-inspect: $work/rank-gap/rank-00000.gtrace: missing (rank 0 of world 2)"
expect 0 "$inspect_bin" "$work/two-runs"  # without --verify: what each file holds, as before
expect 2 timeout 20 "$diff_bin" --merge "$work/fifo/rank-00001.gtrace"
expect_stderr "gradtrace-diff: $work/fifo/rank-00001.gtrace: not a regular file (a FIFO)"
# Invalid UTF-8 (a directory named with byte 0xFF; a rename that cuts the two-byte 'é') aborted the JSON
# output with nlohmann's type_error.316 (exit 134): each invalid byte is written as U+FFFD.
ff="$work/d"$'\xff'
cp -r "$work/ref" "$ff"
expect 0 "$diff_bin" --self "$ff" --json "$work/ff.json"
grep -qF "\"dir\": \"$work/d"$'\xef\xbf\xbd'"\"," "$work/ff.json" || fail "0xFF in a path: not U+FFFD in the JSON"
"$synth" "$work/ete" --prefix 'été.'
"$synth" "$work/ete2" --prefix 'été.' --sp 2 --zero-stage 2 --scaling ds-4530 --loss local-mean
# RE2 matches UTF-8 characters; its \C (one byte) still cuts one.
expect 1 "$diff_bin" "$work/ete" "$work/ete2" --rename '^\C=' --json "$work/ete.json"
grep -qF '"name": "'$'\xef\xbf\xbd''té.head.weight",' "$work/ete.json" || fail "cut character: not U+FFFD in the JSON"
"$python" -c 'import json, sys; json.load(open(sys.argv[1], encoding="utf-8"))' "$work/ete.json" \
  || fail "cut character: the JSON is not UTF-8"
# Names, the recorded scaling and the run id from a trace went out as raw HTML and terminal escapes; a
# backtick closed the name's code span and a carriage return ended its table row.
hostile=$'a`b\r|<img src=x onerror=alert(1)>\x1b[2J.'
"$synth" "$work/inj" --prefix "$hostile"
"$synth" "$work/inj2" --prefix "$hostile" --sp 2 --zero-stage 2 --scaling ds-4530 --loss local-mean \
  --recorded-scaling '<svg onload=alert(1)>|x' --run-id $'r\x1b]0;title\x07'
expect 1 "$diff_bin" "$work/inj" "$work/inj2" --markdown "$work/inj.md"
grep -q $'[\033\r]' "$work/out" && fail "a control byte from a trace reached the terminal: $(cat -v "$work/out")"
grep -qF 'scaled     ...mg src=x onerror=alert(1)>\x1b[2J.head.weight ' "$work/out" \
  || fail "text report: the name's control bytes not shown as escapes: $(sed -n 6,7p "$work/out")"
expect 0 "$inspect_bin" "$work/inj2/rank-00000.gtrace"
grep -q $'[\033\r\a]' "$work/out" && fail "inspect: a control byte from a trace reached the terminal"
grep -qF 'run id       r\x1b]0;title\x07' "$work/out" || fail "inspect: run id not escaped: $(grep run "$work/out")"
if "$python" -c 'import markdown_it' 2>/dev/null; then
  # Rendered as GitHub does (tables) and with raw HTML allowed, as markdown-it can be configured.
  "$python" - "$work/inj.md" <<'PY' || fail "Markdown report: renders hostile trace strings unsafely"
import html.parser, sys
from markdown_it import MarkdownIt
rendered = MarkdownIt("commonmark", {"html": True}).enable("table").render(open(sys.argv[1], encoding="utf-8").read())
class Page(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags, self.code, self.cells, self.open = set(), [], [], None
    def handle_starttag(self, tag, attrs):
        self.tags.add(tag)
        if tag in ("code", "td"):
            self.open = tag
            (self.code if tag == "code" else self.cells).append("")
    def handle_endtag(self, tag):
        self.open = None if tag == self.open else self.open
    def handle_data(self, data):
        if self.open:
            (self.code if self.open == "code" else self.cells)[-1] += data
page = Page()
page.feed(rendered)
assert not page.tags & {"img", "svg", "script"}, page.tags
names = [c for c in page.code if c.startswith("a`b\\x0d|<img src=x onerror=alert(1)>\\x1b[2J.")]
assert len(names) == 14 and "a`b\\x0d|<img src=x onerror=alert(1)>\\x1b[2J.head.weight" in names, page.code
assert page.cells.count("scaled") == 14, page.cells  # one table row per parameter
assert "<svg onload=alert(1)>|x" in page.cells, page.cells  # the recorded scaling, as text
PY
else
  echo "note: markdown-it-py not installed in $python; Markdown rendering not checked" >&2
fi
# --merge on crafted partial reports: 50,000 nested arrays overflowed the stack (SIGSEGV); shard.n = 2^31-1
# and param_count = 1e9 sized vectors before any check (bad_alloc, SIGABRT).
head -c 50000 /dev/zero | tr '\0' '[' >"$work/deep.json"
expect 2 "$diff_bin" --merge "$work/deep.json"
expect_stderr "gradtrace-diff: $work/deep.json: nested deeper than 64 arrays and objects (byte 64)"
sed 's/^    "n": 3$/    "n": 2147483647/' "$work/parts3/part-0.json" >"$work/huge-n.json"
expect 2 "$diff_bin" --merge "$work/huge-n.json"
expect_stderr "gradtrace-diff: --merge: shard 1/2147483647 missing (parts given: $work/huge-n.json)"
sed 's/^  "param_count": [0-9]*,$/  "param_count": 1000000000,/' "$work/parts3/part-0.json" >"$work/huge-count.json"
expect 2 "$diff_bin" --merge "$work/huge-count.json" "$work/parts3/part-1.json" "$work/parts3/part-2.json"
expect_stderr "gradtrace-diff: --merge: parameter index 14 of 1000000000 is in no part (parts given: \
$work/huge-count.json, $work/parts3/part-1.json, $work/parts3/part-2.json)"

finish cli_test
