"""The prompt cache's disk tier when the server is killed while it writes: a server with
--cache-disk reads several conversations, is asked to stop (SIGINT: it writes every entry held
in RAM to disk) and is killed (SIGKILL) a moment after its first file appears, a different
moment each round, from inside the first write to after the last. The next server on the
directory must start, drop what the kill cut (never load it, never crash), reuse what was
written whole, and answer every conversation's next turn exactly as a server without a cache.

  serve_cache_kill.py KVSTREAM MODEL
"""
import os
import signal
import sys
import tempfile
import time

from openai import OpenAI

from serve_util import Server, chat_answer, check

CONVERSATIONS = [
    "Write three sentences about the sea, the wind and a lighthouse keeper named %s." % name
    for name in ("Ana", "Bo", "Cyril", "Dagny", "Emil", "Fern")
]


def ask(server, text, max_tokens=8):
    with OpenAI(base_url=server.url + "/v1", api_key="none") as client:  # no idle connection
        return chat_answer(client, [{"role": "user", "content": text}], max_tokens, 2)


def files(d):
    return sorted(os.listdir(d))


def main():
    binary, model = sys.argv[1], sys.argv[2]
    # What a server without a cache answers to each conversation's second turn.
    cold = Server(binary, model, "--cache-ram", "0")
    second = [c + " Then one more about the harbour." for c in CONVERSATIONS]
    want = [ask(cold, s)[::2] for s in second]  # text and log-probabilities
    cold.stop()
    delays = [0.0, 0.001, 0.003, 0.006, 0.01, 0.02, 0.04, 0.1]
    cut = reused = 0
    with tempfile.TemporaryDirectory() as d:
        for delay in delays:
            for f in files(d):
                os.unlink(os.path.join(d, f))
            flags = ("--cache-ram", "64", "--cache-disk", d)
            s = Server(binary, model, *flags)
            for c in CONVERSATIONS:
                ask(s, c)
            s.proc.send_signal(signal.SIGINT)
            deadline = time.time() + 60
            while files(d) == ["lock"] and s.proc.poll() is None and time.time() < deadline:
                time.sleep(0.0002)
            time.sleep(delay)
            s.proc.kill()
            s.proc.wait(timeout=30)
            left = files(d)
            cut += any(f.startswith(".tmp") for f in left)
            t = Server(binary, model, *flags)
            for i, text in enumerate(second):
                answer = ask(t, text)
                reused += answer[1].prompt_tokens_details.cached_tokens
                got = answer[::2]
                check(got == want[i], "killed %.3f s after SIGINT (%d files left: %s): turn 2 of "
                      "conversation %d differs from a cold server's: %r against %r"
                      % (delay, len(left), left, i, got, want[i]))
            check("error" not in t.log().lower(), "the server after the kill: " + t.log()[-1500:])
            check(not any(f.startswith(".tmp") for f in files(d)),
                  "the next server left the cut writes: %s" % files(d))
            t.stop()
            print("killed %.3f s after SIGINT: %d files left, the next server answered all %d "
                  "turns as a cold one" % (delay, len(left), len(second)), flush=True)
    # The rounds must catch the server mid-write, not only before or after it.
    check(cut > 0, "no round killed the server inside a write")
    check(reused > 0, "no later server reused an entry written before the kill")
    print("serve cache kill: ok (%d rounds killed it inside a write; %d prompt tokens came from "
          "entries written before a kill)" % (cut, reused))


if __name__ == "__main__":
    main()
