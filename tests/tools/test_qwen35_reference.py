#!/usr/bin/env python3
"""tools/reference.py's qwen35 (Gated DeltaNet + gated attention hybrids) on tiny random files:
the layer map as llama.cpp reads it (full_attention_interval, attention.recurrent_layers, the
MTP blocks counted in block_count), bad files refused by name, the first token's GDN output
against its closed form, a prompt fed token by token equal to the same prompt in one batch
(the conv tail and the delta-rule state carried between calls), and the synthetic preset
tiny-qwen35 written by `kvstream synth` (its path in argv[1], when given) loaded and run."""
import pathlib
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import reference  # noqa: E402  (sets the NumPy/OpenBLAS paths before NumPy loads)
import ref_qwen35  # noqa: E402
import numpy as np  # noqa: E402

E, H, HKV, D, F, V = 64, 2, 1, 32, 96, 300
S, HK, HV, KC = 16, 2, 4, 4  # GDN head size, key heads, value heads, conv taps


def check(cond, what):
    if not cond:
        sys.exit("FAIL: " + what)


def tiny_model(path, n_layer=4, interval=4, recurrent=None, nextn=0, drop=None, v_heads=HV):
    """A random qwen35 file of f32 tensors (the MTP blocks as llama.cpp names them)."""
    import gguf
    rng = np.random.default_rng(0)
    n_all = n_layer + nextn
    w = gguf.GGUFWriter(str(path), "qwen35")
    w.add_embedding_length(E)
    w.add_block_count(n_all)
    w.add_feed_forward_length(F)
    w.add_head_count(H)
    w.add_head_count_kv(HKV)
    w.add_key_length(D)
    w.add_value_length(D)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(1e7)
    w.add_rope_dimension_count(D // 4)
    w.add_rope_dimension_sections([1, 1, 2, 0])
    w.add_ssm_conv_kernel(KC)
    w.add_ssm_state_size(S)
    w.add_ssm_group_count(HK)
    w.add_ssm_time_step_rank(v_heads)
    w.add_ssm_inner_size(v_heads * S)
    if interval is not None:
        w.add_full_attention_interval(interval)
    if recurrent is not None:
        w.add_array("qwen35.attention.recurrent_layers", recurrent)
    if nextn:
        w.add_nextn_predict_layers(nextn)
    kinds = recurrent if recurrent is not None else [
        i < n_layer and (i + 1) % (interval or 4) != 0 for i in range(n_all)]

    def t(*shape, one=0.0, scale=0.2):
        return (one + rng.standard_normal(shape) * scale).astype(np.float32)

    def add(name, arr):
        if name != drop:
            w.add_tensor(name, arr)

    add("token_embd.weight", t(V, E))
    add("output_norm.weight", t(E, one=1))
    add("output.weight", t(V, E))
    kd, vd = HK * S, v_heads * S
    for i in range(n_all):
        b = "blk.%d." % i
        for n in ("attn_norm", "post_attention_norm"):
            add(b + n + ".weight", t(E, one=1))
        add(b + "ffn_gate.weight", t(F, E))
        add(b + "ffn_up.weight", t(F, E))
        add(b + "ffn_down.weight", t(E, F))
        if kinds[i]:
            add(b + "attn_qkv.weight", t(2 * kd + vd, E))
            add(b + "attn_gate.weight", t(vd, E))
            add(b + "ssm_conv1d.weight", t(2 * kd + vd, KC, scale=0.5))
            add(b + "ssm_dt.bias", t(v_heads))
            add(b + "ssm_a", -np.exp(t(v_heads)))
            add(b + "ssm_beta.weight", t(v_heads, E))
            add(b + "ssm_alpha.weight", t(v_heads, E))
            add(b + "ssm_norm.weight", t(S, one=1))
            add(b + "ssm_out.weight", t(E, vd))
        else:
            add(b + "attn_q.weight", t(2 * H * D, E))
            add(b + "attn_k.weight", t(HKV * D, E))
            add(b + "attn_v.weight", t(HKV * D, E))
            add(b + "attn_output.weight", t(E, H * D))
            add(b + "attn_q_norm.weight", t(D, one=1))
            add(b + "attn_k_norm.weight", t(D, one=1))
        if i >= n_layer:
            add(b + "nextn.eh_proj.weight", t(E, 2 * E))
            add(b + "nextn.enorm.weight", t(E, one=1))
            add(b + "nextn.hnorm.weight", t(E, one=1))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def refused(path, what):
    try:
        reference.Model(str(path))
    except ValueError as e:
        check(what in str(e), "refusal names %r: %s" % (what, e))
        return
    sys.exit("FAIL: %s accepted" % path.name)


def check_layer_map(tmp):
    m = reference.Model(str(tiny_model(tmp / "i4.gguf", n_layer=8)))
    check(m.cfg.recurrent == [True] * 3 + [False] + [True] * 3 + [False], "interval 4: %s" % m.cfg.recurrent)
    m = reference.Model(str(tiny_model(tmp / "i2.gguf", n_layer=4, interval=2)))
    check(m.cfg.recurrent == [True, False] * 2, "interval 2")
    kinds = [False, True, True, False, True]
    m = reference.Model(str(tiny_model(tmp / "rl.gguf", n_layer=4, recurrent=kinds, nextn=1)))
    check(m.cfg.recurrent == kinds[:4] and m.cfg.n_layer == 4 and m.cfg.n_nextn == 1, "recurrent_layers + MTP")
    m = reference.Model(str(tiny_model(tmp / "mtp.gguf", n_layer=4, nextn=1)))
    check(m.cfg.n_layer == 4 and len(m.layers) == 4 and "blk.4.nextn.eh_proj.weight" in m.w, "MTP block loaded")
    # the sections [1, 1, 2, 0] over n_rot / 2 = 4 pairs: sectors 0 (t), 1 (h), 2 (w), 3 (e: 3 < 3 * 1 fails)
    check(m.cfg.rope_pair_at_pos == [True, True, True, False], "rope pairs %s" % m.cfg.rope_pair_at_pos)
    refused(tiny_model(tmp / "i3.gguf", n_layer=4, interval=3), "full_attention_interval")
    refused(tiny_model(tmp / "miss.gguf", drop="blk.1.ssm_conv1d.weight"), "blk.1.ssm_conv1d.weight")
    refused(tiny_model(tmp / "heads.gguf", v_heads=3), "ssm sizes")


def check_first_token(tmp):
    """At the first token the state is zero: o = beta v (k . q) per value head, with value
    head h reading key head h % HK."""
    m = reference.Model(str(tiny_model(tmp / "one.gguf", n_layer=4)))
    run = reference.Runner(m, kv_type="f32")
    c, L = m.cfg, m.layers[0]
    h = np.random.default_rng(2).standard_normal((1, E)).astype(np.float32)
    got = ref_qwen35.gated_delta_net(run, 0, L, h)
    kd = HK * S
    mixed = (h @ L["attn_qkv"].T)[0]
    conv = reference.silu(mixed * L["ssm_conv1d"][:, KC - 1])  # only the last tap sees data
    q = conv[:kd].reshape(HK, S)
    k = conv[kd:2 * kd].reshape(HK, S)
    q = q / np.linalg.norm(q, axis=1, keepdims=True) / np.sqrt(S)
    k = k / np.linalg.norm(k, axis=1, keepdims=True)
    v = conv[2 * kd:].reshape(HV, S)
    beta = 1 / (1 + np.exp(-(h @ L["ssm_beta"].T)[0]))
    o = np.stack([beta[j] * v[j] * float(k[j % HK] @ q[j % HK]) for j in range(HV)])
    z = (h @ L["attn_gate"].T)[0].reshape(HV, S)
    o = o / np.sqrt(np.mean(o * o, axis=1, keepdims=True) + c.eps) * L["ssm_norm"] * reference.silu(z)
    want = o.reshape(1, HV * S) @ L["ssm_out"].T
    check(np.abs(got - want).max() < 1e-5 * max(1.0, np.abs(want).max()), "first token's GDN output")


def check_steps(path, n_tok=40, tol=1e-4):
    m = reference.Model(str(path))
    toks = [int(t) for t in np.random.default_rng(1).integers(0, m.cfg.n_vocab, n_tok)]
    batch = reference.Runner(m, kv_type="f32").forward(toks, want="all")
    check(np.isfinite(batch).all(), "finite logits")
    run = reference.Runner(m, kv_type="f32")
    steps = np.stack([run.forward([t]) for t in toks])
    err = np.abs(steps - batch).max() / np.abs(batch).max()
    check(err < tol, "token by token as in one batch: relative error %.2e" % err)
    run = reference.Runner(m, kv_type="f32")
    half = np.concatenate([run.forward(toks[:n_tok // 2], want="all"), run.forward(toks[n_tok // 2:], want="all")])
    check(np.abs(half - batch).max() / np.abs(batch).max() < tol, "two batches as one")
    return m


def main():
    with tempfile.TemporaryDirectory() as d:
        tmp = pathlib.Path(d)
        check_layer_map(tmp)
        check_first_token(tmp)
        check_steps(tiny_model(tmp / "steps.gguf", n_layer=8))
        print("tiny random files: layer map, refusals, first token, steps OK")
        if len(sys.argv) > 1:
            path = tmp / "tiny-qwen35.gguf"
            subprocess.run([sys.argv[1], "synth", "tiny-qwen35:f32", "-o", str(path)], check=True)
            m = check_steps(path, n_tok=24)
            c = m.cfg
            shape = (c.arch, c.n_layer, c.ssm_k_heads, c.ssm_v_heads, c.ssm_state, c.ssm_conv, c.n_rot)
            print("tiny-qwen35 %s: steps OK" % (shape,))
    print("OK")


if __name__ == "__main__":
    main()
