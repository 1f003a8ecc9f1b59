#!/usr/bin/env python3
"""Reference tokenization for test_tokenizer: builds a HuggingFace `tokenizers` BPE from a
byte-level vocab (a GGUF file or a JSON dump) and prints the ids of each text as JSON.

usage: tokenizer_ref.py request.json  ->  {"ids": [[...], ...]} on stdout
request: {"gguf": path} or {"vocab": {"tokens", "types", "merges", "pre"}},
         optional "pre" (overrides the vocab's), "texts": [...]
         or {"gguf": path, "dump": true}  ->  the vocab as JSON (tokens, types, merges, ids)
         or {"gguf": path, "spm": true, "texts": [...]}: a SentencePiece vocab, tokenized by
         tools/reference.py's tokenizer (llama.cpp's llm_tokenizer_spm, special pieces split
         out first), without BOS
"""
import json
import os
import sys

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

# The pre-tokenizer regexes as HF tokenizer.json files write them (not llama.cpp's rewrites).
LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
          r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
         r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def read_gguf(path):
    from gguf import GGUFReader

    r = GGUFReader(path)

    def field(key):
        f = r.fields.get(key)
        if f is None:
            return None
        if len(f.types) > 1:  # array
            if f.types[1].name == "STRING":
                return [bytes(f.parts[i]).decode("utf-8") for i in f.data]
            return [f.parts[i].tolist()[0] for i in f.data]
        if f.types[0].name == "STRING":
            return bytes(f.parts[f.data[0]]).decode("utf-8")
        return f.parts[f.data[0]].tolist()[0]

    return {
        "model": field("tokenizer.ggml.model"),
        "pre": field("tokenizer.ggml.pre") or "default",
        "tokens": field("tokenizer.ggml.tokens"),
        "types": field("tokenizer.ggml.token_type"),
        "merges": field("tokenizer.ggml.merges") or [],
        "bos": field("tokenizer.ggml.bos_token_id"),
        "eos": field("tokenizer.ggml.eos_token_id"),
        "chat_template": field("tokenizer.chat_template") or "",
    }


def build(v, pre):
    vocab = {}
    for i, t in enumerate(v["tokens"]):
        vocab.setdefault(t, i)  # first of duplicates wins
    merges = [tuple(m.split(" ", 1)) for m in v["merges"]]
    ignore = pre in ("llama3", "llama-bpe")
    tk = Tokenizer(models.BPE(vocab, merges, ignore_merges=ignore))
    if pre == "smollm":  # SmolLM2's tokenizer.json
        tk.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    elif pre in ("gpt2", "gpt-2"):
        tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    elif pre in ("llama3", "llama-bpe", "qwen2"):
        rx = QWEN2 if pre == "qwen2" else LLAMA3
        tk.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(rx), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    else:
        raise SystemExit(f"tokenizer_ref.py: no reference for pre-tokenizer {pre!r}")
    tk.decoder = decoders.ByteLevel()
    types = v.get("types") or [1] * len(v["tokens"])
    tk.add_special_tokens([AddedToken(t, special=True, normalized=False)
                           for t, ty in zip(v["tokens"], types) if ty == 3])
    tk.add_tokens([AddedToken(t, special=False, normalized=False)
                   for t, ty in zip(v["tokens"], types) if ty == 4])
    return tk


def spm_ids(path, texts):
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
    import reference
    from gguf import GGUFReader

    tk = reference.build_tokenizer(GGUFReader(path))
    return [tk.encode(t).ids for t in texts]


def main():
    req = json.load(open(sys.argv[1], encoding="utf-8"))
    if req.get("spm"):
        json.dump({"ids": spm_ids(req["gguf"], req["texts"])}, sys.stdout)
        return
    v = read_gguf(req["gguf"]) if "gguf" in req else req["vocab"]
    if req.get("dump"):
        json.dump(v, sys.stdout, ensure_ascii=False)
        return
    tk = build(v, req.get("pre") or v.get("pre", "gpt2"))
    ids = [tk.encode(t, add_special_tokens=False).ids for t in req["texts"]]
    json.dump({"ids": ids}, sys.stdout)


if __name__ == "__main__":
    main()
