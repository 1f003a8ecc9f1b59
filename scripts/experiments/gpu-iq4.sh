#!/usr/bin/env bash
# On the GPU machine: the iq4_xs matrix-vector kernel at one token (issue 30), then the CUDA
# tests that cover the products.
#   scripts/experiments/gpu-iq4.sh [HBM_GB/S]    (default 3350, an H100 SXM; an H200 has 4800)
# KVS_BIN (default build/sm90) holds kvs_matvec_sweep, kvs_cuda_test_cuda_ops and
# kvs_cuda_test_cuda (directly or under tests/) and kvstream; logs in OUT (default out/iq4).
# 1. kvs_matvec_sweep iq4_xs q4_0 q4_k q3_k on Qwen3.5 27B's matrices: each variant's us, GB/s and
#    % of HBM_GB/S, the variant q_shape() picks ("chosen") and the chosen ones over a decode
#    step's matrices ("step"); then the fastest variant per format and matrix.
# 2. kvs_cuda_test_cuda_ops (every format's products against the CPU, iq4_xs and iq4_nl among
#    them, 1 to 8 tokens) and kvs_cuda_test_cuda (whole models against the CPU, streamed against
#    resident bit for bit), each with its verdict and first failures (KVS_TEST_TIMEOUT seconds
#    each, default 150).
set -uo pipefail
bin=${KVS_BIN:-build/sm90}
out=${OUT:-out/iq4}
hbm=${1:-3350}
. "$(dirname "$0")/../gpu-common.sh"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem --format=csv \
  > "$out/gpu.txt" 2>&1
cat "$out/gpu.txt"
echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)" | tee "$out/commit.txt"

echo "== kvs_matvec_sweep (HBM $hbm GB/s)"
timeout 150 "$(find_bin kvs_matvec_sweep)" --shapes 27b --hbm "$hbm" iq4_xs q4_0 q4_k q3_k \
  > "$out/sweep.txt" 2>&1
rc=$?
echo "kvs_matvec_sweep: exit $rc (log: $out/sweep.txt)"
[ "$rc" = 0 ] || failed=1
grep -E "step|chosen" "$out/sweep.txt"
# The fastest line of each format and shape.
python3 - "$out/sweep.txt" <<'EOF'
import re, sys
best = {}
for line in open(sys.argv[1]):
    m = re.match(r"(\S+)\s+(\S+)\s+(?:chosen )?(R=\S+ U=\S+ pipe=\S+ split=\S+)\s+"
                 r"([\d.]+) us\s+(\d+) GB/s\s+([\d.]+) %", line)
    if m:
        fmt, shape, variant, us, gbs, pct = m.groups()
        key = (fmt, shape)
        if key not in best or float(us) < best[key][0]:
            best[key] = (float(us), variant, pct)
print("fastest variant per format and matrix:")
for (fmt, shape), (us, variant, pct) in best.items():
    print(f"  {fmt:6} {shape:8}  {us:8.2f} us  {pct:>5} %  {variant}")
EOF

for t in kvs_cuda_test_cuda_ops kvs_cuda_test_cuda; do gtest "$t" "${KVS_TEST_TIMEOUT:-150}"; done
[ "$failed" = 0 ] && echo "all passed"
exit "$failed"
