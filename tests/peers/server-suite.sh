#!/usr/bin/env bash
# llama.cpp's own server tests (tools/server/tests/unit of the vendored tree in PyPI's
# llama-cpp-python sdist, the version build-llama.sh pins) against `kvstream serve`, started
# through tests/peers/llama-server, which maps only the model-download flags to local GGUFs.
# The outcome is compared with tests/peers/server-suite-expected.txt (server_suite.py): a test
# that fails and is not listed fails the run, and so does a listed test that passes (shrink
# the list). The sdist and a venv with the suite's requirements are kept in KVS_PEERS_CACHE
# (default ~/.cache/kvstream/peers).
#   tests/peers/server-suite.sh [KVSTREAM] [PYTEST ARGS...]   (default build/cpu/kvstream)
# KVS_SUITE_JOBS: pytest-xdist workers (default: the cores); KVS_SUITE_WRITE=1 rewrites the
# expected list from this run's failures (reasons of entries already there are kept).
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
kvstream=$(realpath "${1:-build/cpu/kvstream}")
shift || true
version=0.3.36
cache=${KVS_PEERS_CACHE:-$HOME/.cache/kvstream/peers}
src=$cache/llama_cpp_python-$version/vendor/llama.cpp
mkdir -p "$cache"
if [ ! -d "$src/tools/server/tests/unit" ]; then
  echo "server-suite: fetching the llama-cpp-python $version sdist" >&2
  python3 -m pip download -q --disable-pip-version-check --no-deps --no-binary :all: \
    "llama-cpp-python==$version" -d "$cache" >&2
  tar -xzf "$cache/llama_cpp_python-$version.tar.gz" -C "$cache"
fi

# The suite's requirements.txt, pinned to versions that install on Python 3.11 and 3.12.
venv=$cache/server-venv
if ! "$venv/bin/python3" -c "import pytest, xdist, openai, requests, wget, filelock" 2>/dev/null
then
  echo "server-suite: installing the suite's requirements into $venv" >&2
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check pytest==8.3.5 pytest-xdist==3.6.1 \
    filelock==3.16.1 numpy==2.2.6 openai==2.14.0 prometheus-client==0.20.0 requests==2.32.3 \
    wget==3.2 aiohttp==3.9.5
fi

for m in SmolLM2-135M-Instruct.Q4_1.gguf gemma-3-270m-q4_k_m.gguf; do
  [ -f "models/$m" ] || scripts/fetch-model.sh "$(case $m in Smol*) echo smollm2 ;; *) echo gemma3-270m ;; esac)"
done

# A fresh copy of the tests, whose tmp/ the suite writes in, where their paths into the tree
# (../../../models/templates, ../../../tools/mtmd) find the sdist's files.
work=build/server-suite
tests=$work/tools/server/tests
rm -rf "$work"
mkdir -p "$work/tools/server"
cp -r "$src/tools/server/tests" "$tests"
ln -s "$src/models" "$work/models"
ln -s "$src/tools/mtmd" "$work/tools/mtmd"
mkdir -p "$tests/tmp"
# test_speculative's draft model, which the suite would download: the local SmolLM2.
ln -s "$root/models/SmolLM2-135M-Instruct.Q4_1.gguf" "$tests/tmp/stories15M-q4_0.gguf"

suites=(basic completion chat_completion stream tokenize security metrics slot_save ctx_shift
        ignore_eos speculative template compat_oai_responses compat_anthropic
        kv_keep_only_active infill)
files=("${suites[@]/#/unit/test_}")
files=("${files[@]/%/.py}")
jobs=${KVS_SUITE_JOBS:-$(nproc)}
export KVS_SUITE_KVSTREAM=$kvstream KVS_SUITE_MODELS=$root/models
export LLAMA_SERVER_BIN_PATH=$root/tests/peers/llama-server
# The suite's servers on the CPU, 2 threads each, whatever KVS_THREADS the caller has.
export KVS_THREADS=2
t0=$SECONDS
(cd "$tests" &&
  "$venv/bin/python3" -m pytest -q -p no:cacheprovider -n "$jobs" --dist=loadfile \
    --junitxml="$root/$work/results.xml" -o junit_family=xunit1 "${files[@]}" "$@" \
    >"$root/$work/pytest.log" 2>&1) || true
echo "server-suite: pytest took $((SECONDS - t0)) s ($jobs workers; log $work/pytest.log)"
"$venv/bin/python3" tests/peers/server_suite.py --junit "$work/results.xml" \
  --expected tests/peers/server-suite-expected.txt ${KVS_SUITE_WRITE:+--write}
