// Shared tokenizer parts: vocab bookkeeping, special-token splitting, decoding, streaming
// detokenization and the factory that picks the tokenizer for a model type.
#include "kvs/tokenizer/tokenizer.h"

#include <algorithm>

#include "kvs/chat/chat_format.h"
#include "kvs/tokenizer/vocab.h"
#include "kvs/util/error.h"

namespace kvs {
namespace tok {

std::unique_ptr<Tokenizer> make_bpe(const VocabData& v);  // bpe.cpp
std::unique_ptr<Tokenizer> make_spm(const VocabData& v);  // spm.cpp

std::unique_ptr<Tokenizer> make_tokenizer(const VocabData& v) {
  KVS_CHECK(!v.tokens.empty(), "tokenizer: the vocabulary is empty");
  KVS_CHECK(v.types.empty() || v.types.size() == v.tokens.size(), "tokenizer: ", v.types.size(),
            " token types for ", v.tokens.size(), " tokens");
  KVS_CHECK(v.scores.empty() || v.scores.size() == v.tokens.size(), "tokenizer: ", v.scores.size(),
            " scores for ", v.tokens.size(), " tokens");
  if (v.model == "gpt2") return make_bpe(v);
  if (v.model == "llama") return make_spm(v);
  fail("tokenizer: unsupported tokenizer model '", v.model, "' (supported: gpt2, llama)");
}

size_t utf8_char_len(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<uint8_t>(s[k]); };
  const uint8_t c = b(i);
  size_t n;
  uint32_t min;
  if (c < 0x80) return 1;
  if ((c & 0xE0) == 0xC0) {
    n = 2, min = 0x80;
  } else if ((c & 0xF0) == 0xE0) {
    n = 3, min = 0x800;
  } else if ((c & 0xF8) == 0xF0) {
    n = 4, min = 0x10000;
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k)
    if ((b(i + k) & 0xC0) != 0x80) return 0;
  const uint32_t cp = utf8_decode(s, i, n);
  // Overlong forms, surrogates and values past U+10FFFF are not valid UTF-8.
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return n;
}

std::string replace_invalid_utf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  const auto cont = [&](size_t k) {
    return k < s.size() && (static_cast<uint8_t>(s[k]) & 0xC0) == 0x80;
  };
  for (size_t i = 0; i < s.size();) {
    const uint8_t c = static_cast<uint8_t>(s[i]);
    size_t n = 0;
    if (c < 0x80) n = 1;
    else if ((c & 0xE0) == 0xC0) n = 2;
    else if ((c & 0xF0) == 0xE0) n = 3;
    else if ((c & 0xF8) == 0xF0) n = 4;
    for (size_t k = 1; k < n; ++k)
      if (!cont(i + k)) n = 0;
    if (n == 0) {
      out += "\xEF\xBF\xBD";
      ++i;
    } else {
      out.append(s, i, n);
      i += n;
    }
  }
  return out;
}

uint32_t utf8_decode(std::string_view s, size_t i, size_t len) {
  const auto b = [&](size_t k) { return static_cast<uint32_t>(static_cast<uint8_t>(s[k])); };
  switch (len) {
    case 1:
      return b(i);
    case 2:
      return ((b(i) & 0x1F) << 6) | (b(i + 1) & 0x3F);
    case 3:
      return ((b(i) & 0x0F) << 12) | ((b(i + 1) & 0x3F) << 6) | (b(i + 2) & 0x3F);
    default:
      return ((b(i) & 0x07) << 18) | ((b(i + 1) & 0x3F) << 12) | ((b(i + 2) & 0x3F) << 6) |
             (b(i + 3) & 0x3F);
  }
}

void SpecialMatcher::build(const std::vector<std::string>& tokens,
                           const std::vector<int32_t>& types) {
  for (auto& b : by_first_byte_) b.clear();
  for (size_t i = 0; i < types.size(); ++i) {
    if ((types[i] != kControl && types[i] != kUser) || tokens[i].empty()) continue;
    by_first_byte_[static_cast<uint8_t>(tokens[i][0])].push_back(
        {tokens[i], static_cast<int32_t>(i), types[i] == kControl});
  }
  for (auto& b : by_first_byte_)
    std::stable_sort(b.begin(), b.end(),
                     [](const Entry& x, const Entry& y) { return x.text.size() > y.text.size(); });
}

std::vector<Fragment> SpecialMatcher::split(std::string_view text, bool parse_special) const {
  std::vector<Fragment> out;
  size_t start = 0;  // start of the pending raw text
  for (size_t i = 0; i < text.size();) {
    const Entry* hit = nullptr;
    for (const Entry& e : by_first_byte_[static_cast<uint8_t>(text[i])]) {
      if (e.control && !parse_special) continue;
      if (text.compare(i, e.text.size(), e.text) == 0) {
        hit = &e;
        break;
      }
    }
    if (!hit) {
      ++i;
      continue;
    }
    if (i > start) out.push_back({-1, text.substr(start, i - start)});
    out.push_back({hit->id, text.substr(i, hit->text.size())});
    i += hit->text.size();
    start = i;
  }
  if (start < text.size()) out.push_back({-1, text.substr(start)});
  return out;
}

}  // namespace tok

void Tokenizer::init_common(const tok::VocabData& v) {
  tokens_ = v.tokens;
  types_ = v.types.empty() ? std::vector<int32_t>(v.tokens.size(), tok::kNormal) : v.types;
  index_.reserve(tokens_.size());
  // The first of duplicate texts wins, as in llama.cpp.
  for (size_t i = 0; i < tokens_.size(); ++i) index_.emplace(tokens_[i], static_cast<int32_t>(i));
  // A vocab text is never shorter than the bytes it stands for: byte-level BPE writes a byte as
  // one or two UTF-8 bytes, SentencePiece a space as three ("▁"), byte tokens as "<0xAB>".
  for (const std::string& t : tokens_) max_token_bytes_ = std::max(max_token_bytes_, t.size());
  const auto n = static_cast<int32_t>(tokens_.size());
  const auto valid = [&](int32_t id) { return id >= 0 && id < n ? id : -1; };
  bos_ = valid(v.bos);
  eos_ = valid(v.eos);
  for (int32_t id : {v.eos, v.eot, v.eom})
    if (valid(id) >= 0) eog_.push_back(id);
  // Chat models end their turns with these even when the vocab names another eos.
  for (const char* t : {"<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|endoftext|>", "<end_of_turn>",
                        "<|end|>", "<|end_of_text|>"}) {
    const int32_t id = find(t);
    if (id >= 0 && (types_[id] == tok::kControl || types_[id] == tok::kUser)) eog_.push_back(id);
  }
  std::sort(eog_.begin(), eog_.end());
  eog_.erase(std::unique(eog_.begin(), eog_.end()), eog_.end());

  const std::string& t = v.chat_template;
  chat_family_ = chat_family_of(t);
  has_chat_template_ = !t.empty();
  chat_template_ = t;
  if (!t.empty()) {
    try {
      chat_format_ = std::make_shared<ChatFormat>(t, "the model's chat template", chat_tokens());
    } catch (const jinja::Error& e) {
      chat_format_error_ = e.what();
    }
  }
}

std::string Tokenizer::chat_family_of(const std::string& t) {
  if (t.find("<|im_start|>") != std::string::npos) return "chatml";
  if (t.find("<|start_header_id|>") != std::string::npos) return "llama3";
  if (t.find("[INST]") != std::string::npos) return "llama2";
  if (t.find("<start_of_turn>") != std::string::npos) return "gemma";
  // No template (base models, Gemma's included though their vocab has the turn pieces) or one
  // of another family: a plain completion, never a guessed format.
  return "none";
}

ChatTokens Tokenizer::chat_tokens() const {
  ChatTokens t;
  if (bos_ >= 0) t.bos = tokens_[static_cast<size_t>(bos_)];
  if (eos_ >= 0) t.eos = tokens_[static_cast<size_t>(eos_)];
  t.add_bos = add_bos_;
  return t;
}

std::string Tokenizer::apply_chat(const std::vector<ChatMessage>& msgs) const {
  if (!chat_format_) return apply_chat_family(msgs);
  ChatInput in;
  for (const auto& m : msgs) in.messages.push_back({{"role", m.role}, {"content", m.content}});
  return chat_format_->apply(in);
}

std::string Tokenizer::apply_chat(const ChatInput& in) const {
  if (chat_format_) return chat_format_->apply(in);
  std::vector<ChatMessage> msgs;
  for (const auto& m : in.messages) {
    ChatMessage cm;
    if (m.contains("role") && m["role"].is_string()) cm.role = m["role"].get<std::string>();
    const auto c = m.contains("content") ? m["content"] : nlohmann::ordered_json();
    if (c.is_string()) {
      cm.content = c.get<std::string>();
    } else if (c.is_array()) {
      for (const auto& part : c)
        if (part.is_object() && part.contains("text") && part["text"].is_string())
          cm.content += part["text"].get<std::string>();
    }
    msgs.push_back(std::move(cm));
  }
  return apply_chat_family(msgs);
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool special) const {
  std::string out;
  bool first_text = strip_first_space_;
  for (int32_t id : ids) {
    std::string piece = token_to_piece(id, special);
    if (first_text && types_.at(static_cast<size_t>(id)) != tok::kControl) {
      if (!piece.empty() && piece[0] == ' ') piece.erase(0, 1);
      first_text = false;
    }
    out += piece;
  }
  return out;
}

bool Tokenizer::is_eog(int32_t id) const {
  return std::binary_search(eog_.begin(), eog_.end(), id);
}

int32_t Tokenizer::find(std::string_view text) const {
  const auto it = index_.find(std::string(text));
  return it == index_.end() ? -1 : it->second;
}

namespace {
std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\n\r\f\v");
  if (b == std::string::npos) return {};
  return s.substr(b, s.find_last_not_of(" \t\n\r\f\v") - b + 1);
}
}  // namespace

std::string Tokenizer::apply_chat_family(const std::vector<ChatMessage>& msgs) const {
  std::string s;
  if (chat_family_ == "chatml") {
    for (const auto& m : msgs) s += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
    s += "<|im_start|>assistant\n";
  } else if (chat_family_ == "llama3") {
    // <|begin_of_text|> comes from BOS when the prompt is encoded.
    for (const auto& m : msgs)
      s += "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n" + m.content + "<|eot_id|>";
    s += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  } else if (chat_family_ == "llama2") {
    // Meta's format: the system prompt goes inside the first [INST]; every finished exchange
    // ends with </s> and the next one starts with <s> (the very first <s> is BOS).
    std::string sys;
    bool first = true;
    for (const auto& m : msgs) {
      if (m.role == "system") {
        sys = m.content;
      } else if (m.role == "user") {
        if (!first) s += "<s>";
        s += "[INST] ";
        if (!sys.empty()) s += "<<SYS>>\n" + sys + "\n<</SYS>>\n\n";
        sys.clear();
        s += m.content + " [/INST]";
        first = false;
      } else {
        s += " " + m.content + " </s>";
      }
    }
  } else if (chat_family_ == "gemma") {
    // Gemma's template: no system role, so the system prompt opens the first user turn; the
    // assistant is "model"; contents are trimmed. <bos> comes from BOS when the prompt is
    // encoded.
    std::string sys;
    for (const auto& m : msgs) {
      if (m.role == "system") {
        sys += trim(m.content);
        continue;
      }
      const std::string role = m.role == "assistant" ? "model" : m.role;
      s += "<start_of_turn>" + role + "\n";
      if (!sys.empty() && role != "model") {
        s += sys + "\n\n";
        sys.clear();
      }
      s += trim(m.content) + "<end_of_turn>\n";
    }
    s += "<start_of_turn>model\n";
  } else {
    // "none": the texts as they are, so the model continues them (llama.cpp's completion
    // where a model has no template).
    for (const auto& m : msgs) s += m.content;
  }
  return s;
}

namespace {
// Moves the complete characters of `buf` to the result; invalid bytes become U+FFFD, and an
// incomplete character at the end stays in `buf` unless `all`.
std::string take_complete(std::string& buf, bool all) {
  std::string out;
  size_t i = 0;
  while (i < buf.size()) {
    const size_t n = tok::utf8_char_len(buf, i);
    if (n > 0) {
      out.append(buf, i, n);
      i += n;
      continue;
    }
    // Is this the start of a character that more bytes could still complete?
    const auto c = static_cast<uint8_t>(buf[i]);
    const size_t want = c >= 0xF0 && c <= 0xF4 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 ? 2 : 0;
    bool prefix = want > 0 && i + want > buf.size();
    for (size_t k = i + 1; prefix && k < buf.size(); ++k)
      prefix = (static_cast<uint8_t>(buf[k]) & 0xC0) == 0x80;
    if (prefix && !all) break;
    out += "\xEF\xBF\xBD";
    ++i;
    // A cut-off character counts as one replacement, not one per byte.
    while (prefix && i < buf.size()) ++i;
  }
  buf.erase(0, i);
  return out;
}
}  // namespace

std::string StreamDecoder::push(int32_t id) {
  pending_ += tok_.token_to_piece(id, false);
  return take_complete(pending_, false);
}

std::string StreamDecoder::flush() {
  return take_complete(pending_, true);
}

}  // namespace kvs
