#!/usr/bin/env bash
# On this machine: what the GPU machine of the `device` tool needs and cannot build (it lacks
# the PCRE2 header) or fetch (no network), under .carry/ (gitignored):
#   .carry/kvs-sm90.tar.gz   kvstream, kvs_matvec_sweep and the CUDA test binaries for sm_90,
#                            stripped (about 30 MB; libcudart, cuBLAS and PCRE2 are there)
#   .carry/model.00, .01     SmolLM2-135M in two pieces (a call carries at most 64 MiB)
# Then, on the device, two calls back to back (a machine idle for 30 s is given back):
#   carry [".carry/model.00"]:  mkdir -p /tmp/kvs && cp .carry/model.00 /tmp/kvs/
#   carry [".carry/kvs-sm90.tar.gz", ".carry/model.01"]:
#     mkdir -p /tmp/kvs/bin /tmp/kvs/models && tar xzf .carry/kvs-sm90.tar.gz -C /tmp/kvs/bin &&
#     cat /tmp/kvs/model.00 .carry/model.01 > /tmp/kvs/models/SmolLM2-135M-Instruct.Q4_1.gguf &&
#     KVS_BIN=/tmp/kvs/bin KVS_MODEL_DIR=/tmp/kvs/models OUT=$OUT scripts/gpu-bench.sh
# (or scripts/gpu-ab.sh); later calls carry only the tarball, or nothing while the
# machine is warm (/tmp/kvs stays).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/cuda/bin"
scripts/fetch-model.sh
cmake --preset cuda-sm90 -G Ninja >/dev/null
cmake --build build/sm90 -j "$(nproc)" \
  --target kvstream kvs_matvec_sweep kvs_cuda_test_cuda kvs_cuda_test_cuda_ops
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for b in kvstream kvs_matvec_sweep tests/kvs_cuda_test_cuda tests/kvs_cuda_test_cuda_ops; do
  strip -o "$tmp/$(basename "$b")" "build/sm90/$b"
done
mkdir -p .carry
tar czf .carry/kvs-sm90.tar.gz -C "$tmp" .
model=models/SmolLM2-135M-Instruct.Q4_1.gguf
head -c 65000000 "$model" > .carry/model.00
tail -c +65000001 "$model" > .carry/model.01
ls -l .carry/kvs-sm90.tar.gz .carry/model.00 .carry/model.01
echo "pack-gpu: built from $(git rev-parse --short HEAD)$(git diff --quiet || echo ' with changes')"
