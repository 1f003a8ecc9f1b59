#!/usr/bin/env bash
# The main job: set-up, build, and generate text with SmolLM2-135M-Instruct on the CPU.
# Extra arguments go to `kvstream run` (e.g. -p "..." -n 128 --temp 0.7).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cmake --preset cpu -G Ninja >/dev/null
cmake --build --preset cpu -j "$(nproc)" --target kvstream
if [ $# -eq 0 ]; then
  set -- -p "Explain in two sentences why the sky is blue." -n 96 --chat
fi
exec build/cpu/kvstream run -m models/SmolLM2-135M-Instruct.Q4_1.gguf "$@"
