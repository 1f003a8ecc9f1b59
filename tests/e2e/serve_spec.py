#!/usr/bin/env python3
"""`kvstream serve --spec ngram` on SmolLM2-135M: greedy answers (completions with their
log-probabilities, float32 values printed in full, a chat, a stream) equal those of a server
without speculation token for token, while most drafts of a prompt that repeats itself are
accepted (timings.draft_n, draft_n_accepted as llama-server names them, and /metrics); the
prompt cache gives the same answer again from cached pages; requests with a temperature, two
at once, run to their length; a draft model (-md, SmolLM2 for itself) gives the same answers,
its drafts nearly all accepted, two requests at once.
Usage: serve_spec.py KVSTREAM MODEL"""
import sys
import threading

import openai

from serve_util import Server, check

BINARY, MODEL = sys.argv[1], sys.argv[2]
FOX = ("The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy "
       "dog. The quick brown fox")
N = 64


def completion(client, prompt, **kw):
    """(text, tokens, log-probabilities, the raw answer) of a greedy completion."""
    r = client.completions.create(model="m", prompt=prompt, temperature=0, max_tokens=N,
                                  logprobs=2, **kw)
    c = r.choices[0]
    return c.text, c.logprobs.tokens, c.logprobs.token_logprobs, c.logprobs.top_logprobs, r


def timings(r):
    return r.model_extra["timings"]


def main():
    common = ("-np", "2", "-c", "2048", "--page-size", "16", "-a", "m", "--cache-ram", "64")
    plain_srv = Server(BINARY, MODEL, *common)
    srv = Server(BINARY, MODEL, *common, "--spec", "ngram", "--draft-max", "8")
    plain = openai.OpenAI(base_url=plain_srv.url + "/v1", api_key="none", max_retries=0)
    spec = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0)
    check("spec_drafted_total" not in plain_srv.metrics(), "speculation metrics without --spec")

    want = completion(plain, FOX)
    got = completion(spec, FOX)
    check(got[:4] == want[:4], "speculative completion differs:\n%r\n%r" % (got[0], want[0]))
    t = timings(got[4])
    check("draft_n" not in timings(want[4]), "draft counts without --spec")
    check(t["draft_n"] > 0 and t["draft_n_accepted"] >= 0.6 * t["draft_n"],
          "the fox prompt's drafts: %r" % t)
    drafted, accepted = t["draft_n"], t["draft_n_accepted"]

    # Again: its pages come from the prompt cache, the rolled-back drafts never in them.
    again = completion(spec, FOX)
    check(again[:4] == want[:4], "the answer with cached pages differs")
    check(again[4].usage.prompt_tokens_details.cached_tokens > 0, "no pages were reused")
    drafted += timings(again[4])["draft_n"]
    accepted += timings(again[4])["draft_n_accepted"]
    # A longer prompt beginning with the first answer: its cached pages hold the first
    # request's tokens and accepted drafts, which must be those of plain decoding.
    longer = FOX + want[0] + " Then the dog"
    got = completion(spec, longer)
    check(got[:4] == completion(plain, longer)[:4], "the answer after a cached answer differs")
    check(got[4].usage.prompt_tokens_details.cached_tokens > 0, "no pages were reused")
    drafted += timings(got[4])["draft_n"]
    accepted += timings(got[4])["draft_n_accepted"]

    msgs = [{"role": "user", "content": "Repeat exactly: " + FOX}]
    chat = [c.chat.completions.create(model="m", messages=msgs, temperature=0, max_tokens=N)
            for c in (plain, spec)]
    check(chat[1].choices[0].message.content == chat[0].choices[0].message.content,
          "speculative chat answer differs")
    drafted += timings(chat[1])["draft_n"]
    accepted += timings(chat[1])["draft_n_accepted"]
    text = "".join(ch.choices[0].text for ch in
                   spec.completions.create(model="m", prompt=FOX, temperature=0, max_tokens=N,
                                           stream=True) if ch.choices)
    check(text == want[0], "the streamed answer differs: %r" % text)

    m = srv.metrics()
    check(m["spec_drafted_total"] >= drafted and m["spec_accepted_total"] >= accepted,
          "metrics %r, answers drafted %d, accepted %d" % (m, drafted, accepted))
    check(m["spec_accepted_total"] < m["spec_drafted_total"], "metrics %r" % m)

    # A temperature: two requests at once, each to its length or an end of generation.
    out = [None, None]

    def sample(i):
        r = spec.completions.create(model="m", prompt=FOX, temperature=0.8, seed=i,
                                    max_tokens=40, frequency_penalty=0.3 * i)
        out[i] = r

    threads = [threading.Thread(target=sample, args=(i,)) for i in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    for r in out:
        check(r is not None and r.choices[0].finish_reason in ("stop", "length"),
              "a sampled request: %r" % r)
        check(r.usage.completion_tokens <= 40 and (r.choices[0].finish_reason == "stop" or
                                                   r.usage.completion_tokens == 40),
              "a sampled request's length: %r" % r.usage)

    spec.close()
    srv.stop()

    # A draft model (SmolLM2 drafting for itself, -md alone turning it on): each slot's draft
    # sequence follows its requests; the answers are plain decoding's, nearly every draft accepted.
    draft_srv = Server(BINARY, MODEL, *common, "-md", MODEL, "--draft-p-min", "0.3")
    draft = openai.OpenAI(base_url=draft_srv.url + "/v1", api_key="none", max_retries=0)
    got = completion(draft, FOX)
    check(got[:4] == want[:4], "draft model completion differs:\n%r\n%r" % (got[0], want[0]))
    t = timings(got[4])
    check(t["draft_n"] > 0 and t["draft_n_accepted"] >= 0.9 * t["draft_n"],
          "the draft model's drafts: %r" % t)
    answers = [None, None]

    def ask(i):
        answers[i] = draft.chat.completions.create(model="m", messages=msgs, temperature=0,
                                                   max_tokens=N)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    for a in answers:
        check(a.choices[0].message.content == chat[0].choices[0].message.content,
              "draft model chat answer differs")
    m = draft_srv.metrics()
    check(m["spec_drafted_total"] > 0, "draft model metrics %r" % m)
    draft.close()
    draft_srv.stop()
    plain.close()
    plain_srv.stop()
    print("serve spec: ok (%d of %d drafts accepted)" % (accepted, drafted))


if __name__ == "__main__":
    main()
