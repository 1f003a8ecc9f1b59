#!/usr/bin/env python3
"""The server's benchmark: starts `kvstream serve` with the given flags, then measures
  - the time to first token of a turn of --turn tokens after a --prefix of tokens, cold and
    again with the prefix in the prompt cache (a second turn on the same prefix);
  - aggregate decode tokens/s of 1, 2, 4, 8 (--concurrency) requests at once, each the shared
    prefix plus a short turn of its own, counted over the window in which all of them decode
    (every streamed token is time-stamped);
and writes the figures as JSON. Prompts are random token ids (a synthetic model's text means
nothing); greedy with ignore_eos, so every answer runs to --n-gen tokens.

  scripts/serve-bench.py --bin build/kvstream -m MODEL [--prefix 32768] [--turn 1024]
      [--n-gen 64] [--concurrency 1,2,4,8] [--json OUT] -- SERVE_FLAGS...
"""
import argparse
import json
import random
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request


def start(binary, model, flags):
    log = tempfile.NamedTemporaryFile(prefix="kvs_serve_bench_", suffix=".log", delete=False)
    proc = subprocess.Popen([binary, "serve", "-m", model, "--port", "0", *flags],
                            stdout=subprocess.DEVNULL, stderr=log)
    deadline = time.time() + 600
    while True:
        text = open(log.name, errors="replace").read()
        m = re.search(r"on http://[^:]+:(\d+)", text)
        if m:
            return proc, "http://127.0.0.1:%s" % m.group(1), log.name
        if proc.poll() is not None or time.time() > deadline:
            sys.exit("serve-bench: the server did not start:\n" + text)
        time.sleep(0.1)


def stream(url, prompt, n_gen):
    """One streamed completion: (its start, the time of each token's chunk, the final usage,
    the server's figures of the answer)."""
    body = {"prompt": prompt, "max_tokens": n_gen, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}
    req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    times, usage, figures, t0 = [], None, None, time.perf_counter()
    with urllib.request.urlopen(req, timeout=3600) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            j = json.loads(line[6:])
            if j.get("error"):
                raise RuntimeError("the server's answer: %s" % j["error"])
            if j.get("usage"):
                usage = j["usage"]
            if j.get("kvstream"):
                figures = j["kvstream"]
            if j.get("choices") and j["choices"][0].get("finish_reason") is None:
                times.append(time.perf_counter())
    return t0, times, usage, figures


def ids(rng, n):
    return [rng.randrange(1000, 30000) for _ in range(n)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--prefix", type=int, default=32768)
    ap.add_argument("--turn", type=int, default=1024)
    ap.add_argument("--n-gen", type=int, default=64)
    ap.add_argument("--concurrency", default="1,2,4,8")
    ap.add_argument("--json")
    ap.add_argument("flags", nargs="*")
    a = ap.parse_args()
    rng = random.Random(1)
    prefix = ids(rng, a.prefix)
    proc, url, log = start(a.bin, a.model, a.flags)
    out = {"model": a.model, "flags": a.flags, "prefix": a.prefix, "turn": a.turn,
           "n_gen": a.n_gen}
    try:
        stream(url, ids(rng, 8), 4)  # warm-up
        ttft = {}
        for name in ("cold", "cached"):
            t0, times, usage, _ = stream(url, prefix + ids(rng, a.turn), 1)
            ttft[name] = {"seconds": times[0] - t0, "usage": usage}
            print("ttft %-6s %.3f s (%s)" % (name, times[0] - t0, usage), flush=True)
        out["ttft"] = ttft

        out["concurrency"] = []
        for c in [int(x) for x in a.concurrency.split(",")]:
            results = [None] * c
            turns = [ids(rng, 16) for _ in range(c)]

            def one(i):
                results[i] = stream(url, prefix + turns[i], a.n_gen)

            threads = [threading.Thread(target=one, args=(i,)) for i in range(c)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            if any(r is None or not r[1] for r in results):
                raise RuntimeError("%d of %d requests gave no tokens" %
                                   (sum(r is None or not r[1] for r in results), c))
            # The window in which every request decodes: from the last first token to the
            # first last token; the tokens of all of them stamped inside it.
            lo = max(r[1][0] for r in results)
            hi = min(r[1][-1] for r in results)
            n = sum(sum(1 for t in r[1] if lo < t <= hi) for r in results)
            rate = n / (hi - lo) if hi > lo else 0.0
            single = [(len(r[1]) - 1) / (r[1][-1] - r[1][0]) for r in results if len(r[1]) > 1]
            row = {"requests": c, "aggregate_tok_s": rate, "window_s": hi - lo,
                   "tokens_in_window": n, "per_request_tok_s": single,
                   "server_tok_s": [r[3]["tokens_per_s"] if r[3] else None for r in results],
                   "completion_tokens": [r[2]["completion_tokens"] if r[2] else None
                                         for r in results]}
            out["concurrency"].append(row)
            print("%d concurrent: %.2f tok/s aggregate (%d tokens in %.2f s), per request %s"
                  % (c, rate, n, hi - lo, " ".join("%.2f" % s for s in single)), flush=True)
        metrics = urllib.request.urlopen(url + "/metrics", timeout=60).read().decode()
        out["metrics"] = [l for l in metrics.splitlines() if l and not l.startswith("#")]
    except Exception:
        sys.stderr.write("serve-bench: the server's log ends:\n" + open(log, errors="replace")
                         .read()[-3000:])
        raise
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
