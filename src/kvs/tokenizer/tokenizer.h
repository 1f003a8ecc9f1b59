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
class ChatFormat;
struct ChatInput;
struct ChatTokens;
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
  // one after the other, a plain completion): llama.cpp's formats without Jinja (--no-jinja).
  const std::string& chat_family() const { return chat_family_; }
  bool has_chat_template() const { return has_chat_template_; }
  std::string apply_chat_family(const std::vector<ChatMessage>& msgs) const;
  // The family of a template's text ("none" where it is none of them), and replacing the
  // file's (--no-jinja with --chat-template).
  static std::string chat_family_of(const std::string& chat_template);
  void set_chat_family(std::string family) { chat_family_ = std::move(family); }

  // The Jinja chat format prompts are rendered with (src/kvs/chat/chat_format.h): by default
  // the file's own tokenizer.chat_template where it parses, else none and the family's format
  // (chat_format_error() says why); the CLI's --chat-template and --no-jinja replace it.
  const ChatFormat* chat_format() const { return chat_format_.get(); }
  void set_chat_format(std::shared_ptr<const ChatFormat> f) { chat_format_ = std::move(f); }
  const std::string& chat_template() const { return chat_template_; }
  const std::string& chat_format_error() const { return chat_format_error_; }
  ChatTokens chat_tokens() const;
  // Whether chats get a chat format (a template or a family), not a plain completion.
  bool has_chat() const { return chat_format_ != nullptr || chat_family_ != "none"; }
  // The prompt of a conversation ending with the assistant's turn open, through the chat format
  // where there is one, else the family's; throws jinja::Error where the template fails.
  std::string apply_chat(const std::vector<ChatMessage>& msgs) const;
  // The same for OpenAI's messages with tools and template arguments; without a Jinja format the
  // messages' texts go to the family's format and the tools are not shown.
  std::string apply_chat(const ChatInput& in) const;

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
  std::string chat_template_, chat_format_error_;
  std::shared_ptr<const ChatFormat> chat_format_;
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
