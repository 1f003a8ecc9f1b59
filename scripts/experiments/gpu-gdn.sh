#!/usr/bin/env bash
# On the GPU machine: qwen35 (Gated DeltaNet + gated attention) on the CUDA backend.
#   scripts/experiments/gpu-gdn.sh [HBM_GB/S]    (default 3350, an H100 SXM; an H200 has 4800)
# Builds the cuda-sm90 preset's targets first where KVS_BIN (default build/sm90) lacks them.
# Then, each with its verdict and first failures:
#   kvs_cuda_test_cuda_gdn: the GDN kernels against the CPU on random inputs (the 27B's 16 key
#     and 48 value heads of 128, smaller heads), decode (f32, 1e-4) and chunked prefill (tf32,
#     5e-3; also against the GPU's own token-by-token run), a prefill carried on by decode steps,
#     the same bits on every run; sigmoid_mul;
#   kvs_cuda_test_cuda: every case (qwen35 against the CPU over several delta-rule chunks, the
#     chunked prefill against -b 1, recurrent layers streamed == resident and unified bit for
#     bit, a reopened slot's zero state, an unsupported head refused before any allocation; and
#     the earlier cases, since every matmul's recorded call changed);
#   kvs_cuda_test_cuda_ops and kvs_cuda_test_cuda_window: the other kernels, and attention with
#     heads of 256 (qwen35's) now on tensor cores for decode and prefill (4e-3 against the CPU).
# Then kvs_gdn_bench at the 27B's shape: decode's delta rule in GB/s and % of HBM_GB/S, a whole
# GDN layer's three launches and their sum over the 48 GDN layers of a token (to set against
# the decode step's time: the 27B's weights at HBM speed), and the chunked prefill's two launches
# in TFLOP/s at 512, 2048 and 8192 tokens beside the token-by-token kernel. Then, where
# installed, compute-sanitizer memcheck and racecheck on one chunked prefill of that shape.
# KVS_GDN_E2E=1: then synthetic qwen35-27b:q4_k (written once as GGUF by scripts/synth-model.sh,
# about 16 GB) through kvstream bench, decode at depths 0 and 4k and a 512-token prefill, and the
# same with KVS_PROFILE=1 for each operation's share of the GPU's time ("delta net decode" and
# "delta net prefill" among them).
# Logs in OUT (default out/gdn).
set -uo pipefail
bin=${KVS_BIN:-build/sm90}
out=${OUT:-out/gdn}
hbm=${1:-3350}
. "$(dirname "$0")/../gpu-common.sh"
tests=(kvs_cuda_test_cuda_gdn kvs_cuda_test_cuda kvs_cuda_test_cuda_ops kvs_cuda_test_cuda_window)
missing=0
for t in kvstream kvs_gdn_bench "${tests[@]}"; do [ -x "$(find_bin "$t")" ] || missing=1; done
if [ "$missing" = 1 ]; then
  echo "== building $bin"
  { cmake --preset cuda-sm90 -G Ninja && cmake --build "$bin" -j"$(nproc)" --target kvstream \
    kvs_gdn_bench "${tests[@]}"; } > "$out/build.txt" 2>&1 ||
    { echo "build failed ($out/build.txt):"; grep -E "error" "$out/build.txt" | head -20; exit 1; }
fi

for t in "${tests[@]}"; do gtest "$t" 900; done

echo "== kvs_gdn_bench (HBM $hbm GB/s)"
timeout 300 "$(find_bin kvs_gdn_bench)" "$hbm" 2>&1 | tee "$out/bench.txt"
[ "${PIPESTATUS[0]}" = 0 ] || failed=1

# compute-sanitizer memcheck and racecheck, where installed, on one chunked prefill of the
# 27B's shape.
san=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
if [ -n "$san" ]; then
  for tool in memcheck racecheck; do
    timeout 45 "$san" --tool "$tool" "$(find_bin kvs_cuda_test_cuda_gdn)" \
      --gtest_filter=CudaGdn.SameBitsEveryRun > "$out/sanitizer-$tool.txt" 2>&1
    echo "compute-sanitizer $tool: exit $? | $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' \
      "$out/sanitizer-$tool.txt" | tr '\n' ' ')"
  done
fi

if [ "${KVS_GDN_E2E:-0}" = 1 ]; then
  echo "== qwen35-27b:q4_k end to end"
  model=$("$(dirname "$0")/../synth-model.sh" "$bin" qwen35-27b:q4_k)
  timeout 1200 "$bin/kvstream" bench -m "$model" --backend cuda --depths 0,4k --n-gen 32 -p 512 \
    --modes resident --json "$out/e2e.json" > "$out/e2e.txt" 2>&1 || failed=1
  grep -E '\| (tg|pp)[0-9]+ \||error' "$out/e2e.txt"
  KVS_PROFILE=1 timeout 1200 "$bin/kvstream" bench -m "$model" --backend cuda --depths 4k \
    --n-gen 32 -p 512 --modes resident > "$out/e2e-profile.txt" 2>&1 || failed=1
  grep -E '^profile:' "$out/e2e-profile.txt" | head -16
fi
[ "$failed" = 0 ] && echo "all passed"
exit "$failed"
