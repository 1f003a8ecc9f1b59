#!/usr/bin/env bash
# Builds stock llama.cpp (CPU) from the vendored tree of PyPI's llama-cpp-python sdist, version
# pinned, and tests/peers/llama_peer.cpp against it, in a cache outside the checkout
# (KVS_PEERS_CACHE, default ~/.cache/kvstream/peers) so later runs reuse both. Prints the path of
# llama_peer on its last line. --bench also builds llama-bench (build-VERSION/bin) from the same
# tree and flags, for scripts/cpu-bench.py.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
version=0.3.36
cache=${KVS_PEERS_CACHE:-$HOME/.cache/kvstream/peers}
src=$cache/llama_cpp_python-$version/vendor/llama.cpp
build=$cache/build-$version
mkdir -p "$cache"

if [ ! -f "$src/include/llama.h" ]; then
  echo "build-llama: fetching the llama-cpp-python $version sdist" >&2
  python3 -m pip download -q --disable-pip-version-check --no-deps --no-binary :all: \
    "llama-cpp-python==$version" -d "$cache" >&2
  tar -xzf "$cache/llama_cpp_python-$version.tar.gz" -C "$cache"
fi

if [ ! -f "$build/src/libllama.a" ]; then
  echo "build-llama: building llama.cpp (CPU) in $build" >&2
  # AVX2, not -march=native: a VM may advertise AMX tiles it does not let a process use (SIGILL
  # in llama.cpp's AMX kernels), and the cache must run on every x86-64 machine CI lands on.
  cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
    -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
    -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_CURL=OFF -DGGML_OPENMP=OFF >&2
  cmake --build "$build" --target llama -j "$(nproc)" >&2
fi

if [ "${1:-}" = --bench ] && [ ! -x "$build/bin/llama-bench" ]; then
  echo "build-llama: building llama-bench in $build" >&2
  cmake -S "$src" -B "$build" -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=OFF \
    -DLLAMA_BUILD_MTMD=OFF >&2
  cmake --build "$build" --target llama-bench -j "$(nproc)" >&2
fi

peer=$cache/llama_peer
stamp=$cache/llama_peer.sha
sum=$(sha256sum "$here/llama_peer.cpp" | cut -d' ' -f1)
if [ ! -x "$peer" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$sum" ]; then
  echo "build-llama: compiling llama_peer" >&2
  libs=$(find "$build" -name 'lib*.a' | sort)
  # shellcheck disable=SC2086  # one library a word
  c++ -std=c++17 -O2 -o "$peer" "$here/llama_peer.cpp" -I"$src/include" -I"$src/src" \
    -I"$src/ggml/include" \
    -Wl,--start-group $libs -Wl,--end-group -lpthread -ldl -lm
  echo "$sum" >"$stamp"
fi
echo "$peer"
