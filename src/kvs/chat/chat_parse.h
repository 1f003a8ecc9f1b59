// A chat model's output as OpenAI's message, as llama-server parses it: reasoning split out of
// <think>...</think> (--reasoning-format) and tool calls in the convention of the model's
// template (Qwen3/Hermes <tool_call>{json}</tool_call>, Qwen3.5/Qwen3-Coder
// <tool_call><function=NAME><parameter=P>...</tool_call>, Llama 3.x's bare JSON object), whole
// at the end or as streamed deltas while it is generated.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace kvs {

// How a template's models write tool calls.
enum class ToolSyntax {
  None,       // no tool calls are parsed
  Hermes,     // <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call> (Qwen2.5, Qwen3)
  XmlParams,  // <tool_call>\n<function=NAME>\n<parameter=P>\nV\n</parameter>...</tool_call>
  Llama3,     // {"name": ..., "parameters": {...}} as the whole answer (<|python_tag|> optional)
};

// The convention of a template's text ("none" where it shows no tool calls).
ToolSyntax tool_syntax_of(const std::string& template_source);
const char* tool_syntax_name(ToolSyntax s);

struct ChatParseOptions {
  bool enabled = false;  // off: the text is the content, as it is
  ToolSyntax tools = ToolSyntax::None;
  bool reasoning = true;             // --reasoning-format deepseek/auto: <think> goes to reasoning
  bool thinking_open = false;        // the prompt ended inside <think> (the template opened it)
  nlohmann::ordered_json tool_defs;  // the request's tools: parameter types for XmlParams
};

struct ToolCall {
  std::string id, name, arguments;  // arguments: JSON text of an object
};

struct ChatMsg {
  std::string content, reasoning;
  std::vector<ToolCall> tool_calls;
};

// The message of `text`; with `partial`, what may still change is held back (a marker's start,
// an unclosed tool call, trailing whitespace) so that later parses only extend it.
ChatMsg parse_chat_output(const std::string& text, const ChatParseOptions& o, bool partial);

// Streams a message: push() takes each piece of generated text and returns OpenAI's delta
// objects for it ({"content"}, {"reasoning_content"}, {"tool_calls": [...]}); finish() the
// rest. message() is the whole message at the end, in OpenAI's shape.
class ChatStream {
 public:
  explicit ChatStream(ChatParseOptions o) : o_(std::move(o)) {}
  std::vector<nlohmann::ordered_json> push(const std::string& text);
  std::vector<nlohmann::ordered_json> finish();
  nlohmann::ordered_json message() const;
  bool has_tool_calls() const { return !msg_.tool_calls.empty(); }

 private:
  std::vector<nlohmann::ordered_json> update(bool partial);

  ChatParseOptions o_;
  std::string text_;
  ChatMsg msg_;  // what has been sent: its texts only grow
  std::vector<std::string> ids_;
};

}  // namespace kvs
