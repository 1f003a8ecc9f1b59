# shellcheck shell=bash disable=SC2154  # bin and out: the sourcing script's
# Sourced by the GPU scripts once they have set `bin` (the binaries' folder) and `out` (the
# logs'): the tests' data, find_bin and gtest.
export KVS_SOURCE_DIR=${KVS_SOURCE_DIR:-$PWD}  # the tests' data: this checkout
mkdir -p "$out"
failed=0
# A program of $bin, or of $bin/tests where the tests are built.
find_bin() { [ -x "$bin/$1" ] && echo "$bin/$1" || echo "$bin/tests/$1"; }
# GoogleTest program NAME with ARGS, at most SECONDS: its log in $out/NAME.txt, its exit status
# and verdict, then the first lines of its failures; failed=1 where it failed.
gtest() {  # NAME SECONDS [ARGS...]
  local t=$1 limit=$2 rc
  shift 2
  KVS_BINARY="$bin/kvstream" timeout "$limit" "$(find_bin "$t")" "$@" > "$out/$t.txt" 2>&1
  rc=$?
  [ "$rc" = 0 ] || failed=1
  echo "$t: exit $rc | $(grep -E '^\[  (PASSED|FAILED) ' "$out/$t.txt" | tr '\n' ' ')"
  grep -E "worst|Failure|Expected|actual|Which is|error" "$out/$t.txt" | head -16
}
