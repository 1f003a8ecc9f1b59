#!/usr/bin/env python3
"""Independent NumPy reference forward pass for GGUF decoder models.

Supported architectures (``general.architecture``): ``llama`` (Llama 2/3,
Mistral, SmolLM2, ...), ``qwen2``, ``qwen3``, ``gemma3`` and ``qwen35`` (the dense
Qwen3.5/3.6 hybrids of Gated DeltaNet and gated attention layers).  The file is read with
``gguf.GGUFReader``; every tensor is dequantized ONCE at load time with
``gguf.quants.dequantize`` and cached as a float32 matrix.  This script is
meant as an oracle for the C++ engine's tests: it shares no code with it.

Usage
-----
  reference.py MODEL.gguf (--tokens 1,2,3 | --tokens-file F | --prompt TEXT)
               [-n N] [--logits-out FILE.npy] [--all-logits-out FILE.npy]
               [--gen-logits-out FILE.npy] [--kv-type f16|f32|bf16|q8_0]
               [--stop-at-eos] [--dump-json FILE.json]

* The whole prompt is processed in ONE batched forward pass (causal mask,
  KV cache filled for all prompt positions; attention per layer uses score
  matrices of shape [n_tok, n_ctx], query rows chunked to bound memory).
* ``--logits-out``: float32 logits of the LAST prompt position, shape [n_vocab].
* ``--all-logits-out``: float32 logits of every prompt position, [n_prompt, n_vocab].
* ``--gen-logits-out``: float32 [N, n_vocab]; row i is the distribution that
  produced generated token i (row 0 == --logits-out).
* Then N tokens are generated greedily (argmax, lowest id on ties) by
  incremental single-token decode steps that reuse the KV cache.  By default
  exactly N tokens are generated (EOS does not stop; pass --stop-at-eos).
* stdout: exactly one line, the generated ids comma-separated (empty line if
  N == 0).  Everything else (progress, timings, decoded text) goes to stderr.

Numerics
--------
Everything is float32 (weights dequantized to f32, activations f32, matmuls
f32 BLAS; RMSNorm mean-square accumulated in f64; RoPE angles computed in
f64 then cos/sin cast to f32; softmax in f32 after max subtraction), EXCEPT
the KV cache emulation selected by ``--kv-type`` (default f16): K (after
RoPE) and V (after projection/bias) are rounded to that storage type before
being written to the cache and used in attention -- this also applies to the
current batch's own keys/values, like an engine that writes the cache first
and then attends over it.  ``q8_0`` quantizes each row (per token, per
kv head, blocks of 32 along head_dim) with gguf.quants.quantize and
dequantizes it back; ``bf16`` rounds to nearest-even bf16; ``f32`` is exact.

Model facts implemented (checked against llama.cpp llama-model.cpp /
convert_hf_to_gguf.py):
* A GGUF tensor with dims [n_in, n_out] (dims[0] contiguous) is a numpy
  matrix (n_out, n_in) and y = W @ x.
* RoPE: ``llama`` -> NORM mode (GPT-J style, adjacent pairs (x[2i], x[2i+1]);
  convert_hf_to_gguf permutes HF q/k weights for this), ``qwen2``/``qwen3`` ->
  NEOX mode (pairs (x[i], x[i + n_rot/2])).
  theta_i = pos * freq_scale * base^(-2i/n_rot) / freq_factor_i,
  n_rot = ``{arch}.rope.dimension_count`` (default head_dim); dims >= n_rot pass
  through.  freq_scale = 1/``{arch}.rope.scaling.factor`` for linear scaling;
  freq_factor from the ``rope_freqs.weight`` tensor (llama3-style) if present.
  YaRN / longrope scaling raise NotImplementedError.
* head_dim = ``{arch}.attention.key_length`` if present else n_embd / n_head
  (V head dim: ``attention.value_length``, same default).  GQA: q head h uses
  kv head h // (n_head / n_head_kv).  Scale 1/sqrt(head_dim_k).
* Optional biases (attn_q/k/v/output.bias; always present for qwen2) are
  added when present.  ``attn_q_norm`` / ``attn_k_norm`` (qwen3) are RMSNorm
  over head_dim per head, applied BEFORE RoPE.
* RMSNorm eps from ``{arch}.attention.layer_norm_rms_epsilon``; FFN is SwiGLU:
  down(silu(gate(x)) * up(x)).  Output head is ``output.weight``, or the
  token embedding (tied) when it is missing.

Gemma 3 (``gemma3``; checked against llama.cpp src/models/gemma3.cpp
``llama_model_gemma3::load_arch_hparams`` and ``graph<iswa>``,
src/llama-model.cpp ``load_swa_pattern`` / ``get_rope_freq_base``,
src/llama-hparams.{h,cpp} ``set_swa_pattern`` / ``is_masked_swa``, and the
converter's ``Gemma3Model`` (conversion/gemma.py, formerly convert_hf_to_gguf.py)):
* The token embedding is multiplied by sqrtf(n_embd) (f32) before layer 0.
* Every norm is RMSNorm with the GGUF weight as is: the converter already
  stored Gemma's (1 + w) (``norm_shift``), so nothing is added here.
* A layer: h = attn_norm(x); q, k, v projections (no biases); per-head
  ``attn_q_norm`` / ``attn_k_norm`` RMSNorm; NEOX RoPE; q *= f_attention_scale
  (then scores are NOT scaled again); attention; ``attn_output``;
  ``post_attention_norm``; x += that.  Then ffn_norm; down(gelu(gate) * up)
  with the tanh GELU 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)));
  ``post_ffw_norm``; x += that.  Final ``output_norm``, tied output head.
* f_attention_scale = 1/sqrt(head_dim) (``attention.key_length``, 256 on
  every size = HF query_pre_attn_scalar), except the 62-layer 27B model:
  1/sqrt(n_embd / n_head) (= 1/sqrt(168)).
* Sliding window: W = ``gemma3.attention.sliding_window``.  Which layers are
  local: ``gemma3.attention.sliding_window_pattern`` as one bool per layer
  (true = local), or as an integer period n, default 6 (published files have
  no key): local iff il % n < n - 1, so layers 5, 11, 17, ... are global.
  A query at position p sees keys j with j <= p and p - j < W (W keys
  including itself; ``is_masked_swa`` masks p - j >= W).  Global layers are
  causal only.  A file without a window (or W = 0) has only global layers.
* RoPE bases: global layers ``gemma3.rope.freq_base`` (1e6) with the file's
  linear rope scaling; local layers ``gemma3.rope.freq_base_swa``, default
  10000, with freq_scale 1.  Both NEOX mode over the whole head_dim.
* Final logit soft-capping c * tanh(logits / c) when the file has
  ``gemma3.final_logit_softcapping`` (Gemma 3 files have none).
* GELU: the exact tanh form in f32 (ggml's CPU backend instead looks it up in
  a table indexed by the input rounded to f16).

Qwen3.5 (``qwen35``) is in ref_qwen35.py, the tokenizers in ref_tokenizer.py, GGUF reading
and the shared numerics in ref_common.py.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time

# first: it pins NumPy's and OpenBLAS's code paths before NumPy loads
from ref_common import dequant_tensor, field_value, gelu_tanh, gguf, log, np, rms_norm, round_kv, silu
import ref_qwen35
from ref_tokenizer import build_tokenizer

SUPPORTED_ARCHS = ("llama", "qwen2", "qwen3", "gemma3", "qwen35")
ROPE_MODE = {"llama": "norm", "qwen2": "neox", "qwen3": "neox", "gemma3": "neox", "qwen35": "neox"}


class Config:
    pass


def swa_layers_from(pattern, n_layer: int):
    """Which layers are sliding-window ones: llama.cpp's set_swa_pattern(n)
    (local iff il % n < n - 1), n = 6 without a pattern key, or the key's
    bool per layer."""
    if pattern is None:
        pattern = 6
    if isinstance(pattern, (list, tuple)):
        if len(pattern) != n_layer:
            raise ValueError("sliding_window_pattern has %d entries for %d layers" % (len(pattern), n_layer))
        return [bool(b) for b in pattern]
    n = int(pattern)
    if n < 0:
        raise ValueError("sliding_window_pattern %d is negative" % n)
    return [n == 0 or il % n < n - 1 for il in range(n_layer)]


class Model:
    def __init__(self, path: str):
        t0 = time.time()
        self.reader = r = gguf.GGUFReader(path)
        arch = field_value(r, "general.architecture")
        if arch not in SUPPORTED_ARCHS:
            raise NotImplementedError("architecture %r not supported (only %s)" % (arch, ", ".join(SUPPORTED_ARCHS)))
        c = self.cfg = Config()
        c.arch = arch

        def req(k):
            v = field_value(r, "%s.%s" % (arch, k))
            if v is None:
                raise ValueError("missing metadata key %s.%s" % (arch, k))
            return v

        def opt(k, d=None):
            return field_value(r, "%s.%s" % (arch, k), d)

        c.n_embd = int(req("embedding_length"))
        c.n_layer = int(req("block_count"))
        c.n_ff = int(req("feed_forward_length"))
        c.n_head = int(req("attention.head_count"))
        c.n_head_kv = int(opt("attention.head_count_kv", c.n_head))
        c.eps = float(opt("attention.layer_norm_rms_epsilon", 1e-5))
        c.head_dim = int(opt("attention.key_length", c.n_embd // c.n_head))
        c.head_dim_v = int(opt("attention.value_length", c.n_embd // c.n_head))
        c.n_rot = int(opt("rope.dimension_count", c.head_dim))
        c.rope_base = float(opt("rope.freq_base", 10000.0))
        c.n_ctx_train = int(opt("context_length", 0) or 0)
        c.rope_mode = ROPE_MODE[arch]
        if c.n_head % c.n_head_kv != 0:
            raise ValueError("n_head %d not a multiple of n_head_kv %d" % (c.n_head, c.n_head_kv))
        if c.n_rot > c.head_dim or c.n_rot % 2:
            raise ValueError("bad rope dimension count %d (head_dim %d)" % (c.n_rot, c.head_dim))

        # rope scaling
        stype = opt("rope.scaling.type", None)
        factor = opt("rope.scaling.factor", None)
        if factor is None:
            factor = opt("rope.scale_linear", None)
        factor = float(factor) if factor else 0.0
        stype = (stype or "linear").lower()
        c.rope_scaling = stype
        if stype in ("none",):
            c.freq_scale = 1.0
        elif stype == "linear":
            c.freq_scale = 1.0 / factor if factor not in (0.0, 1.0) else 1.0
        elif stype in ("yarn", "longrope"):
            if factor in (0.0, 1.0):
                c.freq_scale = 1.0  # degenerate: no scaling actually applied
            else:
                raise NotImplementedError("rope scaling type %r (factor %g) is not implemented in reference.py" % (stype, factor))
        else:
            raise NotImplementedError("unknown rope scaling type %r" % stype)

        # layer kinds and the Gemma 3 specifics (see the module docstring)
        c.n_swa = 0
        c.swa_layers = [False] * c.n_layer
        c.rope_base_swa = c.rope_base
        c.embd_scale = None
        c.q_scale = None
        c.final_softcap = 0.0
        if arch == "gemma3":
            c.n_swa = int(opt("attention.sliding_window", 0) or 0)
            if c.n_swa < 0:
                raise ValueError("gemma3.attention.sliding_window %d is negative" % c.n_swa)
            if c.n_swa > 0:
                c.swa_layers = swa_layers_from(opt("attention.sliding_window_pattern", None), c.n_layer)
                c.rope_base_swa = float(opt("rope.freq_base_swa", 10000.0))
            c.final_softcap = float(opt("final_logit_softcapping", 0.0) or 0.0)
            c.embd_scale = float(np.float32(math.sqrt(c.n_embd)))
            q_div = c.n_embd // c.n_head if c.n_layer == 62 else c.head_dim
            c.q_scale = float(np.float32(1.0 / math.sqrt(q_div)))

        c.recurrent = [False] * c.n_layer
        c.n_nextn = 0
        if arch == "qwen35":
            ref_qwen35.read_config(c, opt, req)

        # tensors
        self.tensor_info = {t.name: t for t in r.tensors}
        self.w = {}
        for name, t in self.tensor_info.items():
            self.w[name] = dequant_tensor(t)
        tok = self.w["token_embd.weight"]
        c.n_vocab = tok.shape[0]
        if tok.shape[1] != c.n_embd:
            raise ValueError("token_embd shape %s does not match n_embd %d" % (tok.shape, c.n_embd))
        self.tied = "output.weight" not in self.w
        self.out_w = self.w["token_embd.weight"] if self.tied else self.w["output.weight"]
        self.rope_freqs = self.w.get("rope_freqs.weight")
        if self.rope_freqs is not None:
            self.rope_freqs = self.rope_freqs.reshape(-1).astype(np.float64)
            if self.rope_freqs.shape[0] < c.n_rot // 2:
                raise ValueError("rope_freqs.weight too short")

        # per-layer views + shape checks
        self.layers = []
        q_dim, kv_dim, v_dim = c.n_head * c.head_dim, c.n_head_kv * c.head_dim, c.n_head_kv * c.head_dim_v
        for il in range(c.n_layer):
            if arch == "qwen35":
                self.layers.append(ref_qwen35.layer_tensors(c, self.w, il))
                continue
            p = "blk.%d." % il
            L = {}
            for k in ("attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight",
                      "attn_output.weight", "ffn_norm.weight", "ffn_gate.weight", "ffn_up.weight",
                      "ffn_down.weight"):
                if p + k not in self.w:
                    raise ValueError("missing tensor %s%s" % (p, k))
                L[k.split(".")[0]] = self.w[p + k]
            for k in ("attn_q.bias", "attn_k.bias", "attn_v.bias", "attn_output.bias",
                      "attn_q_norm.weight", "attn_k_norm.weight", "post_attention_norm.weight",
                      "post_ffw_norm.weight"):
                v = self.w.get(p + k)
                L[k.replace(".weight", "").replace(".", "_")] = v
            exp = {"attn_q": (q_dim, c.n_embd), "attn_k": (kv_dim, c.n_embd), "attn_v": (v_dim, c.n_embd),
                   "attn_output": (c.n_embd, c.n_head * c.head_dim_v), "ffn_gate": (c.n_ff, c.n_embd),
                   "ffn_up": (c.n_ff, c.n_embd), "ffn_down": (c.n_embd, c.n_ff)}
            for k, s in exp.items():
                if L[k].shape != s:
                    raise ValueError("%s%s.weight has shape %s, expected %s" % (p, k, L[k].shape, s))
            self.layers.append(L)
        if arch == "gemma3":
            for il, L in enumerate(self.layers):
                for k in ("attn_q_norm", "attn_k_norm", "post_attention_norm", "post_ffw_norm"):
                    if L[k] is None:
                        raise ValueError("missing tensor blk.%d.%s.weight" % (il, k))
        if arch == "qwen3" and self.layers and self.layers[0]["attn_q_norm"] is None:
            log("warning: qwen3 model without attn_q_norm")
        self.load_s = time.time() - t0

    def describe(self) -> dict:
        c = self.cfg
        d = dict(vars(c))
        d["tied_output"] = self.tied
        d["rope_freqs"] = self.rope_freqs is not None
        return d


class Runner:
    def __init__(self, model: Model, kv_type: str = "f16", max_ctx: int = 0, q_chunk: int = 512):
        self.m = model
        self.kv_type = kv_type
        self.q_chunk = q_chunk
        c = model.cfg
        self.n_past = 0
        self.hidden = None  # a list: every forward's last-layer rows, before the output norm
        self.cap = max(16, max_ctx)
        # recurrent layers keep no K/V: a conv tail and a delta-rule state per layer instead
        self.k = [None if c.recurrent[il] else np.zeros((c.n_head_kv, self.cap, c.head_dim), np.float32)
                  for il in range(c.n_layer)]
        self.v = [None if c.recurrent[il] else np.zeros((c.n_head_kv, self.cap, c.head_dim_v), np.float32)
                  for il in range(c.n_layer)]
        self.conv_state, self.ssm_state = {}, {}
        for il in range(c.n_layer):
            if c.recurrent[il]:
                conv_dim = (2 * c.ssm_k_heads + c.ssm_v_heads) * c.ssm_state
                self.conv_state[il] = np.zeros((c.ssm_conv - 1, conv_dim), np.float32)
                self.ssm_state[il] = np.zeros((c.ssm_v_heads, c.ssm_state, c.ssm_state), np.float32)
        half = c.n_rot // 2
        inv = c.rope_base ** (-2.0 * np.arange(half, dtype=np.float64) / c.n_rot)
        if model.rope_freqs is not None:
            inv = inv / model.rope_freqs[:half]
        self.inv_freq = inv * c.freq_scale
        # sliding-window layers: their own base, no scaling, no frequency factors
        self.inv_freq_swa = c.rope_base_swa ** (-2.0 * np.arange(half, dtype=np.float64) / c.n_rot)
        # qwen35's multi-section rope: 1 where a pair rotates by the token's position, 0 where
        # by the text tokens' fourth position (always 0)
        self.pair_at_pos = np.array(getattr(c, "rope_pair_at_pos", [True] * half), np.float64)

    def _ensure(self, n: int) -> None:
        if n <= self.cap:
            return
        new = max(n, self.cap * 2)
        for i in range(len(self.k)):
            if self.k[i] is None:
                continue
            k = np.zeros((self.k[i].shape[0], new, self.k[i].shape[2]), np.float32)
            v = np.zeros((self.v[i].shape[0], new, self.v[i].shape[2]), np.float32)
            k[:, :self.cap] = self.k[i][:, :self.cap]
            v[:, :self.cap] = self.v[i][:, :self.cap]
            self.k[i], self.v[i] = k, v
        self.cap = new

    def rope(self, x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
        """x: (n_heads, T, head_dim); cos/sin: (T, n_rot/2)."""
        c = self.m.cfg
        nr = c.n_rot
        out = x.copy()
        if c.rope_mode == "norm":
            x0 = x[..., 0:nr:2]
            x1 = x[..., 1:nr:2]
            out[..., 0:nr:2] = x0 * cos - x1 * sin
            out[..., 1:nr:2] = x0 * sin + x1 * cos
        else:
            h = nr // 2
            x0 = x[..., :h]
            x1 = x[..., h:nr]
            out[..., :h] = x0 * cos - x1 * sin
            out[..., h:nr] = x0 * sin + x1 * cos
        return out

    def attend(self, il: int, q, k, v, p0: int, local: bool, scale) -> np.ndarray:
        """Writes k, v (heads, T, dim) at positions p0.. of layer il's cache and attends q
        (heads, T, dim) over positions 0..p0+T-1 (causal; the last n_swa in a local layer).
        Returns (T, n_head * head_dim_v)."""
        c = self.m.cfg
        nh, nkv, hd, hdv = c.n_head, c.n_head_kv, c.head_dim, c.head_dim_v
        g = nh // nkv
        T = q.shape[1]
        n_ctx = p0 + T
        self.k[il][:, p0:n_ctx] = round_kv(k, self.kv_type)
        self.v[il][:, p0:n_ctx] = round_kv(v, self.kv_type)
        K = self.k[il][:, :n_ctx]   # (nkv, n_ctx, hd)
        V = self.v[il][:, :n_ctx]   # (nkv, n_ctx, hdv)
        qg = q.reshape(nkv, g, T, hd)
        attn = np.empty((nkv, g, T, hdv), np.float32)
        for t0 in range(0, T, self.q_chunk):
            t1 = min(T, t0 + self.q_chunk)
            tc = t1 - t0
            s = np.matmul(qg[:, :, t0:t1].reshape(nkv, g * tc, hd), K.transpose(0, 2, 1))
            s = s.reshape(nkv, g, tc, n_ctx) * scale
            # causal mask: query at position p0+t may see keys j <= p0+t,
            # in a sliding-window layer only the last n_swa of them
            qpos = np.arange(p0 + t0, p0 + t1)[:, None]
            kpos = np.arange(n_ctx)[None, :]
            seen = kpos <= qpos
            if local:
                seen &= qpos - kpos < c.n_swa
            s = np.where(seen, s, np.float32(-np.inf))
            s -= s.max(axis=-1, keepdims=True)
            np.exp(s, out=s)
            s /= s.sum(axis=-1, keepdims=True)
            attn[:, :, t0:t1] = np.matmul(s.reshape(nkv, g * tc, n_ctx), V).reshape(nkv, g, tc, hdv)
        return attn.reshape(nh, T, hdv).transpose(1, 0, 2).reshape(T, nh * hdv)

    def forward(self, tokens, want: str = "last") -> np.ndarray:
        """Process tokens at positions n_past.. ; returns logits.

        want: 'last' -> (n_vocab,), 'all' -> (T, n_vocab)."""
        m, c = self.m, self.m.cfg
        T = len(tokens)
        if T == 0:
            raise ValueError("empty batch")
        toks = np.asarray(tokens, dtype=np.int64)
        if toks.min() < 0 or toks.max() >= c.n_vocab:
            raise ValueError("token id out of range [0, %d)" % c.n_vocab)
        p0 = self.n_past
        n_ctx = p0 + T
        self._ensure(n_ctx)
        pos = np.arange(p0, n_ctx, dtype=np.float64)
        rope_cs = {}
        for local, inv in ((False, self.inv_freq), (True, self.inv_freq_swa)):
            ang = (pos[:, None] * self.pair_at_pos[None, :]) * inv[None, :]
            rope_cs[local] = (np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32))
        nh, nkv, hd, hdv = c.n_head, c.n_head_kv, c.head_dim, c.head_dim_v
        # gemma3 scales q before the product instead of the scores
        scale = np.float32(1.0) if c.q_scale is not None else np.float32(1.0 / math.sqrt(hd))
        gemma = c.arch == "gemma3"

        x = m.w["token_embd.weight"][toks]  # (T, n_embd), f32 copy
        if c.embd_scale is not None:
            x = x * np.float32(c.embd_scale)
        for il, L in enumerate(m.layers):
            if c.arch == "qwen35":
                x = ref_qwen35.block(self, il, L, x, p0, rope_cs[False], scale)
                continue
            local = c.swa_layers[il]
            cos, sin = rope_cs[local]
            h = rms_norm(x, L["attn_norm"], c.eps)
            q = h @ L["attn_q"].T
            k = h @ L["attn_k"].T
            v = h @ L["attn_v"].T
            if L["attn_q_bias"] is not None:
                q += L["attn_q_bias"]
            if L["attn_k_bias"] is not None:
                k += L["attn_k_bias"]
            if L["attn_v_bias"] is not None:
                v += L["attn_v_bias"]
            q = q.reshape(T, nh, hd).transpose(1, 0, 2)     # (nh, T, hd)
            k = k.reshape(T, nkv, hd).transpose(1, 0, 2)    # (nkv, T, hd)
            v = v.reshape(T, nkv, hdv).transpose(1, 0, 2)   # (nkv, T, hdv)
            if L["attn_q_norm"] is not None:
                q = rms_norm(q, L["attn_q_norm"], c.eps)
            if L["attn_k_norm"] is not None:
                k = rms_norm(k, L["attn_k_norm"], c.eps)
            q = self.rope(q, cos, sin)
            k = self.rope(k, cos, sin)
            if c.q_scale is not None:
                q = q * np.float32(c.q_scale)
            o = self.attend(il, q, k, v, p0, local, scale)
            o = o @ L["attn_output"].T
            if L["attn_output_bias"] is not None:
                o += L["attn_output_bias"]
            if gemma:
                o = rms_norm(o, L["post_attention_norm"], c.eps)
            x = x + o
            h = rms_norm(x, L["ffn_norm"], c.eps)
            if gemma:
                f = (gelu_tanh(h @ L["ffn_gate"].T) * (h @ L["ffn_up"].T)) @ L["ffn_down"].T
                f = rms_norm(f, L["post_ffw_norm"], c.eps)
            else:
                f = (silu(h @ L["ffn_gate"].T) * (h @ L["ffn_up"].T)) @ L["ffn_down"].T
            x = x + f
        if self.hidden is not None:
            self.hidden.append(x)
        self.n_past = n_ctx
        if want == "last":
            x = x[-1:]
        x = rms_norm(x, m.w["output_norm.weight"], c.eps)
        logits = (x @ m.out_w.T).astype(np.float32)
        if c.final_softcap > 0:
            cap = np.float32(c.final_softcap)
            logits = np.tanh(logits / cap) * cap
        return logits[0] if want == "last" else logits


def read_token_list(s: str):
    parts = [p for p in re.split(r"[,\s]+", s.strip()) if p]
    return [int(p) for p in parts]


# --------------------------------------------------------------------------
# main
# --------------------------------------------------------------------------

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="NumPy reference forward pass for GGUF llama/qwen2/qwen3/gemma3/qwen35 models")
    ap.add_argument("model")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--tokens", help="comma/space separated token ids")
    src.add_argument("--tokens-file", help="file with comma/space/newline separated token ids")
    src.add_argument("--prompt", help="text, tokenized with a BPE built from the GGUF vocab (convenience)")
    ap.add_argument("-n", "--n-predict", type=int, default=0, help="number of tokens to generate greedily")
    ap.add_argument("--logits-out", help=".npy: float32 logits of last prompt position [n_vocab]")
    ap.add_argument("--all-logits-out", help=".npy: float32 logits of all prompt positions [n_prompt, n_vocab]")
    ap.add_argument("--gen-logits-out", help=".npy: float32 [N, n_vocab], row i selected generated token i")
    ap.add_argument("--mtp-logits-out", help=".npy: float32 [n_prompt - 1, n_vocab], qwen35's MTP head "
                    "(ref_qwen35.mtp_logits): row q from position q's state and token q + 1")
    ap.add_argument("--kv-type", default="f16", choices=["f16", "f32", "bf16", "q8_0"],
                    help="KV cache storage emulation (default f16)")
    ap.add_argument("--stop-at-eos", action="store_true", help="stop generation at tokenizer.ggml.eos_token_id")
    ap.add_argument("--add-bos", action="store_true", help="with --prompt: prepend BOS (default: GGUF add_bos_token)")
    ap.add_argument("--dump-json", help="write config / tokens / top logits as JSON to this file")
    ap.add_argument("--q-chunk", type=int, default=512, help="query rows per attention chunk (memory bound)")
    args = ap.parse_args(argv)

    t_start = time.time()
    model = Model(args.model)
    c = model.cfg
    log("[reference] loaded %s: arch=%s layers=%d d=%d ff=%d heads=%d/%d hd=%d rot=%d(%s) base=%g "
        "freq_scale=%g eps=%g vocab=%d tied=%s rope_freqs=%s (%.2fs)" % (
            args.model, c.arch, c.n_layer, c.n_embd, c.n_ff, c.n_head, c.n_head_kv, c.head_dim,
            c.n_rot, c.rope_mode, c.rope_base, c.freq_scale, c.eps, c.n_vocab, model.tied,
            model.rope_freqs is not None, model.load_s))
    if c.n_swa:
        log("[reference] sliding window %d, global layers %s, local rope base %g" % (
            c.n_swa, [il for il in range(c.n_layer) if not c.swa_layers[il]], c.rope_base_swa))

    tokenizer = None
    if args.prompt is not None:
        tokenizer = build_tokenizer(model.reader)
        tokens = tokenizer.encode(args.prompt, add_special_tokens=False).ids
        add_bos = args.add_bos or bool(field_value(model.reader, "tokenizer.ggml.add_bos_token", False))
        bos = field_value(model.reader, "tokenizer.ggml.bos_token_id")
        if add_bos and bos is not None:
            tokens = [int(bos)] + tokens
        log("[reference] prompt tokens: %s" % ",".join(map(str, tokens)))
    elif args.tokens is not None:
        tokens = read_token_list(args.tokens)
    else:
        with open(args.tokens_file) as f:
            tokens = read_token_list(f.read())
    if not tokens:
        raise SystemExit("reference.py: empty prompt")

    N = max(0, args.n_predict)
    runner = Runner(model, kv_type=args.kv_type, max_ctx=len(tokens) + N, q_chunk=max(1, args.q_chunk))
    if args.mtp_logits_out:
        runner.hidden = []
    t0 = time.time()
    if args.all_logits_out:
        all_logits = runner.forward(tokens, want="all")
        np.save(args.all_logits_out, all_logits.astype(np.float32))
        last = all_logits[-1].copy()
    else:
        last = runner.forward(tokens, want="last")
    t_prompt = time.time() - t0
    log("[reference] prompt: %d tokens in %.2fs (kv=%s)" % (len(tokens), t_prompt, args.kv_type))
    if args.mtp_logits_out:
        mrun = Runner(model, kv_type=args.kv_type, max_ctx=len(tokens), q_chunk=max(1, args.q_chunk))
        hidden = np.concatenate(runner.hidden, axis=0)[:len(tokens)]
        np.save(args.mtp_logits_out, ref_qwen35.mtp_logits(mrun, hidden, tokens))
    if args.logits_out:
        np.save(args.logits_out, last.astype(np.float32))

    eos = field_value(model.reader, "tokenizer.ggml.eos_token_id")
    gen, gen_logits = [], []
    logits = last
    t1 = time.time()
    for i in range(N):
        gen_logits.append(logits)
        nxt = int(np.argmax(logits))
        gen.append(nxt)
        if args.stop_at_eos and eos is not None and nxt == int(eos):
            break
        if i + 1 < N:
            logits = runner.forward([nxt], want="last")
    t_gen = time.time() - t1
    if N:
        log("[reference] generated %d tokens in %.2fs" % (len(gen), t_gen))
    if args.gen_logits_out:
        arr = np.stack(gen_logits).astype(np.float32) if gen_logits else np.zeros((0, c.n_vocab), np.float32)
        np.save(args.gen_logits_out, arr)

    if gen:
        try:
            if tokenizer is None:
                tokenizer = build_tokenizer(model.reader)
            log("[reference] text: %r" % tokenizer.decode(gen, skip_special_tokens=False))
        except Exception as e:  # convenience only
            log("[reference] (no detokenization: %s)" % e)

    if args.dump_json:
        top = np.argsort(-last, kind="stable")[:10]
        info = {
            "model": args.model, "config": model.describe(), "kv_type": args.kv_type,
            "prompt_tokens": [int(t) for t in tokens], "generated": gen,
            "last_logits_top10": [[int(i), float(last[i])] for i in top],
            "timing_s": {"load": model.load_s, "prompt": t_prompt, "generate": t_gen,
                         "total": time.time() - t_start},
        }
        with open(args.dump_json, "w") as f:
            json.dump(info, f, indent=1)

    print(",".join(str(t) for t in gen))
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
