// Python's str, dict and list methods as a template calls them ("a,b".split(","),
// message.get("x"), text.startswith(...)), item and attribute access, and the string helpers
// the filters share; lists and dicts cannot be changed in place, as in transformers' sandbox.
#include <algorithm>
#include <cstdlib>
#include <string>
#include <utility>

#include "kvs/chat/jinja_impl.h"
#include "kvs/util/error.h"

namespace kvs::jinja {

const Value& need_str(const Value& v, const char* what) {
  if (!v.is_string()) fault(std::string(what) + " needs a string, not '" + type_name(v) + "'");
  return v;
}

int64_t need_int(const Value& v, const char* what) {
  if (v.type != Value::Type::Int && v.type != Value::Type::Bool)
    fault(std::string(what) + " needs an integer, not '" + type_name(v) + "'");
  return v.as_int();
}

static bool ascii_lower(char32_t c) {
  return c >= 'a' && c <= 'z';
}
static bool ascii_upper(char32_t c) {
  return c >= 'A' && c <= 'Z';
}
char32_t up(char32_t c) {
  return ascii_lower(c) ? c - 32 : c;
}
char32_t down(char32_t c) {
  return ascii_upper(c) ? c + 32 : c;
}
static bool alpha(char32_t c) {
  return ascii_lower(c) || ascii_upper(c) || c >= 0xC0;
}

std::string map_chars(const std::string& s, char32_t (*f)(char32_t)) {
  std::u32string u = to_u32(s);
  for (char32_t& c : u) c = f(c);
  return to_utf8(u);
}

// str.strip/lstrip/rstrip: Python's whitespace, or the characters of `chars`.
std::string strip(const std::string& s, const Value& chars, bool left, bool right) {
  const std::u32string u = to_u32(s);
  const std::u32string set = chars.is_string() ? to_u32(chars.s) : std::u32string();
  const auto drop = [&](char32_t c) {
    return chars.is_string() ? set.find(c) != std::u32string::npos : py_space(c);
  };
  size_t b = 0, e = u.size();
  if (left)
    while (b < e && drop(u[b])) ++b;
  if (right)
    while (e > b && drop(u[e - 1])) --e;
  return to_utf8(u.substr(b, e - b));
}

List split(const std::string& s, const Value& sep, int64_t maxsplit, bool from_right) {
  List out;
  if (!sep.is_string()) {
    // Runs of whitespace separate, leading and trailing whitespace dropped.
    const std::u32string u = to_u32(s);
    std::vector<std::u32string> words;
    size_t k = 0;
    if (!from_right) {
      while (k < u.size()) {
        while (k < u.size() && py_space(u[k])) ++k;
        if (k >= u.size()) break;
        if (maxsplit >= 0 && static_cast<int64_t>(words.size()) == maxsplit) {
          size_t e = u.size();
          while (e > k && py_space(u[e - 1])) --e;
          words.push_back(u.substr(k, e - k));
          break;
        }
        size_t e = k;
        while (e < u.size() && !py_space(u[e])) ++e;
        words.push_back(u.substr(k, e - k));
        k = e;
      }
    } else {
      size_t e = u.size();
      while (e > 0) {
        while (e > 0 && py_space(u[e - 1])) --e;
        if (e == 0) break;
        if (maxsplit >= 0 && static_cast<int64_t>(words.size()) == maxsplit) {
          size_t b = 0;
          while (b < e && py_space(u[b])) ++b;
          words.push_back(u.substr(b, e - b));
          break;
        }
        size_t b = e;
        while (b > 0 && !py_space(u[b - 1])) --b;
        words.push_back(u.substr(b, e - b));
        e = b;
      }
      std::reverse(words.begin(), words.end());
    }
    for (auto& w : words) out.push_back(Value::str(to_utf8(w)));
    return out;
  }
  if (sep.s.empty()) fault("empty separator");
  std::vector<std::string> parts;
  if (!from_right) {
    size_t b = 0, e;
    while ((maxsplit < 0 || static_cast<int64_t>(parts.size()) < maxsplit) &&
           (e = s.find(sep.s, b)) != std::string::npos) {
      parts.push_back(s.substr(b, e - b));
      b = e + sep.s.size();
    }
    parts.push_back(s.substr(b));
  } else {
    size_t e = s.size();
    while (maxsplit < 0 || static_cast<int64_t>(parts.size()) < maxsplit) {
      if (e < sep.s.size()) break;
      const size_t b = s.rfind(sep.s, e - sep.s.size());
      if (b == std::string::npos) break;
      parts.push_back(s.substr(b + sep.s.size(), e - b - sep.s.size()));
      e = b;
    }
    parts.push_back(s.substr(0, e));
    std::reverse(parts.begin(), parts.end());
  }
  for (auto& p : parts) out.push_back(Value::str(std::move(p)));
  return out;
}

std::string replace(const std::string& s, const std::string& from, const std::string& to,
                    int64_t count) {
  std::string out;
  if (from.empty()) {
    // Python inserts `to` between every character and at both ends.
    const std::u32string u = to_u32(s);
    int64_t n = 0;
    for (size_t k = 0; k <= u.size(); ++k) {
      if (count < 0 || n < count) {
        out += to;
        ++n;
      }
      if (k < u.size()) out += to_utf8(u.substr(k, 1));
    }
    return out;
  }
  size_t b = 0, e;
  int64_t n = 0;
  while ((count < 0 || n < count) && (e = s.find(from, b)) != std::string::npos) {
    out += s.substr(b, e - b) + to;
    b = e + from.size();
    ++n;
  }
  return out + s.substr(b);
}

// Python's str.title(): a letter after a non-letter starts a word.
static std::string py_title(const std::string& s) {
  std::u32string u = to_u32(s);
  bool prev = false;
  for (char32_t& c : u) {
    c = prev ? down(c) : up(c);
    prev = alpha(c);
  }
  return to_utf8(u);
}

std::string capitalize(const std::string& s) {
  std::u32string u = to_u32(s);
  for (size_t k = 0; k < u.size(); ++k) u[k] = k == 0 ? up(u[k]) : down(u[k]);
  return to_utf8(u);
}

static bool prefix_test(const std::string& s, const Value& p, bool start) {
  const auto one = [&](const std::string& x) {
    if (x.size() > s.size()) return false;
    return start ? s.compare(0, x.size(), x) == 0
                 : s.compare(s.size() - x.size(), x.size(), x) == 0;
  };
  if (p.is_list()) {
    for (const Value& x : *p.list)
      if (one(need_str(x, start ? "startswith" : "endswith").s)) return true;
    return false;
  }
  return one(need_str(p, start ? "startswith" : "endswith").s);
}

namespace {

[[noreturn]] void unsafe(const std::string& attr, const Value& obj) {
  fault("access to attribute '" + attr + "' of '" + type_name(obj) + "' object is unsafe.");
}

}  // namespace

Value items_of(const Value& v) {
  List out;
  if (v.is_undefined()) return Value::make_list();
  if (!v.is_dict()) fault("can only get item pairs from a mapping, not '" + type_name(v) + "'");
  for (const auto& [k, x] : v.dict->items) out.push_back(Value::make_list({key_value(k), x}, true));
  return Value::make_list(std::move(out));
}

Value get_item(const Value& obj, const Value& key) {
  switch (obj.type) {
    case Value::Type::Seq:
    case Value::Type::String: {
      if (key.type != Value::Type::Int && key.type != Value::Type::Bool)
        return Value::undefined(
            cat("'", type_name(obj), " object' has no attribute '", to_str(key), "'"));
      int64_t k = key.as_int();
      if (obj.is_list()) {
        const auto n = static_cast<int64_t>(obj.list->size());
        if (k < 0) k += n;
        if (k < 0 || k >= n)
          return Value::undefined(
              cat("'", type_name(obj), " object' has no element ", to_str(key)));
        return (*obj.list)[static_cast<size_t>(k)];
      }
      const std::u32string u = to_u32(obj.s);
      const auto n = static_cast<int64_t>(u.size());
      if (k < 0) k += n;
      if (k < 0 || k >= n) return Value::undefined("'str object' has no element " + to_str(key));
      return Value::str(to_utf8(u.substr(static_cast<size_t>(k), 1)));
    }
    case Value::Type::Dict:
      if (key.is_string() || key.is_number() || key.is_none()) {
        if (const Value* v = obj.dict->find(dict_key(key))) return *v;
        if (key.is_string()) return get_attr(obj, key.s);
      }
      return Value::undefined("'dict object' has no attribute '" + to_str(key) + "'");
    default:
      return Value::undefined(
          cat("'", type_name(obj), " object' has no attribute '", to_str(key), "'"));
  }
}

Value get_attr(const Value& obj, const std::string& name) {
  static const char* kDictMethods[] = {"items", "keys",    "values",     "get",   "update",
                                       "pop",   "popitem", "setdefault", "clear", "copy"};
  static const char* kStrMethods[] = {
      "strip",   "lstrip",  "rstrip",  "split",      "rsplit",       "startswith",  "endswith",
      "upper",   "lower",   "title",   "capitalize", "replace",      "find",        "rfind",
      "index",   "count",   "join",    "splitlines", "isdigit",      "isalpha",     "isalnum",
      "isspace", "islower", "isupper", "format",     "removeprefix", "removesuffix"};
  static const char* kListMethods[] = {"index",  "count", "append", "extend",  "insert", "pop",
                                       "remove", "clear", "sort",   "reverse", "copy"};
  const auto bound = [&](auto& names) {
    for (const char* n : names)
      if (name == n) {
        Value self = obj;
        return Value::function([self, name](CallArgs& a) {
          Value out;
          call_method(self, name, a, out);
          return out;
        });
      }
    return Value::undefined(cat("'", type_name(obj), " object' has no attribute '", name, "'"));
  };
  if (obj.is_dict()) {
    if (!obj.dict->ns) {
      for (const char* n : kDictMethods)
        if (name == n) return bound(kDictMethods);
    }
    if (const Value* v = obj.dict->find(name)) return *v;
    return Value::undefined(cat("'", type_name(obj), " object' has no attribute '", name, "'"));
  }
  if (obj.is_string()) return bound(kStrMethods);
  if (obj.is_list()) return bound(kListMethods);
  return Value::undefined(cat("'", type_name(obj), " object' has no attribute '", name, "'"));
}

bool call_method(const Value& obj, const std::string& name, CallArgs& a, Value& out) {
  if (obj.is_string()) {
    const std::string& s = obj.s;
    if (name == "strip" || name == "lstrip" || name == "rstrip") {
      out = Value::str(strip(s, a.get("chars", 0), name != "rstrip", name != "lstrip"));
    } else if (name == "split" || name == "rsplit") {
      const Value ms = a.get("maxsplit", 1, Value::integer(-1));
      out = Value::make_list(split(s, a.get("sep", 0), need_int(ms, "split"), name == "rsplit"));
    } else if (name == "startswith" || name == "endswith") {
      out = Value::boolean(prefix_test(s, a.get("prefix", 0), name == "startswith"));
    } else if (name == "upper" || name == "lower") {
      out = Value::str(map_chars(s, name == "upper" ? up : down));
    } else if (name == "title") {
      out = Value::str(py_title(s));
    } else if (name == "capitalize") {
      out = Value::str(capitalize(s));
    } else if (name == "replace") {
      const Value c = a.get("count", 2, Value::integer(-1));
      out = Value::str(replace(s, need_str(a.get("old", 0), "replace").s,
                               need_str(a.get("new", 1), "replace").s, need_int(c, "replace")));
    } else if (name == "find" || name == "rfind" || name == "index") {
      const std::string sub = need_str(a.get("sub", 0), name.c_str()).s;
      const size_t at = name == "rfind" ? s.rfind(sub) : s.find(sub);
      if (at == std::string::npos && name == "index") fault("substring not found");
      out = Value::integer(
          at == std::string::npos ? -1 : static_cast<int64_t>(to_u32(s.substr(0, at)).size()));
    } else if (name == "count") {
      const std::string sub = need_str(a.get("sub", 0), "count").s;
      int64_t n = 0;
      if (sub.empty()) {
        n = static_cast<int64_t>(to_u32(s).size()) + 1;
      } else {
        for (size_t at = s.find(sub); at != std::string::npos; at = s.find(sub, at + sub.size()))
          ++n;
      }
      out = Value::integer(n);
    } else if (name == "join") {
      std::string r;
      bool first = true;
      for (const Value& x : iterate(a.get("iterable", 0))) {
        if (!first) r += s;
        r += need_str(x, "join").s;
        first = false;
      }
      out = Value::str(std::move(r));
    } else if (name == "splitlines") {
      List l;
      size_t b = 0;
      while (b < s.size()) {
        size_t e = s.find_first_of("\r\n", b);
        if (e == std::string::npos) {
          l.push_back(Value::str(s.substr(b)));
          break;
        }
        l.push_back(Value::str(s.substr(b, e - b)));
        b = e + (s[e] == '\r' && e + 1 < s.size() && s[e + 1] == '\n' ? 2 : 1);
      }
      out = Value::make_list(std::move(l));
    } else if (name == "isdigit" || name == "isalpha" || name == "isalnum" || name == "isspace") {
      const std::u32string u = to_u32(s);
      bool all = !u.empty();
      for (const char32_t c : u) {
        const bool d = c >= '0' && c <= '9';
        all = all && (name == "isdigit"   ? d
                      : name == "isalpha" ? alpha(c)
                      : name == "isalnum" ? d || alpha(c)
                                          : py_space(c));
      }
      out = Value::boolean(all);
    } else if (name == "islower" || name == "isupper") {
      bool cased = false, ok = true;
      for (const char32_t c : to_u32(s)) {
        if (ascii_lower(c) || ascii_upper(c)) cased = true;
        if (name == "islower" ? ascii_upper(c) : ascii_lower(c)) ok = false;
      }
      out = Value::boolean(cased && ok);
    } else if (name == "removeprefix" || name == "removesuffix") {
      const std::string x = need_str(a.get("prefix", 0), name.c_str()).s;
      out = Value::str(s);
      if (prefix_test(s, Value::str(x), name == "removeprefix"))
        out.s = name == "removeprefix" ? s.substr(x.size()) : s.substr(0, s.size() - x.size());
    } else if (name == "format") {
      // "{}" and "{0}" / "{name}" fields.
      std::string r;
      size_t next = 0;
      for (size_t k = 0; k < s.size(); ++k) {
        if (s[k] == '{' && k + 1 < s.size() && s[k + 1] == '{') {
          r += '{';
          ++k;
        } else if (s[k] == '}' && k + 1 < s.size() && s[k + 1] == '}') {
          r += '}';
          ++k;
        } else if (s[k] == '{') {
          const size_t e = s.find('}', k);
          if (e == std::string::npos) fault("Single '{' encountered in format string");
          const std::string field = s.substr(k + 1, e - k - 1);
          Value v;
          if (field.empty())
            v = a.get("", next++);
          else if (field.find_first_not_of("0123456789") == std::string::npos)
            v = a.get("", static_cast<size_t>(std::atoll(field.c_str())));
          else
            v = a.get(field.c_str(), SIZE_MAX);
          if (v.is_undefined()) fault("format: no argument for field {" + field + "}");
          r += to_str(v);
          k = e;
        } else {
          r += s[k];
        }
      }
      out = Value::str(std::move(r));
    } else {
      return false;
    }
    return true;
  }
  if (obj.is_dict() && !obj.dict->ns) {
    if (name == "items") {
      out = items_of(obj);
    } else if (name == "keys" || name == "values") {
      List l;
      for (const auto& [k, v] : obj.dict->items) l.push_back(name == "keys" ? key_value(k) : v);
      out = Value::make_list(std::move(l));
    } else if (name == "get") {
      const Value key = a.get("key", 0);
      const Value* v = key.is_string() || key.is_number() || key.is_none()
                           ? obj.dict->find(dict_key(key))
                           : nullptr;
      out = v ? *v : a.get("default", 1, Value::none());
    } else if (name == "copy") {
      out = Value::make_dict();
      out.dict->items = obj.dict->items;
    } else if (name == "update" || name == "pop" || name == "popitem" || name == "setdefault" ||
               name == "clear") {
      unsafe(name, obj);
    } else {
      return false;
    }
    return true;
  }
  if (obj.is_list()) {
    if (name == "index" || name == "count") {
      const Value x = a.get("value", 0);
      int64_t n = 0, first = -1;
      for (size_t k = 0; k < obj.list->size(); ++k)
        if (equal((*obj.list)[k], x)) {
          if (first < 0) first = static_cast<int64_t>(k);
          ++n;
        }
      if (name == "index" && first < 0) fault(repr(x) + " is not in list");
      out = Value::integer(name == "index" ? first : n);
    } else if (name == "copy") {
      out = Value::make_list(*obj.list);
    } else if (name == "append" || name == "extend" || name == "insert" || name == "pop" ||
               name == "remove" || name == "clear" || name == "sort" || name == "reverse") {
      unsafe(name, obj);
    } else {
      return false;
    }
    return true;
  }
  return false;
}

}  // namespace kvs::jinja
