// Internal: the tokenizer.ggml.* contents as plain vectors, so tokenizers can be built (and
// tested) without a GGUF file, plus the UTF-8 helpers the tokenizers share.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kvs/tokenizer/tokenizer.h"
#include "kvs/util/utf8.h"

namespace kvs::tok {

enum TokenType : int32_t {
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUser = 4,
  kUnused = 5,
  kByte = 6
};

struct VocabData {
  std::string model = "gpt2";  // "gpt2" (byte-level BPE) or "llama" (SentencePiece BPE)
  std::string pre = "default";
  std::vector<std::string> tokens;
  std::vector<int32_t> types;       // empty: all normal
  std::vector<std::string> merges;  // byte-level BPE only, "left right" in rank order
  std::vector<float> scores;        // SentencePiece only
  int32_t bos = -1, eos = -1, eot = -1, eom = -1, unk = -1, pad = -1;
  std::optional<bool> add_bos, add_eos;
  std::optional<bool> add_space_prefix;  // SentencePiece; default true
  std::string chat_template;
};

// Builds the tokenizer for `v.model`; fails naming an unknown model or pre-tokenizer.
std::unique_ptr<Tokenizer> make_tokenizer(const VocabData& v);

// Length of the UTF-8 sequence starting at s[i] if it is complete and valid, else 0.
size_t utf8_char_len(std::string_view s, size_t i);
// `s` with every byte that does not start a well-formed sequence replaced by U+FFFD, one a byte,
// as llama.cpp's BPE reads text (lead and continuation bits only: overlong forms pass).
std::string replace_invalid_utf8(std::string_view s);
// Decodes the valid character at s[i] (utf8_char_len(s, i) must be > 0).
uint32_t utf8_decode(std::string_view s, size_t i, size_t len);

// Splits `text` around special tokens: returns (token id or -1, text span) fragments in order.
// Control tokens are matched only with parse_special; user-defined ones always (as llama.cpp
// and HF tokenizers do). Leftmost match wins, then the longest.
struct Fragment {
  int32_t id;  // -1: raw text
  std::string_view text;
};
class SpecialMatcher {
 public:
  void build(const std::vector<std::string>& tokens, const std::vector<int32_t>& types);
  std::vector<Fragment> split(std::string_view text, bool parse_special) const;

 private:
  struct Entry {
    std::string text;
    int32_t id;
    bool control;
  };
  std::vector<Entry> by_first_byte_[256];  // longest first
};

}  // namespace kvs::tok
