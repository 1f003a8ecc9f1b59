// Tokenizers from GGUF vocabularies: byte-level BPE (gpt2 model, pre-tokenizer regexes of
// llama3, qwen2, smollm and gpt2 through PCRE2) and SentencePiece-style BPE (llama model),
// special tokens, streaming detokenization and chat templates.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace kvs {
namespace gguf {
class File;
}
namespace tok {
struct VocabData;
}

struct ChatMessage {
  std::string role;  // "system", "user", "assistant"
  std::string content;
};

class Tokenizer {
 public:
  // Reads tokenizer.ggml.* from the file; fails on an unknown tokenizer model or pre-tokenizer.
  static std::unique_ptr<Tokenizer> from_gguf(const gguf::File& f);
  virtual ~Tokenizer() = default;

  // Text -> ids. With parse_special, control/user-defined tokens written in the text
  // ("<|im_start|>") become their ids; add_bos prepends BOS when the vocab asks for it
  // (tokenizer.ggml.add_bos_token) or, when that key is absent, per model type.
  virtual std::vector<int32_t> encode(std::string_view text, bool add_bos,
                                      bool parse_special) const = 0;
  // The bytes a token stands for (byte tokens decoded, SentencePiece "▁" as space).
  // Control tokens give their text only with `special`.
  virtual std::string token_to_piece(int32_t id, bool special) const = 0;
  std::string decode(const std::vector<int32_t>& ids, bool special = false) const;

  int32_t n_vocab() const { return static_cast<int32_t>(tokens_.size()); }
  const std::string& token_text(int32_t id) const { return tokens_.at(static_cast<size_t>(id)); }
  int32_t bos() const { return bos_; }
  int32_t eos() const { return eos_; }
  bool add_bos() const { return add_bos_; }
  // End of generation: eos, eot, eom, or a control token such as <|im_end|>.
  bool is_eog(int32_t id) const;
  // Id of a token by its exact text, or -1.
  int32_t find(std::string_view text) const;
  // The most bytes of text one token can stand for (at most its vocab text's length, at least
  // one UTF-8 character's): a text of more than n times this many bytes has more than n tokens.
  size_t max_token_bytes() const { return max_token_bytes_; }

  // Chat template family detected from tokenizer.chat_template ("chatml", "llama3", "llama2",
  // "gemma"; "none" where the file has no template or one of another family), and the prompt
  // text for a conversation ending with the assistant's turn open ("none": the messages' texts
  // one after the other, a plain completion).
  const std::string& chat_family() const { return chat_family_; }
  bool has_chat_template() const { return has_chat_template_; }
  std::string apply_chat(const std::vector<ChatMessage>& msgs) const;
  // The family of a template's text, as detected from the file ("none" where unknown).
  static std::string chat_family_of(const std::string& chat_template);
  // Replaces the file's family (serve --chat-template NAME or --chat-template-file).
  void set_chat_family(std::string family) {
    chat_family_ = std::move(family);
    has_chat_template_ = true;
  }

 protected:
  // Copies tokens, types, special ids, add_bos and the chat family from the vocab.
  void init_common(const tok::VocabData& v);

  std::vector<std::string> tokens_;
  std::vector<int32_t> types_;  // tokenizer.ggml.token_type (1 normal, 3 control, 4 user, 6 byte)
  int32_t bos_ = -1, eos_ = -1;
  std::vector<int32_t> eog_;
  bool add_bos_ = false;
  std::string chat_family_ = "none";
  bool has_chat_template_ = false;
  std::unordered_map<std::string, int32_t> index_;  // token text -> id
  bool strip_first_space_ = false;  // SentencePiece: decode drops the prefix space encode added
  size_t max_token_bytes_ = 4;
};

// Accumulates token pieces and releases only complete UTF-8 characters, so a multi-byte
// character split over two tokens is never printed half.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tok) : tok_(tok) {}
  std::string push(int32_t id);  // the complete text that this token finishes
  std::string flush();           // whatever is left (invalid bytes as U+FFFD)

 private:
  const Tokenizer& tok_;
  std::string pending_;
};

// A byte-level BPE vocabulary for synthetic models: the 256 byte tokens, merges learned from
// a built-in text, and ChatML special tokens, written as tokenizer.ggml.* metadata so that
// kvstream and llama.cpp can both load the file.
struct SyntheticVocab {
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  std::vector<std::string> merges;
  int32_t bos = 0, eos = 0;
  std::string model = "gpt2", pre = "gpt-2";  // tokenizer.ggml.model / .pre to write
  std::string chat_template;                 // a ChatML template
};
SyntheticVocab make_synthetic_vocab(int32_t n_vocab);

}  // namespace kvs
