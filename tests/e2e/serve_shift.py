#!/usr/bin/env python3
"""llama-server's --context-shift on `kvstream serve`: a greedy /completion of more tokens than
the context holds goes on past its end (truncated: true), each shift dropping n_discard tokens
after the first n_keep and reading the rest again; what follows the first shift equals the
greedy answer of a server without a shift (nor a prompt cache) asked the kept tokens as its
prompt, token for token. On SmolLM2 (full layers: the KV is cut back to n_keep) and on synthetic
models with window and recurrent layers (tiny-gemma3, tiny-qwen35: the sequence starts over from
the prompt cache). Without --context-shift the answer ends at the context's end, truncated.
Usage: serve_shift.py KVSTREAM MODEL"""
import sys

from serve_util import Server, check

BINARY, MODEL = sys.argv[1], sys.argv[2]
N_CTX = 160
PROMPT = "Once upon a time, in a small village by the sea, there lived an old fisherman who"


def completion(srv, body):
    st, _, b = srv.http("POST", "/completion", body)
    check(st == 200, "/completion -> %d %r" % (st, b))
    return b


def case(model, n_keep, n_discard):
    flags = ("-c", str(N_CTX), "-np", "1", "-b", "64")
    srv = Server(BINARY, model, *flags, "--context-shift", "-v")
    cold = Server(BINARY, model, *flags, "--cache-ram", "0")
    _, _, t = srv.http("POST", "/tokenize", {"content": PROMPT, "add_special": True})
    prompt = t["tokens"]
    _, _, t = srv.http("POST", "/tokenize", {"content": PROMPT, "add_special": False})
    bos = 1 if len(prompt) > len(t["tokens"]) else 0
    n = 2 * N_CTX
    body = {"prompt": prompt, "n_predict": n, "temperature": 0, "ignore_eos": True,
            "return_tokens": True}
    if n_keep is not None:
        body["n_keep"] = n_keep
    if n_discard:
        body["n_discard"] = n_discard
    got = completion(srv, body)
    gen = got["tokens"]
    check(got["tokens_predicted"] == n and len(gen) == n and got["truncated"] is True,
          "%s: %d tokens past a context of %d: %r" % (model, n, N_CTX,
                                                       {k: got[k] for k in ("tokens_predicted",
                                                                            "truncated")}))
    check("context shift" in srv.log(), "%s: no shift in the server's log" % model)
    # The first shift, as llama-server computes it: the token sampled with the context full
    # (position N_CTX) is read after the kept ones.
    k = N_CTX - len(prompt)
    held = prompt + gen[:k]
    keep = len(prompt) if n_keep == -1 else (n_keep or 0) + bos
    left = N_CTX - keep
    discard = min(max(n_discard or left // 2, 0), max(0, left - 1))
    kept = held[:keep] + held[keep + discard:] + [gen[k]]
    after = N_CTX - len(kept)  # tokens before the next shift
    want = completion(cold, {"prompt": kept, "n_predict": after, "temperature": 0,
                             "ignore_eos": True, "return_tokens": True})
    check(want["tokens"] == gen[k + 1:k + 1 + after],
          "%s: after the shift (keep %d, discard %d): %r, a cold run of the kept tokens: %r" %
          (model, keep, discard, gen[k + 1:k + 1 + after], want["tokens"]))
    # Without --context-shift the answer ends with the context, truncated.
    end = completion(cold, body)
    check(end["tokens"] == gen[:k + 1] and end["truncated"] is True and
          end["stop_type"] == "limit", "%s: without a shift: %d tokens, truncated %r" %
          (model, len(end["tokens"]), end["truncated"]))
    short = completion(srv, {"prompt": prompt, "n_predict": 4, "temperature": 0})
    check(short["truncated"] is False, "%s: a short answer says truncated" % model)
    srv.stop()
    cold.stop()


def main():
    case(MODEL, None, 0)
    case(MODEL, 4, 0)
    case(MODEL, -1, 20)
    case("synthetic:tiny-gemma3", -1, 0)
    case("synthetic:tiny-qwen35", 2, 0)
    print("ok")


if __name__ == "__main__":
    main()
