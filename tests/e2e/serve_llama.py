"""llama-server's own API on `kvstream serve`: -c as the total over the slots, /props,
/completion against /v1/completions, /tokenize and /detokenize, /apply-template, the slot actions
(save, erase, restore with --slot-save-path: a restored slot's prefix is reused and its greedy
answer is the cold one; a corrupt file is refused by name), X-Api-Key and authentication_error,
CORS preflights, llamacpp:* metrics and the flags llama-server's command lines carry; an
assistant message continued (prefill, continue_final_message), return_progress,
timings_per_token, post_sampling_probs, --reasoning off and --no-jinja --chat-template NAME; n
choices that read their prompt once, whole and streamed, chat and completion.

Usage: serve_llama.py KVSTREAM MODEL"""
import json
import os
import sys
import tempfile

from serve_util import Server, check

BINARY, MODEL = sys.argv[1], sys.argv[2]
PROMPT = "The capital of France is a city that"


def completion(srv, body):
    st, _, b = srv.http("POST", "/completion", body)
    check(st == 200, "/completion %r -> %d %r" % (body, st, b))
    return b


def main():
    with tempfile.TemporaryDirectory() as slots:
        srv = Server(BINARY, MODEL, "-np", "2", "-c", "1024", "--slot-save-path", slots,
                     "-a", "b,a", "--tags", "x,y", "--jinja", "-cb", "-ub", "64", "--no-mmap",
                     "-sm", "none", "--kv-unified", "--slots")
        # --kv-unified: each slot may hold all of -c.
        st, _, p = srv.http("GET", "/props")
        check(st == 200 and p["total_slots"] == 2 and
              p["default_generation_settings"]["n_ctx"] == 1024, "/props %r" % p)
        st, _, m = srv.http("GET", "/models")
        check(m["data"][0]["id"] == "a" and set(m["data"][0]["aliases"]) == {"a", "b"} and
              m["data"][0]["tags"] == ["x", "y"], "/models %r" % m)

        # /completion's text is /v1/completions's, greedy.
        a = completion(srv, {"prompt": PROMPT, "n_predict": 12, "temperature": 0,
                             "return_tokens": True, "n_probs": 3})
        _, _, o = srv.http("POST", "/v1/completions", {"prompt": PROMPT, "max_tokens": 12,
                                                      "temperature": 0})
        check(a["content"] == o["choices"][0]["text"], "/completion %r vs /v1/completions %r"
              % (a["content"], o["choices"][0]["text"]))
        check(len(a["tokens"]) == 12 and a["stop_type"] == "limit" and
              a["timings"]["predicted_n"] == 12 and len(a["completion_probabilities"]) == 12 and
              len(a["completion_probabilities"][0]["top_logprobs"]) == 3, "/completion %r" % a)
        st, _, t = srv.http("POST", "/tokenize", {"content": PROMPT})
        st2, _, d = srv.http("POST", "/detokenize", {"tokens": t["tokens"]})
        check(st == 200 and st2 == 200 and d["content"] == PROMPT, "tokenize round trip %r" % d)
        st, _, at = srv.http("POST", "/apply-template",
                             {"messages": [{"role": "user", "content": "Hi"}]})
        check(st == 200 and "<|im_start|>user\nHi<|im_end|>" in at["prompt"], "%r" % at)

        # Slot actions: a prompt in slot 1, saved, erased (the next run reads it all), restored
        # (the next run reuses it and answers as the cold run did).
        body = {"prompt": "Once upon a time in a quiet village", "n_predict": 8, "temperature": 0,
                "id_slot": 1}
        cold = completion(srv, body)
        check(cold["id_slot"] == 1, "id_slot %r" % cold["id_slot"])
        st, _, sv = srv.http("POST", "/slots/1?action=save", {"filename": "one.bin"})
        check(st == 200 and sv["n_saved"] > 8 and sv["n_written"] > 0, "save %r" % sv)
        st, _, er = srv.http("POST", "/slots/1?action=erase")
        check(st == 200 and er["n_erased"] == sv["n_saved"], "erase %r" % er)
        again = completion(srv, body)
        check(again["timings"]["cache_n"] == 0 and again["content"] == cold["content"],
              "after erase %r" % again["timings"])
        srv.http("POST", "/slots/1?action=erase")
        st, _, rs = srv.http("POST", "/slots/0?action=restore", {"filename": "one.bin"})
        check(st == 200 and rs["n_restored"] == sv["n_saved"], "restore %r" % rs)
        warm = completion(srv, dict(body, id_slot=0))
        check(warm["timings"]["cache_n"] > 0 and warm["content"] == cold["content"],
              "after restore: %r, %r vs %r" % (warm["timings"], warm["content"], cold["content"]))
        # Refusals name what is wrong.
        with open(os.path.join(slots, "bad.bin"), "wb") as f:
            f.write(b"KVSSLOT1" + b"\0" * 100)
        st, _, e = srv.http("POST", "/slots/0?action=restore", {"filename": "bad.bin"})
        check(st == 400 and "bad.bin" in e["error"]["message"], "corrupt file: %d %r" % (st, e))
        st, _, e = srv.http("POST", "/slots/0?action=save", {"filename": "../x"})
        check(st == 400 and "filename" in e["error"]["message"], "path name: %d %r" % (st, e))
        st, _, e = srv.http("POST", "/slots/0?action=nothing")
        check(st == 400, "unknown action: %d" % st)
        # The whole context is the limit, in llama-server's error shape.
        st, _, e = srv.http("POST", "/completion", {"prompt": "hi " * 1100})
        check(st == 400 and e["error"]["type"] == "exceed_context_size_error" and
              e["error"]["n_ctx"] == 1024 and "exceeds the available context size" in
              e["error"]["message"], "too long: %d %r" % (st, e))
        # CORS: a preflight echoes the origin.
        st, h, _ = srv.http("OPTIONS", "/completion", headers={"Origin": "http://x.example"})
        check(st == 200 and h.get("Access-Control-Allow-Origin") == "http://x.example",
              "preflight %d %r" % (st, h))
        _, _, text = srv.http("GET", "/metrics")
        check("llamacpp:tokens_predicted_total" in text and
              "llamacpp:prompt_tokens_cached_total" in text, "llamacpp metrics")
        # Anthropic's Messages API: the chat endpoint's greedy answer, in its shapes.
        msgs = [{"role": "user", "content": "Say hello"}]
        _, _, oa = srv.http("POST", "/v1/chat/completions",
                            {"messages": msgs, "max_tokens": 10, "temperature": 0})
        st, _, am = srv.http("POST", "/v1/messages", {"model": "claude", "max_tokens": 10,
                                                     "temperature": 0, "messages": msgs})
        check(st == 200 and am["type"] == "message" and am["content"][0]["type"] == "text" and
              am["content"][0]["text"] == oa["choices"][0]["message"]["content"] and
              am["stop_reason"] in ("end_turn", "max_tokens") and
              am["usage"]["input_tokens"] == oa["usage"]["prompt_tokens"], "/v1/messages %r" % am)
        st, _, ct = srv.http("POST", "/v1/messages/count_tokens", {"messages": msgs})
        check(st == 200 and ct == {"input_tokens": am["usage"]["input_tokens"]}, "%r" % ct)
        st, _, text = srv.http("POST", "/v1/messages", {"max_tokens": 10, "temperature": 0,
                                                       "messages": msgs, "stream": True})
        kinds = [l[7:] for l in text.splitlines() if l.startswith("event: ")]
        check(st == 200 and kinds[:2] == ["message_start", "content_block_start"] and
              kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"],
              "/v1/messages stream %r" % kinds)
        st, _, e = srv.http("POST", "/v1/messages", {"max_tokens": 10, "messages": [
            {"role": "user", "content": [{"type": "image", "source": {}}]}]})
        check(st == 400 and "image" in e["error"]["message"], "an image block: %d %r" % (st, e))
        # OpenAI's Responses API: the chat endpoint's greedy answer as one message item.
        st, _, rp = srv.http("POST", "/v1/responses", {"input": msgs, "max_output_tokens": 10,
                                                      "temperature": 0})
        check(st == 200 and rp["id"].startswith("resp_") and rp["status"] == "completed" and
              rp["output"][0]["id"].startswith("msg_") and
              rp["output"][0]["content"][0]["text"] == oa["choices"][0]["message"]["content"],
              "/v1/responses %r" % rp)
        st, _, text = srv.http("POST", "/responses", {"input": "Say hello", "max_output_tokens": 10,
                                                     "temperature": 0, "stream": True})
        kinds = [l[7:] for l in text.splitlines() if l.startswith("event: ")]
        check(st == 200 and kinds[0] == "response.created" and
              kinds[-1] == "response.completed" and "response.output_text.delta" in kinds,
              "/responses stream %r" % kinds)
        # n choices (each its own sequence and seed), __verbose, constrained sampling refused.
        st, _, nc = srv.http("POST", "/chat/completions", {"messages": msgs, "n": 3, "seed": 5,
                                                          "max_tokens": 8, "temperature": 1})
        check(st == 200 and [c["index"] for c in nc["choices"]] == [0, 1, 2] and
              len({c["message"]["content"] for c in nc["choices"]}) > 1, "n=3: %r" % nc)
        st, _, vb = srv.http("POST", "/chat/completions", {"messages": msgs, "max_tokens": 2,
                                                          "verbose": True})
        check(st == 200 and "Say hello" in vb["__verbose"]["prompt"], "verbose: %r" % vb)
        st, _, e = srv.http("POST", "/completion", {"prompt": "x", "grammar": 'root ::= "a"'})
        check(st == 200 and e["content"] == "a", "grammar: %d %r" % (st, e))
        # An assistant message last is continued (llama-server's prefill): its text ends the
        # prompt, after the template's opening of the assistant's turn.
        pre = msgs + [{"role": "assistant", "content": [{"type": "text", "text": "Wh"},
                                                       {"type": "text", "text": "ill"}]}]
        st, _, vp = srv.http("POST", "/chat/completions", {"messages": pre, "max_tokens": 1,
                                                          "verbose": True})
        check(st == 200 and vp["__verbose"]["prompt"].endswith(
            "<|im_start|>assistant\nWh\n\nill"), "prefill: %r" % vp.get("__verbose"))
        st, _, e = srv.http("POST", "/chat/completions", {
            "messages": pre, "max_tokens": 1, "continue_final_message": True,
            "add_generation_prompt": True})
        check(st == 400 and e["error"]["param"] == "continue_final_message", "%d %r" % (st, e))
        st, _, e = srv.http("POST", "/chat/completions", {
            "messages": pre + [{"role": "assistant", "content": "x"}], "max_tokens": 1})
        check(st == 400, "two assistant messages last: %d %r" % (st, e))
        st, _, ag = srv.http("POST", "/apply-template", {"messages": msgs,
                                                        "add_generation_prompt": False})
        check(st == 200 and not ag["prompt"].rstrip().endswith("assistant"), "%r" % ag)
        # return_progress: a prompt_progress object after each chunk of -b 64 (-ub is accepted,
        # -b is the step), the first before any, the last at the whole prompt; timings_per_token.
        long_prompt = "the quick brown fox jumps over the lazy dog " * 20
        st, _, text = srv.http("POST", "/completion", {
            "prompt": long_prompt, "n_predict": 2, "stream": True, "return_progress": True,
            "timings_per_token": True, "cache_prompt": False})
        chunks = [json.loads(l[6:]) for l in text.splitlines() if l.startswith("data: ")]
        prog = [c["prompt_progress"] for c in chunks if "prompt_progress" in c]
        total = prog[-1]["total"] if prog else 0
        check(st == 200 and len(prog) >= 2 and prog[0]["processed"] == prog[0]["cache"] and
              prog[-1]["processed"] == total and
              all(a["processed"] < b["processed"] for a, b in zip(prog, prog[1:])) and
              all("timings" in c for c in chunks if "content" in c and c["content"]),
              "return_progress: %r" % prog)
        # post_sampling_probs: probabilities after the sampler's chain, summing to at most 1.
        ps = completion(srv, {"prompt": PROMPT, "n_predict": 3, "n_probs": 5, "temperature": 1,
                              "top_k": 5, "post_sampling_probs": True})
        for t in ps["completion_probabilities"]:
            check(0 < t["prob"] <= 1 and 1 <= len(t["top_probs"]) <= 5 and
                  sum(p["prob"] for p in t["top_probs"]) <= 1 + 1e-5 and
                  t["id"] in [p["id"] for p in t["top_probs"]], "post_sampling_probs %r" % t)
        st, _, sl = srv.http("GET", "/slots")
        check(st == 200 and all(s["is_processing"] is False for s in sl), "/slots %r" % sl)
        srv.stop()

    # --reasoning off: templates get enable_thinking false; --no-jinja --chat-template NAME is
    # llama.cpp's format of that name.
    with tempfile.NamedTemporaryFile("w", suffix=".jinja", delete=False) as f:
        f.write("{% for m in messages %}{{ m.content }}{% endfor %}"
                "{% if enable_thinking %}[think]{% else %}[no think]{% endif %}")
        tmpl = f.name
    for flag, want in (("auto", "[think]"), ("off", "[no think]")):
        srv = Server(BINARY, MODEL, "--chat-template-file", tmpl, "--reasoning", flag)
        st, _, ap = srv.http("POST", "/apply-template", {"messages": [{"role": "user",
                                                                      "content": "Hi"}]})
        check(st == 200 and ap["prompt"] == "Hi" + want, "--reasoning %s: %r" % (flag, ap))
        srv.stop()
    os.unlink(tmpl)
    srv = Server(BINARY, MODEL, "--no-jinja", "--chat-template", "llama3")
    st, _, ap = srv.http("POST", "/apply-template", {"messages": [{"role": "user",
                                                                  "content": "Hi"}]})
    check(st == 200 and "<|start_header_id|>user<|end_header_id|>" in ap["prompt"], "%r" % ap)
    srv.stop()

    # -c is split over the slots; X-Api-Key and authentication_error; several addresses.
    srv = Server(BINARY, MODEL, "-np", "2", "-c", "512", "--api-key", "k1,k2")
    st, _, e = srv.http("POST", "/completion", {"prompt": "Hi", "n_predict": 1})
    check(st == 401 and e["error"]["type"] == "authentication_error", "no key: %d %r" % (st, e))
    st, _, p = srv.http("GET", "/props", headers={"X-Api-Key": "k2"})
    check(st == 200 and p["default_generation_settings"]["n_ctx"] == 256, "/props %d %r" % (st, p))
    st, _, e = srv.http("POST", "/completion", {"prompt": "hi " * 300, "n_predict": 1},
                        headers={"Authorization": "Bearer k1"})
    check(st == 400 and e["error"]["n_ctx"] == 256, "-c 512 -np 2: %d %r" % (st, e))
    srv.stop()
    # n choices read the prompt once: the first puts its pages in the prompt cache as soon as it
    # has read it, the others reuse them; greedy, each is the cold answer of a server without a
    # cache, bit for bit in its text.
    story = [{"role": "user", "content": "Write a long story about a cat who lives in a library "
                                         "and reads every book on the shelves, through winter."}]
    srv = Server(BINARY, MODEL, "--cache-ram", "0")
    st, _, cold = srv.http("POST", "/chat/completions", {"messages": story, "max_tokens": 12,
                                                        "temperature": 0})
    srv.stop()
    srv = Server(BINARY, MODEL, "-np", "3", "-c", "3072", "--metrics")
    st, _, nc = srv.http("POST", "/chat/completions", {"messages": story, "max_tokens": 12,
                                                      "temperature": 0, "n": 3})
    m = srv.metrics()
    want = cold["choices"][0]["message"]["content"]
    p = nc["usage"]["prompt_tokens"]
    check(st == 200 and [c["message"]["content"] for c in nc["choices"]] == [want] * 3,
          "n=3 greedy against the cold answer %r: %r" % (want, nc))
    check(m["prompt_cache_hits_total"] == 2 and m["prompt_cache_tokens_total"] == 2 * (p - 1),
          "the other choices reused the first's prompt: %r of %d tokens" % (m, p))
    # Streamed, each chunk one choice's by its index: they add up to the whole answer's.
    st, _, text = srv.http("POST", "/chat/completions", {
        "messages": story, "max_tokens": 12, "temperature": 0, "n": 3, "stream": True,
        "stream_options": {"include_usage": True}})
    got, finish, usage = ["", "", ""], [None] * 3, None
    for line in text.splitlines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        c = json.loads(line[6:])
        usage = c.get("usage") or usage
        for ch in c["choices"]:
            got[ch["index"]] += ch["delta"].get("content") or ""
            finish[ch["index"]] = ch["finish_reason"] or finish[ch["index"]]
    check(st == 200 and got == [want] * 3 and finish == ["length"] * 3 and
          usage["completion_tokens"] == 36 and text.endswith("data: [DONE]\n\n"),
          "n=3 streamed: %r %r %r" % (got, finish, usage))
    st, _, cc = srv.http("POST", "/v1/completions", {"prompt": PROMPT, "max_tokens": 6,
                                                    "temperature": 0, "n": 2})
    check(st == 200 and [c["index"] for c in cc["choices"]] == [0, 1] and
          cc["choices"][0]["text"] == cc["choices"][1]["text"], "completion n=2: %r" % cc)
    st, _, e = srv.http("POST", "/chat/completions", {"messages": story, "max_tokens": 2, "n": 2,
                                                      "logprobs": True})
    check(st == 400 and e["error"]["param"] == "n", "n with logprobs: %d %r" % (st, e))
    srv.stop()
    print("serve_llama: ok")


main()
