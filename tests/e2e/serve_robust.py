#!/usr/bin/env python3
"""`kvstream serve` against clients that misbehave: a second server on a port in use fails
naming the address; a wrong method on an endpoint is 405 with Allow, an unknown path 404; a
POST without a body is answered at once, a body that stops coming and an idle connection are
dropped within seconds; 200 idle connections do not delay a new client; a 30 MB prompt is
refused with llama-server's exceed_context_size_error in under 2 s without the server's memory
growing. Usage: serve_robust.py KVSTREAM MODEL"""
import json
import socket
import subprocess
import sys
import time

from serve_util import Server, check

BINARY, MODEL = sys.argv[1], sys.argv[2]
N_CTX = 2048
TIMEOUT = 2  # --timeout of the server under test


def rss_peak(pid):
    """VmHWM of a process, in bytes: the most memory it has held."""
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM")


def connect(port):
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    return s


def answer_and_close(s, limit):
    """Seconds until the server first answers on s or closes it, and until it closes it (None
    for not within limit)."""
    t0 = time.time()
    first = None
    s.settimeout(limit)
    try:
        while s.recv(65536):
            first = first or time.time() - t0
    except socket.timeout:
        return first, None
    except ConnectionResetError:
        pass
    return first or time.time() - t0, time.time() - t0


def completion_s(srv):
    t0 = time.time()
    st, _, b = srv.http("POST", "/v1/completions", {"prompt": "Hi", "max_tokens": 1})
    check(st == 200, "completion -> %d %r" % (st, b))
    return time.time() - t0


def main():
    srv = Server(BINARY, MODEL, "-c", str(N_CTX), "--timeout", str(TIMEOUT))

    # A second server on the same port: an error naming the address, not a shared port.
    r = subprocess.run([BINARY, "serve", "-m", MODEL, "--port", str(srv.port), "-t", "2",
                        "-c", "256"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                       text=True, timeout=120)
    check(r.returncode != 0, "a second server on port %d started" % srv.port)
    check("127.0.0.1:%d" % srv.port in r.stderr and "in use" in r.stderr,
          "the second server's error: %r" % r.stderr)

    # Wrong methods: 405 with Allow and an OpenAI-shaped body; unknown paths stay 404.
    for method, path, allow in [("GET", "/v1/chat/completions", "POST"),
                                ("PUT", "/v1/completions", "POST"),
                                ("DELETE", "/v1/chat/completions", "POST"),
                                ("POST", "/health", "GET"), ("POST", "/v1/models", "GET")]:
        st, h, b = srv.http(method, path, raw=b"{}" if method != "GET" else None)
        check(st == 405 and allow in h.get("Allow", "") and b["error"]["message"] and
              b["error"]["type"], "%s %s -> %d %r %r" % (method, path, st, h, b))
    for method in ["GET", "POST"]:
        st, _, b = srv.http(method, "/v1/nothing", raw=b"{}" if method == "POST" else None)
        check(st == 404 and b["error"]["code"] == "not_found", "%s unknown path -> %d" % (method, st))

    # A POST without a body (curl -X POST URL): answered at once, not after a timeout.
    s = connect(srv.port)
    t0 = time.time()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n\r\n")
    s.settimeout(5)
    head = s.recv(4096).decode(errors="replace")
    check(head.startswith("HTTP/1.1 411") and time.time() - t0 < 1,
          "POST without a body: %r after %.2f s" % (head[:80], time.time() - t0))
    s.close()

    # A body that stops coming: answered after --timeout, closed after the keep-alive wait of
    # 5 s; a connection that never sends a request: closed after the keep-alive wait.
    s = connect(srv.port)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: 100\r\n\r\n{\"prompt\"")
    first, end = answer_and_close(s, 30)
    check(first < TIMEOUT + 1.5 and end is not None and end < TIMEOUT + 5 + 2,
          "a stalled body: answered after %.1f s, closed after %s s" % (first, end))
    s.close()
    s = connect(srv.port)
    _, end = answer_and_close(s, 30)
    check(end is not None and end < 5 + 2, "an idle connection stayed open %s s" % end)
    s.close()

    # 200 idle connections do not delay a new client's request.
    base = min(completion_s(srv) for _ in range(3))
    idle = [connect(srv.port) for _ in range(200)]
    time.sleep(0.5)  # accepted, each holding an HTTP thread
    t0 = time.time()
    st, _, _ = srv.http("GET", "/health")
    health = time.time() - t0
    loaded = min(completion_s(srv) for _ in range(3))
    for s in idle:
        s.close()
    check(st == 200 and health < 0.1, "/health behind 200 idle connections: %.3f s" % health)
    check(loaded - base < 0.1, "a completion took %.3f s behind 200 idle connections, %.3f s "
          "without" % (loaded, base))

    # A prompt far past the context: refused before it is tokenized, in llama-server's shape.
    peak = rss_peak(srv.proc.pid)
    text = "hello world " * (30 * 1000 * 1000 // 12)
    slowest = 0
    for path, body, field in [("/v1/completions", {"prompt": text, "max_tokens": 1}, "prompt"),
                              ("/v1/chat/completions",
                               {"messages": [{"role": "user", "content": text}]}, "messages")]:
        raw = json.dumps(body).encode()
        t0 = time.time()
        st, _, b = srv.http("POST", path, raw=raw)
        dt = time.time() - t0
        e = b["error"] if isinstance(b, dict) else {}
        check(st == 400 and e.get("type") == "exceed_context_size_error" and
              e.get("n_ctx") == N_CTX and e.get("n_prompt_tokens", 0) >= N_CTX and
              e.get("param") == field, "%d MB to %s -> %d %r" % (len(raw) >> 20, path, st,
                                                                 str(b)[:300]))
        check(dt < 2, "%d MB to %s answered in %.2f s" % (len(raw) >> 20, path, dt))
        slowest = max(slowest, dt)
    grown = rss_peak(srv.proc.pid) - peak
    check(grown < 256 << 20, "the 30 MB prompts grew the server's peak RSS by %d MiB" % (grown >> 20))
    # Past the context by its tokens alone: the exact count.
    st, _, b = srv.http("POST", "/v1/completions", {"prompt": "hi " * 3000, "max_tokens": 1})
    check(st == 400 and b["error"]["type"] == "exceed_context_size_error" and
          b["error"]["n_prompt_tokens"] > N_CTX and b["error"]["n_ctx"] == N_CTX,
          "3000 words -> %d %r" % (st, b))
    check(completion_s(srv) < 30, "no answer after the refusals")
    srv.stop()
    print("serve robust: ok (behind 200 idle connections /health %.3f s, a completion %.3f s "
          "against %.3f s; 30 MB refused in %.2f s, peak RSS +%d MiB)"
          % (health, loaded, base, slowest, grown >> 20))


if __name__ == "__main__":
    main()
