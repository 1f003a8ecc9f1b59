// The body of a generation request, read and checked: OpenAI's chat and completion fields into
// a GenRequest (scheduler.h), every refusal an ApiError in OpenAI's error shape naming the field.
// Apart from the server so that a fuzzer can drive it without one (tests/fuzz/fuzz_request.cpp).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kvs/engine/sampler.h"
#include "scheduler.h"

namespace kvs {
class Tokenizer;
}

namespace kvs::cli {

using json = nlohmann::json;

// A request the server refuses, with OpenAI's error shape; `extra` fields are added to (or
// replace) those of the error object.
struct ApiError {
  ApiError(int s, std::string m, std::string t = "invalid_request_error", std::string c = "",
           std::string p = "", json x = json::object())
      : status(s),
        message(std::move(m)),
        type(std::move(t)),
        code(std::move(c)),
        param(std::move(p)),
        extra(std::move(x)) {}
  int status;
  std::string message, type, code, param;
  json extra;
};

[[noreturn]] void bad(std::string message, std::string param = "", std::string code = "");

// Typed fields of a request body: absent or null gives `def`; a wrong type or a value out of
// range is a 400 naming the field.
double number(const json& b, const char* key, double def, double lo, double hi);
int64_t integer(const json& b, const char* key, int64_t def, int64_t lo, int64_t hi);
std::string text_of(const json& o, const char* key);  // a string field of an object, or ""
bool boolean(const json& b, const char* key, bool def);

// The body as a JSON object, or a 400 saying why not.
json parse_body(const std::string& body);

// What a request is read against: the server's model, context and defaults.
struct RequestRules {
  const Tokenizer& tok;
  int32_t n_ctx;
  SamplerParams sampling;  // the server's sampling flags
  int64_t seed = -1, n_predict = -1;
  bool ignore_eos = false;
  bool context_shift = false;  // --context-shift
  int32_t keep = 0;            // --keep: a request's default n_keep
  bool split_reasoning = true;  // --reasoning-format: <think> text becomes reasoning_content
  bool enable_thinking = true;  // --reasoning off: the templates' enable_thinking false

  GenRequest chat_request(const json& b) const;
  GenRequest completion_request(const json& b) const;
  // The prompt text of a chat body's messages (the model's template applied, tools and
  // chat_template_kwargs included); `parse` gets how the answer is read (reasoning, tool calls).
  std::string chat_text(const json& b, ChatParseOptions* parse = nullptr) const;
  // llama-server's /completion body (n_predict, n_probs, logit_bias, id_slot, ...) for one of
  // its prompts, already tokenized.
  GenRequest native_request(const json& b, std::vector<int32_t> prompt) const;
  // A prompt of llama-server's: text (BOS added where the vocab wants it, special tokens
  // parsed), token ids, a list mixing both, or {"prompt_string": TEXT}.
  std::vector<int32_t> native_prompt(const json& p) const;

 private:
  GenRequest common(const json& b) const;
  std::vector<std::pair<int32_t, float>> logit_bias(const json& b) const;
  [[noreturn]] void too_long(size_t n_tokens, size_t bytes, const char* field) const;
  void check_text_size(size_t bytes, const char* field) const;
  void set_prompt(GenRequest& r, std::vector<int32_t> ids, const char* field) const;
};

}  // namespace kvs::cli
