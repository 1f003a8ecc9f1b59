#!/usr/bin/env python3
"""kvstream against stock llama.cpp on the same GGUF bytes (CPU backends of both).

Synthetic files of every architecture and several weight formats: the logits after 1, 2, 37, 700
and 3000 tokens, kvstream (f16 KV) on the file against llama.cpp (f16 KV) in two ways:
  same weights  llama.cpp on a copy of the file dequantized to f32 (tests/peers/dequant.py): the
                same real weights with full-precision activations in both engines; within
                max(0.01, 1.5 x llama.cpp's own f16-vs-q8_0-KV spread on that case);
  same file     llama.cpp on the file itself, which rounds the activations to 8 bits before each
                quantized matrix product; within max(0.01, 1.5 x the larger of llama.cpp's KV
                spread and its own file-vs-f32-copy spread).
Relative L2 of the logits throughout. The real models (SmolLM2-135M, Gemma 3 270M): 32 greedy
tokens on three prompts equal to llama.cpp's, or the first difference at a near tie (top-2
margin < 0.1 in both engines).

  peers.py --kvstream build/cpu/kvstream --peer PATH/llama_peer [--work DIR] [--cache DIR]
           [--only SUBSTR] [--json OUT] [--backend cpu|cuda]

Ends with "peers: N passed, N failed"; exits 1 if any case failed.
"""
import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
LENGTHS = [1, 2, 37, 700, 3000]
MTP_LENGTHS = [2, 37, 700]

# (preset, weight format): every architecture, formats across the block families; the tiny
# presets' rows of 128 take K-quants by llama.cpp's fallback, so the K and IQ formats also run
# on a preset with rows of 256 or more.
SYNTH = [
    ("tiny", "q8_0"), ("tiny", "f16"), ("tiny-h128", "q4_k"), ("tiny-h128", "iq4_xs"),
    ("tiny-qwen2", "q4_0"), ("tiny-qwen2", "q5_1"),
    ("tiny-qwen3", "q8_0"), ("tiny-qwen3", "bf16"),
    ("tiny-gemma3", "q8_0"), ("tiny-gemma3", "q4_1"),
    ("tiny-qwen35", "q8_0"), ("tiny-qwen35", "f16"), ("tiny-qwen35-gdn", "q8_0"),
    ("qwen35-mini", "q6_k"),
]

# Every weight format, each on a preset whose rows of 256 and 512 take every block family as
# is; checked as the synthetic cases are, at one length.
FORMATS = ["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q2_k", "q3_k", "q4_k",
           "q5_k", "q6_k", "iq4_nl", "iq4_xs"]
FORMAT_PRESET, FORMAT_LENGTHS = "tiny-h128", [37]

REAL = [
    ("models/SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2"),
    ("models/gemma-3-270m-q4_k_m.gguf", "gemma3-270m"),
]
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Once upon a time, in a small village by the sea, there lived",
]
N_GREEDY = 32
NEAR_TIE = 0.1


def run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])} ... failed ({r.returncode}):\n{r.stderr[-2000:]}")
    return r.stdout


def rel_l2(a, b):
    a = a.astype(np.float64)
    b = b.astype(np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def n_vocab_of(path):
    from gguf import GGUFReader  # the venv's gguf package (scripts/setup.sh)
    r = GGUFReader(path)
    return len(r.fields["tokenizer.ggml.tokens"].data)


class Kvstream:
    """kvstream's side. With `record` (a list), the logits commands are written down for another
    machine to run (as a shell script over $KV and $W) and nothing is compared; with `replay`, the
    logits those commands wrote are read from that folder."""

    def __init__(self, exe, backend, record=None, replay=""):
        self.exe, self.backend, self.record, self.replay = exe, backend, record, replay

    def _logits(self, args, out):
        if self.record is not None:
            b = os.path.basename
            cmd = ["$KV"] + [("$W/" + b(x)) if x.endswith((".gguf", ".npy")) else x for x in args]
            self.record.append(" ".join(cmd + ["$W/" + b(out)]))
            return None
        if self.replay:
            return np.load(os.path.join(self.replay, os.path.basename(out))).reshape(-1)
        run([self.exe] + args + [out])
        return np.load(out).reshape(-1)

    def synth(self, spec, path):
        if self.record is not None:
            self.record.append(f"$KV synth {spec} -o $W/{os.path.basename(path)}")
        if not os.path.exists(path):
            run([self.exe, "synth", spec, "-o", path])

    def logits(self, model, tokens, out):
        return self._logits(["run", "-m", model, "--tokens", ",".join(map(str, tokens)), "-n", "0",
                             "--backend", self.backend, "-ctk", "f16", "-ctv", "f16", "-t", "2",
                             "-c", str(len(tokens) + 16), "--logits-out"], out)

    def mtp_logits(self, model, tokens, out):
        return self._logits(["run", "-m", model, "--tokens", ",".join(map(str, tokens)), "-n", "0",
                             "--backend", self.backend, "-ctk", "f16", "-ctv", "f16", "-t", "2",
                             "--spec", "mtp", "-c", str(len(tokens) + 16), "--mtp-logits-out"], out)

    def tokenize(self, model, text, out):
        run([self.exe, "run", "-m", model, "-p", text, "-n", "0", "--backend", self.backend,
             "-t", "2", "--json", out])
        with open(out) as f:
            return json.load(f)["prompt_tokens"]

    def greedy(self, model, tokens, n, out):
        run([self.exe, "run", "-m", model, "--tokens", ",".join(map(str, tokens)), "-n", str(n),
             "--backend", self.backend, "--temp", "0", "-ctk", "f16", "-ctv", "f16", "-t", "2",
             "-c", str(len(tokens) + n + 16), "--json", out])
        with open(out) as f:
            return json.load(f)["tokens"]


def margin(l):
    top = np.sort(l)[-2:]
    return float(top[1] - top[0])


def presets_of(exe):
    """kvstream synth's presets, from its help."""
    import re
    text = run([exe, "synth", "--help"])
    return re.search(r"presets: ([^)]*)\)", text.replace("\n", " ")).group(1).replace(" ", "").split(",")


def preset_loads(kv, peer, work, results):
    """Every preset, its matrices zeros (a sparse file), through llama.cpp's loader: metadata,
    vocabulary and every tensor's name, type and shape as llama.cpp expects them."""
    for preset in presets_of(kv.exe):
        path = os.path.join(work, f"{preset}.zeros.gguf")
        if not os.path.exists(path):
            run([kv.exe, "synth", f"{preset}:q4_k", "--zeros", "-o", path])
        try:
            note, ok = run([peer, "load", path]).strip(), True
        except RuntimeError as e:
            note, ok = str(e).splitlines()[-1], False
        os.remove(path)
        results.append({"case": f"{preset} loads", "passed": ok, "note": note})
        print(f"  {preset:22s} llama.cpp loads it: {note}  {'ok' if ok else 'FAIL'}", flush=True)


def synth_case(kv, peer, work, preset, fmt, results, lengths=None):
    lengths = lengths or LENGTHS
    name = f"{preset}:{fmt}"
    path = os.path.join(work, f"{preset}.{fmt}.gguf")
    kv.synth(name, path)
    rng = np.random.default_rng(sum(ord(c) * 31 ** i for i, c in enumerate(name)) % (1 << 32))
    n_vocab = n_vocab_of(path)
    tokens = rng.integers(0, n_vocab, size=max(lengths)).tolist()
    tok_file = os.path.join(work, f"{preset}.{fmt}.tokens")
    with open(tok_file, "w") as f:
        f.write(",".join(map(str, tokens)))
    deq = os.path.join(work, f"{preset}.{fmt}.f32.gguf")
    if not os.path.exists(deq):
        run([sys.executable, os.path.join(HERE, "dequant.py"), path, deq])
    ll = {}
    for key, model, kvt in (("f16", path, "f16"), ("q8_0", path, "q8_0"), ("f32", deq, "f16")):
        out = os.path.join(work, f"{preset}.{fmt}.llama-{key}.npy")
        run([peer, "logits", model, "--tokens", "@" + tok_file, "--at", ",".join(map(str, lengths)),
             "--ctk", kvt, "--ctv", kvt, "--out", out])
        ll[key] = np.load(out)
    for i, n in enumerate(lengths):
        ours = kv.logits(path, tokens[:n], os.path.join(work, f"{preset}.{fmt}.kv-{n}.npy"))
        if ours is None:
            continue
        kv_spread = rel_l2(ll["q8_0"][i], ll["f16"][i])
        act_spread = rel_l2(ll["f16"][i], ll["f32"][i])
        tol_w = max(0.01, 1.5 * kv_spread)
        tol_f = max(0.01, 1.5 * max(kv_spread, act_spread))
        err_w = rel_l2(ours, ll["f32"][i])
        err_f = rel_l2(ours, ll["f16"][i])
        ok = err_w <= tol_w and err_f <= tol_f
        results.append({"case": name, "tokens": n, "rel_l2_same_weights": err_w,
                        "rel_l2_same_file": err_f, "llama_kv_spread": kv_spread,
                        "llama_activation_spread": act_spread, "tol_same_weights": tol_w,
                        "tol_same_file": tol_f, "passed": ok})
        print(f"  {name:22s} {n:5d}  same weights {err_w:.5f} (tol {tol_w:.4f})  same file "
              f"{err_f:.5f} (tol {tol_f:.4f})  llama.cpp KV {kv_spread:.5f} act {act_spread:.5f}"
              f"  {'ok' if ok else 'FAIL'}", flush=True)
    if preset in ("tiny-qwen35", "qwen35-mini"):
        mtp_case(kv, peer, work, name, path, deq, tokens, results)


def mtp_case(kv, peer, work, name, path, deq, tokens, results):
    """The MTP head's logits of the last entry against llama.cpp's MTP graph on the same weights,
    fed the same entries (token k with the trunk's state after token k - 1, k >= 1). llama.cpp's
    speculative loop also feeds token 0 with a zero state first; that difference is reported."""
    for n in MTP_LENGTHS:
        tok = ",".join(map(str, tokens[:n]))
        ll = {}
        for key, extra in (("f16", ["--ctk", "f16", "--ctv", "f16"]),
                           ("q8_0", ["--ctk", "q8_0", "--ctv", "q8_0"]),
                           ("zero", ["--zero-entry", "1"])):
            out = os.path.join(work, f"{name}.mtp-{n}.llama-{key}.npy")
            run([peer, "mtp", deq, "--tokens", tok, "--out", out] + extra)
            ll[key] = np.load(out).reshape(-1)
        ours = kv.mtp_logits(path, tokens[:n], os.path.join(work, f"{name}.mtp-{n}.kv.npy"))
        if ours is None:
            continue
        spread = rel_l2(ll["q8_0"], ll["f16"])
        tol = max(0.01, 1.5 * spread)
        err, err_zero = rel_l2(ours, ll["f16"]), rel_l2(ours, ll["zero"])
        ok = err <= tol
        results.append({"case": name + " mtp", "tokens": n, "rel_l2_same_weights": err,
                        "llama_kv_spread": spread, "tol_same_weights": tol,
                        "rel_l2_llama_zero_entry": err_zero, "passed": ok})
        print(f"  {name + ' MTP':22s} {n:5d}  same weights {err:.5f} (tol {tol:.4f})  against "
              f"llama.cpp's loop with its zero-state entry {err_zero:.5f}  {'ok' if ok else 'FAIL'}",
              flush=True)


def greedy_peer(peer, path, prompt):
    lines = run([peer, "greedy", path, "--prompt", prompt, "-n", str(N_GREEDY)]).splitlines()
    prompt_ids = [int(x) for x in lines[0].split()[1:]]
    ref = [(int(l.split()[1]), float(l.split()[2])) for l in lines[1:] if l.startswith("token")]
    return prompt_ids, ref


def first_difference(kv, path, work, tag, prompt_ids, ours, ref):
    """(passed, note): tokens equal, or the first difference at a near tie in both engines."""
    ref_tok = [t for t, _ in ref]
    n = min(len(ours), len(ref_tok))
    diff = next((i for i in range(n) if ours[i] != ref_tok[i]), None)
    if diff is None:
        if len(ours) != len(ref_tok):
            return False, f"lengths differ: {len(ours)} against {len(ref_tok)}"
        return True, f"{n} tokens equal"
    l = kv.logits(path, prompt_ids + ref_tok[:diff], os.path.join(work, f"{tag}.diff.npy"))
    ours_margin, ref_margin = margin(l), ref[diff][1]
    return (ours_margin < NEAR_TIE and ref_margin < NEAR_TIE,
            f"first difference at token {diff}: margins {ours_margin:.4f} (kvstream), "
            f"{ref_margin:.4f} (llama.cpp)")


def real_case(kv, peer, work, cache, path, label, results):
    """Greedy tokens against llama.cpp on the file's f32 copy (the same weights; must agree) and
    on the file itself (reported: llama.cpp rounds the activations there). The copy is kept in
    cache, named by the file's name and size."""
    deq = os.path.join(cache, f"{os.path.basename(path)}.{os.path.getsize(path)}.f32.gguf")
    if not os.path.exists(deq):
        run([sys.executable, os.path.join(HERE, "dequant.py"), path, deq])
    for pi, prompt in enumerate(PROMPTS):
        prompt_ids, ref = greedy_peer(peer, deq, prompt)
        ours = kv.greedy(path, prompt_ids, len(ref), os.path.join(work, f"{label}.{pi}.json"))
        ok, note = first_difference(kv, path, work, f"{label}.{pi}", prompt_ids, ours, ref)
        same_ids, ref_file = greedy_peer(peer, path, prompt)
        ours_ids = kv.tokenize(path, prompt, os.path.join(work, f"{label}.{pi}.tok.json"))
        if ours_ids != prompt_ids:
            ok, note = False, f"prompt tokens differ: {ours_ids} against llama.cpp's {prompt_ids}"
        _, note_file = first_difference(kv, path, work, f"{label}.{pi}.file", prompt_ids, ours,
                                        ref_file)
        results.append({"case": f"{label} prompt {pi}", "passed": ok and same_ids == prompt_ids,
                        "same_weights": note, "same_file": note_file})
        print(f"  {label:14s} prompt {pi}  same weights: {note}  {'ok' if ok else 'FAIL'}\n"
              f"  {'':14s}           same file:    {note_file}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kvstream", required=True)
    ap.add_argument("--peer", required=True)
    ap.add_argument("--work", default="build/peers")
    ap.add_argument("--cache", default="", help="where the real models' f32 copies are kept")
    ap.add_argument("--only", default="")
    ap.add_argument("--json", default="")
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--record", default="",
                    help="write kvstream's commands of the synthetic cases to this script (for a "
                    "GPU machine; llama.cpp's logits stay in --work) and compare nothing")
    ap.add_argument("--replay", default="",
                    help="read kvstream's logits of the synthetic cases from this folder, where "
                    "the --record script wrote them")
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    kv = Kvstream(a.kvstream, a.backend, [] if a.record else None, a.replay)
    results, t0 = [], time.time()
    for preset, fmt in SYNTH:
        if a.only in f"{preset}:{fmt}":
            synth_case(kv, a.peer, a.work, preset, fmt, results)
    for fmt in FORMATS:
        if (FORMAT_PRESET, fmt) not in SYNTH and a.only in f"{FORMAT_PRESET}:{fmt}":
            synth_case(kv, a.peer, a.work, FORMAT_PRESET, fmt, results, FORMAT_LENGTHS)
    if not a.replay and not a.record and a.only in "loads":
        preset_loads(kv, a.peer, a.work, results)
    if a.record:
        with open(a.record, "w") as f:
            f.write("#!/bin/sh\n# kvstream's side of tests/peers/peers.py on another machine: "
                    "KV=kvstream W=folder sh SCRIPT\nset -e\n" + "\n".join(kv.record) + "\n")
        print(f"peers: {len(kv.record)} commands written to {a.record}")
        return
    for path, label in REAL:
        if a.only not in label or a.replay:
            continue
        if not os.path.exists(path):
            results.append({"case": label, "passed": False, "note": f"{path} is missing"})
            print(f"  {label}: {path} is missing (scripts/fetch-model.sh)  FAIL")
            continue
        real_case(kv, a.peer, a.work, a.cache or a.work, path, label, results)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"backend": a.backend, "seconds": time.time() - t0, "results": results}, f,
                      indent=1)
    passed = sum(r["passed"] for r in results)
    failed = len(results) - passed
    worst = {}
    for r in results:
        if "rel_l2_same_file" in r:
            w = worst.setdefault(r["case"].split(":")[0], [0.0, 0.0])
            w[0] = max(w[0], r["rel_l2_same_weights"])
            w[1] = max(w[1], r["rel_l2_same_file"])
        elif "rel_l2_same_weights" in r:
            w = worst.setdefault(r["case"].split(":")[0] + " MTP", [0.0, None])
            w[0] = max(w[0], r["rel_l2_same_weights"])
    for preset, (w, f) in worst.items():
        print(f"  worst rel L2 {preset}: same weights {w:.5f}" +
              (f", same file {f:.5f}" if f is not None else ""))
    print(f"peers: {passed} passed, {failed} failed ({time.time() - t0:.0f} s)")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
