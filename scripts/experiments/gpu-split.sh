#!/usr/bin/env bash
# On the GPU machine: split attention (--kv-mode split, issue 33) against stream-only (auto).
# synthetic:llama3-8b:q4_0 with q8_0 K and q4_0 V under --vram-limit 6.66G, --fill random (no
# prefill), decode at 64K, 128K and 256K: 3 repetitions of 8 tokens after one untimed token
# (each repetition continues the sequence, so their spread shows whether the CPU's share had
# settled), modes auto and split; first with the link as it is, then with the ring's copies
# limited by --h2d-limit (a simulated PCIe 5 x8 card, 25 GB/s by default). Before that, the
# CUDA split tests (split against resident logits, the same bits run after run, the waits on
# the CPU's flags) and the plan's prediction for each mode and link at 256K. Writes to OUT:
#   machine.txt, test_cuda_split.txt
#   plan-{auto,split}-{full,limited}.{txt,json}   kvstream plan at 256K
#   bench-{full,limited}.{md,json}                kvstream bench, both modes in each
#   summary.txt                                   split against auto, depth by depth
#   scripts/experiments/gpu-split.sh
# KVS_BIN: the folder with kvstream and tests/ (default build/sm90, built here if missing);
# OUT (default out/split); LIMIT: --vram-limit (6.66G); H2D_LIMIT: --h2d-limit in bytes a second
# (25000000000: 25 GB/s; 25G would be 25 GiB/s); KVS_DEPTHS (64k,128k,256k); TESTS=0 skips
# the tests. About 3 minutes on an H100 once built.
set -uo pipefail
bin=${KVS_BIN:-build/sm90}
out=${OUT:-out/split}
limit=${LIMIT:-6.66G}
h2d=${H2D_LIMIT:-25000000000}
depths=${KVS_DEPTHS:-64k,128k,256k}
mkdir -p "$out"
export KVS_SOURCE_DIR=${KVS_SOURCE_DIR:-$PWD}
cmake --build "$bin" -j 16 --target kvstream kvs_cuda_test_cuda_split >/dev/null || exit 1
{ lscpu | grep -E 'Model name|^CPU\(s\)|NUMA node\(s\)'; nvidia-smi --query-gpu=name --format=csv,noheader; uptime; } |
  tee "$out/machine.txt"

if [ "${TESTS:-1}" != 0 ]; then
  timeout 240 "$bin/tests/kvs_cuda_test_cuda_split" > "$out/test_cuda_split.txt" 2>&1
  echo "kvs_cuda_test_cuda_split: exit $? | $(grep -E '^\[  (PASSED|FAILED) ' "$out/test_cuda_split.txt" | tr '\n' ' ')"
  grep -E "against resident|Failure|Expected|actual" "$out/test_cuda_split.txt" | head -20
fi

model=$("$(dirname "$0")/../synth-model.sh" "$bin" llama3-8b:q4_0)  # written once, then mapped
kv=(-ctk q8_0 -ctv q4_0 --vram-limit "$limit")
for link in full limited; do
  lim=(); [ "$link" = limited ] && lim=(--h2d-limit "$h2d")
  for mode in auto split; do
    "$bin/kvstream" plan -m synthetic:llama3-8b:q4_0 "${kv[@]}" -c 256k --kv-mode "$mode" \
      "${lim[@]}" --json "$out/plan-$mode-$link.json" > "$out/plan-$mode-$link.txt" 2>&1
    echo "plan $mode, link $link, 256K: $(grep -E '^bound' "$out/plan-$mode-$link.txt")"
  done
  timeout 280 "$bin/kvstream" bench -m "$model" "${kv[@]}" --backend cuda --fill random \
    --modes auto,split --depths "$depths" --n-gen 8 -r 3 -p 0 "${lim[@]}" --json "$out/bench-$link.json" \
    > "$out/bench-$link.md" 2> "$out/bench-$link.err"
  echo "bench, link $link: exit $?"
  grep -E '\| tg[0-9]+ \|' "$out/bench-$link.md"
done

# Split against stream-only, depth by depth and link by link, with what split did.
python3 - "$out" <<'PY' | tee "$out/summary.txt"
import json, os, sys
out = sys.argv[1]
for link in ("full", "limited"):
    path = os.path.join(out, f"bench-{link}.json")
    if not os.path.exists(path):
        print(f"{link}: no {path}")
        continue
    runs = json.load(open(path))["runs"]
    by = {(r["mode"], r["depth"]): r for r in runs}
    for depth in sorted({r["depth"] for r in runs}):
        a, s = by.get(("auto", depth)), by.get(("split", depth))
        if not a or not s:
            continue
        limit = a.get("h2d_limit", 0)
        if limit:  # the throttle: the copy stream's bytes over its busy time, at most the limit
            print(f"link {link}, depth {depth}: auto copied at {a['h2d_bytes_per_s'] / 1e9:.2f} GB/s, "
                  f"limit {limit / 1e9:.2f}: {'ok' if a['h2d_bytes_per_s'] <= limit * 1.01 else 'ABOVE THE LIMIT'}")
        g = 2**30
        reps = ", ".join(f"{x:.2f}" for x in s["tg_tokens_per_s_reps"])
        share = s.get("cpu_bytes_per_token", 0) / max(1, s.get("cpu_bytes_per_token", 0) + s["streamed_bytes_per_token"])
        print(f"link {link} (h2d limit {s.get('h2d_limit', 0) / 1e9:.1f} GB/s), depth {depth}: "
              f"auto {a['tg_tokens_per_s']:.2f} tok/s ({a['h2d_bytes_per_s'] / 1e9:.1f} GB/s, bound {a.get('bound', '?')}), "
              f"split {s['tg_tokens_per_s']:.2f} [{reps}] = {s['tg_tokens_per_s'] / a['tg_tokens_per_s']:.2f}x; "
              f"split: CPU share {share:.3f}, streamed {s['streamed_bytes_per_token'] / g:.2f} GiB/token, "
              f"copy_s {s.get('copy_s_per_token', 0) * 1e3:.1f} ms at {s['h2d_bytes_per_s'] / 1e9:.1f} GB/s, "
              f"CPU {s.get('cpu_bytes_per_token', 0) / g:.2f} GiB/token, cpu_s {s.get('cpu_s_per_token', 0) * 1e3:.1f} ms "
              f"at {s.get('cpu_bytes_per_s', 0) / 1e9:.1f} GB/s, device waited for the CPU "
              f"{s.get('cpu_wait_s_per_token', 0) * 1e3:.1f} ms, bound {s.get('bound', '?')}, "
              f"step {1e3 / s['tg_tokens_per_s']:.1f} ms vs plan {s.get('plan_predicted_step_s', 0) * 1e3:.1f} ms "
              f"({s.get('plan_bound', '?')})")
PY
uptime | tee -a "$out/machine.txt"
