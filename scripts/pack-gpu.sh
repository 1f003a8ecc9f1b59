#!/usr/bin/env bash
# On this machine: what the GPU machine of the `device` tool needs and cannot build (it lacks
# the PCRE2 header) or fetch (no network): kvstream, kvs_matvec_sweep and the CUDA test
# binaries for sm_90, stripped (libcudart, cuBLAS and PCRE2 are there), and SmolLM2-135M for
# its tests (`--no-model`: without it; those tests then skip), as one archive cut into pieces
# of at most 60 MiB, .carry/pack.00, .01, ... (gitignored): a call carries at most 64 MiB, so
# each piece goes over in a call of its own, back to back (a machine idle for 30 s is given
# back), and the last call unpacks them into /tmp/kvs (bin/, models/). It prints the calls.
#   scripts/pack-gpu.sh [--no-model]
set -euo pipefail
cd "$(dirname "$0")/.."
model=yes
[ "${1:-}" = "--no-model" ] && model=no
export PATH="$PATH:/usr/local/cuda/bin"
[ "$model" = yes ] && scripts/fetch-model.sh
cmake --preset cuda-sm90 -G Ninja >/dev/null
cmake --build build/sm90 -j "$(nproc)" \
  --target kvstream kvs_matvec_sweep kvs_cuda_test_cuda kvs_cuda_test_cuda_ops
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/bin" "$tmp/models"
for b in kvstream kvs_matvec_sweep tests/kvs_cuda_test_cuda tests/kvs_cuda_test_cuda_ops; do
  strip -o "$tmp/bin/$(basename "$b")" "build/sm90/$b"
done
[ "$model" = yes ] && cp models/SmolLM2-135M-Instruct.Q4_1.gguf "$tmp/models/"
mkdir -p .carry
rm -f .carry/pack.* .carry/kvs-sm90.tar.gz .carry/model.0*
tar czf - -C "$tmp" bin models | split -b 60M -d - .carry/pack.
pieces=(.carry/pack.*)
ls -l "${pieces[@]}"
echo "pack-gpu: built from $(git rev-parse --short HEAD)$(git diff --quiet || echo ' with changes')"
echo "the device calls, back to back:"
last=$((${#pieces[@]} - 1))
for i in "${!pieces[@]}"; do
  p=${pieces[$i]}
  if [ "$i" -lt "$last" ]; then
    echo "  carry [\"$p\"]: mkdir -p /tmp/kvs && cp $p /tmp/kvs/"
  else
    echo "  carry [\"$p\"]: mkdir -p /tmp/kvs && cp $p /tmp/kvs/ &&"
    echo "    cat /tmp/kvs/pack.* | tar xz -C /tmp/kvs && KVS_BIN=/tmp/kvs/bin \\"
    echo "    KVS_MODEL_DIR=/tmp/kvs/models OUT=\$OUT scripts/gpu-bench.sh   (or gpu-ab.sh, ...)"
  fi
done
echo "later calls carry nothing while the machine is warm (/tmp/kvs stays)."
