#!/usr/bin/env python3
"""`kvstream serve` under concurrent clients on SmolLM2-135M, -np 4, a KV arena small enough
that pages stream, -b 64 so that long prompts are read in chunks between the others' decode
steps: every greedy answer completed under load equals the same request served alone; clients
that hang up midway cancel their generation and free its slot; malformed requests get 400
meanwhile; /metrics counts agree with what the clients saw. Then, with one slot and no queue,
a second request gets 503 with Retry-After, and a cancelled stream gives its slot to the next.
Usage: serve_load.py KVSTREAM MODEL"""
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import openai

from serve_util import Server, check

BINARY, MODEL = sys.argv[1], sys.argv[2]
LONG = " ".join("Item %d is a %s box." % (i, ["red", "green", "blue"][i % 3]) for i in range(30))
# (kind, prompt, max_tokens): chats and completions, two sharing a long prefix.
REQUESTS = [
    ("chat", "Name three fruits.", 20),
    ("chat", "What is 7 times 6?", 12),
    ("chat", LONG + " What color is item 4?", 16),
    ("text", LONG + " Item 31 is a", 10),
    ("text", "Once upon a time", 24),
    ("chat", "Write a haiku about the sea.", 24),
    ("text", "def fibonacci(n):", 20),
    ("chat", "Say hello in French.", 8),
]
COUNTING = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10,"  # goes on well past the few chunks read


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
    srv = Server(BINARY, MODEL, "-np", "4", "-c", "1024", "-b", "64", "--page-size", "16",
                 "--kv-arena", "6M", "--ring-chunk", "64K", "-a", "m")
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=120)

    alone = [ask(client, *r) for r in REQUESTS]
    count_prompt = ask(client, "text", COUNTING, 1)[1].prompt_tokens
    base = settle(srv)

    # 16 answers, 4 hang-ups and 4 malformed requests from 8 threads at once.
    jobs = [("answer", i % len(REQUESTS), i % 2 == 1) for i in range(16)]
    jobs += [("cancel", None, True)] * 4 + [("bad", None, False)] * 4
    jobs = [jobs[(i * 7) % len(jobs)] for i in range(len(jobs))]  # interleaved
    errors, lock = [], threading.Lock()

    def one(job):
        what, i, stream = job
        try:
            if what == "answer":
                text, usage, _ = ask(client, *REQUESTS[i], stream=stream)
                if (text, usage.completion_tokens) != (alone[i][0], alone[i][1].completion_tokens):
                    raise AssertionError("request %d under load: %r, alone: %r" %
                                         (i, text, alone[i][0]))
                return usage
            if what == "cancel":
                _, _, chunks = ask(client, "text", COUNTING, 200, stream=True, cancel_after=3)
                if chunks != 3:
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
    check(not errors, "under load: " + "; ".join(errors))

    m = settle(srv)
    d = {k: m[k] - base.get(k, 0) for k in m}
    answered = [u for u in usages if u is not None]
    check(d["requests_total"] == 20 and d["requests_finished_total"] == 16 and
          d["requests_cancelled_total"] == 4 and d["requests_failed_total"] == 0,
          "request counts %r" % d)
    check(d["prompt_tokens_total"] == sum(u.prompt_tokens for u in answered) + 4 * count_prompt,
          "prompt tokens %r" % d)
    done_tokens = sum(u.completion_tokens for u in answered)
    check(done_tokens + 4 * 3 <= d["completion_tokens_total"] <= done_tokens + 4 * 200,
          "completion tokens %r (answers %d)" % (d, done_tokens))
    check(d["http_errors_total"] == 4, "http errors %r" % d)
    check(m["bytes_streamed_total"] > 0, "nothing streamed: the arena is not small enough")
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
    print("serve load: ok (%.1f s under load)" % elapsed)


if __name__ == "__main__":
    main()
