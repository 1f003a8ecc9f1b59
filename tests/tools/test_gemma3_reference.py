#!/usr/bin/env python3
"""tools/reference.py on Gemma 3 270M (models/gemma-3-270m-q4_k_m.gguf, scripts/fetch-model.sh):
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


def main():
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
    check(c.q_scale == np.float32(1 / 16) and c.final_softcap == 0.0, "q scale / soft-cap")
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
