#!/usr/bin/env bash
# A synthetic model written once as GGUF and reused: prints the file for SPEC (e.g.
# llama3-8b:q4_0), made with BIN/kvstream synth under KVS_SYNTH_DIR (default /tmp/kvs-synth) if
# missing, or synthetic:SPEC if it cannot be written. The same bytes as -m synthetic:SPEC, but
# mapped instead of built: a large model's random weights take far longer to make than its file
# to load, and a comparison runs the model many times.
#   scripts/synth-model.sh BIN SPEC
set -uo pipefail
dir=${KVS_SYNTH_DIR:-/tmp/kvs-synth}
f="$dir/${2//:/-}.gguf"
if [ ! -s "$f" ]; then
  mkdir -p "$dir" && "$1/kvstream" synth "$2" -o "$f.part" >/dev/null 2>&1 && mv "$f.part" "$f" ||
    { rm -f "$f.part"; echo "synthetic:$2"; exit 0; }
fi
echo "$f"
