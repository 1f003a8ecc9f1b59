#!/usr/bin/env python3
"""`kvstream serve`'s prompt cache on models with recurrent and window layers (synthetic
tiny-qwen35 and tiny-gemma3, random weights, the default page of 256 positions): a short
conversation's second turn reports cached tokens (the first turn's prompt and answer, up to the
last token that tokenizes back alike; for qwen35 back to a checkpoint of the Gated DeltaNet
state), and its answer and log-probabilities equal those of a server without a cache; /metrics
counts qwen35's checkpoints. With --cache-disk the cache outlives the server: turn 2 asked of a
restarted server resumes from disk alike; a second server on the same directory is refused.
Usage: serve_cache_hybrid.py KVSTREAM"""
import subprocess
import sys
import tempfile

import openai

from serve_util import Server, chat_answer, check

BINARY = sys.argv[1]
TURNS = ["Which vegetables grow well in shade?", "And which of those can I sow in autumn?"]
N = 12


def answer(client, msgs):
    return chat_answer(client, msgs, N, 3)


def conversation(client):
    msgs = [{"role": "user", "content": TURNS[0]}]
    first = answer(client, msgs)
    msgs += [{"role": "assistant", "content": first[0]}, {"role": "user", "content": TURNS[1]}]
    return first, answer(client, msgs)


def cached(usage):
    d = usage.prompt_tokens_details
    return d.cached_tokens if d is not None else None


def main():
    for preset in ("tiny-qwen35", "tiny-gemma3"):
        common = ("-np", "2", "-c", "2048", "-a", "m")
        cold_srv = Server(BINARY, "synthetic:" + preset, *common, "--cache-ram", "0")
        srv = Server(BINARY, "synthetic:" + preset, *common, "--cache-ram", "64")
        cold = openai.OpenAI(base_url=cold_srv.url + "/v1", api_key="none", max_retries=0)
        warm = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0)
        want1, want2 = conversation(cold)
        got1, got2 = conversation(warm)
        check(cached(got1[1]) == 0 and got1 == want1, "%s: turn 1 differs: %r" % (preset, got1))
        c2 = cached(got2[1])
        check(c2 is not None and 0 < c2 < got2[1].prompt_tokens,
              "%s: turn 2 reused %r of %d tokens" % (preset, c2, got2[1].prompt_tokens))
        check(c2 >= got1[1].prompt_tokens,
              "%s: turn 2 reused %d, less than turn 1's prompt (%d)" %
              (preset, c2, got1[1].prompt_tokens))
        check(got2[0] == want2[0], "%s: turn 2 with its cached prefix: %r, cold: %r" %
              (preset, got2[0], want2[0]))
        check(got2[2] == want2[2], "%s: turn 2's log-probabilities differ from a cold run's" % preset)
        m = srv.metrics()
        check(m["prompt_cache_hits_total"] == 1 and m["prompt_cache_tokens_total"] == c2,
              "%s: metrics after turn 2: %r" % (preset, m))
        if preset == "tiny-qwen35":
            check(m["prompt_cache_checkpoints"] >= 2 and
                  0 < m["prompt_cache_checkpoint_bytes"] < m["prompt_cache_bytes"],
                  "%s: checkpoint metrics: %r" % (preset, m))
        # The disk tier: turn 1, a restart, turn 2.
        with tempfile.TemporaryDirectory() as disk:
            flags = (*common, "--cache-ram", "64", "--cache-disk", disk)
            first = Server(BINARY, "synthetic:" + preset, *flags)
            client = openai.OpenAI(base_url=first.url + "/v1", api_key="none", max_retries=0)
            msgs = [{"role": "user", "content": TURNS[0]}]
            d1 = answer(client, msgs)
            twice = subprocess.run([BINARY, "serve", "-m", "synthetic:" + preset, "--port", "0",
                                    *flags], capture_output=True, text=True, timeout=60)
            check(twice.returncode != 0 and "another kvstream process" in twice.stderr,
                  "%s: a second server on one --cache-disk: %r" % (preset, twice.stderr[-300:]))
            client.close()
            first.stop()
            again = Server(BINARY, "synthetic:" + preset, *flags)
            client = openai.OpenAI(base_url=again.url + "/v1", api_key="none", max_retries=0)
            msgs += [{"role": "assistant", "content": d1[0]}, {"role": "user", "content": TURNS[1]}]
            d2 = answer(client, msgs)
            check(d1 == want1 and d2[0] == want2[0] and d2[2] == want2[2],
                  "%s: the conversation across a restart differs from a cold server's" % preset)
            check(cached(d2[1]) == c2, "%s: after a restart turn 2 reused %r, not %d" %
                  (preset, cached(d2[1]), c2))
            m = again.metrics()
            check(m["prompt_cache_disk_reads_total"] > 0, "%s: disk metrics: %r" % (preset, m))
            client.close()
            again.stop()
        cold.close()
        warm.close()
        cold_srv.stop()
        srv.stop()
        print("serve cache (%s): ok (turn 2 reused %d of %d prompt tokens; turn 1: %d + %d)" %
              (preset, c2, got2[1].prompt_tokens, got1[1].prompt_tokens,
               got1[1].completion_tokens))


if __name__ == "__main__":
    main()
