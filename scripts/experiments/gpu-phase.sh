#!/usr/bin/env bash
# On the GPU machine: what the phase arena buys. synthetic:llama3-8b:q4_0 with q8_0 K and q4_0 V
# under --vram-limit 6.66G, decoded at 128K and 256K (--fill random) with the phase arena (the
# default) and with --no-phase-arena, twice each, alternating; then the decode arenas and tok/s
# side by side. Before that, the CUDA exactness tests whose cases now switch phases (streamed ==
# resident bit for bit with the phase arena on and off, sequences starting while others decode).
#   scripts/experiments/gpu-phase.sh
# KVS_BIN: the folder with kvstream and tests/ (default build/sm90); OUT: the logs and JSON
# (default out/phase). KVS_DEPTHS overrides 128k,256k.
set -uo pipefail
bin=${KVS_BIN:-build/sm90}
out=${OUT:-out/phase}
depths=${KVS_DEPTHS:-128k,256k}
mkdir -p "$out"
synth="$(dirname "$0")/../synth-model.sh"  # the model written once as GGUF, then mapped
model=$("$synth" "$bin" llama3-8b:q4_0)

echo "== CUDA exactness (phase arena in the random stream cases)"
timeout 300 "$bin/tests/kvs_cuda_test_cuda" --gtest_filter='CudaStream.*' > "$out/test-cuda.txt" 2>&1
echo "exit $?: $(grep -E '^\[  (PASSED|FAILED)' "$out/test-cuda.txt" | tr '\n' ' ')"

echo "== plan (predicted, activations only in the workspace)"
for cfg in phase no-phase; do
  flag=""; [ "$cfg" = no-phase ] && flag=--no-phase-arena
  # shellcheck disable=SC2086  # an empty flag is no argument
  "$bin/kvstream" plan -m synthetic:llama3-8b:q4_0 -ctk q8_0 -ctv q4_0 -c 256k --vram-limit 6.66G \
    $flag --json "$out/plan-$cfg.json" > "$out/plan-$cfg.txt" 2>&1
  echo "[$cfg] $(grep -E '^(arena|phase|partition)' "$out/plan-$cfg.txt" | tr -s ' ' | tr '\n' ' ')"
done

echo "== bench (decode at $depths, 32 tokens x 3, pp512 after it)"
for round in 1 2; do
  for cfg in phase no-phase; do
    flag=""; [ "$cfg" = no-phase ] && flag=--no-phase-arena
    f="$out/$cfg-$round"
    # shellcheck disable=SC2086
    timeout 590 "$bin/kvstream" bench -m "$model" -ctk q8_0 -ctv q4_0 --backend cuda \
      --fill random --modes auto --depths "$depths" --n-gen 32 -r 3 --vram-limit 6.66G $flag \
      --json "$f.json" > "$f.txt" 2>&1
    echo "[$cfg] round $round (exit $?): $(grep -E '\| tg[0-9]+ \|' "$f.txt" |
      awk -F'|' '{printf "depth%s tg%s |", $5, $7}')"
  done
done

python3 - "$out" <<'EOF'
import json, os, sys
out = sys.argv[1]
rows = {}
for cfg in ("phase", "no-phase"):
    for rnd in (1, 2):
        p = os.path.join(out, f"{cfg}-{rnd}.json")
        if not os.path.exists(p):
            continue
        for r in json.load(open(p))["runs"]:
            rows.setdefault((r["depth"], cfg), []).append(r)
print("| depth | phase arena | decode arena | workspace | tg tok/s (rounds) | streamed/token | pp512 |")
print("| ---: | --- | ---: | ---: | ---: | ---: | ---: |")
summary = {}
for (depth, cfg), rs in sorted(rows.items()):
    tg = [r["tg_tokens_per_s"] for r in rs]
    mean = sum(tg) / len(tg)
    summary[f"{depth}-{cfg}"] = {"arena_bytes": rs[0]["arena_bytes"],
                                 "workspace_bytes": rs[0].get("workspace_bytes", 0),
                                 "tg_tokens_per_s": tg, "tg_mean": mean,
                                 "streamed_bytes_per_token": rs[0]["streamed_bytes_per_token"],
                                 "pp_tokens_per_s": [r.get("pp_tokens_per_s") for r in rs]}
    tgs = ", ".join("%.2f" % x for x in tg)
    pps = ", ".join("%.0f" % r.get("pp_tokens_per_s", 0) for r in rs)
    print(f"| {depth} | {cfg} | {rs[0]['arena_bytes'] / 2**30:.3f} GiB | "
          f"{rs[0].get('workspace_bytes', 0) / 2**20:.1f} MiB | {mean:.2f} ({tgs}) | "
          f"{rs[0]['streamed_bytes_per_token'] / 1e9:.2f} GB | {pps} |")
for depth in sorted({d for d, _ in rows}):
    a, b = summary.get(f"{depth}-phase"), summary.get(f"{depth}-no-phase")
    if a and b:
        print(f"depth {depth}: decode arena +{(a['arena_bytes'] - b['arena_bytes']) / 2**20:.0f} MiB, "
              f"tg x{a['tg_mean'] / b['tg_mean']:.3f} with the phase arena")
json.dump(summary, open(os.path.join(out, "summary.json"), "w"), indent=1)
EOF
