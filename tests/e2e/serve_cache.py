#!/usr/bin/env python3
"""`kvstream serve`'s prompt cache on SmolLM2-135M: turn 2 of a conversation reads only what
turn 1 did not leave, up to its last matching token (usage.prompt_tokens_details.cached_tokens, and the
prompt-cache figures of /metrics), and its answer and log-probabilities (of the chosen tokens
and the 5 best, as the JSON carries them: float32 values printed in full) equal those of a
server without a cache; so do a prompt that turn 1 covers but for its last token and one that
leaves turn 1's tokens inside a page. The cache off (--cache-ram 0) reports no cached tokens.
Usage: serve_cache.py KVSTREAM MODEL"""
import sys

import openai

from serve_util import Server, chat_answer, check

BINARY, MODEL = sys.argv[1], sys.argv[2]
P = 16  # --page-size
SYSTEM = ("You answer questions about gardening. Keep answers short and practical, name the "
          "plants you mean, and say when something depends on the climate. ") * 4
TURNS = ["Which vegetables grow well in shade?", "And which of those can I sow in autumn?"]
N = 20


def answer(client, msgs):
    return chat_answer(client, msgs, N, 5)


def conversation(client):
    """Both turns' answers, the second asked with the first's answer in the history."""
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TURNS[0]}]
    first = answer(client, msgs)
    msgs += [{"role": "assistant", "content": first[0]}, {"role": "user", "content": TURNS[1]}]
    return first, answer(client, msgs)


def cached(usage):
    d = usage.prompt_tokens_details
    return d.cached_tokens if d is not None else None


def main():
    common = ("-np", "2", "-c", "4096", "--page-size", str(P), "-a", "m")
    cold_srv = Server(BINARY, MODEL, *common, "--cache-ram", "0")
    cold = openai.OpenAI(base_url=cold_srv.url + "/v1", api_key="none", max_retries=0)
    srv = Server(BINARY, MODEL, *common, "--cache-ram", "64")
    warm = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0)

    want1, want2 = conversation(cold)
    check(cached(want1[1]) == 0 and cached(want2[1]) == 0,
          "a server without a cache reports cached tokens: %r %r" % (want1[1], want2[1]))
    check("prompt_cache_hits_total" not in cold_srv.metrics(), "prompt-cache metrics without a cache")

    got1, got2 = conversation(warm)
    check(cached(got1[1]) == 0, "turn 1 on a fresh server: %r" % got1[1])
    check(got1 == want1, "turn 1 differs from the server without a cache")
    # Turn 1's prompt and answer are in the KV of its sequence (all but the last token sampled),
    # all in the cache; turn 2 begins with them where the answer tokenizes back alike.
    turn1 = got1[1].prompt_tokens + got1[1].completion_tokens - 1
    c2 = cached(got2[1])
    check(got1[1].prompt_tokens <= c2 <= turn1,
          "turn 2 reused %r tokens (turn 1: %d prompt + %d answer)" %
          (c2, got1[1].prompt_tokens, got1[1].completion_tokens))
    check(got2[0] == want2[0], "turn 2 with its cached prefix: %r, cold: %r" % (got2[0], want2[0]))
    check(got2[2] == want2[2], "turn 2's log-probabilities differ from a cold run's")
    m = srv.metrics()
    check(m["prompt_cache_hits_total"] == 1 and m["prompt_cache_tokens_total"] == c2,
          "metrics after turn 2: %r" % m)
    check(m["prompt_cache_bytes"] > 0 and m["prompt_cache_evictions_total"] == 0,
          "metrics after turn 2: %r" % m)

    # Completions: a prompt again (every token but its last cached),
    # and that prompt cut inside a page with other text after it.
    def text(client, prompt):
        r = client.completions.create(model="m", prompt=prompt, temperature=0, max_tokens=N,
                                      logprobs=5)
        c = r.choices[0]
        return c.text, c.logprobs.token_logprobs, c.logprobs.top_logprobs, r.usage

    base = SYSTEM + " " + TURNS[0]
    for prompt in (base, base[: len(base) * 2 // 3] + " Tomatoes need sun."):
        w = text(cold, prompt)
        text(warm, base)  # puts base's pages in the cache (again: a hit, the same pages)
        g = text(warm, prompt)
        check(g[:3] == w[:3], "completion of %r with a cached prefix differs" % prompt[-40:])
        check(cached(g[3]) > 0 and cached(g[3]) <= g[3].prompt_tokens - 1,
              "completion reused %r of %d tokens" % (cached(g[3]), g[3].prompt_tokens))

    cold.close()
    warm.close()
    cold_srv.stop()
    srv.stop()
    print("serve cache: ok (turn 2 reused %d of %d prompt tokens)" % (c2, got2[1].prompt_tokens))


if __name__ == "__main__":
    main()
