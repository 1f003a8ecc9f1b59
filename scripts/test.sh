#!/usr/bin/env bash
# The whole test suite on the CPU backend: set-up, build, ctest. CUDA tests are skipped where
# no GPU is present. Extra arguments go to ctest (e.g. -L unit, -R gguf).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cmake --preset cpu -G Ninja >/dev/null
cmake --build --preset cpu -j "$(nproc)"
ctest --test-dir build/cpu --output-on-failure -j "$(nproc)" "$@"
