"""`kvstream serve`'s chat page at / in headless Chromium, driven over the DevTools protocol
through --remote-debugging-pipe (JSON messages ending in NUL on fds 3 and 4, so no websocket
client is needed): with --api-key the page asks for the key; a greedy answer streams to the same
text as the API's whole answer, a second turn sends the history, the figures of the `kvstream`
field are shown; Stop frees the slot; New conversation forgets the history.

usage: serve_page.py KVSTREAM MODEL"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))
from serve_util import Server, check, fail  # noqa: E402

KEY = "page-test-key"


class Browser:
    def __init__(self, exe, url):
        self.profile = tempfile.mkdtemp(prefix="kvs_chromium_")
        to_browser_r, self.to_browser = os.pipe()
        self.from_browser, from_browser_w = os.pipe()

        def fds():  # the browser reads commands on fd 3 and answers on fd 4
            r, w = os.dup(to_browser_r), os.dup(from_browser_w)  # neither is 3 or 4 now
            os.dup2(r, 3)
            os.dup2(w, 4)

        self.proc = subprocess.Popen(
            [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             "--no-first-run", "--remote-debugging-pipe", "--user-data-dir=" + self.profile, url],
            pass_fds=(3, 4), preexec_fn=fds,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(to_browser_r)
        os.close(from_browser_w)
        self.buf = b""
        self.next_id = 0
        self.session = None
        deadline = time.time() + 30
        while self.session is None:
            check(time.time() < deadline, "chromium opened no page")
            pages = [t for t in self.call("Target.getTargets")["targetInfos"]
                     if t["type"] == "page"]
            if pages:
                self.session = self.call("Target.attachToTarget", targetId=pages[0]["targetId"],
                                         flatten=True)["sessionId"]
            else:
                time.sleep(0.1)

    def call(self, method, session=None, **params):
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params}
        if session:
            msg["sessionId"] = session
        os.write(self.to_browser, json.dumps(msg).encode() + b"\0")
        while True:  # events and other answers are skipped
            while b"\0" not in self.buf:
                chunk = os.read(self.from_browser, 1 << 16)
                check(chunk, "chromium closed the DevTools pipe")
                self.buf += chunk
            raw, self.buf = self.buf.split(b"\0", 1)
            reply = json.loads(raw)
            if reply.get("id") == self.next_id:
                check("error" not in reply, "%s: %s" % (method, reply.get("error")))
                return reply["result"]

    # The value of a JavaScript expression in the page (a promise is awaited).
    def js(self, expr):
        r = self.call("Runtime.evaluate", self.session, expression=expr, awaitPromise=True,
                      returnByValue=True)
        check("exceptionDetails" not in r, "%s: %s" % (expr, r.get("exceptionDetails")))
        return r["result"].get("value")

    # Polls until expr is truthy; one that throws (the page not loaded yet) is false.
    def wait(self, expr, what, timeout=20):
        deadline = time.time() + timeout
        while True:
            v = self.js("(() => { try { return %s } catch (e) { return false } })()" % expr)
            if v:
                return v
            check(time.time() < deadline, "timed out waiting for " + what)
            time.sleep(0.05)

    def close(self):
        try:  # a clean exit takes chromium's helper processes with it
            os.write(self.to_browser, json.dumps({"id": 0, "method": "Browser.close"}).encode()
                     + b"\0")
            self.proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.profile, ignore_errors=True)


LAST = "[...document.querySelectorAll('.assistant')].at(-1)"


def ask(b, text, max_tokens):
    """Types a message into the page, sends it and waits for the answer's end: its text, its
    state (done, stopped, error) and the figures shown."""
    b.js("$('max').value = %d; $('temp').value = 0; $('input').value = %s; "
         "$('ask').requestSubmit()" % (max_tokens, json.dumps(text)))
    b.wait(LAST + "?.dataset.state", "the answer to " + repr(text), timeout=25)
    return b.js("({text: %s.firstChild.data, state: %s.dataset.state, "
                "stats: %s.querySelector('.stats').textContent, "
                "figures: {...%s.querySelector('.stats').dataset}})" % ((LAST,) * 4))


def api_answer(srv, messages, max_tokens):
    status, _, body = srv.http("POST", "/v1/chat/completions",
                               {"messages": messages, "max_tokens": max_tokens,
                                "temperature": 0},
                               headers={"Authorization": "Bearer " + KEY})
    check(status == 200, "the API answers %d: %s" % (status, body))
    return body


def main():
    binary, model = sys.argv[1], sys.argv[2]
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if not exe:
        print("SKIP: chromium is not installed (scripts/setup.sh installs it)")
        sys.exit(77)  # ctest's SKIP_RETURN_CODE for this test
    # An arena too small for the second turn's history, so that some of it streams; answers
    # past end-of-generation, so that the long one is still streaming when Stop is clicked.
    srv = Server(binary, model, "-np", "2", "-c", "2048", "-b", "64", "--page-size", "16",
                 "--kv-arena", "3M", "--ring-chunk", "64K", "--api-key", KEY, "--ignore-eos")
    b = None
    try:
        status, hdrs, page = srv.http("GET", "/")
        check(status == 200 and hdrs["Content-Type"].startswith("text/html"),
              "/ answers %d %s without the key" % (status, hdrs.get("Content-Type")))
        check("<script>" in page and 'src="http' not in page and 'href="http' not in page,
              "the page is not self-contained")
        b = Browser(exe, srv.url + "/")
        b.wait("document.readyState === 'complete' && !$('keybox').hidden",
               "the page asking for the API key")
        b.js("$('key').value = %s; $('key').dispatchEvent(new Event('change'))" % json.dumps(KEY))
        b.wait("$('model').textContent === %s" % json.dumps(os.path.basename(model)),
               "the model's name once the key is given")

        # A greedy answer through the page's stream equals the API's whole answer.
        q1, n = "What is the capital of France?", 24
        q2 = "Paris is a city in France. " * 40 + "Where is Paris?"
        a1 = ask(b, q1, n)
        check(a1["state"] == "done", "first answer ended %s: %s" % (a1["state"], a1["text"]))
        ref1 = api_answer(srv, [{"role": "user", "content": q1}], n)
        check(a1["text"] == ref1["choices"][0]["message"]["content"],
              "page %r != API %r" % (a1["text"], ref1["choices"][0]["message"]["content"]))
        k = ref1["kvstream"]
        u = ref1["usage"]
        check(u["prompt_tokens"] <= k["context_used"] <= u["total_tokens"] and k["n_ctx"] == 1024,
              "the kvstream figures %s against usage %s" % (k, u))
        full_pages = k["pages_resident"] + k["pages_streamed"]
        check(full_pages > 0 and full_pages % ((k["context_used"] + 15) // 16) == 0,
              "the pages %s are not a whole number of layers of %d positions"
              % (k, k["context_used"]))
        f = a1["figures"]
        check(float(f.get("tokens_per_s", 0)) > 0
              and int(f.get("context_used", -1)) == k["context_used"]
              and int(f.get("pages_resident", 0)) + int(f.get("pages_streamed", 0)) == full_pages,
              "the page's figures %s against the API's %s" % (f, k))
        check("tokens/s" in a1["stats"] and ("context %d of 1024" % k["context_used"])
              in a1["stats"] and "streamed" in a1["stats"], "the stats line: " + a1["stats"])

        # The second turn carries the first: the same as the API given the whole history.
        a2 = ask(b, q2, n)
        ref2 = api_answer(srv, [{"role": "user", "content": q1},
                                {"role": "assistant", "content": a1["text"]},
                                {"role": "user", "content": q2}], n)
        check(a2["state"] == "done" and a2["text"] == ref2["choices"][0]["message"]["content"],
              "second turn: page %r != API %r" % (a2["text"],
                                                   ref2["choices"][0]["message"]["content"]))
        f2 = a2["figures"]
        check(int(f2["context_used"]) == ref2["kvstream"]["context_used"] > k["context_used"],
              "the second turn's context %s, the API's %s" % (f2, ref2["kvstream"]))
        check(int(f2["pages_streamed"]) > 0 and ("%s streamed" % f2["pages_streamed"])
              in a2["stats"], "nothing of the long history streamed: " + a2["stats"])

        # Stop: a long answer, stopped once text has streamed in, frees its slot.
        b.js("$('max').value = 600; $('input').value = 'Count from 1 to 500, one number a "
             "line.'; $('ask').requestSubmit()")
        b.wait("document.querySelectorAll('.assistant').length === 3 && "
               "(%s.firstChild.data.length > 8)" % LAST, "text streaming in")
        check(b.js(LAST + ".dataset.state") is None, "the long answer ended before Stop")
        b.js("$('stop').click()")
        b.wait(LAST + ".dataset.state === 'stopped'", "the page to show the answer stopped")
        check("stopped after" in b.js(LAST + ".querySelector('.stats').textContent"),
              "the stopped answer's stats line")
        deadline = time.time() + 10
        while True:
            _, _, slots = srv.http("GET", "/slots", headers={"Authorization": "Bearer " + KEY})
            if all(s["state"] == "idle" for s in slots):
                break
            check(time.time() < deadline, "Stop did not free the slot: %s" % slots)
            time.sleep(0.05)
        m = srv.http("GET", "/metrics", headers={"Authorization": "Bearer " + KEY})[2]
        check("kvstream_requests_cancelled_total 1\n" in m, "no cancel counted:\n" + m)

        # New conversation: no history, the next answer is the first turn's again.
        b.js("$('clear').click()")
        check(b.js("history.length === 0 && $('log').children.length === 0"),
              "New conversation left the history")
        a3 = ask(b, q1, n)
        check(a3["text"] == a1["text"], "after New conversation %r != %r"
              % (a3["text"], a1["text"]))
    except BaseException:
        srv.proc.kill()  # a failed check leaves no server behind
        raise
    finally:
        if b:
            b.close()
    srv.stop()
    print("serve page: ok")


if __name__ == "__main__":
    try:
        main()
    except SystemExit:
        raise
    except Exception as e:  # noqa: BLE001
        fail("%s: %s" % (type(e).__name__, e))
