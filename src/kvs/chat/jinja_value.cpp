// Values of the Jinja engine with Python's semantics: str(), repr(), json.dumps, ==, <, float
// formatting, iteration, UTF-8 as code points.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "kvs/chat/jinja_impl.h"
#include "kvs/util/error.h"
#include "kvs/util/utf8.h"

namespace kvs::jinja {

void fault(const std::string& message) {
  throw Fault(message);
}

Value Value::make_dict() {
  Value v = with(Type::Dict);
  v.dict = std::make_shared<Dict>();
  return v;
}

const Value* Dict::find(std::string_view key) const {
  for (const auto& [k, v] : items)
    if (k == key) return &v;
  return nullptr;
}

void Dict::set(const std::string& key, Value v) {
  for (auto& [k, old] : items)
    if (k == key) {
      old = std::move(v);
      return;
    }
  items.emplace_back(key, std::move(v));
}

Value CallArgs::get(const char* name, size_t index, Value def) const {
  for (const auto& [k, v] : kw)
    if (k == name) return v;
  if (index < pos.size()) return pos[index];
  return def;
}

void CallArgs::check(const char* what, size_t max, std::initializer_list<const char*> names) const {
  if (pos.size() > max)
    fault(std::string(what) + " takes at most " + std::to_string(max) + " positional arguments, " +
          std::to_string(pos.size()) + " given");
  for (const auto& kv : kw) {
    bool known = false;
    for (const char* n : names) known = known || kv.first == n;
    if (!known) fault(std::string(what) + " got an unexpected keyword argument '" + kv.first + "'");
  }
}

std::string dict_key(const Value& k) {
  switch (k.type) {
    case Value::Type::String:
      return k.s;
    case Value::Type::None:
      return "\x01n";
    case Value::Type::Bool:
    case Value::Type::Int:
      return "\x01i" + std::to_string(k.as_int());
    case Value::Type::Float:
      if (k.f == std::floor(k.f) && std::fabs(k.f) < 9e18)
        return "\x01i" + std::to_string(static_cast<int64_t>(k.f));
      return cat("\x01f", float_repr(k.f));
    default:
      fault("unhashable type: '" + type_name(k) + "'");
  }
}

Value key_value(const std::string& stored) {
  if (stored.empty() || stored[0] != '\x01') return Value::str(stored);
  if (stored[1] == 'n') return Value::none();
  if (stored[1] == 'i') return Value::integer(std::strtoll(stored.c_str() + 2, nullptr, 10));
  return Value::number(std::strtod(stored.c_str() + 2, nullptr));
}

Value Value::from_json(const nlohmann::ordered_json& j) {
  using T = nlohmann::ordered_json::value_t;
  switch (j.type()) {
    case T::null:
      return none();
    case T::boolean:
      return boolean(j.get<bool>());
    case T::number_integer:
      return integer(j.get<int64_t>());
    case T::number_unsigned:
      return integer(static_cast<int64_t>(j.get<uint64_t>()));
    case T::number_float:
      return number(j.get<double>());
    case T::string:
      return str(j.get<std::string>());
    case T::array: {
      List l;
      l.reserve(j.size());
      for (const auto& e : j) l.push_back(from_json(e));
      return make_list(std::move(l));
    }
    case T::object: {
      Value d = make_dict();
      for (const auto& [k, e] : j.items()) d.dict->items.emplace_back(k, from_json(e));
      return d;
    }
    default:
      return undefined();
  }
}

bool Value::truthy() const {
  switch (type) {
    case Type::Undefined:
    case Type::None:
      return false;
    case Type::Bool:
      return b;
    case Type::Int:
      return i != 0;
    case Type::Float:
      return f != 0;
    case Type::String:
      return !s.empty();
    case Type::Seq:
      return !list->empty();
    case Type::Dict:
      return !dict->items.empty();
    case Type::Callable:
      return true;
  }
  return false;
}

std::string type_name(const Value& v) {
  switch (v.type) {
    case Value::Type::Undefined:
      return "undefined";
    case Value::Type::None:
      return "NoneType";
    case Value::Type::Bool:
      return "bool";
    case Value::Type::Int:
      return "int";
    case Value::Type::Float:
      return "float";
    case Value::Type::String:
      return "str";
    case Value::Type::Seq:
      return v.tuple ? "tuple" : "list";
    case Value::Type::Dict:
      return v.dict->ns ? "Namespace" : "dict";
    case Value::Type::Callable:
      return "function";
  }
  return "?";
}

// Python's repr of a float: the shortest digits that read back the same, in fixed notation
// for exponents -5..15, else d.ddde+XX.
std::string float_repr(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  char buf[40];
  for (int prec = 1; prec <= 17; ++prec) {
    std::snprintf(buf, sizeof buf, "%.*e", prec - 1, x);
    if (std::strtod(buf, nullptr) == x) break;
  }
  // buf is [-]d.ddde[+-]XX: split into digits and exponent.
  std::string m(buf);
  const size_t e = m.find('e');
  const int exp = std::atoi(m.c_str() + e + 1);
  std::string digits;
  bool neg = false;
  for (size_t k = 0; k < e; ++k) {
    if (m[k] == '-') neg = true;
    if (m[k] >= '0' && m[k] <= '9') digits += m[k];
  }
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  std::string out = neg ? "-" : "";
  const int n = static_cast<int>(digits.size());
  if (exp < -4 || exp >= 16) {
    out += digits.substr(0, 1);
    if (n > 1) out += "." + digits.substr(1);
    char eb[16];
    std::snprintf(eb, sizeof eb, "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    return out + eb;
  }
  if (exp < 0) return out + "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
  if (exp + 1 >= n) return out + digits + std::string(static_cast<size_t>(exp + 1 - n), '0') + ".0";
  return out + digits.substr(0, static_cast<size_t>(exp + 1)) + "." +
         digits.substr(static_cast<size_t>(exp + 1));
}

std::u32string to_u32(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t n = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    if (i + n > s.size()) n = 1;
    char32_t cp = n == 1 ? c : c & (0x7F >> n);
    for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
    out.push_back(cp);
    i += n;
  }
  return out;
}

std::string to_utf8(std::u32string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) utf8_append(out, c);
  return out;
}

// str.isspace()'s characters (str.strip() and str.split() without arguments use them).
bool py_space(char32_t c) {
  return (c >= 9 && c <= 13) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

namespace {

std::string repr_str(const std::string& s) {
  const bool sq = s.find('\'') != std::string::npos, dq = s.find('"') != std::string::npos;
  const char q = sq && !dq ? '"' : '\'';
  std::string out(1, q);
  for (const char32_t c : to_u32(s)) {
    if (c == static_cast<char32_t>(q) || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7F || (c >= 0x80 && c < 0xA0)) {
      char b[8];
      std::snprintf(b, sizeof b, "\\x%02x", static_cast<unsigned>(c));
      out += b;
    } else {
      out += to_utf8(std::u32string(1, c));
    }
  }
  return out + q;
}

std::string json_str(const std::string& s) {
  std::string out = "\"";
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20) {
          char b[8];
          std::snprintf(b, sizeof b, "\\u%04x", c);
          out += b;
        } else {
          out += ch;
        }
    }
  }
  return out + "\"";
}

void json_into(std::string& out, const Value& v, int indent, int depth, const std::string& item_sep,
               const std::string& key_sep) {
  const auto newline = [&](int d) {
    if (indent < 0) return;
    out += '\n';
    out.append(static_cast<size_t>(indent * d), ' ');
  };
  switch (v.type) {
    case Value::Type::None:
      out += "null";
      return;
    case Value::Type::Bool:
      out += v.b ? "true" : "false";
      return;
    case Value::Type::Int:
      out += std::to_string(v.i);
      return;
    case Value::Type::Float:
      out += std::isnan(v.f)   ? "NaN"
             : std::isinf(v.f) ? (v.f > 0 ? "Infinity" : "-Infinity")
                               : float_repr(v.f);
      return;
    case Value::Type::String:
      out += json_str(v.s);
      return;
    case Value::Type::Seq:
      if (v.list->empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k) out += item_sep;
        newline(depth + 1);
        json_into(out, (*v.list)[k], indent, depth + 1, item_sep, key_sep);
      }
      newline(depth);
      out += ']';
      return;
    case Value::Type::Dict:
      if (v.dict->items.empty()) {
        out += "{}";
        return;
      }
      out += '{';
      for (size_t k = 0; k < v.dict->items.size(); ++k) {
        if (k) out += item_sep;
        newline(depth + 1);
        const Value key = key_value(v.dict->items[k].first);
        out += json_str(key.is_none()                   ? "null"
                        : key.type == Value::Type::Bool ? (key.b ? "true" : "false")
                                                        : to_str(key)) +
               key_sep;
        json_into(out, v.dict->items[k].second, indent, depth + 1, item_sep, key_sep);
      }
      newline(depth);
      out += '}';
      return;
    default:
      fault("Object of type " + type_name(v) + " is not JSON serializable");
  }
}

}  // namespace

std::string to_json(const Value& v, int indent, const std::string& item_sep,
                    const std::string& key_sep) {
  std::string out;
  json_into(out, v, indent, 0, item_sep, key_sep);
  return out;
}

std::string repr(const Value& v) {
  switch (v.type) {
    case Value::Type::String:
      return repr_str(v.s);
    case Value::Type::Seq: {
      std::string out = v.tuple ? "(" : "[";
      for (size_t k = 0; k < v.list->size(); ++k) out += (k ? ", " : "") + repr((*v.list)[k]);
      if (v.tuple && v.list->size() == 1) out += ",";
      return out + (v.tuple ? ")" : "]");
    }
    case Value::Type::Dict: {
      if (v.dict->ns) {
        std::string out = "<Namespace {";
        for (size_t k = 0; k < v.dict->items.size(); ++k)
          out += (k ? ", " : "") + repr_str(v.dict->items[k].first) + ": " +
                 repr(v.dict->items[k].second);
        return out + "}>";
      }
      std::string out = "{";
      for (size_t k = 0; k < v.dict->items.size(); ++k)
        out += (k ? ", " : "") + repr(key_value(v.dict->items[k].first)) + ": " +
               repr(v.dict->items[k].second);
      return out + "}";
    }
    default:
      return to_str(v);
  }
}

std::string to_str(const Value& v) {
  switch (v.type) {
    case Value::Type::Undefined:
      return "";
    case Value::Type::None:
      return "None";
    case Value::Type::Bool:
      return v.b ? "True" : "False";
    case Value::Type::Int:
      return std::to_string(v.i);
    case Value::Type::Float:
      return float_repr(v.f);
    case Value::Type::String:
      return v.s;
    case Value::Type::Callable:
      return "<function>";
    default:
      return repr(v);
  }
}

bool equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.type == Value::Type::Float || b.type == Value::Type::Float)
      return a.as_double() == b.as_double();
    return a.as_int() == b.as_int();
  }
  if (a.type != b.type) return false;
  switch (a.type) {
    case Value::Type::Undefined:
    case Value::Type::None:
      return true;
    case Value::Type::String:
      return a.s == b.s;
    case Value::Type::Seq:
      if (a.list->size() != b.list->size()) return false;
      for (size_t k = 0; k < a.list->size(); ++k)
        if (!equal((*a.list)[k], (*b.list)[k])) return false;
      return true;
    case Value::Type::Dict:
      if (a.dict->items.size() != b.dict->items.size()) return false;
      for (const auto& [k, x] : a.dict->items) {
        const Value* y = b.dict->find(k);
        if (!y || !equal(x, *y)) return false;
      }
      return true;
    case Value::Type::Callable:
      return a.func == b.func;
    default:
      return false;
  }
}

bool less(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.type == Value::Type::Float || b.type == Value::Type::Float)
      return a.as_double() < b.as_double();
    return a.as_int() < b.as_int();
  }
  if (a.is_string() && b.is_string()) return to_u32(a.s) < to_u32(b.s);
  if (a.is_list() && b.is_list()) {
    const size_t n = std::min(a.list->size(), b.list->size());
    for (size_t k = 0; k < n; ++k) {
      if (!equal((*a.list)[k], (*b.list)[k])) return less((*a.list)[k], (*b.list)[k]);
    }
    return a.list->size() < b.list->size();
  }
  if (a.is_undefined() || b.is_undefined()) fault(a.is_undefined() ? a.s : b.s);
  fault("'<' not supported between instances of '" + type_name(a) + "' and '" + type_name(b) + "'");
}

List iterate(const Value& v) {
  switch (v.type) {
    case Value::Type::Undefined:
      return {};
    case Value::Type::Seq:
      return *v.list;
    case Value::Type::Dict: {
      List keys;
      for (const auto& kv : v.dict->items) keys.push_back(key_value(kv.first));
      return keys;
    }
    case Value::Type::String: {
      List chars;
      for (const char32_t c : to_u32(v.s))
        chars.push_back(Value::str(to_utf8(std::u32string(1, c))));
      return chars;
    }
    default:
      fault(cat("'", type_name(v), "' object is not iterable"));
  }
}

}  // namespace kvs::jinja
