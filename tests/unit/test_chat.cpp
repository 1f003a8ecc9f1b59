// The chat layer: the Jinja engine's errors (tests/tools/test_chat_template.py checks its output
// against jinja2), ChatFormat's context and BOS handling, and the parsers of a model's answer
// (reasoning, tool calls) whole and streamed, on canned outputs.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kvs/chat/chat_format.h"
#include "kvs/chat/chat_parse.h"
#include "kvs/chat/jinja.h"

namespace kvs {
namespace {

using ojson = nlohmann::ordered_json;

std::string render(const std::string& src, const ojson& ctx = ojson::object()) {
  return jinja::Template(src, "t").render(ctx);
}

std::string error_of(const std::string& src, const ojson& ctx = ojson::object()) {
  try {
    render(src, ctx);
  } catch (const jinja::Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Jinja, Basics) {
  EXPECT_EQ(render("{% for m in messages %}{{ loop.index }}:{{ m.role|upper }} {% endfor %}",
                   {{"messages", {{{"role", "user"}}, {{"role", "assistant"}}}}}),
            "1:USER 2:ASSISTANT ");
  EXPECT_EQ(render("{% set ns = namespace(n=0) %}{% for x in [1, 2, 3] %}{% set ns.n = ns.n + x %}"
                   "{% endfor %}{{ ns.n }}"),
            "6");
  EXPECT_EQ(render("{{ x|tojson }}", {{"x", {{"b", 1}, {"a", {1.5, nullptr, "é"}}}}}),
            "{\"b\": 1, \"a\": [1.5, null, \"é\"]}");
  EXPECT_EQ(render("{{ '  a b  '.strip().split(' ') }} {{ 'abc'[::-1] }} {{ 7 // 2 }} {{ 1 / 2 }}"),
            "['a', 'b'] cba 3 0.5");
  EXPECT_EQ(render("{% macro f(a, b='x') %}{{ a }}{{ b }}{% endmacro %}{{ f(1) }}{{ f(2, b=3) }}"),
            "1x23");
  // trim_blocks and lstrip_blocks, as transformers renders templates.
  EXPECT_EQ(render("  {% if true %}\n  x\n  {% endif %}\n  y\n"), "  x\n  y");
}

TEST(Jinja, ErrorsNameTemplateAndPosition) {
  EXPECT_EQ(error_of("a\n  {% if %}"),
            "template 't' at line 2, column 11: expected an expression, found the end of the tag");
  EXPECT_EQ(error_of("{% for x in y %}"),
            "template 't' at line 1, column 17: the template ended where else or endfor was "
            "expected");
  EXPECT_EQ(error_of("{{ 'a' ~ }}"),
            "template 't' at line 1, column 12: expected an expression, found '}}'");
  EXPECT_EQ(error_of("{% frobnicate %}"),
            "template 't' at line 1, column 4: unknown tag 'frobnicate'");
  EXPECT_EQ(error_of("x\n{{ raise_exception('No tools here') }}"),
            "template 't' at line 2, column 19: raise_exception: No tools here");
  EXPECT_EQ(error_of("{{ messages[0].role }}", {{"messages", ojson::array()}}),
            "template 't' at line 1, column 15: 'list object' has no element 0");
  EXPECT_EQ(error_of("{{ 1 + 'a' }}"),
            "template 't' at line 1, column 6: unsupported operand type(s) for +: 'int' and 'str'");
  EXPECT_EQ(error_of("{% set l = [] %}{{ l.append(1) }}"),
            "template 't' at line 1, column 28: access to attribute 'append' of 'list' object is "
            "unsafe.");
  EXPECT_EQ(error_of("{{ 1|nosuchfilter }}"),
            "template 't' at line 1, column 6: no filter named 'nosuchfilter'");
  // Deep recursion is an error, not a crash.
  EXPECT_NE(error_of("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}").find("recursion"),
            std::string::npos);
  EXPECT_NE(error_of("{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}")
                .find("nested"),
            std::string::npos);
}

TEST(ChatFormat, ContextBosAndKwargs) {
  const std::string src =
      "{{ bos_token }}{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
      "{% if tools %}[{{ tools|length }} tools]{% endif %}"
      "{% if add_generation_prompt %}<assistant>{% endif %}"
      "{% if enable_thinking is defined and not enable_thinking %}(no think){% endif %}";
  ChatTokens t{"<s>", "</s>", true, false};
  const ChatFormat f(src, "test", t, {{"enable_thinking", true}});
  ChatInput in;
  in.messages = {{{"role", "user"}, {"content", "hi"}}};
  // The tokenizer adds BOS: the rendered one is dropped.
  EXPECT_EQ(f.apply(in), "<user>hi<assistant>");
  in.kwargs = {{"enable_thinking", false}};  // the request's kwargs over the server's
  in.tools = {{{"type", "function"}}};
  in.add_generation_prompt = false;
  EXPECT_EQ(f.apply(in), "<user>hi[1 tools](no think)");
  t.add_bos = false;
  EXPECT_EQ(ChatFormat(src, "test", t).apply(in), "<s><user>hi[1 tools](no think)");
  EXPECT_THROW(ChatFormat("{% if %}", "bad", t), jinja::Error);
}

TEST(ChatFormat, Builtins) {
  ChatInput in;
  in.messages = {{{"role", "system"}, {"content", "Be brief."}},
                 {{"role", "user"}, {"content", "Hi!"}}};
  const ChatTokens t{"<s>", "</s>", true, false};
  EXPECT_EQ(ChatFormat(ChatFormat::builtin("chatml"), "chatml", t).apply(in),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n"
            "<|im_start|>assistant\n");
  EXPECT_EQ(ChatFormat(ChatFormat::builtin("llama3"), "llama3", t).apply(in),
            "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_EQ(ChatFormat(ChatFormat::builtin("gemma"), "gemma", t).apply(in),
            "<start_of_turn>user\nBe brief.\n\nHi!<end_of_turn>\n<start_of_turn>model\n");
  in.messages.push_back({{"role", "assistant"}, {"content", "Hello."}});
  in.messages.push_back({{"role", "user"}, {"content", "Bye"}});
  EXPECT_EQ(ChatFormat(ChatFormat::builtin("llama2"), "llama2", t).apply(in),
            "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi! [/INST] Hello. </s><s>[INST] Bye [/INST]");
  EXPECT_EQ(ChatFormat::builtin("nope"), "");
}

ChatParseOptions opts(ToolSyntax s, bool thinking_open = false) {
  ChatParseOptions o;
  o.enabled = true;
  o.tools = s;
  o.thinking_open = thinking_open;
  return o;
}

// Streams `text` in pieces of `step` bytes: the deltas must add up to the whole parse, and
// texts may only grow.
ojson stream(const std::string& text, const ChatParseOptions& o, size_t step) {
  ChatStream s(o);
  std::string content, reasoning;
  size_t calls = 0;
  auto take = [&](const std::vector<ojson>& ds) {
    for (const ojson& d : ds) {
      if (d.contains("content")) content += d["content"].get<std::string>();
      if (d.contains("reasoning_content")) reasoning += d["reasoning_content"].get<std::string>();
      if (d.contains("tool_calls")) {
        EXPECT_EQ(d["tool_calls"][0]["index"], calls);
        ++calls;
      }
    }
  };
  for (size_t k = 0; k < text.size(); k += step) take(s.push(text.substr(k, step)));
  take(s.finish());
  const ojson m = s.message();
  EXPECT_EQ(content, m["content"].is_null() ? "" : m["content"].get<std::string>()) << text;
  EXPECT_EQ(reasoning, m.value("reasoning_content", std::string())) << text;
  EXPECT_EQ(calls, m.contains("tool_calls") ? m["tool_calls"].size() : 0u) << text;
  return m;
}

TEST(ChatParse, PlainTextIsUnchanged) {
  for (const char* t : {"Hello world.\n", "  <b>bold</b> ", "<thin", "a <tool_call", ""}) {
    for (size_t step : {1, 3, 100}) {
      const ojson m = stream(t, opts(ToolSyntax::Hermes), step);
      EXPECT_EQ(m["content"], t);
      EXPECT_FALSE(m.contains("tool_calls"));
    }
  }
}

TEST(ChatParse, Reasoning) {
  const std::string t = "<think>\nThe user greets me.\n</think>\n\nHello!";
  for (size_t step : {1, 2, 7, 100}) {
    const ojson m = stream(t, opts(ToolSyntax::None), step);
    EXPECT_EQ(m["reasoning_content"], "The user greets me.");
    EXPECT_EQ(m["content"], "Hello!");
  }
  // The template opened <think> (Qwen3.5): the answer starts inside the reasoning.
  const ojson m = stream("Let me think.\n</think>\n\nYes.", opts(ToolSyntax::None, true), 3);
  EXPECT_EQ(m["reasoning_content"], "Let me think.");
  EXPECT_EQ(m["content"], "Yes.");
  // --reasoning-format none: the tags stay in the content.
  ChatParseOptions o = opts(ToolSyntax::None);
  o.reasoning = false;
  EXPECT_EQ(stream(t, o, 4)["content"], t);
  // Cut off while reasoning: what came is reasoning.
  EXPECT_EQ(stream("<think>still going", opts(ToolSyntax::None), 5)["reasoning_content"],
            "still going");
}

TEST(ChatParse, HermesToolCalls) {
  const std::string t =
      "<think>\nNeed weather.\n</think>\n\nLet me check.\n<tool_call>\n"
      "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n"
      "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}\n</tool_call>";
  for (size_t step : {1, 5, 1000}) {
    const ojson m = stream(t, opts(ToolSyntax::Hermes), step);
    EXPECT_EQ(m["reasoning_content"], "Need weather.");
    EXPECT_EQ(m["content"], "Let me check.");
    ASSERT_EQ(m["tool_calls"].size(), 2u);
    EXPECT_EQ(m["tool_calls"][0]["function"]["name"], "get_weather");
    EXPECT_EQ(m["tool_calls"][0]["function"]["arguments"], "{\"city\":\"Paris\"}");
    EXPECT_EQ(m["tool_calls"][0]["type"], "function");
    EXPECT_TRUE(m["tool_calls"][0]["id"].get<std::string>().starts_with("call_"));
    EXPECT_EQ(m["tool_calls"][1]["function"]["arguments"], "{\"a\":1,\"b\":2}");
  }
  // Only a call: the content is null.
  const ojson only = stream("<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>",
                            opts(ToolSyntax::Hermes), 4);
  EXPECT_TRUE(only["content"].is_null());
  // A malformed call stays text.
  EXPECT_EQ(stream("<tool_call>\nnot json\n</tool_call>", opts(ToolSyntax::Hermes), 3)["content"],
            "<tool_call>\nnot json\n</tool_call>");
}

TEST(ChatParse, XmlParamToolCalls) {
  ChatParseOptions o = opts(ToolSyntax::XmlParams, true);
  o.tool_defs = ojson::parse(R"([{"type": "function", "function": {"name": "get_weather",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"},
      "days": {"type": "integer"}, "zip": {"type": "string"}}}}}])");
  const std::string t =
      "The user wants weather.\n</think>\n\n<tool_call>\n<function=get_weather>\n"
      "<parameter=city>\nNew York\n</parameter>\n<parameter=days>\n3\n</parameter>\n"
      "<parameter=zip>\n10001\n</parameter>\n</function>\n</tool_call>";
  for (size_t step : {1, 9, 1000}) {
    const ojson m = stream(t, o, step);
    EXPECT_EQ(m["reasoning_content"], "The user wants weather.");
    ASSERT_EQ(m["tool_calls"].size(), 1u);
    EXPECT_EQ(m["tool_calls"][0]["function"]["name"], "get_weather");
    // "10001" is a string by the schema, 3 an integer.
    EXPECT_EQ(m["tool_calls"][0]["function"]["arguments"],
              "{\"city\":\"New York\",\"days\":3,\"zip\":\"10001\"}");
  }
}

TEST(ChatParse, Llama3ToolCalls) {
  const ojson m = stream("{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}",
                         opts(ToolSyntax::Llama3), 2);
  ASSERT_EQ(m["tool_calls"].size(), 1u);
  EXPECT_EQ(m["tool_calls"][0]["function"]["arguments"], "{\"city\":\"Paris\"}");
  EXPECT_EQ(stream("<|python_tag|>{\"name\": \"f\", \"parameters\": {}}", opts(ToolSyntax::Llama3),
                   3)["tool_calls"][0]["function"]["name"],
            "f");
  // Text, or JSON that is no call, is the content.
  EXPECT_EQ(stream("It is sunny.", opts(ToolSyntax::Llama3), 2)["content"], "It is sunny.");
  EXPECT_EQ(stream("{\"a\": 1}", opts(ToolSyntax::Llama3), 2)["content"], "{\"a\": 1}");
}

TEST(ChatParse, SyntaxOfTemplates) {
  EXPECT_EQ(tool_syntax_of("<tool_call>\n<function=example>\n<parameter=x>"),
            ToolSyntax::XmlParams);
  EXPECT_EQ(tool_syntax_of("{{- '<tool_call>\\n{\"name\": \"' }}"), ToolSyntax::Hermes);
  EXPECT_EQ(tool_syntax_of("<|start_header_id|>{% if tools %}"), ToolSyntax::Llama3);
  EXPECT_EQ(tool_syntax_of("<start_of_turn>"), ToolSyntax::None);
}

}  // namespace
}  // namespace kvs
