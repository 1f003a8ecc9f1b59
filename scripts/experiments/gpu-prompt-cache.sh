#!/usr/bin/env bash
# On a GPU machine: whether the prompt cache is exact on CUDA. tests/e2e/serve_cache.py with
# every server on --backend cuda: turn 2 of a conversation on a server with the prompt cache
# (turn 1's pages reused, several of them written by decode steps) against a server without
# one, answers and log-probabilities compared exactly; then two completions whose cached pages
# were written by prefills only. Exit 0 and "serve cache: ok" when they are identical.
#   scripts/experiments/gpu-prompt-cache.sh [BUILD_DIR]   (default build/sm90; models/ from scripts/fetch-model.sh)
set -uo pipefail
cd "$(dirname "$0")/../.."
bin=${1:-build/sm90}
py=.venv/bin/python3
[ -x "$py" ] || py=python3
KVS_SERVE_ARGS="--backend cuda" "$py" tests/e2e/serve_cache.py "$bin/kvstream" \
  models/SmolLM2-135M-Instruct.Q4_1.gguf
