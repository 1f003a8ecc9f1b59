// How a conversation becomes prompt text, as llama-server does it with --jinja: the model's own
// Jinja chat template (or one given by name or text) rendered over OpenAI's messages, the
// request's tools and the template's keyword arguments (enable_thinking, ...).
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "kvs/chat/jinja.h"

namespace kvs {

// The texts of the vocabulary's special tokens a template may print, and whether the tokenizer
// adds BOS/EOS itself (then a rendered leading BOS or trailing EOS is dropped, as llama.cpp does,
// so that the prompt does not have two).
struct ChatTokens {
  std::string bos, eos;
  bool add_bos = false, add_eos = false;
};

// One conversation to render.
struct ChatInput {
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();  // OpenAI's messages
  nlohmann::ordered_json tools;  // null, or OpenAI's list of tools
  bool add_generation_prompt = true;
  nlohmann::ordered_json kwargs = nlohmann::ordered_json::object();  // chat_template_kwargs
};

class ChatFormat {
 public:
  // A Jinja template's text; `name` is how errors and logs call it. Throws jinja::Error naming
  // the position where it does not parse.
  ChatFormat(const std::string& source, std::string name, ChatTokens tokens,
             nlohmann::ordered_json kwargs = nlohmann::ordered_json::object());

  // The prompt text: the template over messages, tools, add_generation_prompt, bos_token,
  // eos_token, the server's kwargs and then the request's. Throws jinja::Error naming the
  // template and position (a template's raise_exception included).
  std::string apply(const ChatInput& in) const;

  const std::string& name() const { return tmpl_.name(); }
  const std::string& source() const { return tmpl_.source(); }
  const nlohmann::ordered_json& kwargs() const { return kwargs_; }
  // Whether the template reads the request's tools (so that tool calls can be asked for).
  bool reads_tools() const;

  // The Jinja text of a built-in template by name (chatml, llama3, llama2, gemma, command-r),
  // or "".
  static std::string builtin(const std::string& name);
  static const char* builtin_names() { return "chatml, llama3, llama2, gemma, command-r"; }

 private:
  jinja::Template tmpl_;
  ChatTokens tokens_;
  nlohmann::ordered_json kwargs_;
};

}  // namespace kvs
