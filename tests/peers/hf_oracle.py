#!/usr/bin/env python3
"""Hugging Face transformers as the second oracle: tiny random Qwen3.5 and Gemma 3 models built
in transformers (fp32, CPU), converted to GGUF by the llama-cpp-python sdist's own
convert_hf_to_gguf.py, and transformers' logits against kvstream's and stock llama.cpp's on the
converted file. Where kvstream and llama.cpp disagree, this says which one reads the model as its
authors wrote it; it also checks the converter's mapping (norm offsets, the GDN's value-head
order, A = -exp(A_log)) that every real GGUF file carries.

Runs in a venv with torch and transformers (tests/peers/hf-oracle.sh makes one):
  hf_oracle.py --llama-src DIR --kvstream BIN --peer BIN [--work DIR] [--json OUT]

Ends with "hf oracle: N passed, N failed".
"""
import argparse
import json
import os
import subprocess
import sys

import numpy as np
import torch

LENGTHS = [1, 2, 37, 200]
TOL = 2e-3  # rel L2 of fp32 logits against transformers' fp32 (f16 KV in both engines)


def tiny_tokenizer(out_dir, n_vocab):
    """A byte-level BPE tokenizer of exactly n_vocab tokens (Gemma 3's converter trims the
    embedding to the tokenizer's size)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders
    from transformers import PreTrainedTokenizerFast
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {c: i for i, c in enumerate(sorted(alphabet))}
    merges = []
    letters = "etaoinshrdlucmfwypvbgkjqxz"
    for a in letters:
        for b in letters:
            if len(vocab) < n_vocab:
                vocab[a + b] = len(vocab)
                merges.append((a, b))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="ee").save_pretrained(out_dir)


def randomize(model, direct_norms=()):
    """Weights at scales that make every path matter: matrices N(0, 1/fan_in), embeddings N(0, 1),
    zero-centred norms (1 + w) N(0, 0.1), norms used as is 1 + N(0, 0.1)."""
    g = torch.Generator().manual_seed(1234)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1:
                shift = 1.0 if any(d in name for d in direct_norms) else 0.0
                scale = 0.5 if ("A_log" in name or "dt_bias" in name) else 0.1
                p.copy_(shift + scale * torch.randn(p.shape, generator=g))
            elif "embed" in name:
                p.copy_(torch.randn(p.shape, generator=g))
            else:
                fan_in = p[0].numel()
                p.copy_(torch.randn(p.shape, generator=g) / fan_in ** 0.5)


def qwen35(work):
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig
    cfg = Qwen3_5TextConfig(
        vocab_size=512, hidden_size=128, intermediate_size=384, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=1, head_dim=64, linear_conv_kernel_dim=4,
        linear_key_head_dim=32, linear_value_head_dim=32, linear_num_key_heads=2,
        linear_num_value_heads=6, max_position_embeddings=4096, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000000.0,
                         "mrope_section": [3, 3, 2], "mrope_interleaved": True,
                         "partial_rotary_factor": 0.25})
    torch.manual_seed(0)
    m = Qwen3_5ForCausalLM(cfg).eval()
    randomize(m, direct_norms=("linear_attn.norm",))
    return m


def gemma3(work):
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig
    cfg = Gemma3TextConfig(
        vocab_size=512, hidden_size=128, intermediate_size=384, num_hidden_layers=7,
        num_attention_heads=4, num_key_value_heads=1, head_dim=64, query_pre_attn_scalar=64,
        sliding_window=16, max_position_embeddings=4096,
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                         "full_attention": {"rope_type": "linear", "factor": 8.0,
                                            "rope_theta": 1000000.0}})
    torch.manual_seed(0)
    m = Gemma3ForCausalLM(cfg).eval()
    randomize(m)
    return m


def convert(llama_src, model_dir, out, outtype, extra):
    """convert_hf_to_gguf.py as its users run it, with the pre-tokenizer check answered: the tiny
    tokenizer's hash is in no table, and its pre-tokenizer does not change a logit."""
    code = (
        "import sys; sys.path.insert(0, %r); sys.path.insert(0, %r)\n"
        "import convert_hf_to_gguf as c\n"
        "from conversion.base import TextModel\n"
        "TextModel.get_vocab_base_pre = lambda self, tokenizer: 'qwen2'\n"
        "sys.argv = ['convert_hf_to_gguf.py', %r, '--outfile', %r, '--outtype', %r] + %r\n"
        "c.main()\n" % (llama_src, os.path.join(llama_src, "gguf-py"), model_dir, out, outtype,
                         extra))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError("convert_hf_to_gguf.py failed:\n" + r.stderr[-3000:])


def rel_l2(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-src", required=True)
    ap.add_argument("--kvstream", required=True)
    ap.add_argument("--peer", required=True)
    ap.add_argument("--work", default="build/hf-oracle")
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    torch.set_num_threads(2)
    results = []
    for name, make in (("qwen35", qwen35), ("gemma3", gemma3)):
        d = os.path.join(a.work, name)
        m = make(d)
        m.save_pretrained(d)
        tiny_tokenizer(d, m.config.vocab_size)
        rng = np.random.default_rng(7)
        tokens = rng.integers(0, m.config.vocab_size, size=max(LENGTHS)).tolist()
        with torch.no_grad():
            hf = m(torch.tensor([tokens])).logits[0].float().numpy()
        for outtype in ("f32", "q8_0"):
            gguf = os.path.join(a.work, f"{name}.{outtype}.gguf")
            # transformers' Qwen3.5 has no MTP block to convert
            convert(a.llama_src, d, gguf, outtype, ["--no-mtp"] if name == "qwen35" else [])
            tok_arg = ",".join(map(str, tokens))
            ll_out = os.path.join(a.work, f"{name}.{outtype}.llama.npy")
            subprocess.run([a.peer, "logits", gguf, "--tokens", tok_arg, "--at",
                            ",".join(map(str, LENGTHS)), "--out", ll_out], check=True,
                           capture_output=True)
            ll = np.load(ll_out)
            for i, n in enumerate(LENGTHS):
                out = os.path.join(a.work, f"{name}.{outtype}.kv-{n}.npy")
                subprocess.run([a.kvstream, "run", "-m", gguf, "--tokens",
                                ",".join(map(str, tokens[:n])), "-n", "0", "-ctk", "f16", "-ctv",
                                "f16", "-t", "2", "--logits-out", out], check=True,
                               capture_output=True)
                kv = np.load(out).reshape(-1)
                e_kv, e_ll = rel_l2(kv, hf[n - 1]), rel_l2(ll[i], hf[n - 1])
                # f32 files must agree with transformers; quantized ones are reported
                ok = outtype != "f32" or e_kv <= TOL
                results.append({"model": name, "gguf": outtype, "tokens": n,
                                "kvstream_vs_hf": e_kv, "llama_vs_hf": e_ll, "passed": ok})
                print(f"  {name:7s} {outtype:5s} {n:4d} tokens  kvstream vs transformers {e_kv:.5f}"
                      f"  llama.cpp vs transformers {e_ll:.5f}  {'ok' if ok else 'FAIL'}",
                      flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"tolerance": TOL, "results": results}, f, indent=1)
    passed = sum(r["passed"] for r in results)
    print(f"hf oracle: {passed} passed, {len(results) - passed} failed")
    sys.exit(0 if passed == len(results) else 1)


if __name__ == "__main__":
    main()
