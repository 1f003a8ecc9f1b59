#!/usr/bin/env bash
# On a GPU machine: split attention (--kv-mode split, issue 33). First its CUDA tests
# (tests/cuda/test_cuda_split.cpp: split against resident logits, the same bits run after run,
# SmolLM2's greedy text at 2K), then decode at 64K, 128K and 256K for llama3-8b q4_0 with q8_0 K
# and q4_0 V under --vram-limit 6.66G (a KV arena of about 2.2 GiB): stream-only (auto) against
# split, with the plan's prediction for each. KVS_BIN is the folder with kvstream and the
# tests (default build/sm90, built here if missing); OUT receives the logs and JSON (default
# out/split); LIMIT overrides the limit.
set -uo pipefail
bin=${KVS_BIN:-build/sm90}
out=${OUT:-out/split}
limit=${LIMIT:-6.66G}
mkdir -p "$out"
export KVS_SOURCE_DIR=${KVS_SOURCE_DIR:-$PWD}
cmake --build "$bin" -j 16 --target kvstream kvs_cuda_test_cuda_split >/dev/null || exit 1
{ lscpu | grep -E 'Model name|^CPU\(s\)'; nvidia-smi --query-gpu=name --format=csv,noheader; uptime; } |
  tee "$out/machine.txt"

timeout 900 "$bin/tests/kvs_cuda_test_cuda_split" > "$out/test_cuda_split.txt" 2>&1
echo "kvs_cuda_test_cuda_split: exit $? | $(grep -E '^\[  (PASSED|FAILED) ' "$out/test_cuda_split.txt" | tr '\n' ' ')"
grep -E "against resident|the CPU read|Failure|Expected|actual" "$out/test_cuda_split.txt" | head -20

model=$("$(dirname "$0")/synth-model.sh" "$bin" llama3-8b:q4_0)
m=(-m "$model" -ctk q8_0 -ctv q4_0 --backend cuda --fill random --vram-limit "$limit")
for mode in auto split; do
  "$bin/kvstream" plan -m synthetic:llama3-8b:q4_0 -ctk q8_0 -ctv q4_0 -c 256k --kv-mode "$mode" \
    --vram-limit "$limit" 2>&1 | grep -E 'streamed|split|bound' | sed "s/^/plan $mode 256K: /"
  timeout "${KVS_BENCH_TIMEOUT:-1200}" "$bin/kvstream" bench "${m[@]}" --modes "$mode" \
    --depths 64k,128k,256k --n-gen 16 -p 0 --json "$out/h200-$mode.json" 2>&1 |
    grep -E '\| tg[0-9]+ \|' | tee "$out/h200-$mode.md"
done
# Split's figures against stream-only's, depth by depth.
python3 - "$out/h200-auto.json" "$out/h200-split.json" <<'PY'
import json, sys
runs = [{r["depth"]: r for r in json.load(open(f))["runs"]} for f in sys.argv[1:]]
for depth, s in sorted(runs[1].items()):
    a = runs[0].get(depth)
    if not a:
        continue
    print(f"depth {depth}: stream {a['tg_tokens_per_s']:.2f} tok/s, split {s['tg_tokens_per_s']:.2f} "
          f"({s['tg_tokens_per_s'] / a['tg_tokens_per_s']:.2f}x); split streamed "
          f"{s['streamed_bytes_per_token'] / 2**30:.2f} GiB/token, the CPU read "
          f"{s.get('cpu_bytes_per_token', 0) / 2**30:.2f} GiB/token in "
          f"{s.get('cpu_s_per_token', 0) * 1e3:.1f} ms ({s.get('cpu_bytes_per_s', 0) / 1e9:.1f} GB/s), "
          f"bound {s.get('bound', '?')}")
PY
uptime | tee -a "$out/machine.txt"
