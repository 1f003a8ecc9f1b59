#!/usr/bin/env bash
# The whole test suite on the CPU backend: set-up, build, ctest. CUDA tests are skipped where
# no GPU is present. Extra arguments go to ctest (e.g. -L unit, -R gguf).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cmake --preset cpu -G Ninja >/dev/null
cmake --build --preset cpu -j "$(nproc)"
ctest --test-dir build/cpu --output-on-failure -j "$(nproc)" "$@"

# The streams, fences, thread pool and the streaming engine (ring, write-back, smallest rings)
# again under ThreadSanitizer (build/tsan).
cmake --preset tsan -G Ninja >/dev/null
cmake --build build/tsan -j "$(nproc)" \
  --target kvs_unit_test_device kvs_unit_test_threadpool kvs_unit_test_stream
export TSAN_OPTIONS="halt_on_error=1"
build/tsan/tests/kvs_unit_test_device
build/tsan/tests/kvs_unit_test_threadpool
build/tsan/tests/kvs_unit_test_stream
