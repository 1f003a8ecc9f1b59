#!/usr/bin/env bash
# On a GPU machine: the matrix-vector kernels of the weight formats against the CPU, then their
# speed at one token on llama3-8b's matrices as a share of the memory's bandwidth.
#   scripts/gpu-quant-check.sh [BUILD_DIR] [HBM_GB/S] [FORMAT...]
# BUILD_DIR holds kvs_matvec_sweep and kvs_cuda_test_cuda_ops (directly or under tests/; default
# build/sm90). HBM_GB/S: the card's bandwidth (default 3350, an H100 SXM; an H200 has 4800).
# FORMATs: those to time (default iq4_xs iq4_nl q5_k q4_k q6_k q3_k q2_k, and q4_0 to compare).
# Prints the tests' verdict and failures (every CudaOps.Matmul* and CudaOps.Matvec* test: each
# format at one to 8 tokens, row counts no tile divides, prefill through f16 tiles), then per
# format and matrix the variant q_shape() picks ("chosen", what a decode step runs) and the
# fastest variant of the sweep, in GB/s and % of HBM_GB/S (bytes: the rows in the device layout,
# which is the file's size but q6_k and q3_k, 1% and 2% larger for alignment), and the chosen
# variants over the four matrices of a layer together (qkv, wo, gateup, down: their bytes over
# their times). Logs: OUT (default out/quant).
set -uo pipefail
bin=${1:-build/sm90}
hbm=${2:-3350}
shift $(($# > 2 ? 2 : $#))
formats=("$@")
[ ${#formats[@]} -eq 0 ] && formats=(iq4_xs iq4_nl q5_k q4_k q6_k q3_k q2_k q4_0)
out=${OUT:-out/quant}
. "$(dirname "$0")/gpu-common.sh"

gtest kvs_cuda_test_cuda_ops 900 --gtest_filter='CudaOps.Matmul*:CudaOps.Matvec*'

timeout 900 "$(find_bin kvs_matvec_sweep)" "${formats[@]}" > "$out/sweep.txt" 2>&1
echo "kvs_matvec_sweep: exit $? (log: $out/sweep.txt)"
python3 - "$out/sweep.txt" "$hbm" <<'EOF'
import re, sys
hbm = float(sys.argv[2])
best, chosen, order = {}, {}, []
for line in open(sys.argv[1]):
    m = re.match(r"(\S+)\s+(\S+)\s+(chosen )?(R=.*?)\s+([\d.]+) us\s+(\d+) GB/s", line)
    if not m:
        continue
    fmt, shape, is_chosen, variant, us, gbs = m.groups()
    key = (fmt, shape)
    if key not in best and key not in chosen:
        order.append(key)
    if is_chosen:
        chosen[key] = (float(gbs), float(us), variant)
    elif float(gbs) > best.get(key, (0,))[0]:
        best[key] = (float(gbs), float(us), variant)
print(f"{'format':7} {'matrix':8} {'chosen GB/s':>11} {'%HBM':>5} {'us':>8}   "
      f"{'best GB/s':>9} {'%HBM':>5}  best variant")
layer = {}
for key in order:
    c = chosen.get(key, (0, 0, "-"))
    b = best.get(key, (0, 0, "-"))
    print(f"{key[0]:7} {key[1]:8} {c[0]:11.0f} {100 * c[0] / hbm:5.1f} {c[1]:8.2f}   "
          f"{b[0]:9.0f} {100 * b[0] / hbm:5.1f}  {b[2]}")
    if key[1] in ("qkv", "wo", "gateup", "down"):
        b_us = layer.setdefault(key[0], [0.0, 0.0])
        b_us[0] += c[0] * c[1] * 1e3
        b_us[1] += c[1]
print(f"\nthe chosen variants over qkv, wo, gateup, down together (of {hbm:.0f} GB/s):")
for fmt, (b, us) in layer.items():
    gbs = b / us / 1e3 if us else 0.0
    print(f"{fmt:7} {gbs:6.0f} GB/s {100 * gbs / hbm:5.1f} %")
EOF
