"""Starting `kvstream serve` for a test: on a free port (--port 0, read back from its first
line), stopped with SIGTERM, which must end it cleanly; and `kvstream run` greedy for the
answers the server must give."""
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request


def fail(what):
    sys.exit("FAIL: " + what)


def check(cond, what):
    if not cond:
        fail(what)


class Server:
    def __init__(self, binary, model, *args):
        self.err = tempfile.NamedTemporaryFile(prefix="kvs_serve_", suffix=".log", delete=False)
        # KVS_SERVE_ARGS: flags added to every server (--backend cuda on a GPU machine).
        extra = os.environ.get("KVS_SERVE_ARGS", "").split()
        # --metrics: llama-server's switch of /metrics, which the tests read.
        self.proc = subprocess.Popen([binary, "serve", "-m", model, "--port", "0", "-t", "2",
                                      "--metrics", *args, *extra], stdout=subprocess.DEVNULL, stderr=self.err)
        deadline = time.time() + 60
        self.port = None
        while self.port is None:
            if self.proc.poll() is not None or time.time() > deadline:
                fail("the server did not start: " + self.log())
            m = re.search(r"on http://[^:]+:(\d+)", self.log())
            if m:
                self.port = int(m.group(1))
            time.sleep(0.05)
        self.url = "http://127.0.0.1:%d" % self.port

    def log(self):
        with open(self.err.name, errors="replace") as f:
            return f.read()

    # (status, headers, body) of a raw request; body parsed as JSON where it is JSON.
    def http(self, method, path, body=None, headers=None, raw=None):
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None
                                            else None)
        h = {"Content-Type": "application/json"}
        h.update(headers or {})
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=h)
        try:
            with urllib.request.urlopen(req, timeout=120) as r:
                status, hdrs, text = r.status, dict(r.headers), r.read().decode()
        except urllib.error.HTTPError as e:
            status, hdrs, text = e.code, dict(e.headers), e.read().decode()
        try:
            return status, hdrs, json.loads(text)
        except ValueError:
            return status, hdrs, text

    def metrics(self):
        status, _, text = self.http("GET", "/metrics")
        check(status == 200, "/metrics answers %d" % status)
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                out[name.replace("kvstream_", "")] = float(value)
        return out

    def stop(self):
        self.proc.send_signal(15)
        try:
            rc = self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            fail("the server did not stop on SIGTERM: " + self.log()[-2000:])
        log = self.log()
        os.unlink(self.err.name)
        check(rc == 0, "the server exited with %d: %s" % (rc, log[-2000:]))
        check("server stopped" in log, "no clean stop in the log: " + log[-2000:])


def run_greedy(binary, model, prompt, n, chat):
    """`kvstream run` greedy: its JSON (tokens, text, prompt_tokens)."""
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "run.json")
        args = [binary, "run", "-m", model, "-p", prompt, "--temp", "0", "-n", str(n), "-t", "2",
                "--json", out]
        if chat:
            args.append("--chat")
        r = subprocess.run(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        check(r.returncode == 0, "kvstream run failed: " + r.stderr)
        with open(out) as f:
            return json.load(f)


def chat_answer(client, msgs, max_tokens, top_logprobs):
    """(text, usage, logprobs as tuples) of a greedy chat request."""
    r = client.chat.completions.create(model="m", messages=msgs, temperature=0,
                                       max_tokens=max_tokens, logprobs=True,
                                       top_logprobs=top_logprobs)
    c = r.choices[0]
    lps = [(t.token, t.logprob, tuple((x.token, x.logprob) for x in t.top_logprobs))
           for t in c.logprobs.content]
    return c.message.content, r.usage, lps
