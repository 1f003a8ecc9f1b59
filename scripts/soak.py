#!/usr/bin/env python3
"""A soak of `kvstream serve`: C clients x R requests on one model, mixing streamed and whole
answers, chats and completions, cancels mid-stream, malformed requests and long prompts. Every
good greedy answer must equal the same request's answer alone (asked first, on a fresh server of
one slot); the server's RSS after the run must stay within 1.2x of its RSS after the first 50
requests. With --kill, the server is killed (SIGKILL) halfway and started again on the same
flags; the clients retry what the kill cut off, and the answers must still be right.

  scripts/soak.py --kvstream build/cpu/kvstream -m models/SmolLM2-135M-Instruct.Q4_1.gguf
                  [--clients 8] [--requests 250] [--kill] [--json OUT] [-- SERVE FLAGS]

Prints requests served, faults injected, p50/p99 latency and RSS; exits 1 on any wrong answer.
"""
import argparse
import http.client
import json
import os
import random
import signal
import sys
import threading
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "e2e"))
from serve_util import Server  # noqa: E402

WORDS = ("apple river stone cloud green quiet number seven table window garden light paper "
         "music winter orange bridge silver forest market").split()
LONG = " ".join("Item %d is a %s box on shelf %d." % (i, ["red", "green", "blue"][i % 3], i % 7)
                for i in range(120))


def rss_of(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def post(url, body, timeout=300):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.status, r.read().decode()


class Soak:
    def __init__(self, a):
        self.a = a
        self.lock = threading.Lock()
        self.latency, self.wrong, self.errors = [], [], []
        self.served = self.cancelled = self.malformed = self.retried = 0
        self.server = None
        self.url = ""

    def start(self):
        self.server = Server(self.a.kvstream, self.a.model, "-np", str(self.a.parallel),
                             *self.a.serve_flags)
        self.url = self.server.url

    def request_body(self, kind, prompt, n, stream):
        if kind == "chat":
            return "/v1/chat/completions", {"messages": [{"role": "user", "content": prompt}],
                                            "max_tokens": n, "temperature": 0, "stream": stream}
        return "/v1/completions", {"prompt": prompt, "max_tokens": n, "temperature": 0,
                                   "stream": stream}

    def answer(self, kind, prompt, n, stream):
        path, body = self.request_body(kind, prompt, n, stream)
        status, text = post(self.url + path, body)
        if status != 200:
            raise RuntimeError("status %d: %s" % (status, text[:200]))
        if not stream:
            j = json.loads(text)
            c = j["choices"][0]
            return c["message"]["content"] if kind == "chat" else c["text"]
        out = []
        for line in text.splitlines():
            if line.startswith("data: ") and line != "data: [DONE]":
                c = json.loads(line[6:])["choices"]
                if c:
                    d = c[0].get("delta", {}).get("content") if kind == "chat" else c[0].get("text")
                    out.append(d or "")
        return "".join(out)

    def cancel_mid_stream(self, kind, prompt):
        path, body = self.request_body(kind, prompt, 64, True)
        req = urllib.request.Request(self.url + path, data=json.dumps(body).encode(),
                                     method="POST", headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as r:
            r.readline()  # the first event, then hang up
        with self.lock:
            self.cancelled += 1

    def malformed_request(self, rng):
        bodies = [b"{", b'{"messages": 7}', b'{"prompt": "x", "max_tokens": -5}',
                  b'{"messages": [{"role": "user"}]}', b"\xff\xfe", b'{"prompt": ' + b"[" * 5000]
        req = urllib.request.Request(self.url + "/v1/chat/completions", data=rng.choice(bodies),
                                     method="POST", headers={"Content-Type": "application/json"})
        try:
            urllib.request.urlopen(req, timeout=60).read()
            ok = False
        except urllib.error.HTTPError as e:
            ok = 400 <= e.code < 500
        with self.lock:
            self.malformed += 1
            if not ok:
                self.errors.append("a malformed request was not refused with 4xx")

    def client(self, cid, jobs, expected):
        rng = random.Random(cid)
        for i, job in enumerate(jobs):
            r = rng.random()
            try:
                if r < 0.05:
                    self.malformed_request(rng)
                    continue
                if r < 0.10:
                    self.cancel_mid_stream(job[0], job[1])
                    continue
            except (OSError, http.client.HTTPException):
                continue  # the server is being restarted
            stream = rng.random() < 0.5
            for attempt in range(30):
                t0 = time.time()
                try:
                    text = self.answer(job[0], job[1], job[2], stream)
                    break
                except (OSError, http.client.HTTPException, RuntimeError, ValueError) as e:
                    if not self.a.kill:
                        with self.lock:
                            self.errors.append("client %d request %d: %s" % (cid, i, e))
                        text = None
                        break
                    with self.lock:
                        self.retried += 1
                    time.sleep(1)
            else:
                text = None
            with self.lock:
                if text is None:
                    continue
                self.latency.append(time.time() - t0)
                self.served += 1
                if text != expected[job]:
                    self.wrong.append({"job": list(job), "got": text, "want": expected[job]})
                if self.served == 50:
                    self.rss_50 = rss_of(self.server.proc.pid)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kvstream", required=True)
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--requests", type=int, default=250)
    ap.add_argument("--parallel", type=int, default=4)
    ap.add_argument("--distinct", type=int, default=40, help="distinct requests the mix draws from")
    ap.add_argument("--kill", action="store_true")
    ap.add_argument("--json", default="")
    ap.add_argument("serve_flags", nargs="*")
    a = ap.parse_args()
    rng = random.Random(1)
    jobs = []
    for i in range(a.distinct):
        words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 40)))
        prompt = (LONG + " " + words) if i % 5 == 0 else words
        jobs.append((rng.choice(["chat", "text"]), prompt, rng.randint(4, 24)))
    s = Soak(a)
    # The answers alone: one slot, no prompt cache (the soak's cache flags left out), the same
    # page size.
    flags, skip = [], False
    for f in a.serve_flags:
        if skip:
            skip = False
        elif f in ("--cache-ram", "--cache-disk", "--cache-disk-size"):
            skip = True
        else:
            flags.append(f)
    alone = Server(a.kvstream, a.model, "-np", "1", "--cache-ram", "0", *flags)
    s.url = alone.url
    expected = {j: s.answer(j[0], j[1], j[2], False) for j in jobs}
    alone.stop()
    s.start()
    s.rss_50 = 0
    mix = [[rng.choice(jobs) for _ in range(a.requests)] for _ in range(a.clients)]
    t0 = time.time()
    threads = [threading.Thread(target=s.client, args=(c, mix[c], expected))
               for c in range(a.clients)]
    for t in threads:
        t.start()
    kills = 0
    if a.kill:
        while s.served < a.clients * a.requests // 2 and any(t.is_alive() for t in threads):
            time.sleep(0.2)
        s.server.proc.send_signal(signal.SIGKILL)
        s.server.proc.wait()
        kills = 1
        s.start()  # a new port: the clients follow s.url
    for t in threads:
        t.join()
    wall = time.time() - t0
    rss_end = rss_of(s.server.proc.pid)
    s.server.stop()
    lat = sorted(s.latency)
    pct = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))] if lat else 0.0
    rss_ok = a.kill or s.rss_50 == 0 or rss_end <= 1.2 * s.rss_50
    result = {
        "clients": a.clients, "requests_per_client": a.requests, "served": s.served,
        "cancelled_mid_stream": s.cancelled, "malformed": s.malformed, "kills": kills,
        "retried_after_kill": s.retried, "wrong_answers": len(s.wrong), "errors": s.errors[:20],
        "p50_s": pct(0.5), "p99_s": pct(0.99), "wall_s": wall, "rss_after_50": s.rss_50,
        "rss_end": rss_end, "rss_ok": rss_ok, "wrong": s.wrong[:5],
    }
    print(json.dumps({k: v for k, v in result.items() if k != "wrong"}, indent=1))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)
    ok = not s.wrong and not s.errors and rss_ok
    print("soak: %d passed, %d failed" % (int(ok), int(not ok)))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
