// jinja2's filters and tests, and the globals a chat template
// may call (range, namespace, dict, raise_exception, strftime_now, cycler, joiner), with the
// semantics of jinja2 3.1 in transformers' ImmutableSandboxedEnvironment: lists and dicts cannot
// be changed in place, tojson is json.dumps(ensure_ascii=False) in the dict's own key order.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <ctime>
#include <string>
#include <utility>

#include "kvs/chat/jinja_impl.h"

namespace kvs::jinja {
namespace {

Value sorted_keys(const Value& v) {
  if (v.is_list()) {
    List out;
    for (const Value& x : *v.list) out.push_back(sorted_keys(x));
    return Value::make_list(std::move(out), v.tuple);
  }
  if (!v.is_dict()) return v;
  Value d = Value::make_dict();
  for (const auto& [k, x] : v.dict->items) d.dict->items.emplace_back(k, sorted_keys(x));
  std::sort(d.dict->items.begin(), d.dict->items.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  return d;
}

// An item's attribute for map/selectattr/sort/...: "a.b" walks, digits index lists.
Value attribute_of(const Value& v, const Value& attr) {
  if (!attr.is_string()) return get_item(v, attr);
  Value cur = v;
  size_t b = 0;
  while (true) {
    const size_t e = attr.s.find('.', b);
    const std::string part = attr.s.substr(b, e == std::string::npos ? e : e - b);
    const bool digits = !part.empty() && part.find_first_not_of("0123456789") == std::string::npos;
    cur = digits ? get_item(cur, Value::integer(std::atoll(part.c_str())))
                 : get_item(cur, Value::str(part));
    if (e == std::string::npos) return cur;
    b = e + 1;
  }
}

// The key sort/unique/min/max compare: strings lowered unless case_sensitive.
Value sort_key(const Value& v, bool case_sensitive) {
  if (!case_sensitive && v.is_string()) return Value::str(map_chars(v.s, down));
  return v;
}

}  // namespace

std::string html_escape(const std::string& s) {
  std::string out;
  for (const char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

namespace {

size_t length(const Value& v) {
  switch (v.type) {
    case Value::Type::String:
      return to_u32(v.s).size();
    case Value::Type::Seq:
      return v.list->size();
    case Value::Type::Dict:
      return v.dict->items.size();
    case Value::Type::Undefined:
      return 0;
    default:
      fault("object of type '" + type_name(v) + "' has no len()");
  }
}

// tojson as transformers defines it: json.dumps(x, ensure_ascii=False, indent, separators,
// sort_keys) rather than jinja2's HTML-safe one.
Value tojson(const Value& v, CallArgs& a) {
  a.check("tojson", 4, {"ensure_ascii", "indent", "separators", "sort_keys"});
  const Value ind = a.get("indent", 1);
  int indent = -1;
  if (ind.type == Value::Type::Int) indent = static_cast<int>(ind.i);
  std::string item_sep = indent >= 0 ? "," : ", ", key_sep = ": ";
  const Value seps = a.get("separators", 2);
  if (seps.is_list() && seps.list->size() == 2) {
    item_sep = need_str((*seps.list)[0], "tojson separators").s;
    key_sep = need_str((*seps.list)[1], "tojson separators").s;
  }
  const Value x = a.get("sort_keys", 3).truthy() ? sorted_keys(v) : v;
  std::string out = to_json(x, indent, item_sep, key_sep);
  if (a.get("ensure_ascii", 0).truthy()) {
    std::string esc;
    for (const char32_t c : to_u32(out)) {
      char b[16];
      if (c < 0x80) {
        esc += static_cast<char>(c);
      } else if (c < 0x10000) {
        std::snprintf(b, sizeof b, "\\u%04x", static_cast<unsigned>(c));
        esc += b;
      } else {
        const char32_t d = c - 0x10000;
        std::snprintf(b, sizeof b, "\\u%04x\\u%04x", static_cast<unsigned>(0xD800 + (d >> 10)),
                      static_cast<unsigned>(0xDC00 + (d & 0x3FF)));
        esc += b;
      }
    }
    out = std::move(esc);
  }
  return Value::str(std::move(out));
}

Value to_int(const Value& v, const Value& def) {
  switch (v.type) {
    case Value::Type::Int:
    case Value::Type::Bool:
      return Value::integer(v.as_int());
    case Value::Type::Float:
      return Value::integer(static_cast<int64_t>(v.f));
    case Value::Type::String: {
      char* end = nullptr;
      const std::string t = strip(v.s, Value::none(), true, true);
      const long long i = std::strtoll(t.c_str(), &end, 10);
      if (!t.empty() && *end == 0) return Value::integer(i);
      const double d = std::strtod(t.c_str(), &end);
      if (!t.empty() && *end == 0) return Value::integer(static_cast<int64_t>(d));
      return def;
    }
    default:
      return def;
  }
}

Value to_float(const Value& v, const Value& def) {
  if (v.is_number()) return Value::number(v.as_double());
  if (v.is_string()) {
    char* end = nullptr;
    const std::string t = strip(v.s, Value::none(), true, true);
    const double d = std::strtod(t.c_str(), &end);
    if (!t.empty() && *end == 0) return Value::number(d);
  }
  return def;
}

std::string indent(const std::string& s, const Value& width, bool first, bool blank) {
  const std::string ind = width.is_string()
                              ? width.s
                              : std::string(static_cast<size_t>(need_int(width, "indent")), ' ');
  // As jinja2: a newline added, then splitlines() (which then drops it).
  std::vector<std::string> lines;
  const std::string t = s + "\n";
  size_t b = 0, e;
  while ((e = t.find('\n', b)) != std::string::npos) {
    lines.push_back(t.substr(b, e - b));
    b = e + 1;
  }
  std::string out;
  for (size_t k = 0; k < lines.size(); ++k) {
    if (k > 0) out += "\n";
    if (k > 0 && (blank || !lines[k].empty())) out += ind;
    out += lines[k];
  }
  if (first) out = ind + out;
  return out;
}

bool select_test(Evaluator& ev, const Value& item, CallArgs& a, size_t first) {
  if (a.pos.size() <= first) return item.truthy();
  const Value name = need_str(a.pos[first], "select");
  CallArgs rest;
  rest.pos.assign(a.pos.begin() + static_cast<std::ptrdiff_t>(first) + 1, a.pos.end());
  return apply_test(ev, name.s, item, rest);
}

}  // namespace

Value apply_filter(Evaluator& ev, const std::string& name, Value v, CallArgs& a) {
  if (name == "default" || name == "d") {
    const bool boolean = a.get("boolean", 1, Value::boolean(false)).truthy();
    if (v.is_undefined() || (boolean && !v.truthy()))
      return a.get("default_value", 0, Value::str(""));
    return v;
  }
  if (v.is_undefined() && name != "length" && name != "count" && name != "items" &&
      name != "list" && name != "string" && name != "trim" && name != "join" && name != "lower" &&
      name != "upper" && name != "safe" && name != "int" && name != "float" && name != "select" &&
      name != "reject" && name != "selectattr" && name != "rejectattr" && name != "map" &&
      name != "unique" && name != "first")
    fault(v.s.empty() ? "undefined value" : v.s);
  if (name == "length" || name == "count") return Value::integer(static_cast<int64_t>(length(v)));
  if (name == "tojson") return tojson(v, a);
  if (name == "string") return Value::str(to_str(v));
  if (name == "safe") {
    Value m = Value::str(to_str(v));
    m.markup = true;
    return m;
  }
  if (name == "trim") return Value::str(strip(to_str(v), a.get("chars", 0), true, true));
  if (name == "upper" || name == "lower")
    return Value::str(map_chars(to_str(v), name == "upper" ? up : down));
  if (name == "capitalize") return Value::str(capitalize(to_str(v)));
  if (name == "title") {
    // jinja2's: words begin after '-', whitespace or an opening bracket.
    std::u32string u = to_u32(to_str(v));
    bool start = true;
    for (char32_t& c : u) {
      const bool sep = py_space(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
      c = sep ? c : start ? up(c) : down(c);
      start = sep;
    }
    return Value::str(to_utf8(u));
  }
  if (name == "items") return items_of(v);
  if (name == "list") return Value::make_list(iterate(v));
  if (name == "first" || name == "last") {
    const List l = iterate(v);
    if (l.empty()) return Value::undefined("No first item, sequence was empty.");
    return name == "first" ? l.front() : l.back();
  }
  if (name == "join") {
    const std::string sep = to_str(a.get("d", 0, Value::str("")));
    const Value attr = a.get("attribute", 1);
    std::string out;
    bool first = true;
    for (const Value& x : iterate(v)) {
      if (!first) out += sep;
      out += to_str(attr.is_undefined() ? x : attribute_of(x, attr));
      first = false;
    }
    return Value::str(std::move(out));
  }
  if (name == "replace") {
    const Value c = a.get("count", 2, Value::none());
    return Value::str(replace(to_str(v), to_str(a.get("old", 0)), to_str(a.get("new", 1)),
                              c.is_none() ? -1 : need_int(c, "replace")));
  }
  if (name == "int") return to_int(v, a.get("default", 0, Value::integer(0)));
  if (name == "float") return to_float(v, a.get("default", 0, Value::number(0)));
  if (name == "abs") {
    if (!v.is_number()) fault("bad operand type for abs(): '" + type_name(v) + "'");
    return v.type == Value::Type::Float ? Value::number(std::fabs(v.f))
                                        : Value::integer(std::llabs(v.as_int()));
  }
  if (name == "round") {
    const int64_t prec = need_int(a.get("precision", 0, Value::integer(0)), "round");
    const std::string method = to_str(a.get("method", 1, Value::str("common")));
    const double m = std::pow(10.0, static_cast<double>(prec)), x = v.as_double() * m;
    const double r = method == "ceil"    ? std::ceil(x)
                     : method == "floor" ? std::floor(x)
                                         : std::nearbyint(x);
    return Value::number(r / m);
  }
  if (name == "indent")
    return Value::str(indent(to_str(v), a.get("width", 0, Value::integer(4)),
                             a.get("first", 1).truthy(), a.get("blank", 2).truthy()));
  if (name == "center") {
    const std::u32string u = to_u32(to_str(v));
    const int64_t w = need_int(a.get("width", 0, Value::integer(80)), "center");
    const int64_t marg = w - static_cast<int64_t>(u.size());
    if (marg <= 0) return Value::str(to_str(v));
    const int64_t left = marg / 2 + (marg & w & 1);
    return Value::str(std::string(static_cast<size_t>(left), ' ') + to_str(v) +
                      std::string(static_cast<size_t>(marg - left), ' '));
  }
  if (name == "escape" || name == "e" || name == "forceescape") {
    Value m = Value::str(v.markup && name != "forceescape" ? v.s : html_escape(to_str(v)));
    m.markup = true;
    return m;
  }
  if (name == "wordcount")
    return Value::integer(static_cast<int64_t>(split(to_str(v), Value::none(), -1, false).size()));
  if (name == "format") {
    CallArgs fa;
    Value args = Value::make_list(a.pos, true);
    (void)fa;
    std::string f = to_str(v);
    // As str % tuple.
    std::string out;
    size_t n = 0;
    for (size_t k = 0; k < f.size(); ++k) {
      if (f[k] != '%' || k + 1 >= f.size()) {
        out += f[k];
        continue;
      }
      const char c = f[++k];
      if (c == '%') {
        out += '%';
      } else if (n < args.list->size()) {
        out += c == 'r' ? repr((*args.list)[n]) : to_str((*args.list)[n]);
        ++n;
      } else {
        fault("not enough arguments for format string");
      }
    }
    return Value::str(std::move(out));
  }
  if (name == "reverse") {
    if (v.is_string()) {
      std::u32string u = to_u32(v.s);
      std::reverse(u.begin(), u.end());
      return Value::str(to_utf8(u));
    }
    List l = iterate(v);
    std::reverse(l.begin(), l.end());
    return Value::make_list(std::move(l));
  }
  if (name == "attr") return get_attr(v, to_str(a.get("name", 0)));
  // jinja2's select/reject/map iterate only a true value ("if value: for item in value").
  if ((name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr" ||
       name == "map") &&
      !v.truthy())
    return Value::make_list();
  if (name == "select" || name == "reject") {
    List out;
    for (const Value& x : iterate(v))
      if (select_test(ev, x, a, 0) == (name == "select")) out.push_back(x);
    return Value::make_list(std::move(out));
  }
  if (name == "selectattr" || name == "rejectattr") {
    if (a.pos.empty()) fault(name + " needs an attribute");
    List out;
    for (const Value& x : iterate(v))
      if (select_test(ev, attribute_of(x, a.pos[0]), a, 1) == (name == "selectattr"))
        out.push_back(x);
    return Value::make_list(std::move(out));
  }
  if (name == "map") {
    List out;
    const Value attr = a.get("attribute", SIZE_MAX);
    if (!attr.is_undefined()) {
      const Value def = a.get("default", SIZE_MAX);
      for (const Value& x : iterate(v)) {
        Value y = attribute_of(x, attr);
        out.push_back(y.is_undefined() && !def.is_undefined() ? def : y);
      }
    } else {
      if (a.pos.empty()) fault("map needs a filter name or attribute=");
      const std::string f = need_str(a.pos[0], "map").s;
      for (const Value& x : iterate(v)) {
        CallArgs rest;
        rest.pos.assign(a.pos.begin() + 1, a.pos.end());
        rest.kw = a.kw;
        out.push_back(apply_filter(ev, f, x, rest));
      }
    }
    return Value::make_list(std::move(out));
  }
  if (name == "unique" || name == "sort" || name == "min" || name == "max" || name == "dictsort") {
    const bool cs = a.get("case_sensitive", name == "dictsort" ? 0
                                            : name == "sort"   ? 1
                                                               : 0)
                        .truthy();
    const Value attr = a.get("attribute", name == "sort" ? 2 : 1);
    const auto key = [&](const Value& x) {
      return sort_key(attr.is_undefined() ? x : attribute_of(x, attr), cs);
    };
    List l = name == "dictsort" ? *items_of(v).list : iterate(v);
    if (name == "dictsort") {
      const bool by_value = to_str(a.get("by", 1, Value::str("key"))) == "value";
      std::stable_sort(l.begin(), l.end(), [&](const Value& x, const Value& y) {
        return less(sort_key((*x.list)[by_value ? 1 : 0], cs),
                    sort_key((*y.list)[by_value ? 1 : 0], cs));
      });
      if (a.get("reverse", 2).truthy()) std::reverse(l.begin(), l.end());
      return Value::make_list(std::move(l));
    }
    if (name == "unique") {
      List out;
      std::vector<Value> seen;
      for (const Value& x : l) {
        const Value k = key(x);
        bool dup = false;
        for (const Value& s : seen) dup = dup || equal(s, k);
        if (!dup) {
          seen.push_back(k);
          out.push_back(x);
        }
      }
      return Value::make_list(std::move(out));
    }
    if (name == "sort") {
      std::stable_sort(l.begin(), l.end(),
                       [&](const Value& x, const Value& y) { return less(key(x), key(y)); });
      if (a.get("reverse", 0).truthy()) std::reverse(l.begin(), l.end());
      return Value::make_list(std::move(l));
    }
    if (l.empty()) return Value::undefined("No aggregated item, sequence was empty.");
    Value best = l[0];
    for (const Value& x : l)
      if (name == "min" ? less(key(x), key(best)) : less(key(best), key(x))) best = x;
    return best;
  }
  if (name == "sum") {
    const Value attr = a.get("attribute", 0);
    Value total = a.get("start", 1, Value::integer(0));
    for (const Value& x : iterate(v)) {
      const Value y = attr.is_undefined() ? x : attribute_of(x, attr);
      if (!y.is_number() || !total.is_number()) fault("unsupported operand type(s) for +");
      total = total.type == Value::Type::Float || y.type == Value::Type::Float
                  ? Value::number(total.as_double() + y.as_double())
                  : Value::integer(total.as_int() + y.as_int());
    }
    return total;
  }
  if (name == "batch") {
    const int64_t n = need_int(a.get("linecount", 0), "batch");
    if (n <= 0) fault("batch needs a positive size");
    const Value fill = a.get("fill_with", 1, Value::none());
    List out, cur;
    for (const Value& x : iterate(v)) {
      cur.push_back(x);
      if (static_cast<int64_t>(cur.size()) == n) {
        out.push_back(Value::make_list(std::move(cur)));
        cur.clear();
      }
    }
    if (!cur.empty()) {
      if (!a.get("fill_with", 1).is_undefined())
        while (static_cast<int64_t>(cur.size()) < n) cur.push_back(fill);
      out.push_back(Value::make_list(std::move(cur)));
    }
    return Value::make_list(std::move(out));
  }
  fault("no filter named '" + name + "'");
}

bool apply_test(Evaluator& ev, const std::string& name, const Value& v, CallArgs& a) {
  using T = Value::Type;
  const Value arg = a.get("", 0);
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "boolean") return v.type == T::Bool;
  if (name == "true") return v.type == T::Bool && v.b;
  if (name == "false") return v.type == T::Bool && !v.b;
  if (name == "integer") return v.type == T::Int;
  if (name == "float") return v.type == T::Float;
  if (name == "number") return v.is_number();
  if (name == "string") return v.is_string();
  if (name == "mapping") return v.is_dict() && !v.dict->ns;
  // Undefined iterates as empty in jinja2 and has a length, so it is both.
  if (name == "iterable") return v.is_string() || v.is_list() || v.is_dict() || v.is_undefined();
  if (name == "sequence") return v.is_string() || v.is_list() || v.is_dict() || v.is_undefined();
  if (name == "callable") return v.type == T::Callable;
  if (name == "sameas") {
    if (v.type != arg.type) return false;
    if (v.is_list()) return v.list == arg.list;
    if (v.is_dict()) return v.dict == arg.dict;
    if (v.is_number() || v.is_none() || v.is_undefined()) return equal(v, arg);
    return false;
  }
  if (name == "escaped") return false;
  if (name == "in") {
    if (arg.is_string()) return v.is_string() && arg.s.find(v.s) != std::string::npos;
    for (const Value& x : iterate(arg))
      if (equal(x, v)) return true;
    return false;
  }
  if (name == "==" || name == "eq" || name == "equalto") return equal(v, arg);
  if (name == "!=" || name == "ne") return !equal(v, arg);
  if (name == "<" || name == "lt" || name == "lessthan") return less(v, arg);
  if (name == ">" || name == "gt" || name == "greaterthan") return less(arg, v);
  if (name == "<=" || name == "le") return !less(arg, v);
  if (name == ">=" || name == "ge") return !less(v, arg);
  if (name == "odd" || name == "even" || name == "divisibleby") {
    const int64_t x = need_int(v, name.c_str());
    if (name == "divisibleby") {
      const int64_t d = need_int(arg, "divisibleby");
      if (d == 0) fault("integer division or modulo by zero");
      return x % d == 0;
    }
    return (x % 2 != 0) == (name == "odd");
  }
  if (name == "lower" || name == "upper") {
    Value out;
    CallArgs none;
    call_method(Value::str(to_str(v)), name == "lower" ? "islower" : "isupper", none, out);
    return out.b;
  }
  (void)ev;
  fault("no test named '" + name + "'");
}

Value builtin_global(const std::string& name, const RenderOptions& o) {
  if (name == "range")
    return Value::function([](CallArgs& a) {
      int64_t start = 0, stop = 0, step = 1;
      if (a.pos.size() == 1) {
        stop = need_int(a.pos[0], "range");
      } else if (a.pos.size() >= 2) {
        start = need_int(a.pos[0], "range");
        stop = need_int(a.pos[1], "range");
        if (a.pos.size() > 2) step = need_int(a.pos[2], "range");
      } else {
        fault("range expected at least 1 argument");
      }
      if (step == 0) fault("range() arg 3 must not be zero");
      List l;
      for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step) {
        if (l.size() >= 100000) fault("range too big");  // as jinja2's sandbox
        l.push_back(Value::integer(k));
      }
      return Value::make_list(std::move(l));
    });
  if (name == "namespace" || name == "dict")
    return Value::function([name](CallArgs& a) {
      Value d = Value::make_dict();
      d.dict->ns = name == "namespace";
      for (const Value& p : a.pos) {
        if (!p.is_dict()) fault(name + "() takes mappings as positional arguments");
        for (const auto& [k, x] : p.dict->items) d.dict->set(k, x);
      }
      for (const auto& [k, x] : a.kw) d.dict->set(k, x);
      return d;
    });
  if (name == "raise_exception")
    return Value::function(
        [](CallArgs& a) -> Value { fault("raise_exception: " + to_str(a.get("message", 0))); });
  if (name == "strftime_now") {
    const int64_t now = o.now;
    return Value::function([now](CallArgs& a) {
      const std::time_t t = now ? static_cast<std::time_t>(now) : std::time(nullptr);
      std::tm tm{};
      localtime_r(&t, &tm);
      char buf[256];
      const std::string f = to_str(a.get("format", 0));
      // The template's own format, as Python's strftime takes it.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
      const size_t n = std::strftime(buf, sizeof buf, f.c_str(), &tm);
#pragma GCC diagnostic pop
      return Value::str(std::string(buf, n));
    });
  }
  if (name == "cycler")
    return Value::function([](CallArgs& a) {
      Value c = Value::make_dict();
      c.dict->ns = true;
      auto items = std::make_shared<List>(a.pos);
      auto pos = std::make_shared<size_t>(0);
      c.dict->set("next", Value::function([items, pos](CallArgs&) {
                    if (items->empty()) return Value::none();
                    Value v = (*items)[*pos % items->size()];
                    ++*pos;
                    return v;
                  }));
      c.dict->set("reset", Value::function([pos](CallArgs&) {
                    *pos = 0;
                    return Value::none();
                  }));
      return c;
    });
  if (name == "joiner")
    return Value::function([](CallArgs& a) {
      const std::string sep = to_str(a.get("sep", 0, Value::str(", ")));
      auto used = std::make_shared<bool>(false);
      return Value::function([sep, used](CallArgs&) {
        const bool first = !*used;
        *used = true;
        return Value::str(first ? "" : sep);
      });
    });
  return Value::undefined();
}

}  // namespace kvs::jinja