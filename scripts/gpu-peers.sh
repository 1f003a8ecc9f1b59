#!/usr/bin/env bash
# On the GPU machine: the CUDA backend's agreement checks. kvstream's CUDA logits of the peers'
# synthetic cases, by the script that `tests/peers/peers.py --backend cuda --record SCRIPT`
# wrote (`peers.py --replay OUT/peers` compares them with llama.cpp's on the machine that
# recorded it), then the CUDA test programs (CUDA against the CPU backend within their
# tolerances, streamed against resident bit for bit): those of KVS_CUDA_TESTS (default every
# kvs_cuda_test_* in KVS_BIN), each at most KVS_TEST_TIMEOUT seconds (default 300).
# The peers' commands stop after KVS_PEERS_TIMEOUT seconds (default 1800).
#   KVS_BIN=folder-with-kvstream OUT=logs scripts/gpu-peers.sh SCRIPT
set -uo pipefail
bin=${KVS_BIN:-build/sm90}
out=${OUT:-out/gpu}
. "$(dirname "$0")/gpu-common.sh"
mkdir -p "$out/peers"
t0=$SECONDS
KV="$bin/kvstream" W="$out/peers" timeout "${KVS_PEERS_TIMEOUT:-1800}" sh "$1" >"$out/peers.log" 2>&1
echo "peers' kvstream commands: exit $? in $((SECONDS - t0)) s"
rm -f "$out/peers"/*.gguf  # rebuilt from the presets by anyone who needs them
tests=${KVS_CUDA_TESTS:-$(ls "$bin" "$bin/tests" 2>/dev/null | grep -E '^kvs_cuda_test_[a-z_]*$' | sort -u)}
for t in $tests; do gtest "$t" "${KVS_TEST_TIMEOUT:-300}"; done
exit "$failed"
