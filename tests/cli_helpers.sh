# Helpers for the command-line tests (bash, sourced after the script sets
# $work, its scratch directory): each command's stdout and stderr go to
# $work/out and $work/err; failures are counted and reported by finish.
#   source "$(dirname "$0")/../cli_helpers.sh"
failures=0

fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }

# expect CODE CMD...: runs CMD; fails unless it exits with CODE.
expect() {
  local want="$1"; shift
  "$@" >"$work/out" 2>"$work/err"
  local got=$?
  [ "$got" = "$want" ] || fail "exit $got (want $want): $* -- $(tail -c 400 "$work/err")"
}

# expect_error TOOL NEEDLE: the error is one line "TOOL: ..." holding NEEDLE, and the last line on stderr;
# before it gradtrace-pack prints its progress lines, the other tools nothing.
expect_error() {
  local lines last
  lines=$(wc -l <"$work/err")
  last=$(tail -n 1 "$work/err")
  [ "$1" = gradtrace-pack ] || [ "$lines" = 1 ] || fail "stderr has $lines lines, want 1: $(head -c 600 "$work/err")"
  case "$last" in "$1: "*) ;; *) fail "the last line on stderr lacks the prefix '$1: ': $last" ;; esac
  case "$last" in *"$2"*) ;; *) fail "the last line on stderr lacks '$2': $last" ;; esac
}

# finish NAME: the summary line and the exit status of the test.
finish() {
  if [ "$failures" -ne 0 ]; then
    echo "$1: $failures failure(s)" >&2
    exit 1
  fi
  echo "$1: all passed"
}
