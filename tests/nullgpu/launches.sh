#!/usr/bin/env bash
# The CUDA backend's host side without a GPU (ctest -L nullgpu, in the CUDA build): kvstream
# with the null GPU of tests/nullgpu/null_cuda.cpp preloaded, which answers every CUDA call on the host
# and refuses launches a real card would (dynamic shared memory over its limit, or over 48 KiB
# not allowed first). Checked: every architecture, K/V type pair and mode launches on the H200
# and on three consumer cards (sm_89 and sm_120 with 16 GiB, sm_86) without an error, streaming
# included; decode steps relaunch one recorded graph (qwen35's too); the switches' host paths
# run; `kvstream run` works; and every launch of tests/cuda's operation tests (head sizes 32 to
# 256, every K/V type, prefill and decode; the Gated DeltaNet's, whose chunk kernel falls back to
# token by token where a card's shared memory cannot hold it) is one the consumer cards take.
# The values are garbage: tests/cuda checks them on a GPU.
#   tests/nullgpu/launches.sh KVSTREAM LIBKVS_NULL_CUDA [OPERATION_TEST_BINARY...]
set -uo pipefail
bin=$1
lib=$2
shift 2
ops=("$@")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failed=0
# Runs kvstream as CARD with ENV (assignments) and ARGS; the report of its launches in $tmp/r.
k() {
  local card=$1 env=$2
  shift 2
  # shellcheck disable=SC2086  # the assignments split on spaces
  if ! env $env KVS_NULL_GPU="$card" KVS_NULL_GPU_REPORT="$tmp/r" LD_PRELOAD="$lib" \
    "$bin" "$@" --json "$tmp/j" >"$tmp/out" 2>&1; then
    echo "FAILED: [$card $env] kvstream $*"
    tail -5 "$tmp/out"
    failed=1
    return 1
  fi
}
# field EXPR FILE: EXPR (a Python suffix) of the JSON in FILE.
field() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))$1)" "$2"; }

for card in h200 rtx4080 rtx3090 rtx5070ti; do
  for model in tiny tiny-qwen2 tiny-qwen3:q4_0 tiny-h128:q4_0 smollm2-135m:q4_1 tiny-qwen35:q4_0; do
    for kv in "f16 f16" "q8_0 q8_0" "q8_0 q4_0" "q4_0 q4_0"; do
      set -- $kv
      k "$card" "" bench -m "synthetic:$model" -ctk "$1" -ctv "$2" --backend cuda \
        --depths 0,300,2000 --n-gen 4 -b 128 --page-size 64 --modes resident,stream \
        --ring-chunk 256K &&
        [ "$(field "['runs'].__len__()" "$tmp/j")" = 6 ] ||
        { echo "FAILED: $card $model $kv: not 6 runs"; failed=1; }
    done
  done
done
echo "every model, K/V pair and mode on every card: done"

# A decode step recorded once relaunches as one graph: 32 timed tokens, a few captures.
for model in tiny tiny-qwen35; do
  k h200 "" bench -m "synthetic:$model" --backend cuda --depths 0 --n-gen 32 -p 0 \
    --modes resident &&
    python3 - "$tmp/r" "$model" <<'EOF' || failed=1
import json, sys
r = json.load(open(sys.argv[1]))
ok = r["graph_launches"] >= 32 and r["captures"] <= 4
print(("" if ok else "FAILED: ") + f"graph relaunch ({sys.argv[2]}): {r}")
sys.exit(0 if ok else 1)
EOF
done
# Streaming steps are not recorded (their copies and fences cut them): they launch kernels.
k rtx4080 "" bench -m synthetic:tiny --backend cuda --depths 300 --n-gen 8 -p 0 --modes auto \
  --kv-arena 160k --page-size 16 -b 64 --no-phase-arena &&
  [ "$(field "['runs'][0]['streamed_bytes_per_token'] > 0" "$tmp/j")" = True ] ||
  { echo "FAILED: stream mode streamed nothing"; failed=1; }
# Split: the CPU's pages, folded on the device after its flag (the flag's kernel, the fold's;
# the null GPU does not wait for the flag, so only the ring's bytes are checked: fewer).
k rtx4080 "" bench -m synthetic:tiny --backend cuda --depths 300 --n-gen 8 -p 0 \
  --modes stream,split --kv-arena 160k --page-size 16 -b 64 --no-phase-arena --split-share 0.5 &&
  python3 -c "import json, sys; r = json.load(open(sys.argv[1]))['runs']
sys.exit(r[1]['streamed_bytes_per_token'] >= r[0]['streamed_bytes_per_token'])" "$tmp/j" ||
  { echo "FAILED: split mode streamed what stream mode does"; failed=1; }
# Split with verify steps: the CPU's partials of every row of a step, a fold of each row.
k rtx4080 "" bench -m synthetic:tiny-qwen35:q4_0 -ctk q8_0 -ctv q4_0 --backend cuda --depths 1000 \
  --n-gen 16 --modes split --kv-arena 100k --page-size 16 -b 64 --no-phase-arena \
  --split-share 0.5 --spec oracle --accept 0.75 --draft-min 3 --draft-max 3 \
  -f "$(dirname "$0")/../../bench/prompts/summarise.txt" &&
  [ "$(field "['runs'][0]['spec'].get('cpu_draft_pages_per_step', 0) > 0" "$tmp/j")" = True ] ||
  { echo "FAILED: split took no page of a verify step's drafts"; failed=1; }

# The switches' host paths (their bits are tests/cuda's).
for env in "KVS_CUDA_GRAPHS=0" "KVS_PDL=0" "KVS_PROFILE=1" "KVS_DECODE_WARP=0" \
  "KVS_DECODE_WARP=1" "KVS_L2_NEXT=0" "KVS_L2_NEXT=16" "KVS_CUDA_GRAPHS=0 KVS_DECODE_WARP=1"; do
  k h200 "$env" bench -m synthetic:tiny-qwen3 -ctk q8_0 -ctv q4_0 --backend cuda \
    --depths 0,700 --n-gen 8 -b 128 --page-size 64 || true
done
echo "switches: done"

k rtx3090 "" run -m synthetic:smollm2-135m -p "hello" -n 8 --backend cuda --temp 0 || true

# kvstream plan gives the arena a run gets under --vram-limit, one that streams and one that
# holds the whole KV: the weights, buffers and scratch counted as the CUDA backend allocates
# them, to the byte. Each case: the model and its options, then the limits.
for m in "tiny-qwen35:q4_k -c 65536|32M 400M" "smollm2-135m:q4_1 -c 16384|200M 400M" \
  "tiny-gemma3:q4_0 -c 65536|30M 200M" "tiny-h128:q4_0 -c 16384 -b 64 --parallel 2|16M 200M" \
  "tiny-qwen3 -c 8192 --kv-mode stream|40M"; do
  # shellcheck disable=SC2086  # the options split on spaces
  set -- ${m%|*}
  model=$1
  shift
  for limit in ${m#*|}; do
    "$bin" plan -m "synthetic:$model" "$@" -ctk q8_0 -ctv q4_0 --vram-limit "$limit" \
      --json "$tmp/plan" 2>"$tmp/out" | grep "^arena" ||
      { echo "FAILED: plan $m"; cat "$tmp/out"; failed=1; continue; }
    k h200 "" run -m "synthetic:$model" "$@" -ctk q8_0 -ctv q4_0 --vram-limit "$limit" \
      --backend cuda -p "hello" -n 2 || continue
    want=$(field "['arena_bytes']" "$tmp/plan")
    got=$(field "['kv']['arena_bytes']" "$tmp/j")
    [ "$want" = "$got" ] ||
      { echo "FAILED: $m --vram-limit $limit: plan's arena $want, the run's $got"; failed=1; }
  done
done
echo "plan against the runs' arenas: done"

# The operation tests' launches on the consumer cards: their values fail here (no GPU), but a
# launch or allocation the card would refuse shows as an error naming the null GPU.
if [ ${#ops[@]} -gt 0 ]; then
  for op in "${ops[@]}"; do
    for card in rtx4080 rtx3090 rtx5070ti; do
      KVS_NULL_GPU="$card" LD_PRELOAD="$lib" "$op" >"$tmp/ops" 2>&1
      if grep -q "null GPU)" "$tmp/ops"; then
        echo "FAILED: $card refuses a launch of $(basename "$op"):"
        grep -B2 "null GPU)" "$tmp/ops" | head -12
        failed=1
      fi
    done
  done
  echo "the operation tests' launches on consumer cards: done"
fi
[ "$failed" = 0 ] && echo "all passed"
exit "$failed"
