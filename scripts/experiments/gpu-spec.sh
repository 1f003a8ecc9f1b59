#!/usr/bin/env bash
# On a GPU machine: what a speculative verify step costs when the history streams (issue 32).
# `bench --verify-tokens 1,2,4,8` on llama3-8b q4_0 with q8_0 K / q4_0 V at 0, 32K, 128K and 256K,
# everything resident and then streamed under --vram-limit (an arena of about 2.2 GiB): each
# verifyK row is a step of K tokens against the one-token step (target: verify5 <= 1.2x once
# streaming dominates). Then SmolLM2's greedy decode of a prompt that repeats itself with and
# without --spec ngram (tokens/s and acceptance on stderr, the JSON beside). KVS_BIN is the folder
# with kvstream (default build/cuda), OUT receives the JSON and tables (default out/gpu), LIMIT
# overrides the limit (default 6.66G); each sweep is bounded by KVS_BENCH_TIMEOUT seconds
# (default 600), the JSON keeping what a sweep cut short had measured.
set -uo pipefail
bin=${KVS_BIN:-build/cuda}
out=${OUT:-out/gpu}
limit=${LIMIT:-6.66G}
t=${KVS_BENCH_TIMEOUT:-600}
mkdir -p "$out"
m=(-m synthetic:llama3-8b:q4_0 -ctk q8_0 -ctv q4_0 --backend cuda --fill random
   --verify-tokens 1,2,4,5,8 --n-gen 16 -p 0)
run() {  # name, then bench arguments
  local name=$1
  shift
  timeout "$t" "$bin/kvstream" bench "${m[@]}" "$@" --json "$out/verify-$name.json" 2>&1 |
    grep -vE 'filling' | tee "$out/verify-$name.md"
}
run resident --modes resident --depths 0,32k
run stream --modes auto --depths 0,32k,128k,256k --vram-limit "$limit"
fox="The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy dog. The quick brown fox"
for spec in off ngram; do
  "$bin/kvstream" run -m models/SmolLM2-135M-Instruct.Q4_1.gguf --backend cuda -p "$fox" \
    -n 256 --temp 0 --ignore-eos --spec "$spec" --json "$out/spec-smollm2-$spec.json" \
    >/dev/null 2>"$out/spec-smollm2-$spec.log"
  grep -E "decode|speculation" "$out/spec-smollm2-$spec.log"
done
