#!/usr/bin/env bash
# The main job: set-up (only what building and running need, and SmolLM2 alone: setup.sh
# --minimal), build kvstream without its tests, and generate text with SmolLM2-135M-Instruct
# on the CPU.
# Extra arguments go to `kvstream run` after the defaults (the model, a prompt, -n 96, --chat);
# each default that an argument gives again is dropped: `-n 200` keeps the prompt, `-p "..."`
# (or -f, --tokens) replaces it, `-m MODEL` runs another model.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --minimal
cmake --preset cpu -G Ninja -DKVS_TESTS=OFF >/dev/null
cmake --build --preset cpu -j "$(nproc)" --target kvstream

model=yes prompt=yes n=yes chat=yes
for a in "$@"; do
  case "$a" in
    -m | --model | --model=*) model=no ;;
    -p | --prompt | --prompt=* | -f | --file | --file=* | --tokens | --tokens=*) prompt=no ;;
    -n | --n-predict | --n-predict=*) n=no ;;
    --chat) chat=no ;;
  esac
done
defaults=()
[ "$model" = yes ] && defaults+=(-m models/SmolLM2-135M-Instruct.Q4_1.gguf)
[ "$prompt" = yes ] && defaults+=(-p "Explain in two sentences why the sky is blue.")
[ "$n" = yes ] && defaults+=(-n 96)
[ "$chat" = yes ] && defaults+=(--chat)
exec build/cpu/kvstream run "${defaults[@]}" "$@"
