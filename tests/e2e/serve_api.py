#!/usr/bin/env python3
"""`kvstream serve` through the official `openai` client on SmolLM2-135M: greedy chat
completions (whole and streamed) and completions equal `kvstream run` greedy on the same
prompt; a two-turn conversation equals `kvstream chat`'s; ignore_eos, logprobs, stop strings, seeds,
/v1/models, /health, /metrics, /slots; malformed requests get OpenAI-style 4xx bodies while
the server keeps serving; --api-key. Usage: serve_api.py KVSTREAM MODEL"""
import json
import os
import subprocess
import sys
import tempfile

import openai

from serve_util import Server, check, run_greedy

BINARY, MODEL = sys.argv[1], sys.argv[2]
QUESTION = "What is the capital of France? Answer in one sentence."
N = 24


def chat_reference(lines, n):
    """`kvstream chat` greedy over these user lines: the assistant's replies."""
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "chat.json")
        r = subprocess.run([BINARY, "chat", "-m", MODEL, "--temp", "0", "-n", str(n), "-t", "2",
                            "--json", out], input="\n".join(lines) + "\n",
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        check(r.returncode == 0, "kvstream chat failed: " + r.stderr)
        with open(out) as f:
            return [m["content"] for m in json.load(f)["messages"] if m["role"] == "assistant"]


def main():
    srv = Server(BINARY, MODEL, "-np", "2", "-c", "4096")
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0)
    model_id = client.models.list().data[0].id
    check(model_id == os.path.basename(MODEL), "model id " + model_id)

    # Chat, whole and streamed, against `kvstream run --chat` greedy.
    ref = run_greedy(BINARY, MODEL, QUESTION, N, chat=True)
    msgs = [{"role": "user", "content": QUESTION}]
    r = client.chat.completions.create(model=model_id, messages=msgs, temperature=0, max_tokens=N)
    text = r.choices[0].message.content
    check(text == ref["text"], "chat %r != run's %r" % (text, ref["text"]))
    check(r.usage.prompt_tokens == len(ref["prompt_tokens"]), "prompt tokens %d" % r.usage.prompt_tokens)
    check(r.usage.completion_tokens == len(ref["tokens"]),
          "completion tokens %d != run's %d" % (r.usage.completion_tokens, len(ref["tokens"])))
    check(r.choices[0].finish_reason == ("length" if len(ref["tokens"]) == N else "stop"),
          "finish_reason " + r.choices[0].finish_reason)
    parts, usage, finish = [], None, None
    for chunk in client.chat.completions.create(model=model_id, messages=msgs, temperature=0,
                                                max_tokens=N, stream=True,
                                                stream_options={"include_usage": True}):
        if chunk.usage:
            usage = chunk.usage
        for c in chunk.choices:
            parts.append(c.delta.content or "")
            finish = c.finish_reason or finish
    check("".join(parts) == ref["text"], "streamed chat %r" % "".join(parts))
    check(usage is not None and usage.completion_tokens == len(ref["tokens"]), "stream usage")
    check(finish == r.choices[0].finish_reason, "streamed finish_reason %r" % finish)

    # ignore_eos (llama-server's): the answer that ended its turn runs on to max_tokens.
    short = client.chat.completions.create(model=model_id, messages=msgs, temperature=0,
                                           max_tokens=64)
    check(short.choices[0].finish_reason == "stop", "the answer did not end its turn")
    long = client.chat.completions.create(model=model_id, messages=msgs, temperature=0,
                                          max_tokens=64, extra_body={"ignore_eos": True})
    check(long.usage.completion_tokens == 64 and long.choices[0].finish_reason == "length" and
          long.choices[0].message.content.startswith(short.choices[0].message.content),
          "ignore_eos gave %d tokens, %r" % (long.usage.completion_tokens,
                                             long.choices[0].finish_reason))

    # Completions against `kvstream run` greedy without the template.
    prompt = "The three primary colors are"
    ref = run_greedy(BINARY, MODEL, prompt, 16, chat=False)
    c = client.completions.create(model=model_id, prompt=prompt, temperature=0, max_tokens=16)
    check(c.choices[0].text == ref["text"], "completion %r != %r" % (c.choices[0].text, ref["text"]))
    streamed = "".join(x.choices[0].text for x in client.completions.create(
        model=model_id, prompt=prompt, temperature=0, max_tokens=16, stream=True) if x.choices)
    check(streamed == ref["text"], "streamed completion %r" % streamed)

    # A stop string inside the greedy answer cuts it there.
    cut = ref["text"].find(" ", 4)
    if cut > 0:
        stop = ref["text"][cut:cut + 3]
        s = client.completions.create(model=model_id, prompt=prompt, temperature=0, max_tokens=16,
                                      stop=[stop, "\u00a7never"])
        check(s.choices[0].text == ref["text"][:ref["text"].find(stop)] and
              s.choices[0].finish_reason == "stop", "stop %r gave %r" % (stop, s.choices[0].text))

    # Two turns against `kvstream chat`, which keeps its KV between them.
    q2 = "And of Germany?"
    a1, a2 = chat_reference([QUESTION, q2], 16)
    conv = [{"role": "user", "content": QUESTION}]
    r1 = client.chat.completions.create(model=model_id, messages=conv, temperature=0, max_tokens=16)
    conv += [{"role": "assistant", "content": r1.choices[0].message.content},
             {"role": "user", "content": q2}]
    r2 = client.chat.completions.create(model=model_id, messages=conv, temperature=0, max_tokens=16)
    check([r1.choices[0].message.content, r2.choices[0].message.content] == [a1, a2],
          "conversation %r != chat's %r" % ([r1.choices[0].message.content,
                                               r2.choices[0].message.content], [a1, a2]))

    # Log-probabilities: the greedy token is the best of the top list, the tokens spell the text.
    r = client.chat.completions.create(model=model_id, messages=msgs, temperature=0, max_tokens=6,
                                       logprobs=True, top_logprobs=3)
    lps = r.choices[0].logprobs.content
    check(len(lps) == 6 and "".join(t.token for t in lps) == r.choices[0].message.content,
          "logprob tokens %r" % [t.token for t in lps])
    for t in lps:
        check(len(t.top_logprobs) == 3 and t.top_logprobs[0].token == t.token and
              t.top_logprobs[0].logprob >= t.top_logprobs[1].logprob >= t.top_logprobs[2].logprob
              and t.logprob <= 0, "top_logprobs %r" % t)

    # Sampling with a seed repeats; penalties are accepted.
    kw = dict(model=model_id, messages=msgs, temperature=1.0, max_tokens=12, seed=7,
              presence_penalty=0.5, frequency_penalty=0.5)
    s1 = client.chat.completions.create(**kw).choices[0].message.content
    s2 = client.chat.completions.create(**kw).choices[0].message.content
    check(s1 == s2, "seed 7 gave %r then %r" % (s1, s2))

    # Errors: OpenAI's shapes, and the server goes on.
    for body, status, param in [
            ({"messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}, 400, "temperature"),
            ({"messages": "hi"}, 400, "messages"),
            ({"model": model_id}, 400, "messages"),
            ({"messages": [{"role": "user"}], "max_tokens": -5}, 400, "max_tokens"),
            ({"messages": [{"role": "user", "content": "hi " * 3000}]}, 400, "messages"),
            ({"messages": [{"role": "user", "content": "hi"}], "model": 4}, 400, "model")]:
        st, _, b = srv.http("POST", "/v1/chat/completions", body)
        check(st == status and b["error"]["param"] == param and b["error"]["message"] and
              b["error"]["type"], "%r -> %d %r" % (body, st, b))
    st, _, b = srv.http("POST", "/v1/chat/completions", raw=b'{"messages": [')
    check(st == 400 and "JSON" in b["error"]["message"], "malformed JSON -> %d %r" % (st, b))
    st, _, b = srv.http("GET", "/v1/nothing")
    check(st == 404 and b["error"]["code"] == "not_found", "unknown path -> %d" % st)
    # Any model name, and llama-server's paths without /v1, are served by the one model.
    check(client.chat.completions.create(model="gpt-4", messages=msgs, temperature=0,
                                         max_tokens=3).choices[0].message.content,
          "another model's name was not served")
    st, _, b = srv.http("POST", "/chat/completions", {"messages": msgs, "max_tokens": 2})
    check(st == 200 and b["choices"][0]["message"]["content"], "/chat/completions -> %d" % st)
    # llama-server's /completions is its own shape (content), not OpenAI's.
    st, _, b = srv.http("POST", "/completions", {"prompt": "Hi", "n_predict": 2})
    check(st == 200 and b["content"] is not None and b["stop"], "/completions -> %d" % st)
    st, _, b = srv.http("GET", "/models")
    check(st == 200 and b["data"][0]["id"] == model_id, "/models -> %d" % st)
    check(client.chat.completions.create(model=model_id, messages=msgs, temperature=0,
                                         max_tokens=3).choices[0].message.content,
          "no answer after the errors")

    check(srv.http("GET", "/health")[:3:2] == (200, {"status": "ok"}), "/health")
    slots = srv.http("GET", "/slots")[2]
    check(len(slots) == 2 and all(s["state"] == "idle" for s in slots), "/slots %r" % slots)
    m = srv.metrics()
    check(m["requests_total"] >= 10 and m["requests_finished_total"] == m["requests_total"] and
          m["slots_busy"] == 0 and m["queue_length"] == 0 and m["http_errors_total"] >= 8,
          "metrics %r" % m)
    client.close()  # else the server waits out the keep-alive of its connections
    srv.stop()

    # --api-key: 401 without it, served with it; /health stays open.
    srv = Server(BINARY, MODEL, "--api-key", "sesame", "-c", "512")
    check(srv.http("GET", "/v1/models")[0] == 401, "no key: not 401")
    check(srv.http("GET", "/v1/models", headers={"Authorization": "Bearer wrong"})[0] == 401,
          "a wrong key: not 401")
    check(srv.http("GET", "/health")[0] == 200, "/health needs no key")
    with openai.OpenAI(base_url=srv.url + "/v1", api_key="wrong", max_retries=0) as wrong:
        try:
            wrong.models.list()
            check(False, "a wrong key was accepted")
        except openai.AuthenticationError:
            pass
    keyed = openai.OpenAI(base_url=srv.url + "/v1", api_key="sesame", max_retries=0)
    check(keyed.completions.create(model=model_id, prompt="Hi", max_tokens=2).choices[0].text
          is not None, "the key was refused")
    keyed.close()
    srv.stop()
    print("serve api: ok")


if __name__ == "__main__":
    main()
