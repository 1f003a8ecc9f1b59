// Internal: byte-level BPE pieces shared by the tokenizer and the synthetic vocab builder.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "kvs/tokenizer/tokenizer.h"
#include "kvs/tokenizer/vocab.h"

namespace kvs::tok {

// GPT-2's byte -> printable character table (each entry one UTF-8 character).
const std::array<std::string, 256>& byte_to_unicode();

// A sequence of PCRE2 regexes; each one splits the pieces the one before left.
class Pretokenizer {
 public:
  explicit Pretokenizer(const std::vector<std::string>& regexes);
  ~Pretokenizer();
  Pretokenizer(const Pretokenizer&) = delete;
  Pretokenizer& operator=(const Pretokenizer&) = delete;
  std::vector<std::string_view> split(std::string_view text) const;

 private:
  std::vector<void*> codes_;  // pcre2_code*, kept opaque so pcre2.h stays in bpe.cpp
};

class BpeTokenizer : public Tokenizer {
 public:
  explicit BpeTokenizer(const VocabData& v);
  std::vector<int32_t> encode(std::string_view text, bool add_bos,
                              bool parse_special) const override;
  std::string token_to_piece(int32_t id, bool special) const override;

 private:
  struct Merge {
    int32_t rank, result;
  };
  static uint64_t pair_key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;

  bool ignore_merges_ = false;  // a piece that is a whole token is taken as is (Llama 3)
  Pretokenizer pre_;
  bool add_eos_ = false;
  SpecialMatcher specials_;
  std::array<int32_t, 256> byte_id_{};  // byte -> its single-byte token, or -1
  std::unordered_map<uint64_t, Merge> merges_;
  std::vector<std::string> pieces_;  // token id -> the bytes it stands for
};

}  // namespace kvs::tok
