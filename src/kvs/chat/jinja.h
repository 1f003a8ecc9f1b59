// A Jinja2 template engine for chat templates: the subset of Jinja2 that Hugging Face's chat
// templates use (statements if/for/set/macro/call/filter/break/continue, expressions with
// Python's semantics, jinja2's filters and tests, Python's str/dict/list methods), rendered as
// transformers renders them (trim_blocks, lstrip_blocks, its tojson, raise_exception,
// strftime_now) over JSON values. Checked string for string against Python's jinja2
// (tests/tools/test_chat_template.py).
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

namespace kvs::jinja {

struct Program;

// A template that fails to parse or render: the message names the template and, where the
// fault has one, the line and column ("template 'qwen3' at 12:5: ...").
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

struct RenderOptions {
  // strftime_now's clock, seconds since the epoch; 0: the current time. Tests fix it so that
  // templates that print today's date render the same in both engines.
  int64_t now = 0;
};

class Template {
 public:
  // Parses `source`; `name` is how errors call it. Throws Error naming the position.
  Template(std::string source, std::string name);
  ~Template();
  Template(Template&&) noexcept;
  Template& operator=(Template&&) noexcept;

  // The text for a context of JSON variables (messages, tools, add_generation_prompt, ...),
  // its objects' keys in their order. Throws Error naming the template and position, also for
  // a template's raise_exception().
  std::string render(const nlohmann::ordered_json& context, const RenderOptions& o = {}) const;
  const std::string& name() const { return name_; }
  const std::string& source() const { return source_; }

 private:
  std::string source_, name_;
  std::unique_ptr<Program> program_;
};

}  // namespace kvs::jinja
