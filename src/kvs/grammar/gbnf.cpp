#include "kvs/grammar/gbnf.h"

#include <algorithm>
#include <map>
#include <unordered_map>

namespace kvs::grammar {

namespace {

constexpr uint32_t kMaxCodePoint = 0x10FFFF;
constexpr size_t kMaxCode = size_t{1} << 22;  // elements in all: past this a grammar is a bomb

bool is_word(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '_';
}

using Seq = std::vector<Grammar::Elem>;
using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;

// Sorted, merged; the complement over all code points with `negate`.
Ranges normalise(Ranges r, bool negate) {
  std::sort(r.begin(), r.end());
  Ranges m;
  for (const auto& [lo, hi] : r) {
    if (!m.empty() && lo <= m.back().second + 1)
      m.back().second = std::max(m.back().second, hi);
    else
      m.emplace_back(lo, hi);
  }
  if (!negate) return m;
  Ranges c;
  uint32_t next = 0;
  for (const auto& [lo, hi] : m) {
    if (lo > next) c.emplace_back(next, lo - 1);
    next = hi + 1;
  }
  if (next <= kMaxCodePoint) c.emplace_back(next, kMaxCodePoint);
  return c;
}

class Parser {
 public:
  explicit Parser(std::string_view s) : s_(s) {}

  Grammar run() {
    skip(true);
    while (p_ < s_.size()) rule();
    return finish();
  }

 private:
  struct Rule {
    std::vector<Seq> alts;
    bool defined = false;
    size_t where = 0;  // definition (or, while undefined, first reference) offset
  };

  [[noreturn]] void error(size_t at, const std::string& what) const {
    int line = 1, col = 1;
    for (size_t i = 0; i < at && i < s_.size(); ++i) {
      if (s_[i] == '\n') {
        ++line;
        col = 1;
      } else if ((static_cast<unsigned char>(s_[i]) & 0xC0) != 0x80) {
        ++col;  // columns count characters, not the bytes of UTF-8
      }
    }
    throw GrammarError(line, col, what);
  }
  char peek(size_t k = 0) const { return p_ + k < s_.size() ? s_[p_ + k] : '\0'; }
  bool at_end() const { return p_ >= s_.size(); }

  void skip(bool newline_ok) {
    while (!at_end()) {
      const char c = peek();
      if (c == '#') {
        while (!at_end() && peek() != '\n' && peek() != '\r') ++p_;
      } else if (c == ' ' || c == '\t' || (newline_ok && (c == '\n' || c == '\r'))) {
        ++p_;
      } else {
        break;
      }
    }
  }

  std::string name() {
    const size_t b = p_;
    while (!at_end() && is_word(peek())) ++p_;
    if (p_ == b) error(b, "expected a rule name");
    return std::string(s_.substr(b, p_ - b));
  }

  uint32_t rule_id(const std::string& n, size_t where) {
    const auto [it, added] = ids_.emplace(n, static_cast<uint32_t>(rules_.size()));
    if (added) {
      rules_.emplace_back();
      rules_.back().where = where;
      names_.push_back(n);
    }
    return it->second;
  }
  uint32_t helper(const std::string& parent, size_t where) {
    std::string n;
    do n = cat(parent, "_", ++helpers_);
    while (ids_.count(n));
    const uint32_t id = rule_id(n, where);
    rules_[id].defined = true;
    return id;
  }

  void rule() {
    const size_t at = p_;
    const std::string n = name();
    skip(false);
    if (s_.substr(p_, 3) != "::=") error(p_, cat("expected '::=' after the rule name '", n, "'"));
    p_ += 3;
    skip(true);
    const uint32_t id = rule_id(n, at);
    if (rules_[id].defined) error(at, cat("rule '", n, "' is defined twice"));
    rules_[id].defined = true;
    rules_[id].where = at;
    auto alts = alternates(n, false);
    rules_[id].alts = std::move(alts);
    if (peek() == '\r') ++p_;
    if (peek() == '\n')
      ++p_;
    else if (!at_end())
      error(p_, cat("unexpected '", peek(), "' in rule '", n, "' (expected a newline or the end)"));
    skip(true);
  }

  std::vector<Seq> alternates(const std::string& n, bool nested) {
    std::vector<Seq> alts;
    alts.push_back(sequence(n, nested));
    while (peek() == '|') {
      ++p_;
      skip(true);
      alts.push_back(sequence(n, nested));
    }
    return alts;
  }

  uint32_t hex(size_t digits) {
    uint32_t v = 0;
    for (size_t i = 0; i < digits; ++i) {
      const char c = peek();
      int d = -1;
      if (c >= '0' && c <= '9') d = c - '0';
      if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
      if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
      if (d < 0) error(p_, cat("expected ", digits, " hex digits"));
      v = v * 16 + static_cast<uint32_t>(d);
      ++p_;
    }
    if (v > kMaxCodePoint) error(p_, "code point beyond U+10FFFF");
    return v;
  }

  // One character of a literal or a class: an escape or a UTF-8 sequence.
  uint32_t character() {
    const size_t at = p_;
    if (at_end()) error(at, "unexpected end of the grammar");
    const auto b = static_cast<unsigned char>(peek());
    if (b == '\\') {
      const char e = peek(1);
      p_ += 2;
      switch (e) {
        case 'x': return hex(2);
        case 'u': return hex(4);
        case 'U': return hex(8);
        case 't': return '\t';
        case 'r': return '\r';
        case 'n': return '\n';
        case '\\': case '"': case '[': case ']': case '-': return static_cast<uint32_t>(e);
        default: error(at, cat("unknown escape '\\", e, "'"));
      }
    }
    const int n = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 0;
    if (n == 0 || p_ + static_cast<size_t>(n) > s_.size()) error(at, "invalid UTF-8");
    uint32_t v = n == 1 ? b : b & (0x7Fu >> n);
    for (int i = 1; i < n; ++i) {
      const auto c = static_cast<unsigned char>(s_[p_ + static_cast<size_t>(i)]);
      if ((c & 0xC0) != 0x80) error(at, "invalid UTF-8");
      v = (v << 6) | (c & 0x3F);
    }
    p_ += static_cast<size_t>(n);
    return v;
  }

  uint32_t set_id(Ranges r) {
    const auto [it, added] = set_ids_.emplace(std::move(r), static_cast<uint32_t>(sets_.size()));
    if (added) sets_.push_back(it->first);
    return it->second;
  }
  Grammar::Elem chars(Ranges r, bool negate) {
    return {Grammar::kChars, set_id(normalise(std::move(r), negate))};
  }

  // x{min,max} (max = UINT64_MAX: unbounded) on seq[from, end), rewritten as llama.cpp does:
  // min copies, then max - min nested optional rules, or one rule recursing on itself.
  void repeat(Seq& seq, size_t from, uint64_t min, uint64_t max, const std::string& n, size_t at) {
    if (from >= seq.size()) error(at, "nothing before the repetition to repeat");
    const bool unbounded = max == UINT64_MAX;
    if (min > kMaxRepeat || (!unbounded && max > kMaxRepeat))
      error(at, cat("more than ", kMaxRepeat, " repetitions"));
    if (!unbounded && max < min) error(at, cat("repetition {", min, ",", max, "}: max < min"));
    const Seq item(seq.begin() + static_cast<std::ptrdiff_t>(from), seq.end());
    if (item.size() * std::max<uint64_t>(min, unbounded ? 1 : max) > kMaxCode)
      error(at, "the repetition makes the grammar too large");
    seq.resize(from);
    for (uint64_t i = 0; i < min; ++i) seq.insert(seq.end(), item.begin(), item.end());
    if (unbounded) {
      const uint32_t r = helper(n, at);  // r ::= item r | ""
      Seq body = item;
      body.push_back({Grammar::kRule, r});
      rules_[r].alts = {std::move(body), Seq{}};
      seq.push_back({Grammar::kRule, r});
      return;
    }
    uint32_t inner = 0;
    for (uint64_t i = 0; i < max - min; ++i) {  // r_i ::= item r_(i-1) | ""
      const uint32_t r = helper(n, at);
      Seq body = item;
      if (i > 0) body.push_back({Grammar::kRule, inner});
      rules_[r].alts = {std::move(body), Seq{}};
      inner = r;
    }
    if (max > min) seq.push_back({Grammar::kRule, inner});
  }

  uint64_t integer() {
    const size_t b = p_;
    uint64_t v = 0;
    while (peek() >= '0' && peek() <= '9') {
      v = std::min<uint64_t>(v * 10 + static_cast<uint64_t>(peek() - '0'), uint64_t{1} << 40);
      ++p_;
    }
    if (p_ == b) error(b, "expected a number");
    return v;
  }

  Seq sequence(const std::string& n, bool nested) {
    Seq seq;
    size_t last = SIZE_MAX;  // where the last item starts, for a repetition after it
    while (!at_end()) {
      const size_t at = p_;
      const char c = peek();
      if (c == '"') {
        ++p_;
        last = seq.size();
        while (peek() != '"') {
          if (at_end()) error(at, "unterminated string literal");
          const uint32_t ch = character();
          seq.push_back(chars({{ch, ch}}, false));
        }
        ++p_;
      } else if (c == '[') {
        ++p_;
        const bool negate = peek() == '^';
        if (negate) ++p_;
        Ranges r;
        while (peek() != ']') {
          if (at_end()) error(at, "unterminated character class");
          const uint32_t lo = character();
          uint32_t hi = lo;
          if (peek() == '-' && peek(1) != ']' && p_ + 1 < s_.size()) {
            ++p_;
            hi = character();
            if (hi < lo) error(at, "a character range whose end is before its start");
          }
          r.emplace_back(lo, hi);
        }
        ++p_;
        last = seq.size();
        seq.push_back(chars(std::move(r), negate));
      } else if (c == '<' || c == '!') {
        error(at, "token references (<...>, !<...>) are not supported");
      } else if (is_word(c)) {
        const std::string ref = name();
        last = seq.size();
        seq.push_back({Grammar::kRule, rule_id(ref, at)});
      } else if (c == '(') {
        ++p_;
        skip(true);
        const uint32_t r = helper(n, at);
        auto alts = alternates(n, true);
        rules_[r].alts = std::move(alts);
        if (peek() != ')') error(p_, "expected ')'");
        ++p_;
        last = seq.size();
        seq.push_back({Grammar::kRule, r});
      } else if (c == '.') {
        ++p_;
        last = seq.size();
        seq.push_back(chars({{0, kMaxCodePoint}}, false));
      } else if (c == '*' || c == '+' || c == '?') {
        ++p_;
        repeat(seq, last, c == '+' ? 1 : 0, c == '?' ? 1 : UINT64_MAX, n, at);
      } else if (c == '{') {
        ++p_;
        skip(nested);
        const uint64_t min = integer();
        uint64_t max = min;
        skip(nested);
        if (peek() == ',') {
          ++p_;
          skip(nested);
          max = peek() >= '0' && peek() <= '9' ? integer() : UINT64_MAX;
          skip(nested);
        }
        if (peek() != '}') error(p_, "expected '}' to close the repetition");
        ++p_;
        repeat(seq, last, min, max, n, at);
      } else {
        break;
      }
      skip(nested);
    }
    return seq;
  }

  Grammar finish() {
    for (size_t i = 0; i < rules_.size(); ++i)
      if (!rules_[i].defined) error(rules_[i].where, cat("undefined rule '", names_[i], "'"));
    const auto root = ids_.find("root");
    if (root == ids_.end()) error(s_.size(), "the grammar has no rule named 'root'");
    Grammar g;
    g.root = root->second;
    g.names = std::move(names_);
    g.sets.reserve(sets_.size());
    for (const Ranges& r : sets_) {
      CharSet cs;
      cs.ranges = r;
      for (const auto& [lo, hi] : r)
        for (uint32_t c = lo; c <= std::min<uint32_t>(hi, 127); ++c) cs.ascii[c >> 6] |= 1ull << (c & 63);
      g.sets.push_back(std::move(cs));
    }
    g.alts.resize(rules_.size());
    for (size_t i = 0; i < rules_.size(); ++i) {
      for (const Seq& a : rules_[i].alts) {
        g.alts[i].push_back(static_cast<uint32_t>(g.code.size()));
        g.code.insert(g.code.end(), a.begin(), a.end());
        g.code.push_back({Grammar::kEnd, 0});
        if (g.code.size() > kMaxCode) error(rules_[i].where, "the grammar is too large");
      }
    }
    check_left_recursion(g);
    return g;
  }

  // A rule that can reach itself before reading a character would expand forever.
  void check_left_recursion(const Grammar& g) {
    const size_t n = g.alts.size();
    std::vector<char> nullable(n, 0);
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t r = 0; r < n; ++r) {
        if (nullable[r]) continue;
        for (uint32_t a : g.alts[r]) {
          size_t i = a;
          while (g.code[i].op == Grammar::kRule && nullable[g.code[i].arg]) ++i;
          if (g.code[i].op == Grammar::kEnd) {
            nullable[r] = changed = true;
            break;
          }
        }
      }
    }
    std::vector<std::vector<uint32_t>> first(n);  // rules reachable before any character
    for (size_t r = 0; r < n; ++r)
      for (uint32_t a : g.alts[r])
        for (size_t i = a; g.code[i].op == Grammar::kRule; ++i) {
          first[r].push_back(g.code[i].arg);
          if (!nullable[g.code[i].arg]) break;
        }
    std::vector<char> state(n, 0);  // 0 new, 1 on the path, 2 done
    std::vector<std::pair<uint32_t, size_t>> path;
    for (uint32_t s = 0; s < n; ++s) {
      if (state[s]) continue;
      path.emplace_back(s, 0);
      state[s] = 1;
      while (!path.empty()) {
        auto& [r, k] = path.back();
        if (k == first[r].size()) {
          state[r] = 2;
          path.pop_back();
          continue;
        }
        const uint32_t t = first[r][k++];
        if (state[t] == 1) {
          // Name the user's rule, not a helper of its groups.
          uint32_t u = t;
          for (const auto& pr : path)
            if (state[pr.first] == 1 && g.names[pr.first].find('_') == std::string::npos) u = pr.first;
          error(rules_[u].where, cat("rule '", g.names[u], "' is left-recursive"));
        }
        if (state[t] == 0) {
          state[t] = 1;
          path.emplace_back(t, 0);
        }
      }
    }
  }

  std::string_view s_;
  size_t p_ = 0;
  std::vector<Rule> rules_;
  std::vector<std::string> names_;
  std::unordered_map<std::string, uint32_t> ids_;
  std::map<Ranges, uint32_t> set_ids_;
  std::vector<Ranges> sets_;
  uint64_t helpers_ = 0;
};

}  // namespace

bool CharSet::contains(uint32_t c) const {
  if (c < 128) return (ascii[c >> 6] >> (c & 63)) & 1;
  auto it = std::upper_bound(ranges.begin(), ranges.end(), std::pair<uint32_t, uint32_t>{c, UINT32_MAX});
  return it != ranges.begin() && std::prev(it)->second >= c;
}

bool CharSet::intersects(uint32_t lo, uint32_t hi) const {
  for (const auto& [a, b] : ranges)
    if (a <= hi && lo <= b) return true;
  return false;
}

Grammar parse_gbnf(std::string_view text) { return Parser(text).run(); }

namespace {
void put_char(std::string& o, uint32_t c, bool in_class) {
  if (c == '"' || c == '\\' || (in_class && (c == ']' || c == '-' || c == '['))) {
    o += '\\';
    o += static_cast<char>(c);
  } else if (c == '\n') {
    o += "\\n";
  } else if (c == '\r') {
    o += "\\r";
  } else if (c == '\t') {
    o += "\\t";
  } else if (c < 0x20 || c == 0x7F) {
    o += cat("\\x", "0123456789ABCDEF"[c >> 4], "0123456789ABCDEF"[c & 15]);
  } else if (c < 0x80) {
    o += static_cast<char>(c);
  } else if (c < 0x10000) {
    o += "\\u";
    for (int s = 12; s >= 0; s -= 4) o += "0123456789ABCDEF"[(c >> s) & 15];
  } else {
    o += "\\U";
    for (int s = 28; s >= 0; s -= 4) o += "0123456789ABCDEF"[(c >> s) & 15];
  }
}
}  // namespace

std::string gbnf_literal(std::string_view s) {
  // Bytes of UTF-8 pass through as they are: a multi-byte character is one character of GBNF.
  std::string o = "\"";
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (c >= 0x80)
      o += ch;
    else
      put_char(o, c, false);
  }
  return o + "\"";
}

std::string Grammar::dump() const {
  std::string o;
  for (size_t r = 0; r < alts.size(); ++r) {
    o += names[r] + " ::=";
    for (size_t a = 0; a < alts[r].size(); ++a) {
      if (a) o += " |";
      for (size_t i = alts[r][a]; code[i].op != kEnd; ++i) {
        o += ' ';
        if (code[i].op == kRule) {
          o += names[code[i].arg];
          continue;
        }
        o += '[';
        for (const auto& [lo, hi] : sets[code[i].arg].ranges) {
          put_char(o, lo, true);
          if (hi != lo) {
            o += '-';
            put_char(o, hi, true);
          }
        }
        o += ']';
      }
    }
    o += '\n';
  }
  return o;
}

}  // namespace kvs::grammar
