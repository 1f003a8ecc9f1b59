// libFuzzer: arbitrary bytes as the body of POST /v1/chat/completions and /v1/completions, read
// as kvstream serve reads one (apps/kvstream/request.cpp): the JSON, the messages, the sampling
// fields, stops, token prompts. Every bad body must end in an ApiError (a 4xx naming the field),
// never a crash, a hang or an exception of another kind; a body that is accepted must give a
// prompt that fits the context and token ids of the vocabulary.
#include <cstdint>
#include <string>

#include "kvs/model/synthetic.h"
#include "kvs/gguf/gguf.h"
#include "kvs/tokenizer/tokenizer.h"
#include "request.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const auto file = kvs::make_synthetic("tiny");
  static const auto tok = kvs::Tokenizer::from_gguf(*file);
  static const kvs::cli::RequestRules rules{*tok, 256, {}, -1, 16, false};
  const std::string body(reinterpret_cast<const char*>(data), size);
  for (const bool chat : {true, false}) {
    try {
      const kvs::cli::json b = kvs::cli::parse_body(body);
      const kvs::cli::GenRequest r = chat ? rules.chat_request(b) : rules.completion_request(b);
      if (r.prompt.empty() || r.prompt.size() >= 256) __builtin_trap();
      for (int32_t id : r.prompt)
        if (id < 0 || id >= tok->n_vocab()) __builtin_trap();
    } catch (const kvs::cli::ApiError& e) {
      if (e.status < 400 || e.status >= 500) __builtin_trap();
    }
  }
  return 0;
}
