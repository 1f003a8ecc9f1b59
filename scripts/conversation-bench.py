#!/usr/bin/env python3
"""A long conversation through `kvstream serve` and its prompt cache, timed (issue 43's figures):
  - --turns turns of --turn new tokens each (random ids; a synthetic model's text means
    nothing), each prompt the previous one plus the new tokens, each answer --n-gen tokens
    greedy: every turn's time to first token, the tokens the cache gave, and /metrics' cache
    bytes and checkpoints after the last turn;
  - the server stopped (SIGINT writes the cache to --cache-disk) and started again: the next
    turn of --next new tokens, its time to first token and the bytes read back from disk, then a
    second such turn from RAM (its new tokens' prefill alone);
  - the prompts of turns 2 on again cold (the first token changed, so nothing matches).
Writes the figures as JSON.

  scripts/conversation-bench.py --bin build/kvstream -m MODEL --cache-disk DIR [--turns 4]
      [--turn 32768] [--next 1024] [--n-gen 16] [--vocab 30000] [--json OUT] -- SERVE_FLAGS...
"""
import argparse
import json
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request


def start(binary, model, flags):
    log = tempfile.NamedTemporaryFile(prefix="kvs_conv_bench_", suffix=".log", delete=False)
    t0 = time.perf_counter()
    proc = subprocess.Popen([binary, "serve", "-m", model, "--port", "0", *flags],
                            stdout=subprocess.DEVNULL, stderr=log)
    while True:
        text = open(log.name, errors="replace").read()
        m = re.search(r"on http://[^:]+:(\d+)", text)
        if m:
            return proc, "http://127.0.0.1:%s" % m.group(1), log.name, time.perf_counter() - t0
        if proc.poll() is not None or time.perf_counter() - t0 > 900:
            sys.exit("conversation-bench: the server did not start:\n" + text[-3000:])
        time.sleep(0.1)


def stop(proc):
    """SIGINT, as a user's Ctrl-C: the server writes its cache to disk and exits."""
    t0 = time.perf_counter()
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=600)
    return time.perf_counter() - t0


def machine():
    """The CPU and its count, for figures from whichever machine ran them."""
    name = "unknown"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import os
    return {"cpu": name, "cpus": os.cpu_count()}


def turn(url, prompt, n_gen):
    """One streamed completion: its time to first token, usage and the server's timings."""
    body = {"prompt": prompt, "max_tokens": n_gen, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}
    req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    first, usage, timings, t0 = None, None, None, time.perf_counter()
    with urllib.request.urlopen(req, timeout=3600) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            j = json.loads(line[6:])
            if j.get("error"):
                raise RuntimeError("the server's answer: %s" % j["error"])
            usage = j.get("usage") or usage
            timings = j.get("timings") or timings
            if first is None and j.get("choices"):
                first = time.perf_counter() - t0
    return {"ttft_s": first, "total_s": time.perf_counter() - t0, "prompt_tokens": len(prompt),
            "cached_tokens": (usage or {}).get("prompt_tokens_details", {}).get("cached_tokens"),
            "prompt_ms": (timings or {}).get("prompt_ms")}


def metrics(url):
    text = urllib.request.urlopen(url + "/metrics", timeout=60).read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("kvstream_prompt_cache"):
            name, value = line.split()
            out[name] = float(value)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--cache-disk", required=True)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--turn", type=int, default=32768)
    ap.add_argument("--next", type=int, default=1024)
    ap.add_argument("--n-gen", type=int, default=16)
    ap.add_argument("--vocab", type=int, default=30000, help="token ids drawn below this")
    ap.add_argument("--json")
    ap.add_argument("flags", nargs="*")
    a = ap.parse_args()
    rng = random.Random(43)
    ids = lambda n: [rng.randrange(a.vocab // 30, a.vocab) for _ in range(n)]  # noqa: E731
    flags = [*a.flags, "--cache-disk", a.cache_disk, "--metrics"]
    out = {"model": a.model, "flags": flags, "turn": a.turn, "next": a.next, "n_gen": a.n_gen,
           "machine": machine()}

    def save():  # after every phase: a run cut short still leaves its figures
        if a.json:
            with open(a.json, "w") as f:
                json.dump(out, f, indent=1)

    def log(name, r):
        save()
        print("%-10s %7d tokens, %7s cached: first token %.3f s (server prompt %.0f ms)"
              % (name, r["prompt_tokens"], r["cached_tokens"], r["ttft_s"],
                 r["prompt_ms"] or 0), flush=True)

    proc, url, logf, out["load_s"] = start(a.bin, a.model, flags)
    try:
        turn(url, ids(8), 2)  # warm-up
        prompts, out["turns"] = [], []
        conv = []
        for k in range(a.turns):
            conv = conv + ids(a.turn)
            prompts.append(conv)
            r = turn(url, conv, a.n_gen)
            log("turn %d" % (k + 1), r)
            out["turns"].append(r)
        out["metrics_after_turns"] = metrics(url)
        out["shutdown_s"] = stop(proc)
        proc, url, logf, out["restart_load_s"] = start(a.bin, a.model, flags)
        turn(url, ids(8), 2)
        conv = conv + ids(a.next)
        r = turn(url, conv, a.n_gen)
        log("restart", r)
        out["after_restart"] = r
        out["metrics_after_restart"] = metrics(url)
        r = turn(url, conv[:-a.next] + ids(a.next), a.n_gen)
        log("from RAM", r)
        out["from_ram"] = r
        out["cold"] = []
        for i, p in enumerate(prompts[1:]):
            r = turn(url, [p[0] + 1 + i] + p[1:], 1)  # a first token of its own: no match
            log("cold", r)
            out["cold"].append(r)
    except Exception:
        sys.stderr.write("conversation-bench: the server's log ends:\n" +
                         open(logf, errors="replace").read()[-3000:])
        raise
    finally:
        if proc.poll() is None:
            stop(proc)
    save()


if __name__ == "__main__":
    main()
