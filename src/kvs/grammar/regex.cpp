#include "kvs/grammar/regex.h"

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "kvs/grammar/gbnf.h"
#include "kvs/util/error.h"
#include "kvs/util/utf8.h"

namespace kvs::grammar {

namespace {

using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;

const Ranges kDigit = {{'0', '9'}};
const Ranges kWord = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
const Ranges kSpace = {{' ', ' '}};  // \t \n \r would be escapes inside JSON: left out

std::string utf8(uint32_t c) {
  std::string s;
  utf8_append(s, c);
  return s;
}

// One character of a GBNF class.
std::string class_char(uint32_t c) {
  if (c == ']' || c == '[' || c == '\\' || c == '-' || c == '"' || c == '^') {
    std::string o(1, '\\');  // appended, not "\\" + s: GCC 12 warns falsely (-Wrestrict) on that
    o += static_cast<char>(c);
    return o;
  }
  if (c < 0x20 || c == 0x7F) return cat("\\x", "0123456789ABCDEF"[c >> 4], "0123456789ABCDEF"[c & 15]);
  return utf8(c);
}

Ranges complement(Ranges r) {
  std::sort(r.begin(), r.end());
  Ranges c;
  uint32_t next = 0;
  for (const auto& [lo, hi] : r) {
    if (lo > next) c.emplace_back(next, lo - 1);
    next = std::max(next, hi + 1);
  }
  if (next <= 0x10FFFF) c.emplace_back(next, 0x10FFFF);
  return c;
}

// Code points as they appear inside a JSON string: `"` and `\` by their escapes, control
// characters and DEL not at all.
std::string json_chars(const Ranges& r) {
  std::string cls;
  bool quote = false, backslash = false;
  std::vector<std::string> escapes;  // control characters a JSON string writes as escapes
  for (const auto& [c, e] : {std::pair<uint32_t, const char*>{'\b', "b"}, {'\t', "t"}, {'\n', "n"},
                             {'\f', "f"}, {'\r', "r"}})
    for (const auto& [lo, hi] : r)
      if (lo <= c && c <= hi) {
        escapes.push_back(cat("\"\\\\", e, "\""));
        break;
      }
  for (auto [lo, hi] : r) {
    lo = std::max<uint32_t>(lo, 0x20);
    if (lo > hi) continue;
    for (uint32_t special : {uint32_t{'"'}, uint32_t{'\\'}, uint32_t{0x7F}}) {
      if (special < lo || special > hi) continue;
      quote |= special == '"';
      backslash |= special == '\\';
    }
    // Split around the three so the class never holds them.
    uint32_t a = lo;
    for (uint32_t special : {uint32_t{'"'}, uint32_t{'\\'}, uint32_t{0x7F}}) {
      if (special < a || special > hi) continue;
      if (special > a) cls += class_char(a) + (special - 1 > a ? "-" + class_char(special - 1) : "");
      a = special + 1;
    }
    if (a <= hi) cls += class_char(a) + (hi > a ? "-" + class_char(hi) : "");
  }
  std::vector<std::string> alts;
  if (!cls.empty()) alts.push_back("[" + cls + "]");
  if (quote) alts.push_back("\"\\\\\\\"\"");
  if (backslash) alts.push_back("\"\\\\\\\\\"");
  alts.insert(alts.end(), escapes.begin(), escapes.end());
  if (alts.empty()) fail("the pattern has a character class no JSON string character fits");
  if (alts.size() == 1) return alts[0];
  std::string o = "(";
  for (size_t i = 0; i < alts.size(); ++i) o += (i ? " | " : "") + alts[i];
  return o + ")";
}

class RegexParser {
 public:
  explicit RegexParser(std::string_view s) : s_(s) {}

  std::string run() {
    if (s_.size() < 2 || s_.front() != '^' || s_.back() != '$')
      fail("a pattern must be anchored as ^...$");
    s_ = s_.substr(1, s_.size() - 2);
    std::string e = alternation();
    if (p_ < s_.size()) fail("unexpected '", s_[p_], "' at ", p_ + 1, " of the pattern");
    return e;
  }

 private:
  bool at_end() const { return p_ >= s_.size(); }
  char peek() const { return at_end() ? '\0' : s_[p_]; }

  uint32_t code_point() {
    const auto b = static_cast<unsigned char>(s_[p_]);
    const int n = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : 4;
    uint32_t v = n == 1 ? b : b & (0x7Fu >> n);
    for (int i = 1; i < n && p_ + static_cast<size_t>(i) < s_.size(); ++i)
      v = (v << 6) | (static_cast<unsigned char>(s_[p_ + static_cast<size_t>(i)]) & 0x3F);
    p_ += static_cast<size_t>(n);
    return v;
  }

  uint32_t hex(size_t n) {
    uint32_t v = 0;
    for (size_t i = 0; i < n; ++i, ++p_) {
      const char c = peek();
      const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
      if (d < 0) fail("a bad hex escape in the pattern");
      v = v * 16 + static_cast<uint32_t>(d);
    }
    return v;
  }

  // An escape after '\': a class (\d ...) into r, or one code point.
  Ranges escape() {
    if (at_end()) fail("the pattern ends with '\\'");
    const char c = s_[p_++];
    switch (c) {
      case 'd': return kDigit;
      case 'w': return kWord;
      case 's': return kSpace;
      case 'D': return complement(kDigit);
      case 'W': return complement(kWord);
      case 'S': return complement(kSpace);
      case 'n': return {{'\n', '\n'}};
      case 't': return {{'\t', '\t'}};
      case 'r': return {{'\r', '\r'}};
      case 'f': return {{'\f', '\f'}};
      case 'v': return {{'\v', '\v'}};
      case 'x': { const uint32_t v = hex(2); return {{v, v}}; }
      case 'u': { const uint32_t v = hex(4); return {{v, v}}; }
      case 'b': case 'B': fail("word boundaries (\\b) in a pattern are not supported");
      default:
        if (c >= '1' && c <= '9') fail("backreferences in a pattern are not supported");
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))
          fail("the escape '\\", c, "' in a pattern is not supported");
        return {{static_cast<unsigned char>(c), static_cast<unsigned char>(c)}};
    }
  }

  Ranges char_class() {
    const bool negate = peek() == '^';
    if (negate) ++p_;
    Ranges r;
    bool first = true;
    while (first || peek() != ']') {
      if (at_end()) fail("an unclosed [ in the pattern");
      first = false;
      Ranges one;
      if (peek() == '\\') {
        ++p_;
        one = escape();
      } else {
        const uint32_t c = code_point();
        one = {{c, c}};
      }
      if (one.size() == 1 && one[0].first == one[0].second && peek() == '-' && p_ + 1 < s_.size() &&
          s_[p_ + 1] != ']') {
        ++p_;
        uint32_t hi;
        if (peek() == '\\') {
          ++p_;
          const Ranges e = escape();
          if (e.size() != 1 || e[0].first != e[0].second) fail("a range to a class in the pattern");
          hi = e[0].first;
        } else {
          hi = code_point();
        }
        if (hi < one[0].first) fail("a reversed range in the pattern");
        one[0].second = hi;
      }
      r.insert(r.end(), one.begin(), one.end());
    }
    ++p_;
    return negate ? complement(r) : r;
  }

  std::string alternation() {
    std::vector<std::string> alts{sequence()};
    while (peek() == '|') {
      ++p_;
      alts.push_back(sequence());
    }
    if (alts.size() == 1) return alts[0];
    std::string o = "(";
    for (size_t i = 0; i < alts.size(); ++i) o += (i ? " | " : "") + (alts[i].empty() ? "\"\"" : alts[i]);
    return o + ")";
  }

  std::string sequence() {
    std::string seq;
    while (!at_end() && peek() != '|' && peek() != ')') {
      std::string atom;
      const char c = peek();
      if (c == '(') {
        ++p_;
        if (peek() == '?') {
          if (p_ + 1 < s_.size() && s_[p_ + 1] == ':')
            p_ += 2;
          else
            fail("lookaround and named groups in a pattern are not supported");
        }
        atom = "(";
        atom += alternation();
        atom += ")";
        if (peek() != ')') fail("an unclosed ( in the pattern");
        ++p_;
        if (atom == "()") atom = "\"\"";
      } else if (c == '[') {
        ++p_;
        atom = json_chars(char_class());
      } else if (c == '.') {
        ++p_;
        atom = json_chars(complement({{'\n', '\n'}, {'\r', '\r'}}));
      } else if (c == '\\') {
        ++p_;
        atom = json_chars(escape());
      } else if (c == '^' || c == '$') {
        fail("anchors inside a pattern are not supported");
      } else if (c == '*' || c == '+' || c == '?' || c == '{') {
        fail("a quantifier with nothing before it in the pattern");
      } else {
        const uint32_t cp = code_point();
        atom = json_chars({{cp, cp}});
      }
      atom += quantifier();
      seq += (seq.empty() ? "" : " ") + atom;
    }
    return seq;
  }

  std::string quantifier() {
    std::string q;
    const char c = peek();
    if (c == '*' || c == '+' || c == '?') {
      ++p_;
      q = std::string(1, c);
    } else if (c == '{') {
      const size_t close = s_.find('}', p_);
      if (close == std::string_view::npos) fail("an unclosed { in the pattern");
      q = std::string(s_.substr(p_, close - p_ + 1));
      for (char d : q.substr(1, q.size() - 2))
        if (!(d >= '0' && d <= '9') && d != ',') fail("a bad repetition ", q, " in the pattern");
      p_ = close + 1;
    }
    if (!q.empty() && peek() == '?') ++p_;  // lazy: the same strings
    return q;
  }

  std::string_view s_;
  size_t p_ = 0;
};

}  // namespace

std::string pattern_to_gbnf(std::string_view pattern) {
  const std::string e = RegexParser(pattern).run();
  return e.empty() ? "\"\"" : e;
}

}  // namespace kvs::grammar
