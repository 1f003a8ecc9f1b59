// libFuzzer: arbitrary bytes as text through the tokenizers kvstream ships: byte-level BPE (the
// synthetic vocabulary's, and the files of KVS_FUZZ_MODELS, colon-separated: SmolLM2's BPE and
// Gemma 3's SentencePiece in CI), with and without special tokens; ids decoded back. Invalid
// UTF-8 must not crash; the synthetic vocabulary, which has every byte, must give valid UTF-8
// back exactly (a real vocab may lack a byte, which is then dropped, as llama.cpp does).
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kvs/gguf/gguf.h"
#include "kvs/model/synthetic.h"
#include "kvs/tokenizer/tokenizer.h"
#include "kvs/tokenizer/vocab.h"
#include "kvs/util/error.h"

namespace {

struct Loaded {
  std::unique_ptr<kvs::gguf::File> file;
  std::unique_ptr<kvs::Tokenizer> tok;
  bool every_byte;
};

std::vector<Loaded> load() {
  std::vector<Loaded> v;
  auto add = [&](std::unique_ptr<kvs::gguf::File> f, bool every_byte) {
    auto t = kvs::Tokenizer::from_gguf(*f);
    v.push_back({std::move(f), std::move(t), every_byte});
  };
  add(kvs::make_synthetic("tiny"), true);
  if (const char* env = std::getenv("KVS_FUZZ_MODELS")) {
    std::string_view s(env);
    while (!s.empty()) {
      const size_t c = s.find(':');
      const std::string path(s.substr(0, c));
      if (!path.empty()) add(kvs::gguf::File::open(path), false);
      s = c == std::string_view::npos ? std::string_view() : s.substr(c + 1);
    }
  }
  return v;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::vector<Loaded> toks = load();
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  bool valid = true;
  for (size_t i = 0; i < text.size() && valid;) {
    const size_t n = kvs::tok::utf8_char_len(text, i);
    valid = n > 0;
    i += n;
  }
  for (const Loaded& l : toks) {
    for (const bool special : {false, true}) {
      try {
        const std::vector<int32_t> ids = l.tok->encode(text, false, special);
        for (int32_t id : ids)
          if (id < 0 || id >= l.tok->n_vocab()) __builtin_trap();
        const std::string back = l.tok->decode(ids, special);
        if (l.every_byte && !special && valid && back != text) __builtin_trap();
      } catch (const kvs::Error&) {  // refusing a text (invalid UTF-8) by name is allowed
      }
    }
  }
  return 0;
}
