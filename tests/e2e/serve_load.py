#!/usr/bin/env python3
"""`kvstream serve` under concurrent clients on SmolLM2-135M, -np 4, a KV arena small enough
that pages stream, -b 64 so that long prompts are read in chunks between the others' decode
steps, and the prompt cache on: 8 clients send 200 requests (chats and completions of random
lengths, a third of them after a shared long prefix that the cache serves, some streamed),
hang up on some midway and send malformed ones meanwhile. Every greedy answer completed under
load equals the same request served alone by a server of one slot without a prompt cache
(the same page size: pages split the attention's sums, and the CPU's int8 products can turn
that rounding into another token);
hang-ups cancel their generation and free its slot; malformed requests get 400; /metrics
counts agree with what the clients saw, nothing is lost. Then, with one slot and no queue, a
second request gets 503 with Retry-After, and a cancelled stream gives its slot to the next.
Usage: serve_load.py KVSTREAM MODEL"""
import random
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import openai

from serve_util import Server, check

BINARY, MODEL = sys.argv[1], sys.argv[2]
WORDS = ("apple river stone cloud green quiet number seven table window garden light paper "
         "music winter orange bridge silver forest market").split()
LONG = " ".join("Item %d is a %s box." % (i, ["red", "green", "blue"][i % 3]) for i in range(30))
COUNTING = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10,"  # goes on well past the few chunks read


def distinct_requests(rng, n):
    """n (kind, prompt, max_tokens) of random lengths, a third after the shared LONG prefix."""
    out = []
    for i in range(n):
        words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 60)))
        if i % 3 == 0:
            prompt = LONG + " Which items are %s? %s" % (rng.choice(["red", "green", "blue"]), words)
        else:
            prompt = words
        out.append((rng.choice(["chat", "text"]), prompt, rng.randint(3, 12)))
    return out


def ask(client, kind, prompt, n, stream=False, cancel_after=None):
    """(text, usage, chunks read) of a greedy request; with cancel_after, hangs up after that
    many chunks."""
    if kind == "chat":
        args = dict(messages=[{"role": "user", "content": prompt}])
        fn = client.chat.completions.create
    else:
        args = dict(prompt=prompt)
        fn = client.completions.create
    args.update(model="m", temperature=0, max_tokens=n)
    if not stream:
        r = fn(**args)
        c = r.choices[0]
        return (c.message.content if kind == "chat" else c.text), r.usage, 1
    s = fn(stream=True, stream_options={"include_usage": True}, **args)
    parts, usage, chunks = [], None, 0
    for chunk in s:
        chunks += 1
        if chunk.usage:
            usage = chunk.usage
        for c in chunk.choices:
            parts.append((c.delta.content or "") if kind == "chat" else c.text)
        if cancel_after is not None and chunks >= cancel_after:
            s.close()
            break
    return "".join(parts), usage, chunks


def settle(srv):
    """The metrics once every slot is free again (cancellations land a step later)."""
    deadline = time.time() + 10
    while True:
        m = srv.metrics()
        if (m["slots_busy"] == 0 and m["queue_length"] == 0) or time.time() > deadline:
            return m
        time.sleep(0.05)


def main():
    rng = random.Random(31)
    requests = distinct_requests(rng, 40)
    # The answers alone: one slot, no prompt cache, each request after the other.
    ref = Server(BINARY, MODEL, "-np", "1", "-c", "1024", "--page-size", "16", "--cache-ram", "0",
                 "-a", "m")
    client = openai.OpenAI(base_url=ref.url + "/v1", api_key="none", max_retries=0, timeout=120)
    alone = [ask(client, *r) for r in requests]
    client.close()
    ref.stop()

    srv = Server(BINARY, MODEL, "-np", "4", "-c", "4096", "-b", "64", "--page-size", "16",
                 "--kv-arena", "6M", "--ring-chunk", "64K", "--cache-ram", "64", "-a", "m")
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=120)
    count_prompt = ask(client, "text", COUNTING, 1)[1].prompt_tokens
    base = settle(srv)

    # 200 requests from 8 threads: every distinct one 4 times (every other streamed), 24
    # hang-ups after 2 to 5 chunks, 16 malformed; in a shuffled order.
    jobs = [("answer", i, k % 2 == 1, None) for i in range(len(requests)) for k in range(4)]
    jobs += [("cancel", None, True, 2 + k % 4) for k in range(24)]
    jobs += [("bad", None, False, None)] * 16
    rng.shuffle(jobs)
    errors, lock = [], threading.Lock()

    def one(job):
        what, i, stream, after = job
        try:
            if what == "answer":
                text, usage, _ = ask(client, *requests[i], stream=stream)
                if (text, usage.completion_tokens) != (alone[i][0], alone[i][1].completion_tokens):
                    raise AssertionError("request %d under load: %r, alone: %r" %
                                         (i, text, alone[i][0]))
                return usage
            if what == "cancel":
                _, _, chunks = ask(client, "text", COUNTING, 200, stream=True, cancel_after=after)
                if chunks != after:
                    raise AssertionError("the counting stream ended after %d chunks" % chunks)
                return None
            st, _, b = srv.http("POST", "/v1/chat/completions", raw=b'{"messages": [{"role"')
            if st != 400 or "error" not in b:
                raise AssertionError("malformed request under load: %d %r" % (st, b))
            return None
        except Exception as e:  # noqa: BLE001 (reported below, with the others)
            with lock:
                errors.append("%s: %r" % (what, e))
            return None

    t0 = time.time()
    with ThreadPoolExecutor(8) as pool:
        usages = list(pool.map(one, jobs))
    elapsed = time.time() - t0
    check(not errors, "under load: %d errors: %s" % (len(errors), "; ".join(errors[:5])))

    m = settle(srv)
    d = {k: m[k] - base.get(k, 0) for k in m}
    answered = [u for u in usages if u is not None]
    check(len(answered) == 160 and d["requests_total"] == 184 and
          d["requests_finished_total"] == 160 and d["requests_cancelled_total"] == 24 and
          d["requests_failed_total"] == 0 and d["requests_rejected_total"] == 0,
          "request counts %r" % d)
    check(d["prompt_tokens_total"] == sum(u.prompt_tokens for u in answered) + 24 * count_prompt,
          "prompt tokens %r" % d)
    done_tokens = sum(u.completion_tokens for u in answered)
    check(done_tokens + 2 * 24 <= d["completion_tokens_total"] <= done_tokens + 24 * 200,
          "completion tokens %r (answers %d)" % (d, done_tokens))
    check(d["http_errors_total"] == 16, "http errors %r" % d)
    check(m["bytes_streamed_total"] > 0, "nothing streamed: the arena is not small enough")
    # The shared prefix and the repeated requests hit the cache; hang-ups may too.
    reused = [u.prompt_tokens_details.cached_tokens for u in answered]
    hits = sum(1 for c in reused if c > 0)
    check(hits >= 40 and hits <= d["prompt_cache_hits_total"] <= hits + 24 and
          sum(reused) <= d["prompt_cache_tokens_total"] <= sum(reused) + 24 * count_prompt,
          "prompt cache: %d answers reused %d tokens, metrics %r" % (hits, sum(reused), d))
    slots = srv.http("GET", "/slots")[2]
    check(all(s["state"] == "idle" for s in slots), "/slots after the load: %r" % slots)
    client.close()
    srv.stop()

    # One slot, no queue: the second request is refused, a hang-up frees the slot.
    srv = Server(BINARY, MODEL, "-np", "1", "--queue", "0", "-c", "512", "-a", "m")
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0)
    s = client.completions.create(model="m", prompt=COUNTING, max_tokens=400, temperature=0,
                                  stream=True)
    next(iter(s))
    slot = srv.http("GET", "/slots")[2][0]
    check(slot["state"] in ("prefill", "decode") and slot["prompt_tokens"] > 0 and
          slot["pages_resident"] > 0 and slot["pages_streamed"] == 0, "/slots while busy: %r" % slot)
    st, hdrs, b = srv.http("POST", "/v1/completions", {"prompt": "Hi", "max_tokens": 2})
    check(st == 503 and hdrs.get("Retry-After") and b["error"]["message"],
          "a full server answered %d %r" % (st, b))
    s.close()
    m = settle(srv)
    check(m["requests_cancelled_total"] == 1 and m["requests_rejected_total"] == 1 and
          m["slots_busy"] == 0, "after the hang-up: %r" % m)
    check(client.completions.create(model="m", prompt="Hi", max_tokens=2).choices[0].text
          is not None, "no answer once the slot is free")
    client.close()
    srv.stop()
    print("serve load: ok (200 requests in %.1f s under load)" % elapsed)


if __name__ == "__main__":
    main()
