#!/usr/bin/env bash
# On the GPU machine: the Gated DeltaNet prefill split over value slices (issue 30).
#   scripts/gpu-gdn2.sh [HBM_GB/S]    (default 3350, an H100 SXM)
# Binaries from KVS_BIN (default build/sm90), the tests' data from KVS_SOURCE_DIR (default this
# checkout), logs in OUT (default out/gdn2). Runs, each with its verdict and first failures:
#   kvs_cuda_test_cuda_gdn: the GDN kernels against the CPU (decode 1e-4, chunked prefill 5e-3,
#     also against the GPU's token-by-token run), prefill carried on by decode, the same bits on
#     every run;
#   kvs_gdn_bench: the prefill's two launches (intra_k, slices_k) at 512, 2048 and 8192 tokens
#     of the 27B's shape, us and TFLOP/s, each launch alone and both;
#   compute-sanitizer memcheck and racecheck (where installed) on one chunked case of the 27B's
#     shape (CudaGdn.SameBitsEveryRun), 45 s each at most.
set -uo pipefail
export KVS_SOURCE_DIR=${KVS_SOURCE_DIR:-$PWD}
bin=${KVS_BIN:-build/sm90}
out=${OUT:-out/gdn2}
hbm=${1:-3350}
mkdir -p "$out"
find_bin() { [ -x "$bin/$1" ] && echo "$bin/$1" || echo "$bin/tests/$1"; }
failed=0

t=kvs_cuda_test_cuda_gdn
timeout 300 "$(find_bin $t)" > "$out/$t.txt" 2>&1
rc=$?
[ "$rc" = 0 ] || failed=1
echo "$t: exit $rc | $(grep -E '^\[  (PASSED|FAILED) ' "$out/$t.txt" | tr '\n' ' ')"
grep -E "Failure|Expected|actual|Which is|error|: y|: state" "$out/$t.txt" | head -24

echo "== kvs_gdn_bench (HBM $hbm GB/s)"
timeout 150 "$(find_bin kvs_gdn_bench)" "$hbm" 2>&1 | tee "$out/bench.txt"
[ "${PIPESTATUS[0]}" = 0 ] || failed=1

san=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
if [ -n "$san" ]; then
  for tool in memcheck racecheck; do
    timeout 45 "$san" --tool "$tool" "$(find_bin $t)" --gtest_filter=CudaGdn.SameBitsEveryRun \
      > "$out/sanitizer-$tool.txt" 2>&1
    echo "compute-sanitizer $tool: exit $? | $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' \
      "$out/sanitizer-$tool.txt" | tr '\n' ' ')"
  done
fi
[ "$failed" = 0 ] && echo "all passed"
exit "$failed"
