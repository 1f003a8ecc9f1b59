#!/usr/bin/env bash
# On the GPU machine: the trials that are off by default (docs/benchmarks.md, "Trials"):
# KVS_MATVEC=staged (one-token integer products through shared-memory rings filled by bulk
# copies), KVS_PDL_EARLY=1 (the short kernels launch the next kernel first) and KVS_FOLD=pipe
# (the decode fold's scan and serial part overlapped).
#   scripts/gpu-trial.sh checks         kvs_matvec_sweep trial (staged bit for bit against
#                                       matvec_q, then times), the CUDA tests with the trials on
#   scripts/gpu-trial.sh exact          the last logits of 700 one-token steps: the fold and
#                                       early launches must not change a bit, staged against
#                                       q within tolerance; KVS_PROFILE's times at depth 0
#   scripts/gpu-trial.sh ab CFG...      decode at depths 0, 32K and 128K of llama3-8b q4_0
#                                       (q8_0 K/V) for each CFG = MATVEC:EARLY:FOLD[:WARP]
#                                       (e.g. q:0:chunk staged:1:pipe q:0:chunk:1; WARP sets
#                                       KVS_DECODE_WARP), every CFG twice, alternating;
#                                       KVS_DEPTHS replaces the depths
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
      KVS_MATVEC=staged KVS_PDL_EARLY=1 KVS_FOLD=pipe KVS_BINARY="$bin/kvstream" timeout 200 \
        "$(find_bin $t)" > "$out/$t-trial.txt" 2>&1
      echo "$t (staged, early, pipe): exit $? | $(grep -E '^\[  (PASSED|FAILED) ' "$out/$t-trial.txt" |
        tr '\n' ' ')"
      grep -E "worst|Failure|Expected|actual" "$out/$t-trial.txt" | head -12
    done
    ;;
  exact)
    # Exactness: 700 prompt tokens one at a time (each a one-token step: the matrix-vector
    # products, the decode attention over pages of 16 and its fold), the last logits saved.
    # The fold and early launches must not change a bit; staged against q is compared
    # within the CUDA tests' tolerance.
    ids=$(seq -s, 1 700)
    for v in q:chunk:0 q:pipe:1 staged:chunk:0; do
      IFS=: read -r mv fo ea <<< "$v"
      KVS_MATVEC=$mv KVS_FOLD=$fo KVS_PDL_EARLY=$ea timeout 120 "$bin/kvstream" run \
        -m synthetic:llama3-8b:q4_0 --backend cuda --tokens "$ids" -b 1 --page-size 16 -n 0 \
        --cache-type-k q8_0 --cache-type-v q8_0 --logits-out "$out/logits-$mv-$fo-$ea.npy" \
        > "$out/logits-$mv-$fo-$ea.txt" 2>&1 || echo "run $v: failed (exit $?)"
    done
    for pair in "q-chunk-0 q-pipe-1"; do
      set -- $pair
      cmp -s "$out/logits-$1.npy" "$out/logits-$2.npy" && echo "logits $1 = $2: same bits" ||
        echo "logits $1 = $2: DIFFER"
    done
    python3 -c "
import numpy as np, sys
a, b = (np.load('$out/logits-%s-chunk-0.npy' % m).astype(np.float64) for m in ('q', 'staged'))
print('logits staged against q: max |diff| %.3g of max |logit| %.3g' % (abs(a - b).max(), abs(a).max()))
" || echo "logits staged against q: not compared"
    for m in q staged; do
      KVS_PROFILE=1 KVS_MATVEC=$m timeout 120 "${bench8b[@]}" --depths 0 --n-gen 16 \
        --json "$out/profile-$m.json" > "$out/profile-$m.txt" 2>&1
      echo "KVS_PROFILE, KVS_MATVEC=$m: exit $?"
      grep -E "^\| synthetic|profile|matmul" "$out/profile-$m.txt" | head -8
    done
    ;;
  ab)
    [ $# -gt 0 ] || { echo "usage: $0 ab MATVEC:EARLY:FOLD[:WARP]..." >&2; exit 2; }
    for round in 1 2; do
      for cfg in "$@"; do
        IFS=: read -r mv ea fo wp <<< "$cfg"
        f="$out/ab-${cfg//:/-}-$round"
        dw=()
        [ -n "$wp" ] && dw=(KVS_DECODE_WARP="$wp")
        env "${dw[@]}" KVS_MATVEC=$mv KVS_PDL_EARLY=$ea KVS_FOLD=$fo timeout 150 "${bench8b[@]}" \
          --depths "${KVS_DEPTHS:-0,32k,128k}" --n-gen 64 --json "$f.json" > "$f.txt" 2>&1
        echo "$cfg round $round (exit $?): $(grep -E '^\| synthetic' "$f.txt" |
          awk -F'|' '{printf "depth%s tg%s |", $5, $7}')"
      done
    done
    ;;
  *)
    echo "usage: $0 checks | exact | ab MATVEC:EARLY:FOLD[:WARP]..." >&2
    exit 2
    ;;
esac
