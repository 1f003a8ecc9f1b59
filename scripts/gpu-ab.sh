#!/usr/bin/env bash
# On the GPU machine: environment switches compared in one call (machines lent for different
# calls differ, so a change is only compared with another in the same call).
#   scripts/gpu-ab.sh bench CFG...   decode of KVS_AB_MODEL (default llama3-8b:q4_0; q8_0 K,
#                                    KVS_CTV V: default q8_0) at KVS_DEPTHS (default
#                                    0,32k,128k), 64 tokens, every CFG twice, alternating
#   scripts/gpu-ab.sh exact CFG...   the last logits of 700 prompt tokens taken one at a time
#                                    (one-token steps: the matrix-vector products, the decode
#                                    attention over pages of 16 and its fold) under every CFG,
#                                    compared bit for bit with the first CFG's
# A CFG is a quoted list of assignments, e.g. "KVS_PDL=0" "" ("": none); "bin=DIR" in it runs
# DIR/kvstream instead of KVS_BIN's, so two builds compare too: "bin=/tmp/base" "bin=build/sm90".
# KVS_BIN: the folder with kvstream (default build/sm90); OUT: where the logs and JSON go
# (default out/ab).
set -uo pipefail
bin=${KVS_BIN:-build/sm90}
out=${OUT:-out/ab}
mode=${1:-}
shift || true
[ $# -gt 0 ] || { echo "usage: $0 bench|exact CFG..." >&2; exit 2; }
mkdir -p "$out"
name() { local n=${1// /_}; n=${n//=/-}; n=${n//\//_}; echo "${n:-default}"; }
# CFG's binary folder and its environment assignments.
cfg_bin() { local w; for w in $1; do [[ $w == bin=* ]] && { echo "${w#bin=}"; return; }; done; echo "$bin"; }
cfg_env() { local w e=""; for w in $1; do [[ $w == bin=* ]] || e+="$w "; done; echo "$e"; }
synth="$(dirname "$0")/synth-model.sh"  # the model written once as GGUF, then mapped

case "$mode" in
  bench)
    for round in 1 2; do
      for cfg in "$@"; do
        f="$out/$(name "$cfg")-$round"
        # shellcheck disable=SC2086  # the assignments split on spaces
        env $(cfg_env "$cfg") timeout 200 "$(cfg_bin "$cfg")/kvstream" bench \
          -m "$("$synth" "$bin" "${KVS_AB_MODEL:-llama3-8b:q4_0}")" -ctk q8_0 \
          -ctv "${KVS_CTV:-q8_0}" --backend cuda --fill random -p 0 --modes resident \
          --depths "${KVS_DEPTHS:-0,32k,128k}" --n-gen 64 --json "$f.json" > "$f.txt" 2>&1
        echo "[$cfg] round $round (exit $?): $(grep -E '\| tg[0-9]+ \|' "$f.txt" |
          awk -F'|' '{printf "depth%s tg%s |", $5, $7}')"
      done
    done
    ;;
  exact)
    ids=$(seq -s, 1 700)
    first=""
    for cfg in "$@"; do
      f="$out/logits-$(name "$cfg")"
      # shellcheck disable=SC2086
      env $(cfg_env "$cfg") timeout 150 "$(cfg_bin "$cfg")/kvstream" run \
        -m "$("$synth" "$bin" llama3-8b:q4_0)" \
        --backend cuda --tokens "$ids" -b 1 --page-size 16 -n 0 --cache-type-k q8_0 \
        --cache-type-v q8_0 --logits-out "$f.npy" > "$f.txt" 2>&1 || echo "[$cfg]: failed (exit $?)"
      if [ -z "$first" ]; then
        first=$f
      elif cmp -s "$first.npy" "$f.npy"; then
        echo "[$cfg]: the same bits as [$1]"
      else
        python3 -c "
import numpy as np
a, b = (np.load(p).astype(np.float64) for p in ('$first.npy', '$f.npy'))
print('[$cfg]: DIFFERS from [$1]: max |diff| %.3g of max |logit| %.3g' % (abs(a - b).max(), abs(a).max()))
" || echo "[$cfg]: DIFFERS from [$1]"
      fi
    done
    ;;
  *)
    echo "usage: $0 bench|exact CFG..." >&2
    exit 2
    ;;
esac
