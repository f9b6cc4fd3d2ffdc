#!/usr/bin/env bash
# The DeepSpeed #5248 matrix on real gradtrace-train traces (not synthetic ones):
# each configuration is captured with real multi-process gloo and diffed against
# a single-rank full-sequence reference with the same weights and data.
#   usage: matrix_5248_test.sh GRADTRACE_TRAIN GRADTRACE_DIFF
set -euo pipefail
train=$1 diff=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

model=(--seed 5248 --seq-len 32 --batch 2 --layers 1 --hidden 32 --heads 4 --vocab 64 --steps 1 --zero-stage 2)
capture() {  # capture NAME ARGS...
  local name=$1; shift
  "$train" "${model[@]}" "$@" --out "$work/$name" >"$work/$name.log" 2>&1 || { cat "$work/$name.log" >&2; fail "capture $name"; }
}
# expect_diff A B EXIT [SCALE EXPRESSION]: exit code, and for exit 1 a single
# scale group whose factor and matched config expression are as given.
expect_diff() {
  local a=$1 b=$2 want=$3 rc=0
  "$diff" "$work/$a" "$work/$b" --json "$work/$b.json" >"$work/$b.out" 2>&1 || rc=$?
  [ "$rc" -eq "$want" ] || { cat "$work/$b.out" >&2; fail "diff $a $b exited $rc, want $want"; }
  [ $# -gt 3 ] || return 0
  python3 - "$work/$b.json" "$4" "$5" <<'PY' || fail "diff $a $b: scale groups"
import json, sys
report, scale, expr = json.load(open(sys.argv[1])), float(sys.argv[2]), sys.argv[3]
groups = [g for g in report["groups"] if g["kind"] == "scale"]
assert len(groups) == 1, f"want one scale group, got {[(g['scale'], g['count']) for g in groups]}"
g = groups[0]
assert abs(g["scale"] - scale) <= 1e-4 * scale, f"scale {g['scale']} != {scale}"
assert g["expression"] == expr, f"expression {g['expression']!r} != {expr!r}"
assert g["count"] == len(report["params"]), "not every parameter is in the group"
assert f"= {expr} for all" in g["explanation"], g["explanation"]
PY
}
# expect_self DIR DIVISOR: --self measures this effective divisor for every parameter.
expect_self() {
  "$diff" --self "$work/$1" --json "$work/$1.self.json" >/dev/null 2>&1 || true
  python3 - "$work/$1.self.json" "$2" <<'PY' || fail "--self $1"
import json, sys
report, want = json.load(open(sys.argv[1])), float(sys.argv[2])
divs = sorted({round(p["divisor"], 6) for p in report["self_params"]})
assert divs == [want], f"effective divisors {divs}, want {want}"
PY
}

capture ref          --nproc 1 --dp 1 --sp 1 --scaling mean --loss local-mean
capture sp2-loss     --nproc 2 --dp 1 --sp 2 --scaling ds-4530 --loss local-mean
capture sp4-loss     --nproc 4 --dp 1 --sp 4 --scaling ds-4530 --loss local-mean
capture sp2-div      --nproc 2 --dp 1 --sp 2 --scaling ds-4530 --loss local-mean-div-sp
capture sp2-mean     --nproc 2 --dp 1 --sp 2 --scaling mean    --loss local-mean
capture dp2sp2-loss  --nproc 4 --dp 2 --sp 2 --scaling ds-4530 --loss local-mean
capture dp2sp2-mean  --nproc 4 --dp 2 --sp 2 --scaling mean    --loss local-mean
capture sp2-sketch   --nproc 2 --dp 1 --sp 2 --scaling ds-4530 --loss local-mean --capture sketch:64

# backward(loss) under DeepSpeed's ZeRO-1/2 divisor (group / sp): sp times too large.
expect_diff ref sp2-loss 1 2 'sp(B)'
expect_diff ref sp4-loss 1 4 'sp(B)'
expect_diff ref dp2sp2-loss 1 2 'sp(B)'
# backward(loss / sp), or a plain mean over the whole group: exact.
expect_diff ref sp2-div 0
expect_diff ref sp2-mean 0
# A sketch of 64 positions per parameter agrees with the full trace on the scale.
expect_diff ref sp2-sketch 1 2 'sp(B)'

# --self: ds-4530 divides by dp, mean by dp x sp.
expect_self sp2-loss 1
expect_self dp2sp2-loss 2
expect_self sp2-mean 2
expect_self dp2sp2-mean 4

# Unequal valid tokens per shard: loss / sp is no longer exact, token-weighted is.
capture ref-ign       --nproc 1 --dp 1 --sp 1 --scaling mean    --loss local-mean        --ignore-frac 0.3
capture sp2-div-ign   --nproc 2 --dp 1 --sp 2 --scaling ds-4530 --loss local-mean-div-sp --ignore-frac 0.3
capture sp2-tok-ign   --nproc 2 --dp 1 --sp 2 --scaling ds-4530 --loss token-weighted    --ignore-frac 0.3
expect_diff ref-ign sp2-div-ign 1
python3 -c "import json,sys; r=json.load(open(sys.argv[1])); sys.exit(r['verdict']=='match')" "$work/sp2-div-ign.json" \
  || fail "loss/sp with unequal shards reported as match"
expect_diff ref-ign sp2-tok-ign 0

# A different model is refused, not compared: exit 2 and one line naming the trace.
model=("${model[@]/#32/48}")  # --seq-len and --hidden 32 -> 48: another model
capture other --nproc 1 --dp 1 --sp 1 --scaling mean --loss local-mean
rc=0; "$diff" "$work/ref" "$work/other" >"$work/other.out" 2>"$work/other.err" || rc=$?
[ "$rc" -eq 2 ] || fail "different models: exit $rc, want 2"
[ "$(wc -l <"$work/other.err")" -eq 1 ] && grep -q "a different model" "$work/other.err" \
  || fail "different models: want one line naming the model change, got: $(cat "$work/other.err")"
echo "matrix_5248: all checks passed"
