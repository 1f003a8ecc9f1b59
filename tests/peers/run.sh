#!/usr/bin/env bash
# The peers stage of scripts/test.sh: kvstream's CPU backend against stock llama.cpp
# (tests/peers/peers.py) and against Hugging Face transformers (tests/peers/hf_oracle.py), and
# kvstream serve against llama.cpp's own server tests (tests/peers/server-suite.sh). Builds
# what it needs once into KVS_PEERS_CACHE (default ~/.cache/kvstream/peers): llama.cpp from the
# pinned llama-cpp-python sdist, a venv with torch and transformers, a venv with the server
# tests' requirements.
#   tests/peers/run.sh [KVSTREAM]   (default build/cpu/kvstream)
set -euo pipefail
cd "$(dirname "$0")/../.."
kvstream=${1:-build/cpu/kvstream}
cache=${KVS_PEERS_CACHE:-$HOME/.cache/kvstream/peers}
export KVS_PEERS_CACHE=$cache
mkdir -p build/peers

peer=$(tests/peers/build-llama.sh | tail -n 1)
.venv/bin/python3 tests/peers/peers.py --kvstream "$kvstream" --peer "$peer" --work build/peers \
  --cache "$cache" --json build/peers/peers.json

hf=$cache/hf-venv
if ! "$hf/bin/python3" -c "import torch, transformers" 2>/dev/null; then
  echo "peers: installing torch and transformers into $hf" >&2
  python3 -m venv "$hf"
  "$hf/bin/pip" install -q --disable-pip-version-check torch==2.15.0 transformers==5.23.0 \
    safetensors==0.8.0 sentencepiece tokenizers
fi
export HF_HUB_OFFLINE=1  # nothing is fetched from a hub
src=$(ls -d "$cache"/llama_cpp_python-*/vendor/llama.cpp | head -n 1)
"$hf/bin/python3" tests/peers/hf_oracle.py --llama-src "$src" --kvstream "$kvstream" \
  --peer "$peer" --work build/peers/hf --json build/peers/hf_oracle.json

# llama.cpp's server tests (about 150 s with 2 workers on 2 cores).
tests/peers/server-suite.sh "$kvstream"
