// SentencePiece-style BPE (GGUF model "llama", the Llama 2 vocab): spaces become "▁", a "▁"
// is put in front, and the adjacent pair whose joined text is the highest-scoring token is
// merged first. Characters no token covers fall back to <0xXX> byte tokens.
#include <array>
#include <cstdio>
#include <queue>

#include "kvs/tokenizer/vocab.h"
#include "kvs/util/error.h"

namespace kvs::tok {
namespace {

const std::string kSpace = "\xE2\x96\x81";  // U+2581 "▁"

class SpmTokenizer : public Tokenizer {
 public:
  explicit SpmTokenizer(const VocabData& v) {
    init_common(v);
    add_bos_ = v.add_bos.value_or(true);
    add_eos_ = v.add_eos.value_or(false);
    add_space_prefix_ = v.add_space_prefix.value_or(true);
    strip_first_space_ = add_space_prefix_;
    unk_ = v.unk >= 0 && v.unk < n_vocab() ? v.unk : find("<unk>");
    scores_ = v.scores.empty() ? std::vector<float>(tokens_.size(), 0.0f) : v.scores;
    specials_.build(tokens_, types_);
    byte_id_.fill(-1);
    pieces_.resize(tokens_.size());
    for (size_t id = 0; id < tokens_.size(); ++id) {
      const std::string& t = tokens_[id];
      if (types_[id] == kByte) {
        unsigned b = 0;
        KVS_CHECK(t.size() == 6 && std::sscanf(t.c_str(), "<0x%2X>", &b) == 1,
                  "tokenizer: byte token ", id, " is '", t, "', expected <0xXX>");
        byte_id_[b] = static_cast<int32_t>(id);
        pieces_[id] = std::string(1, static_cast<char>(b));
        continue;
      }
      for (size_t i = 0; i < t.size();) {
        if (t.compare(i, kSpace.size(), kSpace) == 0) {
          pieces_[id] += ' ';
          i += kSpace.size();
        } else {
          pieces_[id] += t[i++];
        }
      }
    }
  }

  std::vector<int32_t> encode(std::string_view text, bool add_bos,
                              bool parse_special) const override {
    std::vector<int32_t> out;
    if (add_bos && add_bos_ && bos_ >= 0) out.push_back(bos_);
    // As llama.cpp does: the space prefix goes before the first text and before text that
    // follows a special token.
    bool after_special = true;
    for (const Fragment& f : specials_.split(text, parse_special)) {
      if (f.id >= 0) {
        out.push_back(f.id);
        after_special = true;
        continue;
      }
      std::string s;
      if (add_space_prefix_ && after_special) s = kSpace;
      for (char c : f.text) {
        if (c == ' ') {
          s += kSpace;
        } else {
          s += c;
        }
      }
      encode_text(s, out);
      after_special = false;
    }
    if (add_bos && add_eos_ && eos_ >= 0) out.push_back(eos_);
    return out;
  }

  std::string token_to_piece(int32_t id, bool special) const override {
    KVS_CHECK(id >= 0 && id < n_vocab(), "tokenizer: token id ", id, " out of range [0, ",
              n_vocab(), ")");
    if ((types_[id] == kControl || types_[id] == kUnknown) && !special) return {};
    return pieces_[id];
  }

 private:
  // Only ordinary pieces take part in merges; control and byte tokens never form from text.
  int32_t mergeable(const std::string& s) const {
    const int32_t id = find(s);
    return id >= 0 && (types_[id] == kNormal || types_[id] == kUser) ? id : -1;
  }

  void encode_text(const std::string& s, std::vector<int32_t>& out) const {
    struct Sym {
      size_t pos, len;
      int32_t prev, next;
    };
    std::vector<Sym> sym;
    for (size_t i = 0; i < s.size();) {
      const size_t n = utf8_char_len(s, i);
      const size_t len = n ? n : 1;  // a bad byte is its own symbol (and becomes <0xXX>)
      const auto k = static_cast<int32_t>(sym.size());
      sym.push_back({i, len, k - 1, k + 1});
      i += len;
    }
    if (sym.empty()) return;
    sym.back().next = -1;

    struct Cand {
      float score;
      int32_t left, right;
      size_t len;                            // joined length, to spot stale entries
      bool operator<(const Cand& o) const {  // highest score, then leftmost
        return score != o.score ? score < o.score : left > o.left;
      }
    };
    std::priority_queue<Cand> q;
    const auto consider = [&](int32_t l) {
      if (l < 0 || sym[l].next < 0) return;
      const Sym& a = sym[l];
      const Sym& b = sym[a.next];
      const int32_t id = mergeable(s.substr(a.pos, a.len + b.len));
      if (id >= 0) q.push({scores_[id], l, a.next, a.len + b.len});
    };
    for (int32_t i = 0; i + 1 < static_cast<int32_t>(sym.size()); ++i) consider(i);
    while (!q.empty()) {
      const Cand c = q.top();
      q.pop();
      Sym& a = sym[c.left];
      if (a.len == 0 || a.next != c.right || a.len + sym[c.right].len != c.len) continue;
      Sym& b = sym[c.right];
      a.len += b.len;
      a.next = b.next;
      if (b.next >= 0) sym[b.next].prev = c.left;
      b.len = 0;
      consider(a.prev);
      consider(c.left);
    }
    for (int32_t i = 0; i >= 0; i = sym[i].next) {
      const std::string piece = s.substr(sym[i].pos, sym[i].len);
      const int32_t id = mergeable(piece);
      if (id >= 0) {
        out.push_back(id);
        continue;
      }
      for (char c : piece) {
        const int32_t b = byte_id_[static_cast<uint8_t>(c)];
        if (b >= 0) {
          out.push_back(b);
        } else if (unk_ >= 0) {
          out.push_back(unk_);
        }
      }
    }
  }

  bool add_eos_ = false, add_space_prefix_ = true;
  int32_t unk_ = -1;
  std::vector<float> scores_;
  SpecialMatcher specials_;
  std::array<int32_t, 256> byte_id_{};
  std::vector<std::string> pieces_;  // id -> text with "▁" as space, byte tokens as bytes
};

}  // namespace

std::unique_ptr<Tokenizer> make_spm(const VocabData& v) {
  return std::make_unique<SpmTokenizer>(v);
}

}  // namespace kvs::tok
