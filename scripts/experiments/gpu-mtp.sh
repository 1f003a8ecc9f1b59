#!/usr/bin/env bash
# On a GPU machine: speculative decoding with the model's MTP block (issue 32, --spec mtp) on the
# CUDA backend.
# 1. tests/cuda/test_cuda_mtp.cpp: greedy with MTP drafts is plain decoding bit for bit
#    (tiny-qwen35 f32 and q4_k; resident, streamed and auto; 1 to 4 sequences), and the MTP
#    block's logits, token by token and for a whole prompt, agree with the CPU backend's within
#    the CUDA-vs-CPU tolerance (2e-2 of the logits' scale).
# 2. synthetic:qwen35-27b:iq4_xs (the real shape: head size 256, the 27B's MTP block), a prompt of
#    2000 tokens, 64 greedy tokens with `run --spec mtp --draft-max 3 --draft-p-min 0` against
#    `--spec off`, resident and streamed (--kv-mode stream): the tokens must be equal; prints the
#    decode tok/s of both and what the MTP block holds on the device. Its weights are random, so
#    nearly every draft is rejected: this measures what drafting costs, not what it gains.
#    `bench` runs no drafter (its --verify-tokens time verify steps of random drafts), hence run.
# KVS_BIN is the folder with kvstream and tests/ (default build/sm90); OUT receives the JSON and
# logs (default out/gpu-mtp). Exits 1 when a check fails.
set -uo pipefail
bin=${KVS_BIN:-build/sm90}
out=${OUT:-out/gpu-mtp}
mkdir -p "$out"
fail=0
"$bin/tests/kvs_cuda_test_cuda_mtp" 2>&1 | tee "$out/test_cuda_mtp.log" |
  grep -E "OK|FAILED|Failure|SKIPPED|accepted|difference" || true
grep -q "FAILED" "$out/test_cuda_mtp.log" && fail=1
grep -q "SKIPPED" "$out/test_cuda_mtp.log" && { echo "no CUDA device?"; fail=1; }

m=synthetic:qwen35-27b:iq4_xs
tokens=$(python3 -c "import random; r = random.Random(5); print(','.join(str(r.randrange(1000, 50000)) for _ in range(2000)))")
for mode in resident stream; do
  kv=(--kv-mode "$mode")
  for spec in off mtp; do
    extra=(--spec off)
    [ "$spec" = mtp ] && extra=(--spec mtp --draft-max 3 --draft-p-min 0)
    "$bin/kvstream" run -m "$m" --backend cuda --tokens "$tokens" -n 64 --temp 0 --ignore-eos \
      -c 4096 "${kv[@]}" "${extra[@]}" --json "$out/$mode-$spec.json" >/dev/null \
      2>"$out/$mode-$spec.log" ||
      { echo "run $mode $spec failed:"; tail -3 "$out/$mode-$spec.log"; fail=1; continue; }
    grep -E "decode|speculation|MTP" "$out/$mode-$spec.log"
  done
  python3 - "$out/$mode-off.json" "$out/$mode-mtp.json" "$mode" <<'EOF' || fail=1
import json, sys
off, on = (json.load(open(p)) for p in sys.argv[1:3])
a, b = off["tokens"], on["tokens"]
sp = on["speculation"]
print("%s: %d drafted, %d accepted, %.1f tok/s against %.1f without; MTP block %.1f MiB" % (
    sys.argv[3], sp["drafted"], sp["accepted"], on["decode_tokens_per_s"],
    off["decode_tokens_per_s"], sp["draft_device_bytes"] / 2**20))
if sp["drafted"] == 0:
    print("%s: no drafts" % sys.argv[3])
    sys.exit(1)
if a != b:
    i = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    print("%s: the tokens part at %d of %d" % (sys.argv[3], i, len(a)))
    sys.exit(1)
print("%s: the %d greedy tokens equal --spec off's" % (sys.argv[3], len(a)))
EOF
done
exit $fail
