#!/usr/bin/env python3
"""tools/reference.py's gemma3 on a tiny random file (the layer pattern keys, the window's
edge) and on Gemma 3 270M (models/gemma-3-270m-q4_k_m.gguf, scripts/fetch-model.sh):
the model's shape and layer kinds as read from the file, the SentencePiece tokenizer on a
sentence, and the greedy continuations and top logits of a short prompt and of one of 1,814
tokens (3.5 sliding windows) whose answer, a word from its first sentence, only the global
layers can still see. The expected values are the reference's own, established once, judged
by reading the text they decode to and found equal to llama.cpp's tokens and greedy text for
the same prompts; they pin the reference so that a change to it shows, and the C++ engine is
compared against the reference elsewhere."""
import os
import pathlib
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import reference  # noqa: E402  (sets the NumPy/OpenBLAS paths before NumPy loads)
import numpy as np  # noqa: E402

MODEL = pathlib.Path(os.environ.get("KVS_GEMMA3_MODEL", ROOT / "models/gemma-3-270m-q4_k_m.gguf"))

SHORT = "The capital of France is"
SHORT_IDS = [2, 818, 5279, 529, 7001, 563]
SHORT_GREEDY = [506, 5279, 529, 506, 2891, 529, 7001, 236761]  # " the capital of the country of France."
SHORT_TOP = [(506, 19.09), (496, 18.55), (9079, 18.27)]    # " the", " a", " Paris"

LONG = ('The secret word is "banana". Remember it. Now count: '
        + ", ".join(str(i) for i in range(1, 381)) + '. Done counting. The secret word was "')
LONG_LEN = 1814
LONG_GREEDY = [50044, 3056, 108, 818]  # 'banana".\n\nThe'
LONG_TOP = [(50044, 17.948), (139242, 14.597)]  # "banana", "Banana"


def check(cond, what):
    if not cond:
        sys.exit("FAIL: " + what)


def greedy(model, ids, n):
    run = reference.Runner(model, max_ctx=len(ids) + n)
    logits = run.forward(ids)
    first, out = logits, []
    for i in range(n):
        out.append(int(np.argmax(logits)))
        if i + 1 < n:
            logits = run.forward([out[-1]])
    return first, out


def check_top(logits, expected, tol, what):
    top = np.argsort(-logits, kind="stable")[:len(expected)]
    got = [(int(t), round(float(logits[t]), 3)) for t in top]
    check([t for t, _ in got] == [t for t, _ in expected], "%s top tokens %s, expected %s" % (what, got, expected))
    for (t, v), (_, e) in zip(got, expected):
        check(abs(v - e) <= tol, "%s logit of %d is %.4f, expected %.4f" % (what, t, v, e))


def tiny_model(path, window, pattern, n_layer=4):
    """A random gemma3 file of f32 tensors: 64 wide, 2 heads and 1 kv head of 32."""
    import gguf
    rng = np.random.default_rng(0)
    E, H, D, F, V = 64, 2, 32, 96, 300
    w = gguf.GGUFWriter(str(path), "gemma3")
    w.add_embedding_length(E)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(F)
    w.add_head_count(H)
    w.add_head_count_kv(1)
    w.add_key_length(D)
    w.add_value_length(D)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(1e6)
    w.add_sliding_window(window)
    if pattern is not None:
        w.add_sliding_window_pattern(pattern)

    def t(*shape, one=0.0):
        return (one + rng.standard_normal(shape) * 0.2).astype(np.float32)

    w.add_tensor("token_embd.weight", t(V, E))
    w.add_tensor("output_norm.weight", t(E, one=1))
    for i in range(n_layer):
        for n, shape in (("attn_q", (H * D, E)), ("attn_k", (D, E)), ("attn_v", (D, E)),
                         ("attn_output", (E, H * D)), ("ffn_gate", (F, E)), ("ffn_up", (F, E)),
                         ("ffn_down", (E, F))):
            w.add_tensor("blk.%d.%s.weight" % (i, n), t(*shape))
        for n, size in (("attn_norm", E), ("ffn_norm", E), ("post_attention_norm", E),
                        ("post_ffw_norm", E), ("attn_q_norm", D), ("attn_k_norm", D)):
            w.add_tensor("blk.%d.%s.weight" % (i, n), t(size, one=1))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def check_window(tmp):
    """The layer pattern as the file gives it, and the window's edge: with W = 8 a query at
    position 7 still sees all keys (0..7) and one at 8 no longer sees key 0."""
    tiny_model(tmp / "p6.gguf", 8, None, n_layer=7)
    check(reference.Model(str(tmp / "p6.gguf")).cfg.swa_layers == [True] * 5 + [False, True],
          "default pattern")
    tiny_model(tmp / "p3.gguf", 8, 3, n_layer=6)
    check(reference.Model(str(tmp / "p3.gguf")).cfg.swa_layers == [True, True, False] * 2,
          "integer pattern")
    tiny_model(tmp / "pa.gguf", 8, [True, False, True, True])
    m = reference.Model(str(tmp / "pa.gguf"))
    check(m.cfg.swa_layers == [True, False, True, True], "array pattern")
    toks = [int(t) for t in np.random.default_rng(1).integers(0, 300, 24)]

    def logits(window, kinds, same_base):
        m.cfg.n_swa, m.cfg.swa_layers = window, kinds
        run = reference.Runner(m, kv_type="f32")
        if same_base:
            run.inv_freq_swa = run.inv_freq
        return run.forward(toks, want="all")

    glob = logits(8, [False] * 4, True)
    win = logits(8, [True, False, True, True], True)
    check(np.array_equal(win[:8], glob[:8]), "positions 0..7 inside the window")
    check(np.abs(win[8] - glob[8]).max() > 1e-3, "position 8 past the window")
    check(np.array_equal(logits(24, [True, False, True, True], True), glob), "a window of the context")
    check(np.abs(logits(24, [True, False, True, True], False) - glob).max() > 1e-3, "local rope base")
    m.cfg.n_swa, m.cfg.swa_layers = 8, [True, False, True, True]
    run = reference.Runner(m, kv_type="f32")
    run.inv_freq_swa = run.inv_freq
    steps = np.stack([run.forward([t]) for t in toks])
    check(np.abs(steps - win).max() < 1e-4, "token by token as in one batch")


def main():
    with tempfile.TemporaryDirectory() as d:
        check_window(pathlib.Path(d))
    print("tiny model: pattern and window edge OK")
    check(MODEL.is_file(), "%s is missing: run scripts/fetch-model.sh gemma3-270m" % MODEL)
    t0 = time.time()
    model = reference.Model(str(MODEL))
    c = model.cfg
    shape = (c.arch, c.n_layer, c.n_embd, c.n_ff, c.n_head, c.n_head_kv, c.head_dim, c.n_vocab)
    check(shape == ("gemma3", 18, 640, 2048, 4, 1, 256, 262144), "shape %s" % (shape,))
    check(c.n_swa == 512, "sliding window %d" % c.n_swa)
    glob = [il for il in range(c.n_layer) if not c.swa_layers[il]]
    check(glob == [5, 11, 17], "global layers %s" % glob)
    check((c.rope_base, c.rope_base_swa) == (1e6, 1e4), "rope bases %g/%g" % (c.rope_base, c.rope_base_swa))
    check(c.q_scale == 1 / 16 and c.final_softcap == 0.0, "q scale / soft-cap")
    tok = reference.build_tokenizer(model.reader)
    ids = [2] + tok.encode(SHORT).ids
    check(ids == SHORT_IDS, "tokens of %r: %s" % (SHORT, ids))
    check(tok.encode("a\n\nb  c").ids == [236746, 108, 236763, 138, 236755], "user-defined pieces")
    check(tok.encode("<start_of_turn>user\n").ids == [105, 2364, 107], "control pieces")
    print("loaded in %.1f s" % (time.time() - t0))

    logits, out = greedy(model, SHORT_IDS, len(SHORT_GREEDY))
    print("%r -> %r" % (SHORT, tok.decode(out)))
    check(out == SHORT_GREEDY, "short greedy %s, expected %s" % (out, SHORT_GREEDY))
    check_top(logits, SHORT_TOP, 0.02, "short")

    t1 = time.time()
    ids = [2] + tok.encode(LONG).ids
    check(len(ids) == LONG_LEN and len(ids) > 3 * c.n_swa, "long prompt has %d tokens" % len(ids))
    logits, out = greedy(model, ids, len(LONG_GREEDY))
    print("%d-token prompt -> %r in %.1f s" % (len(ids), tok.decode(out), time.time() - t1))
    check(out == LONG_GREEDY, "long greedy %s, expected %s" % (out, LONG_GREEDY))
    check_top(logits, LONG_TOP, 0.02, "long")
    print("OK")


if __name__ == "__main__":
    main()
