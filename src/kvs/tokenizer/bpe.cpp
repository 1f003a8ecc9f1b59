// Byte-level BPE (GGUF model "gpt2"): text is split by the pre-tokenizer's regexes (PCRE2),
// every piece's bytes are mapped to GPT-2's printable code points, and adjacent symbols are
// merged lowest merge rank first.
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <array>
#include <queue>
#include <unordered_map>

#include "kvs/tokenizer/bpe.h"
#include "kvs/tokenizer/vocab.h"
#include "kvs/util/error.h"

namespace kvs::tok {

const std::array<std::string, 256>& byte_to_unicode() {
  // GPT-2's table: printable Latin-1 bytes stand for themselves, the other 68 bytes take code
  // points from U+0100 on, in byte order. So every byte is one visible character.
  static const std::array<std::string, 256> table = [] {
    std::array<std::string, 256> t;
    uint32_t next = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool keep = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
      utf8_append(t[b], keep ? b : next++);
    }
    return t;
  }();
  return table;
}

namespace {

// The regexes that split text before BPE, applied in sequence (each one splits the pieces of
// the one before; matches and the text between matches both become pieces), as in llama.cpp.
const char* const kGpt2 =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
const char* const kLlama3 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* const kQwen2 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

std::vector<std::string> pre_regexes(const std::string& pre, bool& ignore_merges) {
  ignore_merges = false;
  if (pre == "llama3" || pre == "llama-bpe") {
    ignore_merges = true;  // Llama 3's tokenizer.json sets ignore_merges
    return {kLlama3};
  }
  if (pre == "qwen2") return {kQwen2};
  if (pre == "smollm") return {R"(\p{N})", kGpt2};  // single digits, then GPT-2
  if (pre == "gpt-2" || pre == "gpt2") return {kGpt2};  // llama.cpp's name; ours before
  if (pre == "default") return {R"([\p{P}\$\+<=>\^~\|]+)", kGpt2, R"(\p{N}+)", "[0-9][0-9][0-9]"};
  fail("tokenizer: unsupported pre-tokenizer '", pre,
       "' (supported: llama3, llama-bpe, qwen2, smollm, gpt-2, default)");
}

}  // namespace

Pretokenizer::Pretokenizer(const std::vector<std::string>& regexes) {
  for (const std::string& r : regexes) {
    int err = 0;
    PCRE2_SIZE off = 0;
    // MATCH_INVALID_UTF: text that is not valid UTF-8 still splits (bad bytes never match,
    // so they end up in the pieces between matches) instead of failing.
    pcre2_code* c =
        pcre2_compile(reinterpret_cast<PCRE2_SPTR>(r.c_str()), r.size(),
                      PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &off, nullptr);
    if (!c) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      fail("tokenizer: bad regex at ", off, ": ", reinterpret_cast<const char*>(msg), " in ", r);
    }
    pcre2_jit_compile(c, PCRE2_JIT_COMPLETE);  // optional: the interpreter is the fallback
    codes_.push_back(c);
  }
}

Pretokenizer::~Pretokenizer() {
  for (void* c : codes_) pcre2_code_free(static_cast<pcre2_code*>(c));
}

std::vector<std::string_view> Pretokenizer::split(std::string_view text) const {
  std::vector<std::string_view> pieces{text}, next;
  if (text.empty()) return {};
  pcre2_match_data* md = pcre2_match_data_create(1, nullptr);
  KVS_CHECK(md, "tokenizer: out of memory");
  for (void* vc : codes_) {
    const auto* code = static_cast<const pcre2_code*>(vc);
    next.clear();
    for (std::string_view s : pieces) {
      const auto* subj = reinterpret_cast<PCRE2_SPTR>(s.data());
      size_t pos = 0, last = 0;
      while (pos < s.size()) {
        const int rc = pcre2_match(code, subj, s.size(), pos, 0, md, nullptr);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
          pcre2_match_data_free(md);
          fail("tokenizer: regex match failed (PCRE2 error ", rc, ")");
        }
        const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
        if (ov[1] == ov[0]) {  // empty match: step over one character and retry
          const size_t n = utf8_char_len(s, ov[0]);
          pos = ov[0] + (n ? n : 1);
          continue;
        }
        if (ov[0] > last) next.push_back(s.substr(last, ov[0] - last));
        next.push_back(s.substr(ov[0], ov[1] - ov[0]));
        last = pos = ov[1];
      }
      if (last < s.size()) next.push_back(s.substr(last));
    }
    pieces.swap(next);
  }
  pcre2_match_data_free(md);
  return pieces;
}

BpeTokenizer::BpeTokenizer(const VocabData& v) : pre_(pre_regexes(v.pre, ignore_merges_)) {
  init_common(v);
  add_bos_ = v.add_bos.value_or(ignore_merges_);  // Llama 3 wants BOS, GPT-2 style vocabs not
  add_eos_ = v.add_eos.value_or(false);
  specials_.build(tokens_, types_);

  const auto& b2u = byte_to_unicode();
  std::unordered_map<uint32_t, uint8_t> u2b;
  for (uint32_t b = 0; b < 256; ++b) {
    byte_id_[b] = find(b2u[b]);
    u2b[utf8_decode(b2u[b], 0, b2u[b].size())] = static_cast<uint8_t>(b);
  }

  // A merge "left right" becomes (left id, right id) -> (rank, merged id); merges whose parts
  // or result are not tokens can never apply and are dropped.
  merges_.reserve(v.merges.size());
  for (size_t r = 0; r < v.merges.size(); ++r) {
    const std::string& m = v.merges[r];
    const size_t sp = m.find(' ', 1);
    if (sp == std::string::npos) fail("tokenizer: merge ", r, " has no space: '", m, "'");
    const int32_t a = find(std::string_view(m).substr(0, sp));
    const int32_t b = find(std::string_view(m).substr(sp + 1));
    const int32_t ab = find(m.substr(0, sp) + m.substr(sp + 1));
    if (a < 0 || b < 0 || ab < 0) continue;
    merges_.emplace(pair_key(a, b), Merge{static_cast<int32_t>(r), ab});
  }

  // Token text back to bytes, once, so decoding is a lookup.
  pieces_.resize(tokens_.size());
  for (size_t id = 0; id < tokens_.size(); ++id) {
    const std::string& t = tokens_[id];
    if (types_[id] == kControl || types_[id] == kUser) {
      pieces_[id] = t;  // stored as plain text, not byte-mapped
      continue;
    }
    for (size_t i = 0; i < t.size();) {
      const size_t n = utf8_char_len(t, i);
      if (n == 0) {  // not UTF-8: keep the byte
        pieces_[id] += t[i++];
        continue;
      }
      const auto it = u2b.find(utf8_decode(t, i, n));
      if (it != u2b.end()) {
        pieces_[id] += static_cast<char>(it->second);
      } else {
        pieces_[id].append(t, i, n);  // outside the table: the character itself
      }
      i += n;
    }
  }
}

void BpeTokenizer::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
  if (ignore_merges_) {
    std::string mapped;
    const auto& b2u = byte_to_unicode();
    for (char c : piece) mapped += b2u[static_cast<uint8_t>(c)];
    const int32_t id = find(mapped);
    if (id >= 0) {
      out.push_back(id);
      return;
    }
  }
  struct Sym {
    int32_t id, prev, next;
  };
  std::vector<Sym> sym;
  sym.reserve(piece.size());
  for (char c : piece) {
    const int32_t id = byte_id_[static_cast<uint8_t>(c)];
    if (id < 0) continue;  // a vocab without this byte (SmolLM2 lacks 0x04): dropped, as llama.cpp does
    const auto i = static_cast<int32_t>(sym.size());
    sym.push_back({id, i - 1, i + 1});
  }
  if (sym.empty()) return;
  sym.back().next = -1;

  struct Cand {
    int32_t rank, left, right, left_id, right_id, result;
    bool operator>(const Cand& o) const {
      return rank != o.rank ? rank > o.rank : left > o.left;  // lowest rank, then leftmost
    }
  };
  std::priority_queue<Cand, std::vector<Cand>, std::greater<>> q;
  const auto consider = [&](int32_t l) {
    if (l < 0 || sym[l].next < 0) return;
    const int32_t r = sym[l].next;
    const auto it = merges_.find(pair_key(sym[l].id, sym[r].id));
    if (it != merges_.end())
      q.push({it->second.rank, l, r, sym[l].id, sym[r].id, it->second.result});
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(sym.size()); ++i) consider(i);
  while (!q.empty()) {
    const Cand c = q.top();
    q.pop();
    // Stale when either side has been merged into something else since it was queued.
    Sym& l = sym[c.left];
    if (l.id != c.left_id || l.next != c.right || sym[c.right].id != c.right_id) continue;
    Sym& r = sym[c.right];
    l.id = c.result;
    l.next = r.next;
    if (r.next >= 0) sym[r.next].prev = c.left;
    r.id = -1;
    consider(l.prev);
    consider(c.left);
  }
  for (int32_t i = 0; i >= 0; i = sym[i].next) out.push_back(sym[i].id);
}

std::vector<int32_t> BpeTokenizer::encode(std::string_view text, bool add_bos,
                                          bool parse_special) const {
  std::vector<int32_t> out;
  if (add_bos && add_bos_ && bos_ >= 0) out.push_back(bos_);
  for (const Fragment& f : specials_.split(text, parse_special)) {
    if (f.id >= 0) {
      out.push_back(f.id);
      continue;
    }
    const std::string text_ok = replace_invalid_utf8(f.text);
    for (std::string_view p : pre_.split(text_ok)) encode_piece(p, out);
  }
  if (add_bos && add_eos_ && eos_ >= 0) out.push_back(eos_);
  return out;
}

std::string BpeTokenizer::token_to_piece(int32_t id, bool special) const {
  KVS_CHECK(id >= 0 && id < n_vocab(), "tokenizer: token id ", id, " out of range [0, ", n_vocab(),
            ")");
  if (types_[id] == kControl && !special) return {};
  return pieces_[id];
}

std::unique_ptr<Tokenizer> make_bpe(const VocabData& v) {
  return std::make_unique<BpeTokenizer>(v);
}

}  // namespace kvs::tok
