// Tokenizer::from_gguf: tokenizer.ggml.* metadata into a VocabData. Kept apart from the
// tokenizers so that they link without the GGUF reader.
#include "kvs/gguf/gguf.h"
#include "kvs/tokenizer/tokenizer.h"
#include "kvs/tokenizer/vocab.h"
#include "kvs/util/error.h"

namespace kvs {

std::unique_ptr<Tokenizer> Tokenizer::from_gguf(const gguf::File& f) {
  tok::VocabData v;
  v.model = f.get_string("tokenizer.ggml.model");
  v.pre = f.get_string("tokenizer.ggml.pre", std::string("default"));

  const auto strings = [&](const char* key, std::vector<std::string>& out) {
    const gguf::Value* val = f.find(key);
    if (!val) return;
    const gguf::Array& a = val->as_array(key);
    out.reserve(a.size());
    for (const gguf::Value& e : a) out.push_back(e.as_string(key));
  };
  strings("tokenizer.ggml.tokens", v.tokens);
  KVS_CHECK(!v.tokens.empty(), f.name(), ": tokenizer.ggml.tokens is missing or empty");
  strings("tokenizer.ggml.merges", v.merges);
  if (const gguf::Value* t = f.find("tokenizer.ggml.token_type")) {
    for (const gguf::Value& e : t->as_array("tokenizer.ggml.token_type"))
      v.types.push_back(static_cast<int32_t>(e.as_int("tokenizer.ggml.token_type")));
  }
  if (const gguf::Value* s = f.find("tokenizer.ggml.scores")) {
    for (const gguf::Value& e : s->as_array("tokenizer.ggml.scores"))
      v.scores.push_back(static_cast<float>(e.as_float("tokenizer.ggml.scores")));
  }
  const auto id = [&](const char* key) { return static_cast<int32_t>(f.get_int(key, -1)); };
  v.bos = id("tokenizer.ggml.bos_token_id");
  v.eos = id("tokenizer.ggml.eos_token_id");
  v.eot = id("tokenizer.ggml.eot_token_id");
  v.eom = id("tokenizer.ggml.eom_token_id");
  v.unk = id("tokenizer.ggml.unknown_token_id");
  v.pad = id("tokenizer.ggml.padding_token_id");
  const auto flag = [&](const char* key) -> std::optional<bool> {
    if (!f.find(key)) return std::nullopt;
    return f.get_bool(key);
  };
  v.add_bos = flag("tokenizer.ggml.add_bos_token");
  v.add_eos = flag("tokenizer.ggml.add_eos_token");
  v.add_space_prefix = flag("tokenizer.ggml.add_space_prefix");
  v.chat_template = f.get_string("tokenizer.chat_template", std::string());
  try {
    return tok::make_tokenizer(v);
  } catch (const Error& e) {
    fail(f.name(), ": ", e.what());
  }
}

}  // namespace kvs
