#!/usr/bin/env bash
# On the GPU machine: the trials that are off by default (docs/benchmarks.md, "Trials"):
# KVS_MATVEC=staged (one-token integer products through shared-memory rings filled by bulk
# copies) and KVS_PDL_EARLY=1 (the short kernels launch the next kernel first).
#   scripts/gpu-trial.sh checks         kvs_matvec_sweep trial (staged bit for bit against
#                                       matvec_q, then times), the CUDA tests with both trials
#                                       on, and KVS_PROFILE's time per operation at depth 0
#   scripts/gpu-trial.sh ab CFG...      decode at depths 0 and 32K of llama3-8b q4_0 (q8_0 K/V)
#                                       for each CFG = MATVEC:EARLY (e.g. q:0 staged:0 q:1
#                                       staged:1), every CFG twice, alternating, in one call
# KVS_BIN: the folder with kvstream, kvs_matvec_sweep and the CUDA test binaries (default
# build/sm90); OUT: where the logs and JSON go (default out/trial); KVS_MODEL_DIR may hold
# SmolLM2 for the model tests.
set -uo pipefail
export KVS_SOURCE_DIR=${KVS_SOURCE_DIR:-$PWD}  # the tests' data: this checkout
bin=${KVS_BIN:-build/sm90}
out=${OUT:-out/trial}
mode=${1:-}
shift || true
mkdir -p "$out"
find_bin() { [ -x "$bin/$1" ] && echo "$bin/$1" || echo "$bin/tests/$1"; }
bench8b=("$bin/kvstream" bench -m synthetic:llama3-8b:q4_0 -ctk q8_0 -ctv q8_0 --backend cuda
  --fill random -p 0 --modes resident)

case "$mode" in
  checks)
    timeout 240 "$bin/kvs_matvec_sweep" trial > "$out/matvec-trial.txt" 2>&1
    echo "kvs_matvec_sweep trial: exit $?"
    grep -E "MISMATCH|^trial" "$out/matvec-trial.txt" | head -20
    grep -E "us " "$out/matvec-trial.txt"
    for t in kvs_cuda_test_cuda_ops kvs_cuda_test_cuda; do
      KVS_MATVEC=staged KVS_PDL_EARLY=1 KVS_BINARY="$bin/kvstream" timeout 200 \
        "$(find_bin $t)" > "$out/$t-trial.txt" 2>&1
      echo "$t (staged, early): exit $? | $(grep -E '^\[  (PASSED|FAILED) ' "$out/$t-trial.txt" |
        tr '\n' ' ')"
      grep -E "worst|Failure|Expected|actual" "$out/$t-trial.txt" | head -12
    done
    for m in q staged; do
      KVS_PROFILE=1 KVS_MATVEC=$m timeout 120 "${bench8b[@]}" --depths 0 --n-gen 16 \
        --json "$out/profile-$m.json" > "$out/profile-$m.txt" 2>&1
      echo "KVS_PROFILE, KVS_MATVEC=$m: exit $?"
      grep -E "^\| synthetic|profile|matmul" "$out/profile-$m.txt" | head -8
    done
    ;;
  ab)
    [ $# -gt 0 ] || { echo "usage: $0 ab MATVEC:EARLY..." >&2; exit 2; }
    for round in 1 2; do
      for cfg in "$@"; do
        KVS_MATVEC=${cfg%%:*} KVS_PDL_EARLY=${cfg##*:} timeout 150 "${bench8b[@]}" --depths 0,32k \
          --n-gen 64 --json "$out/ab-${cfg/:/-}-$round.json" > "$out/ab-${cfg/:/-}-$round.txt" 2>&1
        echo "$cfg round $round (exit $?): $(grep -E '^\| synthetic' \
          "$out/ab-${cfg/:/-}-$round.txt" | awk -F'|' '{printf "depth%s tg%s |", $5, $7}')"
      done
    done
    ;;
  *)
    echo "usage: $0 checks | ab MATVEC:EARLY..." >&2
    exit 2
    ;;
esac
