#!/usr/bin/env bash
# On a GPU machine: the CUDA tests, then the benchmarks of docs/benchmarks.md. KVS_BIN is the
# folder with kvstream, kvs_cuda_test_cuda and kvs_cuda_test_cuda_ops (default build/cuda);
# OUT receives the logs and one bench JSON per configuration (default out/gpu). Extra
# arguments replace the depths (default 0,32k,128k). KVS_MODEL_DIR may hold SmolLM2.
set -uo pipefail
bin=${KVS_BIN:-build/cuda}
out=${OUT:-out/gpu}
depths=${1:-0,32k,128k}
. "$(dirname "$0")/gpu-common.sh"
synth="$(dirname "$0")/synth-model.sh"  # the model written once as GGUF, then mapped
for t in kvs_cuda_test_cuda_ops kvs_cuda_test_cuda; do gtest "$t" 300; done
for cfg in "llama3-8b:q4_0 q8_0 q8_0" "llama3-8b:q4_0 q8_0 q4_0" "qwen3-8b:q8_0 q8_0 q8_0"; do
  set -- $cfg
  name="${1/:/-}-k$2-v$3"
  timeout "${KVS_BENCH_TIMEOUT:-600}" "$bin/kvstream" bench -m "$("$synth" "$bin" "$1")" \
    -ctk "$2" -ctv "$3" \
    --backend cuda --fill random --depths "$depths" --n-gen 32 -r 3 --modes resident \
    --json "$out/h200-$name.json" 2>&1 |
    grep -E '\| (tg|pp)[0-9]+ \|' | tee "$out/$name.md"
done
