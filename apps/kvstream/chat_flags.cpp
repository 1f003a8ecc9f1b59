#include "chat_flags.h"

#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>

#include "kvs/chat/chat_format.h"
#include "kvs/tokenizer/tokenizer.h"
#include "kvs/util/error.h"
#include "options.h"

namespace kvs::cli {

void add_chat_template_flags(CLI::App* c, ChatTemplateArgs& a) {
  // --jinja is the default, as in recent llama-server; the flag is accepted for its scripts.
  c->add_flag("--jinja{false}", a.no_jinja, "Render the model's Jinja chat template (the default)");
  c->add_flag("--no-jinja", a.no_jinja,
              "Use llama.cpp's built-in chat formats (chatml, llama3, llama2, gemma) instead of "
              "the model's Jinja template");
  c->add_option("--chat-template", a.chat_template,
                cat("Chat template: a built-in name (", ChatFormat::builtin_names(),
                    ") or Jinja text, instead of the model's"));
  c->add_option("--chat-template-file", a.chat_template_file,
                "File of a Jinja chat template, instead of the model's");
  c->add_option(
      "--chat-template-kwargs", a.chat_template_kwargs,
      "JSON object of the template's extra arguments, e.g. '{\"enable_thinking\":false}'");
  c->add_option("--reasoning-format", a.reasoning_format,
                "none: <think> text stays in the content; deepseek, auto: it becomes "
                "reasoning_content")
      ->check(CLI::IsMember({"none", "deepseek", "deepseek-legacy", "auto"}))
      ->capture_default_str();
}

std::string chat_template_name(const Tokenizer& tok) {
  if (const ChatFormat* f = tok.chat_format())
    return f->source() == tok.chat_template() ? "its own chat template"
                                              : cat("chat template ", f->name());
  if (tok.chat_family() == "none") return "no chat template";
  return cat(tok.chat_family(), " chat format");
}

void apply_chat_template_flags(Tokenizer& tok, const ChatTemplateArgs& a) {
  KVS_CHECK(a.chat_template.empty() || a.chat_template_file.empty(),
            "give --chat-template or --chat-template-file, not both");
  if (a.no_jinja) {
    // llama.cpp's formats without Jinja: a family by name or as detected in a template's text.
    tok.set_chat_format(nullptr);
    const std::string given =
        a.chat_template_file.empty() ? a.chat_template : read_file(a.chat_template_file);
    if (given.empty()) return;
    const bool named = given == "chatml" || given == "llama3" || given == "llama2" || given == "gemma";
    const std::string family = named ? given : Tokenizer::chat_family_of(given);
    if (family != "none") {
      tok.set_chat_family(family);
      return;
    }
    // Another of llama.cpp's built-in formats (command-r) is kvstream's built-in template.
    KVS_CHECK(!ChatFormat::builtin(a.chat_template).empty(),
              a.chat_template_file.empty() ? "--chat-template" : "--chat-template-file",
              " with --no-jinja must name a built-in format (", ChatFormat::builtin_names(),
              ") or be a template of chatml, llama3, llama2 or gemma");
  }
  nlohmann::ordered_json kwargs = nlohmann::ordered_json::object();
  if (!a.chat_template_kwargs.empty()) {
    kwargs = nlohmann::ordered_json::parse(a.chat_template_kwargs, nullptr, false);
    KVS_CHECK(kwargs.is_object(), "--chat-template-kwargs must be a JSON object, got '",
              a.chat_template_kwargs, "'");
  }
  std::string text, name;
  if (!a.chat_template_file.empty()) {
    text = read_file(a.chat_template_file);
    name = a.chat_template_file;
  } else if (!a.chat_template.empty()) {
    text = ChatFormat::builtin(a.chat_template);
    name = a.chat_template;
    if (text.empty()) {
      // A template's text (any with Jinja syntax or spaces, as llama-server renders it); a bare
      // word is a name, and an unknown one is refused.
      KVS_CHECK(a.chat_template.find_first_of("{ \n") != std::string::npos,
                "--chat-template '", a.chat_template, "' is neither a built-in name (",
                ChatFormat::builtin_names(), ") nor a Jinja template");
      text = a.chat_template;
      name = "--chat-template";
    }
  } else if (const ChatFormat* f = tok.chat_format()) {
    if (kwargs.empty()) return;
    text = f->source();
    name = f->name();
  } else {
    if (!tok.chat_format_error().empty())
      std::fprintf(stderr,
                   "kvstream: warning: the model's chat template cannot be used (%s); using the "
                   "%s format\n",
                   tok.chat_format_error().c_str(), tok.chat_family().c_str());
    return;
  }
  try {
    tok.set_chat_format(std::make_shared<ChatFormat>(text, name, tok.chat_tokens(), kwargs));
  } catch (const jinja::Error& e) {
    throw Error(e.what());
  }
}

}  // namespace kvs::cli
