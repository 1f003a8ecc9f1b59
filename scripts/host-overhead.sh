#!/usr/bin/env bash
# The host's share of a decode step, measured without a GPU: `kvstream bench` of a CUDA build
# with the null GPU of tests/nullgpu/null_cuda.cpp preloaded (every CUDA and cuBLAS call answered on
# the host; kernels, graphs and copies' waits take no time), so a token's time is the host's
# work alone: the engine's bookkeeping, the step's recording and key, its staged inputs, the
# graph's relaunch and the logits' copy. On the GPU machine the GPU idles for that long (plus
# the real calls' cost) before each step, since a token needs the last one's logits.
#   scripts/host-overhead.sh [MODEL] [DEPTHS]    default synthetic:llama3-8b:q4_0, 0,32k,128k
# KVS_BIN: the CUDA build folder (default build/sm90, built here first); 3 runs, 2000 tokens.
# KVS_NULL_GPU=rtx4080|rtx3090|rtx5070ti: the null GPU claims that consumer card instead of the
# H200 (its memory, SMs and shared-memory limits, which it enforces on every launch).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${KVS_BIN:-build/sm90}
model=${1:-synthetic:llama3-8b:q4_0}
depths=${2:-0,32k,128k}
if [ -z "${KVS_BIN:-}" ]; then
  export PATH="$PATH:/usr/local/cuda/bin"
  [ -f build/sm90/build.ninja ] || cmake --preset cuda-sm90 -G Ninja >/dev/null
  cmake --build build/sm90 -j "$(nproc)" --target kvstream kvs_null_cuda
fi
json=$(mktemp)
trap 'rm -f "$json"' EXIT
for run in 1 2 3; do
  LD_PRELOAD="$bin/libkvs_null_cuda.so" "$bin/kvstream" bench -m "$model" -ctk q8_0 -ctv q8_0 \
    --backend cuda --depths "$depths" --n-gen 2000 -p 0 --modes resident --json "$json" \
    >/dev/null 2>&1
  python3 - "$json" "$run" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
print(f"run {sys.argv[2]}: " + "  ".join(
    f"depth {r['depth']}: {1e6 / r['tg_tokens_per_s']:.1f} us a token, "
    f"{r['host_issue_s_per_token'] * 1e6:.1f} us to issue" for r in d["runs"]))
EOF
done
