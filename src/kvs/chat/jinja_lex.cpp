// The Jinja lexer: text and tags with jinja2's whitespace rules as transformers sets them
// (trim_blocks, lstrip_blocks, "-" and "+" markers), tags' insides as tokens.
#include <cstdlib>
#include <string>
#include <utility>

#include "kvs/chat/jinja_impl.h"

namespace kvs::jinja {
namespace {

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}
bool name_start(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
bool name_char(char c) {
  return name_start(c) || (c >= '0' && c <= '9');
}

class Lexer {
 public:
  Lexer(const std::string& src, const std::string& name) : s_(src), name_(name) {}

  std::vector<Tok> run() {
    size_t p = 0;
    bool line_starting = true;
    while (true) {
      size_t q = p;
      while ((q = s_.find('{', q)) != std::string::npos) {
        if (q + 1 < s_.size() && (s_[q + 1] == '{' || s_[q + 1] == '%' || s_[q + 1] == '#')) break;
        ++q;
      }
      std::string text = s_.substr(p, q == std::string::npos ? std::string::npos : q - p);
      if (q == std::string::npos) {
        if (!text.empty()) out_.push_back({Tok::Text, text, p});
        break;
      }
      const char kind = s_[q + 1];
      const char sign = q + 2 < s_.size() ? s_[q + 2] : 0;
      if (sign == '-') {
        size_t e = text.size();
        while (e > 0 && is_space(text[e - 1])) --e;
        text.resize(e);
      } else if (sign != '+' && kind != '{') {
        // lstrip_blocks: a block or comment tag alone on its line after indentation takes it.
        const size_t l = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
        if (l > 0 || line_starting) {
          bool blank = l < text.size();
          for (size_t k = l; k < text.size(); ++k) blank = blank && is_space(text[k]);
          if (blank) text.resize(l);
        }
      }
      if (!text.empty()) out_.push_back({Tok::Text, text, p});
      p = q + 2 + (sign == '-' || sign == '+' ? 1 : 0);
      char end_sign = 0;
      if (kind == '#') {
        const size_t e = s_.find("#}", p);
        if (e == std::string::npos) fail(q, "the comment is not closed ('#}' missing)");
        end_sign = e > p && s_[e - 1] == '-' ? '-' : 0;
        p = e + 2;
      } else {
        out_.push_back({kind == '{' ? Tok::VarBegin : Tok::BlockBegin, "", q});
        p = tag(p, kind == '{' ? '}' : '%', end_sign);
        out_.push_back({kind == '{' ? Tok::VarEnd : Tok::BlockEnd, "", p});
        if (kind == '%') p = raw_block(p, end_sign);
      }
      // After the tag: "-" eats all whitespace, a block or comment end its first newline.
      line_starting = false;
      if (end_sign == '-') {
        while (p < s_.size() && is_space(s_[p])) line_starting = s_[p++] == '\n';
      } else if (kind != '{' && end_sign != '+' && p < s_.size() && s_[p] == '\n') {
        ++p;
        line_starting = true;
      }
    }
    out_.push_back({Tok::End, "", s_.size()});
    return std::move(out_);
  }

 private:
  [[noreturn]] void fail(size_t pos, const std::string& m) {
    throw Error("template '" + name_ + "' at " + where(s_, pos) + ": " + m);
  }

  // Lexes a tag's inside from p up to its end ("}}" or "%}", with an optional "-" or "+" before
  // it, which goes to end_sign); returns the position after the end.
  size_t tag(size_t p, char close, char& end_sign) {
    int depth = 0;  // brackets open: an end marker inside them is not the end (as jinja2)
    while (true) {
      while (p < s_.size() && is_space(s_[p])) ++p;
      if (p >= s_.size()) fail(p, std::string("the tag is not closed ('") + close + "}' missing)");
      const char c = s_[p];
      if (depth == 0) {
        if ((c == '-' || c == '+') && s_.compare(p + 1, 2, std::string(1, close) + "}") == 0 &&
            (c == '-' || close == '%')) {
          end_sign = c;
          return p + 3;
        }
        if (c == close && p + 1 < s_.size() && s_[p + 1] == '}') return p + 2;
      }
      if (name_start(c)) {
        size_t e = p;
        while (e < s_.size() && name_char(s_[e])) ++e;
        out_.push_back({Tok::Name, s_.substr(p, e - p), p});
        p = e;
      } else if (c >= '0' && c <= '9') {
        p = number(p);
      } else if (c == '\'' || c == '"') {
        p = string(p);
      } else {
        static const char* kOps[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "/",
                                     "*",  "%",  "~",  "[",  "]",  "(",  ")", "{", "}",
                                     ">",  "<",  "=",  ".",  ":",  "|",  ",", ";"};
        const char* op = nullptr;
        for (const char* o : kOps)
          if (s_.compare(p, std::char_traits<char>::length(o), o) == 0) {
            op = o;
            break;
          }
        if (!op) fail(p, std::string("unexpected character '") + c + "'");
        const std::string o = op;
        if (o == "(" || o == "[" || o == "{") ++depth;
        if ((o == ")" || o == "]" || o == "}") && depth > 0) --depth;
        out_.push_back({Tok::Op, o, p});
        p += o.size();
      }
    }
  }

  size_t number(size_t p) {
    size_t e = p;
    auto digits = [&] {
      while (e < s_.size() && ((s_[e] >= '0' && s_[e] <= '9') || s_[e] == '_')) ++e;
    };
    digits();
    bool real = false;
    if (e + 1 < s_.size() && s_[e] == '.' && s_[e + 1] >= '0' && s_[e + 1] <= '9') {
      real = true;
      ++e;
      digits();
    }
    if (e < s_.size() && (s_[e] == 'e' || s_[e] == 'E')) {
      size_t x = e + 1;
      if (x < s_.size() && (s_[x] == '+' || s_[x] == '-')) ++x;
      if (x < s_.size() && s_[x] >= '0' && s_[x] <= '9') {
        real = true;
        e = x;
        digits();
      }
    }
    std::string t;
    for (size_t k = p; k < e; ++k)
      if (s_[k] != '_') t += s_[k];
    Tok tk{real ? Tok::Float : Tok::Int, t, p};
    if (real)
      tk.f = std::strtod(t.c_str(), nullptr);
    else
      tk.i = std::strtoll(t.c_str(), nullptr, 10);
    out_.push_back(tk);
    return e;
  }

  // A quoted string with Python's escapes.
  size_t string(size_t p) {
    const char q = s_[p];
    std::string v;
    size_t k = p + 1;
    while (true) {
      if (k >= s_.size()) fail(p, "the string is not closed");
      const char c = s_[k];
      if (c == q) break;
      if (c != '\\' || k + 1 >= s_.size()) {
        v += c;
        ++k;
        continue;
      }
      const char e = s_[k + 1];
      k += 2;
      switch (e) {
        case 'n':
          v += '\n';
          break;
        case 't':
          v += '\t';
          break;
        case 'r':
          v += '\r';
          break;
        case 'b':
          v += '\b';
          break;
        case 'f':
          v += '\f';
          break;
        case 'v':
          v += '\v';
          break;
        case 'a':
          v += '\a';
          break;
        case '0':
          v += '\0';
          break;
        case '\\':
          v += '\\';
          break;
        case '\'':
          v += '\'';
          break;
        case '"':
          v += '"';
          break;
        case '\n':
          break;
        case 'x':
        case 'u':
        case 'U': {
          const size_t n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          if (k + n > s_.size()) fail(k, "a truncated \\" + std::string(1, e) + " escape");
          const char32_t cp =
              static_cast<char32_t>(std::strtoul(s_.substr(k, n).c_str(), nullptr, 16));
          v += to_utf8(std::u32string(1, cp));
          k += n;
          break;
        }
        default:
          v += '\\';
          v += e;
      }
    }
    out_.push_back({Tok::Str, v, p});
    return k + 1;
  }

  // {% raw %}: the text up to {% endraw %} as it is.
  size_t raw_block(size_t p, char& end_sign) {
    const size_t n = out_.size();
    if (n < 3 || out_[n - 2].type != Tok::Name || out_[n - 2].v != "raw" ||
        out_[n - 3].type != Tok::BlockBegin)
      return p;
    out_.resize(n - 3);
    size_t q = p;
    while ((q = s_.find("{%", q)) != std::string::npos) {
      size_t k = q + 2;
      if (k < s_.size() && (s_[k] == '-' || s_[k] == '+')) ++k;
      while (k < s_.size() && is_space(s_[k])) ++k;
      if (s_.compare(k, 6, "endraw") == 0) {
        std::string text = s_.substr(p, q - p);
        if (s_[q + 2] == '-') {
          while (!text.empty() && is_space(text.back())) text.pop_back();
        }
        out_.push_back({Tok::Text, text, p});
        k += 6;
        while (k < s_.size() && is_space(s_[k])) ++k;
        end_sign = 0;
        if (k < s_.size() && (s_[k] == '-' || s_[k] == '+')) end_sign = s_[k++];
        if (s_.compare(k, 2, "%}") != 0) fail(k, "'%}' expected after endraw");
        return k + 2;
      }
      q += 2;
    }
    fail(p, "{% raw %} without {% endraw %}");
  }

  const std::string& s_;
  const std::string& name_;
  std::vector<Tok> out_;
};

}  // namespace

std::vector<Tok> lex(const std::string& source, const std::string& name) {
  return Lexer(source, name).run();
}

}  // namespace kvs::jinja
