"""Tokenizers of reference.py (``--prompt`` and the decoded text only): BPE through the
``tokenizers`` package, built from the GGUF vocab and merges, and SentencePiece written out here.

SentencePiece pieces ("\u2581" for space, <0xNN> byte pieces) merge by score as llama.cpp's
llm_tokenizer_spm does, no space prefix (``add_space_prefix`` false), the control and
user-defined pieces (Gemma 3's <start_of_turn>, runs of newlines, spaces, tabs) split out
first, longest first, as llama_tokenize does with parse_special."""

from __future__ import annotations

import re

from ref_common import field_value


_PRE_REGEX = {
    "llama-bpe": r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    "qwen2": r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
}


class SpmTokenizer:
    """SentencePiece ("llama" GGUF tokenizer model) as llama.cpp's llm_tokenizer_spm:
    the text's spaces become U+2581, adjacent pieces merge by the highest score of
    their concatenation (leftmost first on ties), a character without a piece
    falls back to its UTF-8 bytes' <0xNN> pieces; unknown, control and
    user-defined pieces in the text are taken whole first.  Offers the two calls of
    ``tokenizers.Tokenizer`` that main() uses."""

    class Encoding:
        def __init__(self, ids):
            self.ids = ids

    def __init__(self, reader):
        self.pieces = [str(t) for t in field_value(reader, "tokenizer.ggml.tokens")]
        self.scores = [float(x) for x in field_value(reader, "tokenizer.ggml.scores")]
        ttypes = [int(t) for t in field_value(reader, "tokenizer.ggml.token_type")]
        if bool(field_value(reader, "tokenizer.ggml.add_space_prefix", True)):
            raise NotImplementedError("SentencePiece with a space prefix is not implemented here")
        self.ids = {p: i for i, p in enumerate(self.pieces)}
        self.ttypes = ttypes
        whole = sorted((p for p, t in zip(self.pieces, ttypes) if t in (2, 3, 4)), key=len, reverse=True)
        self.whole_re = re.compile("|".join(re.escape(p) for p in whole)) if whole else None

    def encode(self, text: str, add_special_tokens: bool = False):
        out = []
        pos = 0
        for mt in (self.whole_re.finditer(text) if self.whole_re else ()):
            out += self._spm(text[pos:mt.start()])
            out.append(self.ids[mt.group(0)])
            pos = mt.end()
        out += self._spm(text[pos:])
        return SpmTokenizer.Encoding(out)

    def _spm(self, text: str):
        import heapq
        sym = list(text.replace(" ", "\u2581"))
        if not sym:
            return []
        prev = list(range(-1, len(sym) - 1))
        nxt = list(range(1, len(sym) + 1))
        nxt[-1] = -1
        heap = []

        def push(a, b):
            i = self.ids.get(sym[a] + sym[b])
            if i is not None:
                heapq.heappush(heap, (-self.scores[i], a, sym[a] + sym[b]))

        for a in range(len(sym) - 1):
            push(a, a + 1)
        while heap:
            _, a, text_ab = heapq.heappop(heap)
            b = nxt[a]
            if not sym[a] or b < 0 or sym[a] + sym[b] != text_ab:
                continue  # a stale pair: one side has merged since
            sym[a], sym[b] = text_ab, ""
            nxt[a] = nxt[b]
            if nxt[a] >= 0:
                prev[nxt[a]] = a
            if prev[a] >= 0:
                push(prev[a], a)
            if nxt[a] >= 0:
                push(a, nxt[a])
        out = []
        a = 0
        while a >= 0:
            i = self.ids.get(sym[a])
            if i is not None:
                out.append(i)
            else:
                out += [self.ids["<0x%02X>" % b] for b in sym[a].encode("utf-8")]
            a = nxt[a]
        return out

    def decode(self, ids, skip_special_tokens: bool = False):
        buf = bytearray()
        for i in ids:
            p, t = self.pieces[i], self.ttypes[i]
            if t == 6:
                buf.append(int(p[3:5], 16))
            elif t == 3 and skip_special_tokens:
                continue
            else:
                buf += p.replace("\u2581", " ").encode("utf-8")
        return buf.decode("utf-8", errors="replace")


def build_tokenizer(reader):
    if field_value(reader, "tokenizer.ggml.model") == "llama":
        return SpmTokenizer(reader)
    from tokenizers import Tokenizer, AddedToken, Regex, decoders, models, pre_tokenizers

    tmodel = field_value(reader, "tokenizer.ggml.model")
    if tmodel != "gpt2":
        raise NotImplementedError("only BPE (gpt2) GGUF tokenizers are supported here, got %r" % tmodel)
    tokens = field_value(reader, "tokenizer.ggml.tokens")
    merges = field_value(reader, "tokenizer.ggml.merges")
    ttypes = field_value(reader, "tokenizer.ggml.token_type") or []
    pre = field_value(reader, "tokenizer.ggml.pre", "default")
    vocab = {t: i for i, t in enumerate(tokens)}
    merge_pairs = [tuple(mm.split(" ", 1)) for mm in merges]
    tk = Tokenizer(models.BPE(vocab=vocab, merges=merge_pairs, fuse_unk=False, byte_fallback=False))
    bl = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in _PRE_REGEX:
        tk.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(_PRE_REGEX[pre]), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    elif pre in ("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone"):
        tk.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), bl])
    else:
        tk.pre_tokenizer = bl
    tk.decoder = decoders.ByteLevel()
    special = [AddedToken(tokens[i], special=True, normalized=False)
               for i, tt in enumerate(ttypes) if int(tt) in (3, 4)]
    if special:
        tk.add_special_tokens(special)
    return tk
