#!/usr/bin/env bash
# Issue 33 on the GPU machine, this build against main's in one run (about 3 minutes once
# built). The CPU attention kernels alone (kvs_cpu_attention_bench, 256K tokens of 8 kv heads of
# 128, 4 query heads each, q8_0/q4_0 and q8_0/q8_0; target 78 GB/s at 16 threads): both builds
# at 8, 15 and 16 threads, then this build's trial switches at 16 (span_attention.cpp:
# KVS_ATTN_PREFETCH=t1|v1|none, KVS_ATTN_VALUES=ymm, KVS_ATTN_AHEAD=32, KVS_ATTN_PIECE=32).
# Split attention inside the pipeline (`kvstream bench --modes split`, llama3-8b q4_0, q8_0 K /
# q4_0 V, --vram-limit 6.66G, 128K, 2 x 16 tokens): this build, main's, this build with its
# split threads unpinned (KVS_SPLIT_PIN=0). Then this build's kernels in split's shape outside
# the pipeline (32 layers of 32K tokens, a job a layer to a SplitWorker of 15 threads).
# KVS_BIN: this build's folder (default build/sm90); KVS_BASE_BIN: main's (skipped where
# unset); OUT (default gpu-results). Writes OUT/machine.txt, attention-{new,base,new-*}.md,
# split-{new,base,new-unpinned}.{md,json,err}, layers-new.md, summary.txt.
set -uo pipefail
bin=${KVS_BIN:-build/sm90}
base=${KVS_BASE_BIN:-}
out=${OUT:-gpu-results}
mkdir -p "$out"
[ -x "$bin/kvs_cpu_attention_bench" ] && [ -x "$bin/kvstream" ] ||
  cmake --build "$bin" -j 16 --target kvs_cpu_attention_bench kvstream >/dev/null || exit 1
{
  lscpu | grep -E 'Model name|^CPU\(s\)|Thread|Core\(s\)|Socket|NUMA node|L2|L3'
  echo "vnni: $(grep -o -w -E 'avx512_vnni|avx_vnni' /proc/cpuinfo | sort -u | tr '\n' ' ')"
  echo "transparent huge pages: $(cat /sys/kernel/mm/transparent_hugepage/enabled)"
  nvidia-smi --query-gpu=name --format=csv,noheader
  echo "new: $bin, base: ${base:-none}"
  uptime
} | tee "$out/machine.txt"

kernels() {  # name, folder, threads, environment
  env $4 "$2/kvs_cpu_attention_bench" --threads "$3" --heads 128 --reps 5 \
    --types q8_0/q4_0,q8_0/q8_0 | tee "$out/attention-$1.md"
}
kernels new "$bin" 8,15,16 KVS_ATTN_PREFETCH=t0
[ -n "$base" ] && kernels base "$base" 8,15,16 KVS_ATTN_PREFETCH=t0
# This build's trial switches (span_attention.cpp): prefetches to L2 (K and V, or V) or none,
# 256-bit values, K rows prefetched 32 ahead (not 16), pieces of 32 rows (not 16).
kernels new-prefetch-t1 "$bin" 16 KVS_ATTN_PREFETCH=t1
kernels new-prefetch-v1 "$bin" 16 KVS_ATTN_PREFETCH=v1
kernels new-prefetch-none "$bin" 16 KVS_ATTN_PREFETCH=none
kernels new-ymm-values "$bin" 16 KVS_ATTN_VALUES=ymm
kernels new-ahead-32 "$bin" 16 KVS_ATTN_AHEAD=32
kernels new-piece-32 "$bin" 16 KVS_ATTN_PIECE=32

model=$("$(dirname "$0")/synth-model.sh" "$bin" llama3-8b:q4_0)  # written once, then mapped
split() {  # name, folder, environment
  env $3 timeout 240 "$2/kvstream" bench -m "$model" -ctk q8_0 -ctv q4_0 --backend cuda \
    --fill random --modes split --vram-limit 6.66G --depths 128k --n-gen 16 -r 2 -p 0 \
    --json "$out/split-$1.json" > "$out/split-$1.md" 2> "$out/split-$1.err"
  echo "split $1: exit $? $(grep -E '\| tg[0-9]+ \|' "$out/split-$1.md")"
}
split new "$bin" KVS_SPLIT_PIN=1
[ -n "$base" ] && split base "$base" KVS_SPLIT_PIN=1
split new-unpinned "$bin" KVS_SPLIT_PIN=0

"$bin/kvs_cpu_attention_bench" --threads 15 --heads 128 --reps 5 --types q8_0/q4_0 --ctx 32k \
  --layers 32 | tee "$out/layers-new.md"

python3 - "$out" <<'PY' | tee "$out/summary.txt"
import json, os, re, sys
out = sys.argv[1]
print("kernels alone, best GB/s (of the plain read):")
rows = {}
names = ("new", "base", "new-prefetch-t1", "new-prefetch-v1", "new-prefetch-none", "new-ymm-values",
         "new-ahead-32", "new-piece-32")
for name in names:
    path = os.path.join(out, f"attention-{name}.md")
    if not os.path.exists(path):
        continue
    for line in open(path):
        m = re.match(r"\| (\S+) \| (\d+) \| (\d+) \| .*\(best ([\d.]+)\) \| ([\d.]+) \| (\d+) % \|", line)
        if m:
            rows.setdefault((m[1], m[3]), {})[name] = (float(m[4]), float(m[5]))
for (types, threads), r in sorted(rows.items()):
    cells = "\n    ".join(f"{n:17s} {r[n][0]:6.1f} ({100 * r[n][0] / r[n][1]:3.0f} % of {r[n][1]:5.1f})" for n in names if n in r)
    print(f"  {types} {threads} threads:\n    {cells}")
print("split, 128K:")
for name in ("new", "base", "new-unpinned"):
    path = os.path.join(out, f"split-{name}.json")
    if not os.path.exists(path):
        print(f"  {name}: no {path}")
        continue
    for s in json.load(open(path))["runs"]:
        g = 2**30
        reps = ", ".join(f"{x:.2f}" for x in s.get("tg_tokens_per_s_reps", []))
        print(f"  {name:13s} {s['tg_tokens_per_s']:6.2f} tok/s [{reps}]: CPU {s.get('cpu_bytes_per_token', 0) / g:.2f} GiB/token "
              f"in {s.get('cpu_s_per_token', 0) * 1e3:.1f} ms at {s.get('cpu_bytes_per_s', 0) / 1e9:.1f} GB/s "
              f"(plan {s.get('plan_cpu_s', 0) * 1e3:.1f} ms), device waited {s.get('cpu_wait_s_per_token', 0) * 1e3:.1f} ms; "
              f"streamed {s['streamed_bytes_per_token'] / g:.2f} GiB in {s.get('copy_s_per_token', 0) * 1e3:.1f} ms at "
              f"{s['h2d_bytes_per_s'] / 1e9:.1f} GB/s; host issue {s.get('host_issue_s_per_token', 0) * 1e3:.1f} ms; "
              f"step {1e3 / s['tg_tokens_per_s']:.1f} ms vs plan {s.get('plan_predicted_step_s', 0) * 1e3:.1f} ms, bound {s.get('bound', '?')}")
PY
uptime | tee -a "$out/machine.txt"
