#!/usr/bin/env bash
# On a GPU machine: the streaming figures of docs/benchmarks.md (issue 5) for llama3-8b q4_0,
# q8_0 K / q4_0 V, with --vram-limit leaving a KV arena of about 2.2 GiB. KVS_BIN is the folder
# with kvstream (default build/cuda), OUT receives one bench JSON per mode (default out/gpu),
# LIMIT overrides the limit (default 6.66G). Each sweep is bounded by KVS_BENCH_TIMEOUT seconds
# (default 300); the JSON keeps what a sweep cut short had measured.
set -uo pipefail
bin=${KVS_BIN:-build/cuda}
out=${OUT:-out/gpu}
limit=${LIMIT:-6.66G}
t=${KVS_BENCH_TIMEOUT:-300}
mkdir -p "$out"
m=(-m synthetic:llama3-8b:q4_0 -ctk q8_0 -ctv q4_0 --backend cuda --fill random)
run() {  # name, then bench arguments
  local name=$1
  shift
  timeout "$t" "$bin/kvstream" bench "${m[@]}" "$@" --json "$out/h200-stream-$name.json" 2>&1 |
    grep -vE 'filling' | tee "$out/h200-stream-$name.md"
}
all=8k,32k,64k,128k,256k
run resident --modes resident --depths "$all" --n-gen 32
run auto --modes auto --depths "$all" --n-gen 32 --vram-limit "$limit"
run unified --modes unified --depths 32k,64k,128k,256k --n-gen 4 --vram-limit "$limit"
run host --modes host --depths 8k,32k,64k,128k --n-gen 4 -p 0
run pair --modes auto --pair 16k,64k --n-gen 16 --vram-limit "$limit"
echo "chart: bench/plot.py $out/h200-stream-{resident,auto,unified,host}.json -o docs/stream-chart"
