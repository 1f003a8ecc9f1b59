#!/usr/bin/env bash
# Issue 33 on the GPU machine, this build against main's in one run (about 3 minutes once
# built), everything in one file, OUT/summary.txt. The CPU attention kernels alone
# (kvs_cpu_attention_bench, 256K tokens of 8 kv heads of 128, 4 query heads each, q8_0/q4_0 and
# q8_0/q8_0, 8 and 16 threads; target 78 GB/s at 16): this build and main's, twice,
# alternating. Then split attention inside the pipeline (`kvstream bench --modes split`,
# llama3-8b q4_0, q8_0 K / q4_0 V, --vram-limit 6.66G, 128K, 2 x 16 tokens): this build, main's,
# this build with its threads unpinned (--split-cpus none), this build again. KVS_BIN: this build's folder (default build/sm90); KVS_BASE_BIN: main's
# (skipped where unset); OUT (default gpu-results).
set -uo pipefail
bin=${KVS_BIN:-build/sm90}
base=${KVS_BASE_BIN:-}
out=${OUT:-gpu-results}
mkdir -p "$out"
sum="$out/summary.txt"
tmp=$(mktemp -d)
[ -x "$bin/kvs_cpu_attention_bench" ] && [ -x "$bin/kvstream" ] ||
  cmake --build "$bin" -j 16 --target kvs_cpu_attention_bench kvstream >/dev/null || exit 1
{
  lscpu | grep -E 'Model name|^CPU\(s\)|Thread|Core\(s\)|Socket|NUMA node\(s\)|L3'
  echo "vnni: $(grep -o -w -E 'avx512_vnni|avx_vnni' /proc/cpuinfo | sort -u | tr '\n' ' ')"
  nvidia-smi --query-gpu=name --format=csv,noheader
  echo "new: $bin, base: ${base:-none}"
  uptime
} > "$sum" 2>&1

kernels() {  # name, folder, threads
  echo "== kernels $1" >> "$sum"
  "$2/kvs_cpu_attention_bench" --threads "$3" --heads 128 --reps 5 --types q8_0/q4_0,q8_0/q8_0 \
    2>&1 | grep -E '^\|' | grep -v -- '---' >> "$sum"
}
for round in 1 2; do
  kernels new "$bin" 8,16
  [ -n "$base" ] && kernels base "$base" 8,16
done

model=$("$(dirname "$0")/../synth-model.sh" "$bin" llama3-8b:q4_0)  # written once, then mapped
split() {  # name, folder, round, more bench arguments
  # shellcheck disable=SC2086  # $4: arguments, a word each
  timeout 240 "$2/kvstream" bench -m "$model" -ctk q8_0 -ctv q4_0 --backend cuda \
    --fill random --modes split --vram-limit 6.66G --depths 128k --n-gen 16 -r 2 -p 0 ${4:-} \
    --json "$tmp/split-$1-$3.json" > "$tmp/split.md" 2> "$tmp/split.err"
  local rc=$?
  python3 - "$tmp/split-$1-$3.json" "$1" "$rc" >> "$sum" 2>&1 <<'PY'
import json, sys
path, name, rc = sys.argv[1:4]
try:
    runs = json.load(open(path))["runs"]
except Exception as e:
    print(f"split {name}: exit {rc}, no JSON ({e})")
    sys.exit(0)
for s in runs:
    g = 2**30
    reps = ", ".join(f"{x:.2f}" for x in s.get("tg_tokens_per_s_reps", []))
    print(f"split {name:5s} {s['tg_tokens_per_s']:6.2f} tok/s [{reps}]: CPU {s.get('cpu_bytes_per_token', 0) / g:.2f} GiB "
          f"in {s.get('cpu_s_per_token', 0) * 1e3:.1f} ms at {s.get('cpu_bytes_per_s', 0) / 1e9:.1f} GB/s, "
          f"device waited {s.get('cpu_wait_s_per_token', 0) * 1e3:.1f} ms; streamed {s['streamed_bytes_per_token'] / g:.2f} GiB "
          f"in {s.get('copy_s_per_token', 0) * 1e3:.1f} ms at {s['h2d_bytes_per_s'] / 1e9:.1f} GB/s; "
          f"step {1e3 / s['tg_tokens_per_s']:.1f} ms vs plan {s.get('plan_predicted_step_s', 0) * 1e3:.1f} ms, bound {s.get('bound', '?')}")
PY
  [ "$rc" = 0 ] || tail -3 "$tmp/split.err" >> "$sum"
}
echo "== split, 128K" >> "$sum"
split new "$bin" 1
[ -n "$base" ] && split base "$base" 1
split unpin "$bin" 1 "--split-cpus none"
split new "$bin" 2
uptime >> "$sum"
rm -rf "$tmp"
cat "$sum"
