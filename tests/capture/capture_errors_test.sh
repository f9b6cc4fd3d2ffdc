#!/usr/bin/env bash
# Issue 20: capture never takes training down. gradtrace-train (2 gloo ranks) writing its traces to a
# filesystem that fills up mid-run: by default (--on-capture-error disable) both ranks warn once, train to
# the end with the same final loss as on a big disk, exit 0, and leave traces that verify as truncated;
# with --on-capture-error abort the run exits non-zero. A directory holding a finished run is refused
# without --overwrite (one line per rank naming the file and the option) and replaced with it.
#
# The small filesystem is a private tmpfs in a mount namespace of the run's own (`unshare -m` as root,
# `unshare -rm` otherwise), so no mount outlives the run; what the run left there is copied out before
# the namespace ends. Where neither can mount, RLIMIT_FSIZE (prlimit; gradtrace-train ignores SIGXFSZ, so
# writes past it fail with EFBIG), a real write error too; GRADTRACE_SMALL_FS=rlimit forces it. The output
# says which.
# Usage: capture_errors_test.sh GRADTRACE_TRAIN GRADTRACE_INSPECT
set -uo pipefail
train="$1" inspect="$2"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }

tiny=(--nproc 2 --dp 2 --vocab 32 --hidden 16 --heads 4 --layers 2 --seq-len 8 --batch 4 --dtype fp64
  --reduce-bucket-size 1500 --timeout 30)
# Measured for this model: each rank writes 3.3 KB of header and RunInfo, then 171 KB per step (7 buckets
# of PRE, POST and FINAL in fp64, which barely compress). 512 KiB for both ranks (256 KiB per file under
# RLIMIT_FSIZE) holds step 0 of both and fills up during step 1 of 6.
size=$((512 * 1024))

if [ "$(id -u)" = 0 ]; then ns=(unshare -m); else ns=(unshare -rm); fi
mkdir -p "$work/probe"
if [ "${GRADTRACE_SMALL_FS:-}" != rlimit ] &&
  "${ns[@]}" sh -c 'mount -t tmpfs -o size=64k tmpfs "$1"' sh "$work/probe" 2>/dev/null; then
  method=tmpfs
  echo "small filesystem: a private tmpfs of $size bytes (${ns[*]})"
else
  method=rlimit
  echo "small filesystem: no private tmpfs (no mount namespace here, or GRADTRACE_SMALL_FS=rlimit); RLIMIT_FSIZE of" \
    "$((size / 2)) bytes per file (prlimit)"
fi

# on_small_fs MNT KEEP CMD...: runs CMD with MNT on the small filesystem, stdout/stderr into $work/out and
# $work/err; copies what CMD left in MNT to KEEP; sets rc to CMD's exit status.
on_small_fs() {
  local mnt="$1" keep="$2"
  shift 2
  mkdir -p "$mnt" "$keep"
  if [ "$method" = tmpfs ]; then
    "${ns[@]}" sh -c 'mnt=$1 keep=$2 size=$3; shift 3
      mount -t tmpfs -o size="$size" tmpfs "$mnt" || exit 97
      "$@"; rc=$?
      cp -a "$mnt"/. "$keep"/
      exit $rc' sh "$mnt" "$keep" "$size" "$@" >"$work/out" 2>"$work/err"
    rc=$?
  else
    prlimit --fsize=$((size / 2)) "$@" >"$work/out" 2>"$work/err"
    rc=$?
    cp -a "$mnt"/. "$keep"/
  fi
}

final_loss() { grep -o 'final loss(rank 0) [^;]*' "$1"; }

# The reference: the same run on a big disk.
"$train" "${tiny[@]}" --steps 6 --out "$work/big" >"$work/big.out" 2>"$work/big.err"
rc=$?
[ "$rc" = 0 ] || fail "big disk: exit $rc: $(tail -3 "$work/big.err")"
"$inspect" --verify "$work/big" >/dev/null 2>"$work/verify.err" || fail "big disk trace does not verify: $(cat "$work/verify.err")"
echo "big disk: exit $rc, $(du -cb "$work"/big/rank-*.gtrace | tail -1 | cut -f1) bytes of traces, $(final_loss "$work/big.err")"

# 1. Default: warn once per rank, train on, exit 0, the same final loss, truncated traces.
on_small_fs "$work/mnt1" "$work/full" "$train" "${tiny[@]}" --steps 6 --out "$work/mnt1/run"
echo "full disk, default: exit $rc"
grep 'capture disabled' "$work/err"
[ "$rc" = 0 ] || fail "full disk, default: exit $rc (want 0): $(tail -5 "$work/err")"
for r in 0 1; do
  n=$(grep -c "^\[rank $r\] gradtrace: WARNING: rank $r: capture disabled after a write error: .*rank-0000$r.gtrace.*training continues without capture" "$work/err")
  [ "$n" = 1 ] || fail "rank $r warned $n times (want 1): $(cat "$work/err")"
done
want="$(final_loss "$work/big.err")"
got="$(final_loss "$work/err")"
[ -n "$want" ] && [ "$want" = "$got" ] || fail "final loss '$got' differs from the big disk's '$want'"
for r in 0 1; do
  f="$work/full/run/rank-0000$r.gtrace"
  [ -f "$f" ] || { fail "no $f"; continue; }
  "$inspect" --verify "$f" >"$work/vout" 2>"$work/verr"
  vrc=$?
  echo "verify rank $r ($(stat -c %s "$f") bytes): exit $vrc: $(cat "$work/verr")"
  [ "$vrc" = 2 ] || fail "verify rank $r: exit $vrc (want 2)"
  grep -qF "file ends without index and footer: the writer did not finish" "$work/verr" ||
    fail "verify rank $r does not say truncated: $(cat "$work/verr")"
  grep -qiE "checksum|corrupt|magic" "$work/verr" && fail "verify rank $r reads as corrupt: $(cat "$work/verr")"
  grep -qE '^totals +[1-9][0-9]* frames' "$work/vout" ||
    fail "verify rank $r lists no frame read before the cut: $(tail -5 "$work/vout")"
  echo "  $(grep -E '^totals' "$work/vout")"
  grep -qE '^ +0 +0 FINAL ' "$work/vout" || fail "rank $r: step 0's FINAL did not fit: $(tail -30 "$work/vout")"
  grep -qE '^ +5 +0 ' "$work/vout" && fail "rank $r: step 5 fitted: the filesystem never filled up"
done

# 2. --on-capture-error abort: the old behaviour, on request.
on_small_fs "$work/mnt2" "$work/abort" "$train" "${tiny[@]}" --steps 6 --out "$work/mnt2/run" --on-capture-error abort
echo "full disk, --on-capture-error abort: exit $rc: $(grep -m1 -E 'No space left|File too large' "$work/err")"
[ "$rc" != 0 ] || fail "full disk with abort: exit 0"
grep -qE '(write|flush) failed: (No space left on device|File too large)' "$work/err" ||
  fail "abort: no write error named: $(tail -5 "$work/err")"

# 3. A directory holding a finished run: refused without --overwrite, replaced with it.
run_id() { "$inspect" "$1" 2>/dev/null | grep -m1 '^run id' | awk '{print $3}'; }
before="$(run_id "$work/big/rank-00000.gtrace")"
"$train" "${tiny[@]}" --steps 1 --out "$work/big" >"$work/out" 2>"$work/err"
rc=$?
echo "re-capture without --overwrite: exit $rc"
grep 'rank-0000' "$work/err"
[ "$rc" = 1 ] || fail "re-capture without --overwrite: exit $rc (want 1)"
for r in 0 1; do
  line=$(grep "rank-0000$r.gtrace" "$work/err")
  [ "$(printf '%s\n' "$line" | grep -c .)" = 1 ] || fail "rank $r: want one line naming its file: $(cat "$work/err")"
  printf '%s' "$line" | grep -qF "gradtrace-train: rank $r: $work/big/rank-0000$r.gtrace: exists (run '" ||
    fail "rank $r: message: $line"
  printf '%s' "$line" | grep -qF -- "--overwrite" || fail "rank $r: message does not name --overwrite: $line"
done
[ "$(run_id "$work/big/rank-00000.gtrace")" = "$before" ] || fail "the refused run touched the finished trace"
"$inspect" --verify "$work/big" >/dev/null 2>&1 || fail "the finished trace no longer verifies after the refusal"
"$train" "${tiny[@]}" --steps 1 --out "$work/big" --overwrite >"$work/out" 2>"$work/err"
rc=$?
echo "re-capture with --overwrite: exit $rc"
[ "$rc" = 0 ] || fail "re-capture with --overwrite: exit $rc: $(tail -3 "$work/err")"
"$inspect" --verify "$work/big" >/dev/null 2>"$work/verr" || fail "overwritten trace does not verify: $(cat "$work/verr")"
after="$(run_id "$work/big/rank-00000.gtrace")"
[ -n "$after" ] && [ "$after" != "$before" ] || fail "run id after --overwrite '$after' (before '$before')"

if [ "$failures" -gt 0 ]; then
  echo "$failures failure(s)" >&2
  exit 1
fi
echo "capture_errors_test: all passed ($method)"
