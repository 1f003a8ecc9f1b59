#!/usr/bin/env python3
"""`kvstream serve`'s chat templates and tools through the openai client: the request's tools,
tool_choice and chat_template_kwargs reach the template (a template given with
--chat-template-file that shows them, measured in prompt tokens), an agent's turn with a tool
call and its result is accepted, streamed answers with tools add up to the whole one, a
template's raise_exception is a 400 naming the template and position, and a template that does
not parse stops the server with its line and column. (The parsing of tool calls and reasoning
out of an answer is tested on canned outputs in tests/unit/test_chat.cpp.)

usage: serve_tools.py KVSTREAM MODEL"""
import json
import os
import subprocess
import sys
import tempfile

from openai import BadRequestError, OpenAI

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_util import Server, check  # noqa: E402

# ChatML, with the tools shown in the system turn as Qwen3 shows them, and a switch to fail.
TEMPLATE = r"""{%- if fail is defined %}{{ raise_exception('asked to fail') }}{% endif %}
{%- if tools %}
<|im_start|>system
You may call functions. Signatures:
<tools>
{%- for tool in tools %}
{{ tool | tojson }}
{%- endfor %}
</tools>
Answer with <tool_call>{"name": ..., "arguments": ...}</tool_call>.<|im_end|>
{% endif %}
{%- if greeting is defined %}<|im_start|>system
{{ greeting }}<|im_end|>
{% endif %}
{%- for m in messages %}
{%- if m.role == 'tool' %}<|im_start|>user
<tool_response>
{{ m.content }}
</tool_response><|im_end|>
{% elif m.tool_calls %}<|im_start|>assistant
{%- for c in m.tool_calls %}
<tool_call>
{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments | tojson }}}
</tool_call>
{%- endfor %}<|im_end|>
{% else %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]


def main():
    binary, model = sys.argv[1], sys.argv[2]
    with tempfile.NamedTemporaryFile("w", suffix=".jinja", delete=False) as f:
        f.write(TEMPLATE)
        tmpl = f.name

    srv = Server(binary, model, "--chat-template-file", tmpl)
    try:
        client = OpenAI(base_url=srv.url + "/v1", api_key="none")
        ask = [{"role": "user", "content": "What is the weather in Paris?"}]

        def prompt_tokens(**kw):
            r = client.chat.completions.create(model="m", messages=kw.pop("messages", ask),
                                               max_tokens=4, temperature=0, **kw)
            return r.usage.prompt_tokens, r

        plain, _ = prompt_tokens()
        with_tools, r = prompt_tokens(tools=TOOLS)
        check(with_tools > plain + 30,
              f"the tools reach the template: {with_tools} prompt tokens against {plain}")
        check(r.choices[0].finish_reason in ("length", "stop", "tool_calls"), "a finish reason")
        none, _ = prompt_tokens(tools=TOOLS, tool_choice="none")
        check(none == plain, f"tool_choice none keeps the tools out: {none} against {plain}")
        kw, _ = prompt_tokens(extra_body={"chat_template_kwargs": {"greeting": "Be brief."}})
        check(kw > plain, f"chat_template_kwargs reach the template: {kw} against {plain}")

        # An agent's turn: the model's call (arguments as the client sends them, a JSON string)
        # and the tool's result, then the answer.
        turn = ask + [
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function",
                 "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "{\"sky\": \"clear\", \"c\": 21}"},
        ]
        after, r = prompt_tokens(messages=turn, tools=TOOLS)
        check(after > with_tools + 20, f"the call and its result are in the prompt: {after}")
        check(r.choices[0].message.role == "assistant", "an assistant message")

        # Streamed with tools: the deltas add up to the whole answer.
        whole = client.chat.completions.create(model="m", messages=turn, tools=TOOLS,
                                               max_tokens=24, temperature=0)
        text, finish = "", None
        for chunk in client.chat.completions.create(model="m", messages=turn, tools=TOOLS,
                                                    max_tokens=24, temperature=0, stream=True):
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
                finish = chunk.choices[0].finish_reason or finish
        check(text == (whole.choices[0].message.content or ""),
              f"streamed {text!r} against {whole.choices[0].message.content!r}")
        check(finish == whole.choices[0].finish_reason, "the same finish reason streamed")

        # A template's raise_exception: a 400 naming the template and where.
        try:
            prompt_tokens(extra_body={"chat_template_kwargs": {"fail": True}})
            check(False, "a template that raises answers 400")
        except BadRequestError as e:
            msg = json.dumps(e.body)
            check("raise_exception: asked to fail" in msg and tmpl in msg and "line 1" in msg,
                  "the error names the template and position: " + msg)
    finally:
        srv.stop()

    # The model's own template (SmolLM2's adds its system prompt) and --no-jinja's ChatML
    # differ by that prompt; --reasoning-format none is accepted.
    srv = Server(binary, model, "--reasoning-format", "none")
    try:
        own = OpenAI(base_url=srv.url + "/v1", api_key="none").chat.completions.create(
            model="m", messages=[{"role": "user", "content": "Hi"}], max_tokens=2,
            temperature=0).usage.prompt_tokens
    finally:
        srv.stop()
    srv = Server(binary, model, "--no-jinja")
    try:
        family = OpenAI(base_url=srv.url + "/v1", api_key="none").chat.completions.create(
            model="m", messages=[{"role": "user", "content": "Hi"}], max_tokens=2,
            temperature=0).usage.prompt_tokens
    finally:
        srv.stop()
    check(own > family, f"the model's template ({own} tokens) adds its system prompt to "
                        f"ChatML's ({family})")

    # A template that does not parse stops the server, naming where.
    p = subprocess.run([binary, "serve", "-m", model, "--port", "0",
                        "--chat-template", "{% if %}x{% endif %}"],
                       capture_output=True, text=True, timeout=60)
    check(p.returncode != 0 and "--chat-template" in p.stderr and "line 1, column" in p.stderr,
          "a bad --chat-template is refused with its position: " + p.stderr[-500:])
    p = subprocess.run([binary, "serve", "-m", model, "--port", "0", "--chat-template", "nosuch"],
                       capture_output=True, text=True, timeout=60)
    check(p.returncode != 0 and "chatml" in p.stderr, "an unknown name lists the built-in ones")
    os.unlink(tmpl)
    print("serve_tools: OK")


if __name__ == "__main__":
    main()
