#!/usr/bin/env bash
# The whole test suite on the CPU backend: set-up, build, ctest; then, where nvcc is installed,
# the CUDA build for every target architecture (its tests need a GPU: tests/cuda, run on the GPU
# machine). Extra arguments go to ctest (e.g. -L unit, -R gguf).
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

# The CUDA backend compiles for sm_86, sm_89, sm_90 and sm_120 (build/cuda; its tests/cuda need
# a GPU), and its host side runs under the null GPU (tests/nullgpu: launches on the H200 and on
# three consumer cards, graph relaunch, streaming, the switches).
if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="$PATH:/usr/local/cuda/bin"
  cmake --preset cuda -G Ninja >/dev/null
  cmake --build build/cuda -j "$(nproc)"
  ctest --test-dir build/cuda --output-on-failure -L nullgpu
  # The timing build (KVS_TRACE, sm_90 only) compiles too.
  cmake --preset trace-sm90 -G Ninja >/dev/null
  cmake --build build/trace -j "$(nproc)" --target kvstream
else
  echo "test.sh: no nvcc, the CUDA build is skipped"
fi
