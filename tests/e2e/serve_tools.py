#!/usr/bin/env python3
"""`kvstream serve`'s chat templates and tools through the openai client: the request's tools,
tool_choice and chat_template_kwargs reach the template (a template given with
--chat-template-file that shows them, measured in prompt tokens), an agent's turn with a tool
call and its result is accepted, streamed answers with tools add up to the whole one, a
template's raise_exception is a 400 naming the template and position, and a template that does
not parse stops the server with its line and column. (The parsing of tool calls and reasoning
out of an answer is tested on canned outputs in tests/unit/test_chat.cpp.) An agent's loop with
tool_choice required, through the openai and the anthropic clients.

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


# Qwen3.5's convention (the parser and the forced call's grammar follow <function=...> and
# <parameter=...> blocks).
XML_TEMPLATE = r"""{%- if tools %}<|im_start|>system
You have these functions:
{%- for tool in tools %}
{{ tool.function | tojson }}
{%- endfor %}
To call one, answer:
<tool_call>
<function=NAME>
<parameter=PARAM>
VALUE
</parameter>
</function>
</tool_call><|im_end|>
{% endif %}
{%- for m in messages %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""


def xml_call(binary, model):
    """tool_choice required in the XML convention: the call's values follow their types."""
    with tempfile.NamedTemporaryFile("w", suffix=".jinja", delete=False) as f:
        f.write(XML_TEMPLATE)
        tmpl = f.name
    srv = Server(binary, model, "--chat-template-file", tmpl)
    try:
        client = OpenAI(base_url=srv.url + "/v1", api_key="none")
        timer = [{"type": "function", "function": {
            "name": "set_timer", "description": "Start a timer.",
            "parameters": {"type": "object", "properties": {"minutes": {"type": "integer"},
                                                            "loud": {"type": "boolean"}},
                           "required": ["minutes"]}}}]
        r = client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "Set a timer for ten minutes."}],
            tools=timer, tool_choice="required", max_tokens=48, temperature=0)
        calls = r.choices[0].message.tool_calls or []
        check(r.choices[0].finish_reason == "tool_calls" and len(calls) == 1 and
              calls[0].function.name == "set_timer" and
              isinstance(json.loads(calls[0].function.arguments).get("minutes"), int),
              "an XML call with an integer: %r" % r.choices[0])
    finally:
        srv.stop()
        os.unlink(tmpl)


def agent_loop(srv, client):
    """An agent's loop end to end: tool_choice "required" holds the answer to a call (by a
    grammar in the template's convention), the client runs the tool and sends its result, the
    model answers; through the openai client (whole and streamed) and the anthropic client."""
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    r = client.chat.completions.create(model="m", messages=ask, tools=TOOLS,
                                       tool_choice="required", max_tokens=64, temperature=0)
    msg = r.choices[0].message
    check(r.choices[0].finish_reason == "tool_calls" and msg.tool_calls
          and msg.tool_calls[0].function.name == "get_weather",
          f"tool_choice required gives a call: {msg}")
    args = json.loads(msg.tool_calls[0].function.arguments)
    check(isinstance(args.get("city"), str), f"the call's arguments follow the schema: {args}")
    streamed = {}
    for chunk in client.chat.completions.create(model="m", messages=ask, tools=TOOLS,
                                                tool_choice="required", max_tokens=64,
                                                temperature=0, stream=True):
        for c in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            t = streamed.setdefault(c.index, {"name": "", "arguments": ""})
            t["name"] += (c.function.name or "") if c.function else ""
            t["arguments"] += (c.function.arguments or "") if c.function else ""
    check(list(streamed.values()) == [{"name": "get_weather",
                                        "arguments": msg.tool_calls[0].function.arguments}],
          f"the streamed call is the whole one's: {streamed}")
    turn = ask + [msg.model_dump(exclude_none=True),
                  {"role": "tool", "tool_call_id": msg.tool_calls[0].id,
                   "content": json.dumps({"sky": "clear", "c": 21})}]
    final = client.chat.completions.create(model="m", messages=turn, tools=TOOLS,
                                           max_tokens=24, temperature=0)
    check(final.choices[0].finish_reason in ("stop", "length")
          and isinstance(final.choices[0].message.content, str),
          f"the answer after the tool's result: {final.choices[0]}")
    try:
        client.chat.completions.create(model="m", messages=ask, tools=TOOLS, max_tokens=4,
                                       tool_choice={"type": "function",
                                                    "function": {"name": "nosuch"}})
        check(False, "a tool_choice naming no tool answers 400")
    except BadRequestError as e:
        check("nosuch" in json.dumps(e.body), "the 400 names the tool: " + json.dumps(e.body))

    import anthropic
    ac = anthropic.Anthropic(base_url=srv.url, api_key="none")
    tools = [{"name": t["function"]["name"], "description": t["function"]["description"],
              "input_schema": t["function"]["parameters"]} for t in TOOLS]
    m = ac.messages.create(model="m", max_tokens=64, tools=tools, tool_choice={"type": "any"},
                           messages=ask, extra_body={"temperature": 0})
    use = [b for b in m.content if b.type == "tool_use"]
    check(m.stop_reason == "tool_use" and use and use[0].name == "get_weather"
          and isinstance(use[0].input.get("city"), str), f"anthropic: a tool_use block: {m}")
    with ac.messages.stream(model="m", max_tokens=64, tools=tools, tool_choice={"type": "any"},
                            messages=ask, extra_body={"temperature": 0}) as s:
        sm = s.get_final_message()
    check([b.model_dump() for b in sm.content] == [b.model_dump() for b in m.content
                                                   if b.type != "tool_use"] +
          [dict(b.model_dump(), id=sm.content[-1].id) for b in use],
          f"anthropic: the streamed message is the whole one: {sm.content} against {m.content}")
    history = ask + [{"role": "assistant", "content": [b.model_dump() for b in m.content]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use[0].id,
                                                   "content": "clear, 21 C"}]}]
    after = ac.messages.create(model="m", max_tokens=24, tools=tools, messages=history,
                               extra_body={"temperature": 0})
    check(after.stop_reason in ("end_turn", "max_tokens") and after.content
          and after.content[0].type == "text", f"anthropic: the answer after the result: {after}")


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

        agent_loop(srv, client)
    finally:
        srv.stop()

    xml_call(binary, model)

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
