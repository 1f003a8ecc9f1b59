// llama-server's chat template flags: --jinja/--no-jinja, --chat-template NAME|JINJA,
// --chat-template-file, --chat-template-kwargs, --reasoning-format; declared once for the
// subcommands that chat (serve, run, chat).
#pragma once

#include <CLI/CLI.hpp>
#include <string>

namespace kvs {
class Tokenizer;
}

namespace kvs::cli {

struct ChatTemplateArgs {
  bool no_jinja = false;  // --no-jinja: llama.cpp's formats without Jinja (chat families)
  std::string chat_template, chat_template_file, chat_template_kwargs;
  std::string reasoning_format = "auto";  // none, deepseek, deepseek-legacy, auto
  // --reasoning-format other than none: <think>...</think> becomes reasoning_content.
  bool split_reasoning() const { return reasoning_format != "none"; }
};
void add_chat_template_flags(CLI::App* c, ChatTemplateArgs& a);
// Sets the tokenizer's chat format from the flags; fails naming the flag and, for a template
// that does not parse, its line and column. Says on stderr when the model's own template
// cannot be used.
void apply_chat_template_flags(Tokenizer& tok, const ChatTemplateArgs& a);
// How chats are formatted, for the start line: the model's own Jinja template, one given by
// name or file, a family's format without Jinja, or none.
std::string chat_template_name(const Tokenizer& tok);

}  // namespace kvs::cli
