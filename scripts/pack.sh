#!/usr/bin/env bash
# Packs the binaries and their libraries for another machine, one that cannot build them (no
# compilers, no -dev packages, no network): kvstream, the test binaries (and the matvec sweep
# where CUDA is built), stripped, the shared libraries they load beyond the base system (glibc
# and the GPU driver, which the other machine must have), optionally SmolLM2-135M for the
# tests, and env.sh, which points the library path and the tests at the unpacked files:
#   tar xzf kvstream-cuda.tar.gz && . kvstream-cuda/env.sh && kvstream --version
#
#   scripts/pack.sh [--preset NAME] [--model] [--no-libs] [--split SIZE] [-o FILE]
#     --preset   the CMake preset to build (default: cuda where nvcc is found, else cpu)
#     --model    include models/SmolLM2-135M-Instruct.Q4_1.gguf (fetched if missing)
#     --no-libs  binaries only, for a machine with the same libraries installed
#     --split    also cut the archive into pieces of SIZE (split -b: 60M, 1G) for a transport
#                with a size limit; `cat FILE.* | tar xz` unpacks them
#     -o         the archive (default: build/kvstream-PRESET.tar.gz)
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/cuda/bin"

preset="" model=no libs=yes split="" out=""
while [ $# -gt 0 ]; do
  case "$1" in
    --preset) preset=$2; shift 2 ;;
    --model) model=yes; shift ;;
    --no-libs) libs=no; shift ;;
    --split) split=$2; shift 2 ;;
    -o) out=$2; shift 2 ;;
    *) echo "pack: unknown argument '$1' (see the head of $0)" >&2; exit 1 ;;
  esac
done
if [ -z "$preset" ]; then
  preset=cpu
  command -v nvcc >/dev/null 2>&1 && preset=cuda
fi
out=${out:-build/kvstream-$preset.tar.gz}
name=$(basename "$out" .tar.gz)

dir=$(cmake --preset "$preset" -G Ninja | sed -n 's/^-- Build files have been written to: //p')
[ -d "$dir" ] || { echo "pack: cannot find the build folder of preset $preset" >&2; exit 1; }
cmake --build "$dir" -j "$(nproc)"
[ "$model" = yes ] && scripts/fetch-model.sh smollm2

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
root="$tmp/$name"
mkdir -p "$root/bin" "$root/lib"
bins=("$dir/kvstream")
[ -x "$dir/kvs_matvec_sweep" ] && bins+=("$dir/kvs_matvec_sweep")
for t in "$dir"/tests/kvs_*; do
  [ -f "$t" ] && [ -x "$t" ] && bins+=("$t")
done
for b in "${bins[@]}"; do
  strip -o "$root/bin/$(basename "$b")" "$b"
done

# The libraries ldd resolves, less glibc's and the driver's: those belong to the other machine.
base='/(ld-linux[^/]*|lib(c|m|dl|rt|pthread|resolv|util|cuda|nvidia-[^/]*)\.so[^/]*)$'
if [ "$libs" = yes ]; then
  for b in "${bins[@]}"; do ldd "$b"; done | awk '$2 == "=>" && $3 ~ /^\// {print $3}' |
    sort -u | grep -Ev "$base" | while read -r lib; do
      cp -L "$lib" "$root/lib/"
    done
fi
if [ "$model" = yes ]; then
  mkdir -p "$root/models"
  cp models/SmolLM2-135M-Instruct.Q4_1.gguf "$root/models/"
fi
cat >"$root/env.sh" <<'ENV'
# Source this: the unpacked binaries on PATH, their libraries first, the tests pointed here.
kvs_root=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export PATH="$kvs_root/bin:$PATH"
export LD_LIBRARY_PATH="$kvs_root/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export KVS_BINARY="$kvs_root/bin/kvstream" KVS_MODEL_DIR="$kvs_root/models"
ENV
echo "built from $(git rev-parse --short HEAD)$(git diff --quiet || echo ' with changes')" \
  >"$root/VERSION"

mkdir -p "$(dirname "$out")"
tar czf "$out" -C "$tmp" "$name"
echo "pack: $out ($(du -h "$out" | cut -f1)): ${#bins[@]} binaries, $(ls "$root/lib" | wc -l) libraries"
if [ -n "$split" ]; then
  rm -f "$out".[0-9][0-9]
  split -b "$split" -d "$out" "$out".
  ls -l "$out".[0-9][0-9]
fi
