#!/usr/bin/env bash
# On the GPU machine's host (16 cores, about 130 GB/s of AVX2 reads, docs/benchmarks.md#the-machine-and-its-ceilings): the
# CPU attention kernels' read speed (bench/cpu_attention_bench.cpp) for 1 to 16 threads, every
# cache type and head size, against issue 33's target of 60 % of 130 GB/s at 16 threads; then
# `kvstream bench --modes host` (llama3-8b q4_0, q8_0 K / q4_0 V) with these kernels and, where
# KVS_BASE_BIN names a build of main, with the ones before them. KVS_BIN is the folder with
# kvstream and kvs_cpu_attention_bench (default build/sm90, built here if missing); OUT
# receives the logs (default out/host-attention).
set -uo pipefail
bin=${KVS_BIN:-build/sm90}
out=${OUT:-out/host-attention}
mkdir -p "$out"
[ -x "$bin/kvs_cpu_attention_bench" ] && [ -x "$bin/kvstream" ] ||
  cmake --build "$bin" -j 16 --target kvs_cpu_attention_bench kvstream >/dev/null || exit 1
{
  lscpu | grep -E 'Model name|^CPU\(s\)|Thread|NUMA|L3'
  echo "vnni: $(grep -o -w -E 'avx512_vnni|avx_vnni' /proc/cpuinfo | sort -u | tr '\n' ' ')"
  uptime
} | tee "$out/host.txt"

# The kernels: 256K tokens of 8 kv heads (0.5 to 1 GiB, past every cache), 4 query heads each.
"$bin/kvs_cpu_attention_bench" --threads 1,2,4,8,12,16 --heads 64,128,256 --reps 5 \
  --types q8_0/q8_0,q8_0/q4_0,q4_0/q4_0,f16/f16 | tee "$out/attention.md"
# 8 query heads a kv head (70B-class models), and a page size of 64.
"$bin/kvs_cpu_attention_bench" --threads 8,16 --heads 128 --group 8 --reps 5 \
  --types q8_0/q8_0,q8_0/q4_0 | tee -a "$out/attention.md"
"$bin/kvs_cpu_attention_bench" --threads 16 --heads 128 --page 64 --reps 5 \
  --types q8_0/q4_0 | tee -a "$out/attention.md"
echo "16 threads against the target (60 % of 130 GB/s = 78 GB/s):"
grep -E '^\| [a-z0-9_/]+ \| [0-9]+ \| 16 \|' "$out/attention.md" |
  awk -F'|' '{split($6, g, " "); printf "%-10s head %4s: %6.1f GB/s %s\n", $2, $3, g[1],
               (g[1] >= 78 ? "(meets)" : "(below)")}'

# Host mode end to end: the KV in host memory, attention on the CPU (llama.cpp's -nkvo).
synth="$(dirname "$0")/../synth-model.sh"
host_bench() {  # name, kvstream's folder
  timeout "${KVS_BENCH_TIMEOUT:-900}" "$2/kvstream" bench -m "$("$synth" "$2" llama3-8b:q4_0)" \
    -ctk q8_0 -ctv q4_0 --backend cuda --fill random --modes host --depths 8k,32k,64k,128k \
    --n-gen 8 -p 0 --json "$out/host-$1.json" 2>&1 | grep -E '\| tg[0-9]+ \|' |
    tee "$out/host-$1.md"
}
host_bench new "$bin"
[ -n "${KVS_BASE_BIN:-}" ] && host_bench base "$KVS_BASE_BIN"
uptime | tee -a "$out/host.txt"
