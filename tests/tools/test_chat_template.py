#!/usr/bin/env python3
"""kvstream's Jinja engine against Python's jinja2, string for string.

Every template below renders a matrix of conversations (system prompts, several turns, tools,
tool calls and their results, reasoning, add_generation_prompt on and off, enable_thinking)
through both: jinja2 set up as transformers sets it up for chat templates (the oracle), and
kvstream's engine through tests/tools/jinja_render.cpp. The texts must be equal, and where jinja2
fails (a template's raise_exception, a role it refuses) kvstream must fail too.

Templates: SmolLM2-135M-Instruct's (from its GGUF in models/), Gemma 3's (checked in under
tests/tools/templates), and llama.cpp's: every models/templates/*.jinja (Qwen3, Qwen3.5, Llama
3.1/3.2/3.3 and 60-odd more) and the inline templates of tests/test-chat-template.cpp, from the
pinned llama-cpp-python sdist (cached as tests/peers/build-llama.sh caches it, fetched if absent).

usage: test_chat_template.py JINJA_RENDER [-v]
"""
import datetime
import json
import os
import pathlib
import re
import subprocess
import sys
import tarfile

try:
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment
except ImportError:
    sys.exit("test_chat_template: needs jinja2 (scripts/setup.sh installs it into .venv)")

ROOT = pathlib.Path(__file__).resolve().parents[2]
VERSION = "0.3.36"
NOW = 1767268800  # 2026-01-01 12:00 UTC: strftime_now's clock in both engines

# Templates that must render every conversation they accept without an error in both engines:
# the models this project runs.
MUST_RENDER = ["SmolLM2-135M-Instruct", "google-gemma-3-it", "Qwen-Qwen3-0.6B", "Qwen3.5-4B",
               "meta-llama-Llama-3.1-8B-Instruct", "meta-llama-Llama-3.2-3B-Instruct",
               "meta-llama-Llama-3.3-70B-Instruct"]

# Where jinja2 fails and kvstream renders on purpose, as llama.cpp's own engine does: a fragment
# of jinja2's message, and why.
RENDERS_WHERE_JINJA2_FAILS = {
    "generator is not JSON serializable":
        "jinja2's map/select give generators that tojson cannot serialize; llama.cpp's engine "
        "and kvstream give lists (llama.cpp's llama-cpp-deepseek-r1 template relies on it)",
}


def oracle_env():
    """jinja2 as transformers' chat_template_utils sets it up."""

    class Generation(jinja2.ext.Extension):
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_support"), [], [], body).set_lineno(lineno)

        def _support(self, caller):
            return caller()

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.datetime.fromtimestamp(NOW).strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    env.globals["dict"] = dict
    return env


def llama_cpp_tree():
    cache = pathlib.Path(os.environ.get("KVS_PEERS_CACHE",
                                        pathlib.Path.home() / ".cache/kvstream/peers"))
    tree = cache / f"llama_cpp_python-{VERSION}" / "vendor" / "llama.cpp"
    if not (tree / "models" / "templates").is_dir():
        cache.mkdir(parents=True, exist_ok=True)
        sdist = cache / f"llama_cpp_python-{VERSION}.tar.gz"
        if not sdist.exists():
            print(f"test_chat_template: fetching the llama-cpp-python {VERSION} sdist", flush=True)
            subprocess.run([sys.executable, "-m", "pip", "download", "-q",
                            "--disable-pip-version-check", "--no-deps", "--no-binary", ":all:",
                            f"llama-cpp-python=={VERSION}", "-d", str(cache)], check=True)
        with tarfile.open(sdist) as t:
            t.extractall(cache, filter="data")
    return tree


def c_string(body):
    """The text of a C++ string literal's inside."""
    out, k = [], 0
    esc = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "'": "'", "0": "\0"}
    while k < len(body):
        c = body[k]
        if c == "\\" and k + 1 < len(body):
            out.append(esc.get(body[k + 1], "\\" + body[k + 1]))
            k += 2
        else:
            out.append(c)
            k += 1
    return "".join(out)


def inline_templates(tree):
    """The templates written inline in llama.cpp's tests/test-chat-template.cpp."""
    src = (tree / "tests" / "test-chat-template.cpp").read_text(encoding="utf-8")
    found = {}
    pat = re.compile(r'/\* \.name= \*/\s*"((?:[^"\\]|\\.)*)",\s*/\* \.template_str= ?\*/\s*'
                     r'(?:u8)?"((?:[^"\\]|\\.)*)"')
    for m in pat.finditer(src):
        found["test-chat-template: " + c_string(m.group(1))] = c_string(m.group(2))
    return found


def gguf_template(path):
    import gguf  # noqa: PLC0415  (in .venv, as for the other tools tests)
    r = gguf.GGUFReader(path)
    f = r.fields.get("tokenizer.chat_template")
    return bytes(f.parts[f.data[0]]).decode("utf-8") if f else None


def templates():
    out = {}
    smol = ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not smol.exists():
        sys.exit(f"test_chat_template: {smol} is missing (scripts/fetch-model.sh fetches it)")
    out["SmolLM2-135M-Instruct"] = gguf_template(smol)
    for p in sorted((ROOT / "tests" / "tools" / "templates").glob("*.jinja")):
        out[p.stem] = p.read_text(encoding="utf-8")
    tree = llama_cpp_tree()
    for p in sorted((tree / "models" / "templates").glob("*.jinja")):
        out[p.stem] = p.read_text(encoding="utf-8")
    out.update(inline_templates(tree))
    return out


TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city, now.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "The city's name"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "add", "description": "Adds two numbers.",
        "parameters": {"type": "object", "properties": {
            "a": {"type": "number"}, "b": {"type": "number"}}, "required": ["a", "b"]}}},
]
CALL = {"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}}
CALL2 = {"id": "call_2", "type": "function",
         "function": {"name": "add", "arguments": {"a": 1.5, "b": 2}}}


def conversations():
    sys_m = {"role": "system", "content": "You are a helpful assistant."}
    u1 = {"role": "user", "content": "Hello"}
    a1 = {"role": "assistant", "content": "Hi there"}
    u2 = {"role": "user", "content": "Who are you?"}
    a2 = {"role": "assistant", "content": "   I am an assistant   "}
    u3 = {"role": "user", "content": "Another question: naïve café, 東京, emoji 🙂 and \"quotes\" 'too'\n"}
    ask = {"role": "user", "content": "What is the weather in Paris?"}
    call = {"role": "assistant", "content": "", "tool_calls": [CALL]}
    call_text = {"role": "assistant", "content": "Let me check.", "tool_calls": [CALL]}
    calls2 = {"role": "assistant", "content": None, "tool_calls": [CALL, CALL2]}
    result = {"role": "tool", "tool_call_id": "call_1", "name": "get_weather",
              "content": "{\"temperature\": 21, \"sky\": \"clear\"}"}
    result2 = {"role": "tool", "tool_call_id": "call_2", "name": "add", "content": "3.5"}
    think = {"role": "assistant", "content": "<think>\nThe user greets me.\n</think>\n\nHello!"}
    reason = {"role": "assistant", "content": "Hello!", "reasoning_content": "A greeting."}
    cases = {
        "user": [u1],
        "system+user": [sys_m, u1],
        "multi-turn": [sys_m, u1, a1, u2, a2, u3],
        "no-system multi-turn": [u1, a1, u2],
        "ends with assistant": [u1, a1],
        "unicode": [u3],
        "thinking in content": [u1, think, u2],
        "reasoning_content": [u1, reason, u2],
        "tools": [sys_m, ask],
        "tool call and result": [sys_m, ask, call, result],
        "tool call with text": [ask, call_text, result, {"role": "assistant", "content": "It is 21 C."}, u2],
        "two tool calls": [ask, calls2, result, result2],
        "content parts": [{"role": "user", "content": [{"type": "text", "text": "Part one. "},
                                                       {"type": "text", "text": "Part two."}]}],
    }
    tool_cases = {"tools", "tool call and result", "tool call with text", "two tool calls"}
    for name, msgs in cases.items():
        for gen in (True, False):
            ctx = {"messages": msgs, "add_generation_prompt": gen,
                   "bos_token": "<s>", "eos_token": "</s>"}
            if name in tool_cases:
                ctx["tools"] = TOOLS
            yield f"{name}, gen={gen}", ctx
    for think_on in (True, False):
        yield f"enable_thinking={think_on}", {"messages": [sys_m, u1, a1, u2], "add_generation_prompt": True,
                                               "bos_token": "<s>", "eos_token": "</s>",
                                               "enable_thinking": think_on}
    yield "tools+enable_thinking=False", {"messages": [ask, call, result], "tools": TOOLS,
                                          "add_generation_prompt": True, "bos_token": "<s>",
                                          "eos_token": "</s>", "enable_thinking": False}


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    verbose = "-v" in sys.argv
    env = oracle_env()
    tmpls = templates()
    cases = list(conversations())
    jobs = []
    for tname, text in tmpls.items():
        for cname, ctx in cases:
            jobs.append((tname, cname, text, ctx))
    lines = "".join(json.dumps({"template": t, "name": tn, "context": c, "now": NOW},
                               ensure_ascii=False) + "\n" for tn, _, t, c in jobs)
    p = subprocess.run([sys.argv[1]], input=lines.encode(), capture_output=True, check=True)
    answers = [json.loads(x) for x in p.stdout.decode().splitlines()]
    assert len(answers) == len(jobs), (len(answers), len(jobs))

    compiled = {}
    mismatches, equal, both_failed = [], 0, 0
    per_template = {}
    deliberate = set()
    for (tname, cname, text, ctx), ans in zip(jobs, answers):
        try:
            if tname not in compiled:
                compiled[tname] = env.from_string(text)
            want, want_err = compiled[tname].render(**ctx), None
        except Exception as e:  # noqa: BLE001  (any failure of jinja2's is the expectation)
            want, want_err = None, f"{type(e).__name__}: {e}"
        got, got_err = ans.get("text"), ans.get("error")
        stats = per_template.setdefault(tname, [0, 0, 0])
        if want_err is not None and got_err is None and any(
                k in want_err for k in RENDERS_WHERE_JINJA2_FAILS):
            deliberate.add(tname)
            equal += 1
            stats[0] += 1
        elif want_err is not None and got_err is not None:
            both_failed += 1
            stats[1] += 1
            if tname in MUST_RENDER and cname.split(",")[0] in ("user", "system+user", "multi-turn"):
                mismatches.append((tname, cname, f"jinja2 failed: {want_err}", got_err))
        elif want_err is None and got == want:
            equal += 1
            stats[0] += 1
        else:
            stats[2] += 1
            mismatches.append((tname, cname, want if want_err is None else f"ERROR {want_err}",
                               got if got_err is None else f"ERROR {got_err}"))
    for tname, (ok, failed, bad) in per_template.items():
        if verbose or bad:
            print(f"  {tname}: {ok} equal, {failed} failed in both, {bad} differ")
    seen = set()
    for tname, cname, want, got in mismatches:
        if tname in seen:
            continue
        seen.add(tname)
        print(f"MISMATCH {tname} / {cname}\n  jinja2:   {want!r}\n  kvstream: {got!r}")
    for tname in sorted(deliberate):
        print(f"  {tname}: renders where jinja2 fails, on purpose (see RENDERS_WHERE_JINJA2_FAILS)")
    templates_ok = sum(1 for s in per_template.values() if s[2] == 0)
    print(f"test_chat_template: {len(tmpls)} templates x {len(cases)} conversations: "
          f"{equal} equal, {both_failed} failed in both, {len(mismatches)} differ; "
          f"{templates_ok} of {len(tmpls)} templates agree on every conversation")
    sys.exit(1 if mismatches else 0)


if __name__ == "__main__":
    main()
