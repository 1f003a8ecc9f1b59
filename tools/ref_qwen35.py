"""Qwen3.5 in reference.py: the dense Qwen3.5/3.6 hybrids of Gated DeltaNet and gated attention
layers (``qwen35``; checked against llama.cpp src/models/qwen35.cpp
``load_arch_hparams`` / ``load_arch_tensors`` / ``graph`` /
``build_layer_attn`` / ``build_layer_attn_linear`` / ``build_norm_gated``,
src/models/delta-net-base.cpp ``build_delta_net_autoregressive`` (the
recurrence; ``build_delta_net_chunking`` is the same sum reordered),
src/llama-graph.cpp ``llm_graph_input_pos::set_input`` (text positions),
ggml-cpu ops.cpp ``ggml_mrope_cache_init`` / ``l2_norm`` / ``ssm_conv``, and
the converter's ``Qwen3NextModel`` / ``_LinearAttentionVReorderBase`` /
``_Qwen35MtpMixin`` (conversion/qwen.py)):
* Layers: ``qwen35.block_count`` counts the ``nextn_predict_layers`` MTP
  blocks appended after the trunk; the trunk is the first block_count -
  nextn layers; the MTP blocks (``blk.N.nextn.*`` and a full attention block)
  are not run by the trunk (``mtp_logits`` runs the first, below).  A trunk layer is recurrent (Gated DeltaNet)
  per ``qwen35.attention.recurrent_layers`` (one bool per block), else per
  ``qwen35.full_attention_interval`` n (default 4): recurrent iff
  (il + 1) % n != 0, so layers 3, 7, 11, ... are full attention.
* Every norm is RMSNorm with the GGUF weight as is (the converter stored
  HF's (1 + w) for every norm except the GDN output norm ``ssm_norm``).
* A layer: h = attn_norm(x); mixer (below); x += mixer; h =
  ``post_attention_norm``(x) (the FFN's pre-norm; there is no ffn_norm);
  x += down(silu(gate(h)) * up(h)).  Final output_norm, ``output.weight``
  (or the tied embedding).
* Gated attention: ``attn_q`` gives 2 * head_dim per head, per head
  [q (head_dim), gate (head_dim)]; per-head RMSNorm ``attn_q_norm`` of q and
  ``attn_k_norm`` of k; rope; causal attention scaled 1/sqrt(head_dim);
  the heads' output times sigmoid(gate); ``attn_output``.
* Rope: llama.cpp's IMROPE (interleaved multi-section, NEOX pairs
  (x[i], x[i + n_rot/2])) over the first n_rot = ``rope.dimension_count``
  dims (head_dim * partial_rotary_factor), base ``rope.freq_base``; pair i
  takes the position of axis t/h/w/e by sector s = i % sum(sections):
  h if s % 3 == 1 and s < 3 sections[1], w if s % 3 == 2 and s < 3
  sections[2], t if s % 3 == 0 and s < 3 sections[0], else e.  Text tokens
  have positions (p, p, p, 0), so with ``rope.dimension_sections``
  [11, 11, 10, 0] and n_rot 64 every pair is at p: plain NEOX rope.  A pair
  on axis e would rotate by position 0 (not at all); implemented as such.
* Gated DeltaNet, with Hk = ``ssm.group_count`` key heads, Hv =
  ``ssm.time_step_rank`` value heads, S = ``ssm.state_size`` (= head size of
  both; ``ssm.inner_size`` = Hv * S), K = ``ssm.conv_kernel``:
  mixed = ``attn_qkv`` h ([q (Hk S), k (Hk S), v (Hv S)]), z = ``attn_gate`` h,
  beta = sigmoid(``ssm_beta`` h), g = softplus(``ssm_alpha`` h +
  ``ssm_dt.bias``) * ``ssm_a`` (the converter stored -exp(A_log)).
  Causal depthwise conv over the last K rows of [conv state (K - 1 rows);
  mixed]: out[t, c] = sum_j in[t + j, c] * ``ssm_conv1d``[c, j]; the last
  K - 1 rows are the next conv state; silu.  q, k L2-normalized per head as
  transformers' l2norm: x / sqrt(||x||^2 + eps) (eps = the rms eps); q *= 1/sqrt(S).
  Value head h reads key head h % Hk (the converter reorders HF's grouped
  value heads to this tiled order).  Per token and value head, with the
  state M [S (v) x S (k)]: M *= exp(g); M += beta (v - M k) k^T; o = M q.
  Then RMSNorm(o, ``ssm_norm``) * silu(z) per head, ``ssm_out``.
  The conv state and M start at zero per sequence; both in f32.
* The MTP head (block N = the first after the trunk; as vLLM's
  ``Qwen3NextMultiTokenPredictor``, DeepSeek-V3's MTP module): entry q pairs
  the trunk's final state at q, h_q = output_norm(x_q) (what the LM head
  reads), with the next token t_{q+1}: e = ``nextn.enorm``(embed(t_{q+1})),
  h = ``nextn.hnorm``(h_q), x = ``nextn.eh_proj`` [e; h] (embedding half
  first; eh_proj is (n_embd, 2 n_embd)), then the block as a gated attention
  layer at position q over the entries before it (its own cache) and its FFN;
  logits of t_{q+2} = head(``nextn.shared_head_norm``(x)).  embed and head
  are ``nextn.embed_tokens`` / ``nextn.shared_head_head`` where the file has
  them, else the trunk's; without shared_head_norm, the output norm.
"""

from __future__ import annotations

import math

from ref_common import np, rms_norm, sigmoid, silu, softplus, l2_norm


def read_config(c, opt, req) -> None:
    """The layer map, the GDN sizes and the rope sections into the config c (see the module
    docstring); opt and req read the architecture's keys."""
    n_all = c.n_layer
    c.n_nextn = int(opt("nextn_predict_layers", 0) or 0)
    if not 0 <= c.n_nextn < n_all:
        raise ValueError("qwen35.nextn_predict_layers %d for %d blocks" % (c.n_nextn, n_all))
    c.n_layer = n_all - c.n_nextn
    recr = opt("attention.recurrent_layers", None)
    if isinstance(recr, (list, tuple)):
        if len(recr) != n_all:
            raise ValueError("qwen35.attention.recurrent_layers has %d entries for %d blocks" % (len(recr), n_all))
        c.recurrent = [bool(b) for b in recr[:c.n_layer]]
    else:
        n = int(opt("full_attention_interval", 4))
        if n <= 0 or c.n_layer % n:
            raise ValueError("qwen35.full_attention_interval %d does not divide %d layers" % (n, c.n_layer))
        c.recurrent = [(il + 1) % n != 0 for il in range(c.n_layer)]
    c.ssm_conv = int(req("ssm.conv_kernel"))
    c.ssm_state = int(req("ssm.state_size"))
    c.ssm_k_heads = int(req("ssm.group_count"))
    c.ssm_v_heads = int(req("ssm.time_step_rank"))
    inner = int(req("ssm.inner_size"))
    if (c.ssm_conv < 2 or c.ssm_state <= 0 or c.ssm_k_heads <= 0 or c.ssm_v_heads % c.ssm_k_heads
            or inner != c.ssm_v_heads * c.ssm_state):
        raise ValueError("qwen35 ssm sizes: conv %d, state %d, %d key heads, %d value heads, inner %d"
                         % (c.ssm_conv, c.ssm_state, c.ssm_k_heads, c.ssm_v_heads, inner))
    sections = [int(x) for x in req("rope.dimension_sections")][:4]
    sections += [0] * (4 - len(sections))
    c.rope_sections = sections
    # which pairs rotate by the token's position (axes t, h, w) and which by 0 (axis e)
    total = sum(sections)
    if total <= 0:
        raise ValueError("qwen35.rope.dimension_sections %s" % sections)
    at_p = []
    for i in range(c.n_rot // 2):
        sec = i % total
        at_p.append((sec % 3 == 1 and sec < 3 * sections[1]) or (sec % 3 == 2 and sec < 3 * sections[2])
                    or (sec % 3 == 0 and sec < 3 * sections[0]))
    c.rope_pair_at_pos = at_p


def layer_tensors(c, w: dict, il: int) -> dict:
    """One trunk layer's tensors out of the dequantized w, shape-checked: a GDN or a gated
    attention layer."""
    p = "blk.%d." % il
    E, S = c.n_embd, c.ssm_state
    key_dim, value_dim = c.ssm_k_heads * S, c.ssm_v_heads * S
    hd, nh, nkv = c.head_dim, c.n_head, c.n_head_kv
    exp = {"attn_norm.weight": (E,), "post_attention_norm.weight": (E,), "ffn_gate.weight": (c.n_ff, E),
           "ffn_up.weight": (c.n_ff, E), "ffn_down.weight": (E, c.n_ff)}
    if c.recurrent[il]:
        exp.update({"attn_qkv.weight": (2 * key_dim + value_dim, E), "attn_gate.weight": (value_dim, E),
                    "ssm_conv1d.weight": (2 * key_dim + value_dim, c.ssm_conv), "ssm_dt.bias": (c.ssm_v_heads,),
                    "ssm_a": (c.ssm_v_heads,), "ssm_beta.weight": (c.ssm_v_heads, E),
                    "ssm_alpha.weight": (c.ssm_v_heads, E), "ssm_norm.weight": (S,),
                    "ssm_out.weight": (E, value_dim)})
    else:
        exp.update({"attn_q.weight": (2 * nh * hd, E), "attn_k.weight": (nkv * hd, E),
                    "attn_v.weight": (nkv * hd, E), "attn_output.weight": (E, nh * hd),
                    "attn_q_norm.weight": (hd,), "attn_k_norm.weight": (hd,)})
    L = {}
    for k, shape in exp.items():
        if p + k not in w:
            raise ValueError("missing tensor %s%s" % (p, k))
        t = w[p + k]
        if t.shape != shape:
            raise ValueError("%s%s has shape %s, expected %s" % (p, k, t.shape, shape))
        L[k.replace(".weight", "").replace(".bias", "")] = t
    return L


def block(run, il: int, L: dict, x, p0: int, cs, scale) -> np.ndarray:
    """One trunk layer (or the MTP block, il = n_layer) on x (T, n_embd) with the Runner
    run's caches: mixer, post_attention_norm, FFN."""
    c = run.m.cfg
    h = rms_norm(x, L["attn_norm"], c.eps)
    if il < c.n_layer and c.recurrent[il]:
        o = gated_delta_net(run, il, L, h)
    else:
        o = gated_attention(run, il, L, h, p0, cs, scale)
    x = x + o
    h = rms_norm(x, L["post_attention_norm"], c.eps)
    return x + (silu(h @ L["ffn_gate"].T) * (h @ L["ffn_up"].T)) @ L["ffn_down"].T


def gated_attention(run, il: int, L: dict, h, p0: int, cs, scale) -> np.ndarray:
    """The gated attention mixer on h (T, n_embd) at positions p0.. over layer il's cache."""
    c = run.m.cfg
    T, nh, nkv, hd = h.shape[0], c.n_head, c.n_head_kv, c.head_dim
    qg = (h @ L["attn_q"].T).reshape(T, nh, 2, hd)
    q = qg[:, :, 0].transpose(1, 0, 2)                              # (nh, T, hd)
    gate = qg[:, :, 1].reshape(T, nh * hd)
    k = (h @ L["attn_k"].T).reshape(T, nkv, hd).transpose(1, 0, 2)  # (nkv, T, hd)
    v = (h @ L["attn_v"].T).reshape(T, nkv, hd).transpose(1, 0, 2)
    q = run.rope(rms_norm(q, L["attn_q_norm"], c.eps), *cs)
    k = run.rope(rms_norm(k, L["attn_k_norm"], c.eps), *cs)
    o = run.attend(il, q, k, v, p0, False, scale) * sigmoid(gate)
    return o @ L["attn_output"].T


def mtp_logits(run, hidden, tokens) -> np.ndarray:
    """The MTP head's logits of entries 0 .. T-2 (see the module docstring) from the trunk's
    last-layer rows hidden (T, n_embd), before the output norm, and the T tokens they read;
    run: a fresh Runner of the model, whose cache of layer n_layer the block takes.  Returns
    (T - 1, n_vocab): row q predicts t_{q+2}."""
    m, c = run.m, run.m.cfg
    if c.n_nextn < 1:
        raise ValueError("the model has no MTP block (qwen35.nextn_predict_layers is 0)")
    il, w = c.n_layer, m.w
    p = "blk.%d." % il
    L = {k[len(p):].replace(".weight", ""): t for k, t in w.items() if k.startswith(p)}
    E = c.n_embd
    for k, shape in {"attn_norm": (E,), "attn_q": (2 * c.n_head * c.head_dim, E),
                     "attn_k": (c.n_head_kv * c.head_dim, E), "attn_output": (E, c.n_head * c.head_dim),
                     "post_attention_norm": (E,), "ffn_down": (E, c.n_ff),
                     "nextn.eh_proj": (E, 2 * E), "nextn.enorm": (E,), "nextn.hnorm": (E,)}.items():
        if k not in L or L[k].shape != shape:
            raise ValueError("MTP tensor %s%s missing or not %s" % (p, k, shape))
    embed = L.get("nextn.embed_tokens", w["token_embd.weight"])
    head = L.get("nextn.shared_head_head", m.out_w)
    norm = L.get("nextn.shared_head_norm", w["output_norm.weight"])
    T = len(tokens) - 1
    toks = np.asarray(tokens[1:], dtype=np.int64)
    h = rms_norm(rms_norm(np.asarray(hidden[:T], np.float32), w["output_norm.weight"], c.eps),
                 L["nextn.hnorm"], c.eps)
    e = rms_norm(embed[toks], L["nextn.enorm"], c.eps)
    x = np.concatenate([e, h], axis=1) @ L["nextn.eh_proj"].T
    run.k.append(np.zeros((c.n_head_kv, max(run.cap, T), c.head_dim), np.float32))
    run.v.append(np.zeros((c.n_head_kv, max(run.cap, T), c.head_dim_v), np.float32))
    ang = (np.arange(T, dtype=np.float64)[:, None] * run.pair_at_pos[None, :]) * run.inv_freq[None, :]
    cs = (np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32))
    x = block(run, il, L, x, 0, cs, np.float32(1.0 / math.sqrt(c.head_dim)))
    return (rms_norm(x, norm, c.eps) @ head.T).astype(np.float32)


def gated_delta_net(run, il: int, L: dict, h) -> np.ndarray:
    """The Gated DeltaNet mixer on h (T, n_embd), token by token; advances layer il's
    conv tail and state in the Runner run.  Returns (T, n_embd)."""
    c = run.m.cfg
    T, S, K = h.shape[0], c.ssm_state, c.ssm_conv
    Hk, Hv = c.ssm_k_heads, c.ssm_v_heads
    key_dim = Hk * S
    mixed = h @ L["attn_qkv"].T                                  # (T, conv_dim)
    z = (h @ L["attn_gate"].T).reshape(T, Hv, S)
    beta = sigmoid(h @ L["ssm_beta"].T)                          # (T, Hv)
    g = softplus(h @ L["ssm_alpha"].T + L["ssm_dt"]) * L["ssm_a"]  # (T, Hv), <= 0
    # causal depthwise conv over [tail; mixed], the kernel's last tap on the current row
    buf = np.concatenate([run.conv_state[il], mixed], axis=0)   # (K - 1 + T, conv_dim)
    w = L["ssm_conv1d"]                                          # (conv_dim, K)
    conv = np.zeros_like(mixed)
    for j in range(K):
        conv += buf[j:j + T] * w[:, j]
    run.conv_state[il] = buf[T:].copy()
    conv = silu(conv)
    q = l2_norm(conv[:, :key_dim].reshape(T, Hk, S), c.eps) * np.float32(1.0 / math.sqrt(S))
    k = l2_norm(conv[:, key_dim:2 * key_dim].reshape(T, Hk, S), c.eps)
    v = conv[:, 2 * key_dim:].reshape(T, Hv, S)
    kh = np.arange(Hv) % Hk                                      # value head -> key head
    q, k = q[:, kh], k[:, kh]                                    # (T, Hv, S)
    M = run.ssm_state[il]                                       # (Hv, S_v, S_k)
    o = np.empty((T, Hv, S), np.float32)
    for t in range(T):
        M *= np.exp(g[t])[:, None, None]
        d = (v[t] - np.einsum("hvk,hk->hv", M, k[t])) * beta[t][:, None]
        M += d[:, :, None] * k[t][:, None, :]
        o[t] = np.einsum("hvk,hk->hv", M, q[t])
    o = rms_norm(o, L["ssm_norm"], c.eps) * silu(z)
    return o.reshape(T, Hv * S) @ L["ssm_out"].T
