// The Jinja evaluator: statements with jinja2's scoping (a for loop's body and a macro's call
// are scopes of their own, an if is not), expressions with Python's semantics, and every fault
// reported with the template's name and the position of the innermost node it happened in.
#include <cmath>
#include <string>
#include <utility>

#include "kvs/chat/jinja_impl.h"
#include "kvs/util/error.h"

namespace kvs::jinja {
namespace {

struct Scope {
  Scope* parent = nullptr;
  std::vector<std::pair<std::string, Value>> vars;

  Value* lookup(const std::string& name) {
    for (Scope* s = this; s; s = s->parent)
      for (auto& [k, v] : s->vars)
        if (k == name) return &v;
    return nullptr;
  }
  void set(const std::string& name, Value v) {
    for (auto& [k, old] : vars)
      if (k == name) {
        old = std::move(v);
        return;
      }
    vars.emplace_back(name, std::move(v));
  }
};

enum class Flow { Normal, Break, Continue };

// A located error: Fault becomes this once a node's position is known, so outer nodes pass it on.
struct Located : std::runtime_error {
  explicit Located(const std::string& m) : std::runtime_error(m) {}
};

class Renderer final : public Evaluator {
 public:
  Renderer(const Program& p, const RenderOptions& o) : p_(p), o_(o) {}

  std::string run(const nlohmann::ordered_json& context) {
    Scope root;
    if (context.is_object())
      for (const auto& [k, v] : context.items()) root.vars.emplace_back(k, Value::from_json(v));
    std::string out;
    try {
      exec(p_.body, root, out);
    } catch (const Located& e) {
      throw Error(e.what());
    }
    return out;
  }

  Value call(const Value& fn, CallArgs& args) override {
    if (fn.type != Value::Type::Callable) {
      if (fn.is_undefined()) fault(fn.s.empty() ? "undefined value is not callable" : fn.s);
      fault(cat("'", type_name(fn), "' object is not callable"));
    }
    return (*fn.func)(args);
  }

 private:
  [[noreturn]] void located(size_t pos, const std::string& m) const {
    throw Located("template '" + p_.name + "' at " + where(p_.source, pos) + ": " + m);
  }

  Flow exec(const Body& body, Scope& sc, std::string& out) {
    for (const StmtP& s : body) {
      const Flow f = exec_one(*s, sc, out);
      if (f != Flow::Normal) return f;
    }
    return Flow::Normal;
  }

  Flow exec_one(const Stmt& s, Scope& sc, std::string& out) {
    try {
      return exec_stmt(s, sc, out);
    } catch (const Fault& e) {
      located(s.pos, e.what());
    }
  }

  Flow exec_stmt(const Stmt& s, Scope& sc, std::string& out) {
    switch (s.kind) {
      case Stmt::Kind::Text:
        out += s.text;
        return Flow::Normal;
      case Stmt::Kind::Output:
        out += to_str(eval(*s.expr, sc));
        return Flow::Normal;
      case Stmt::Kind::If:
        for (const auto& [cond, body] : s.branches)
          if (!cond || eval(*cond, sc).truthy()) return exec(body, sc, out);
        return Flow::Normal;
      case Stmt::Kind::For:
        return exec_for(s, sc, out);
      case Stmt::Kind::Set:
        assign(s, sc, eval(*s.expr, sc));
        return Flow::Normal;
      case Stmt::Kind::SetBlock: {
        std::string text;
        exec(s.body, sc, text);
        sc.set(s.targets[0], Value::str(std::move(text)));
        return Flow::Normal;
      }
      case Stmt::Kind::Macro:
        sc.set(s.text, macro(s, sc, nullptr));
        return Flow::Normal;
      case Stmt::Kind::CallBlock: {
        // The call's macro gets caller(), which renders this block's body.
        Value caller = macro(s, sc, nullptr);
        const Expr& c = *s.expr;
        Value fn = eval(*c.args[0], sc);
        CallArgs a = args_of(c, sc, 1);
        a.kw.emplace_back("caller", caller);
        out += to_str(call(fn, a));
        return Flow::Normal;
      }
      case Stmt::Kind::FilterBlock: {
        std::string text;
        exec(s.body, sc, text);
        out += to_str(filter_chain(*s.filter, Value::str(std::move(text)), sc));
        return Flow::Normal;
      }
      case Stmt::Kind::Break:
        return Flow::Break;
      case Stmt::Kind::Continue:
        return Flow::Continue;
    }
    return Flow::Normal;
  }

  // A filter block's filters: the innermost (null subject) gets `v`.
  Value filter_chain(const Expr& f, Value v, Scope& sc) {
    if (f.args[0]) v = filter_chain(*f.args[0], std::move(v), sc);
    CallArgs a = args_of(f, sc, 1);
    return apply_filter(*this, f.name, std::move(v), a);
  }

  void bind(const std::vector<std::string>& targets, const Value& v, Scope& sc) {
    if (targets.size() == 1) {
      sc.set(targets[0], v);
      return;
    }
    const List items = iterate(v);
    if (items.size() != targets.size())
      fault("cannot unpack " + std::to_string(items.size()) + " values into " +
            std::to_string(targets.size()));
    for (size_t k = 0; k < items.size(); ++k) sc.set(targets[k], items[k]);
  }

  void assign(const Stmt& s, Scope& sc, Value v) {
    if (s.attr_of) {
      Value obj = eval(*s.attr_of, sc);
      if (obj.type != Value::Type::Dict || !obj.dict->ns)
        fault("cannot assign attribute on non-namespace object");
      obj.dict->set(s.text, std::move(v));
      return;
    }
    bind(s.targets, v, sc);
  }

  Flow exec_for(const Stmt& s, Scope& sc, std::string& out) {
    const Value seq = eval(*s.expr, sc);
    List items = iterate(seq);
    if (s.filter) {
      List kept;
      for (const Value& it : items) {
        Scope f{&sc, {}};
        bind(s.targets, it, f);
        if (eval(*s.filter, f).truthy()) kept.push_back(it);
      }
      items = std::move(kept);
    }
    if (items.empty()) return exec(s.else_body, sc, out);
    const auto n = static_cast<int64_t>(items.size());
    for (int64_t k = 0; k < n; ++k) {
      Scope body{&sc, {}};
      Value loop = Value::make_dict();
      Dict& d = *loop.dict;
      d.set("index", Value::integer(k + 1));
      d.set("index0", Value::integer(k));
      d.set("revindex", Value::integer(n - k));
      d.set("revindex0", Value::integer(n - k - 1));
      d.set("first", Value::boolean(k == 0));
      d.set("last", Value::boolean(k == n - 1));
      d.set("length", Value::integer(n));
      d.set("depth", Value::integer(1));
      d.set("depth0", Value::integer(0));
      d.set("previtem", k > 0 ? items[static_cast<size_t>(k - 1)]
                              : Value::undefined("'previtem' is undefined"));
      d.set("nextitem", k + 1 < n ? items[static_cast<size_t>(k + 1)]
                                  : Value::undefined("'nextitem' is undefined"));
      d.set("cycle", Value::function([k](CallArgs& a) {
              if (a.pos.empty()) fault("no items for cycling given");
              return a.pos[static_cast<size_t>(k) % a.pos.size()];
            }));
      body.set("loop", loop);
      bind(s.targets, items[static_cast<size_t>(k)], body);
      if (exec(s.body, body, out) == Flow::Break) break;
    }
    return Flow::Normal;
  }

  // A macro (or a call block's caller) as a function; it sees the scope it was defined in.
  Value macro(const Stmt& s, Scope& def, const void*) {
    const Stmt* m = &s;
    Scope* outer = &def;
    return Value::function([this, m, outer](CallArgs& a) {
      // A macro that calls itself without end is an error, not a stack overflow.
      if (calls_ >= kMaxCalls)
        fault("macro recursion deeper than " + std::to_string(kMaxCalls) + " calls");
      ++calls_;
      struct Leave {
        int& n;
        ~Leave() { --n; }
      } leave{calls_};
      Scope sc{outer, {}};
      size_t used = 0;
      for (size_t k = 0; k < m->params.size(); ++k) {
        const auto& [name, def_expr] = m->params[k];
        Value v = Value::undefined("'" + name + "' is undefined");
        bool given = false;
        for (const auto& [kn, kv] : a.kw)
          if (kn == name) v = kv, given = true;
        if (!given && k < a.pos.size()) {
          v = a.pos[k];
          given = true;
          ++used;
        }
        if (!given && def_expr) v = eval(*def_expr, sc);
        sc.set(name, v);
      }
      List rest(a.pos.begin() + static_cast<std::ptrdiff_t>(std::min(used, a.pos.size())),
                a.pos.end());
      if (used < m->params.size()) rest.clear();
      sc.set("varargs", Value::make_list(std::move(rest)));
      Value kwargs = Value::make_dict();
      for (const auto& [kn, kv] : a.kw) {
        bool param = kn == "caller";
        for (const auto& p : m->params) param = param || p.first == kn;
        if (!param) kwargs.dict->set(kn, kv);
        if (kn == "caller") sc.set("caller", kv);
      }
      sc.set("kwargs", kwargs);
      std::string out;
      exec(m->body, sc, out);
      return Value::str(std::move(out));
    });
  }

  CallArgs args_of(const Expr& e, Scope& sc, size_t first) {
    CallArgs a;
    for (size_t k = first; k < e.args.size(); ++k) a.pos.push_back(eval(*e.args[k], sc));
    for (const auto& [n, x] : e.kwargs) a.kw.emplace_back(n, eval(*x, sc));
    return a;
  }

  Value eval(const Expr& e, Scope& sc) {
    try {
      return eval_expr(e, sc);
    } catch (const Fault& f) {
      located(e.pos, f.what());
    }
  }

  static void need_defined(const Value& v) {
    if (v.is_undefined()) fault(v.s.empty() ? "undefined value" : v.s);
  }

  Value eval_expr(const Expr& e, Scope& sc) {
    switch (e.kind) {
      case Expr::Kind::Literal:
        return e.literal;
      case Expr::Kind::Name: {
        if (Value* v = sc.lookup(e.name)) return *v;
        Value g = builtin_global(e.name, o_);
        if (g.is_undefined()) g.s = "'" + e.name + "' is undefined";
        return g;
      }
      case Expr::Kind::ListLit:
      case Expr::Kind::Tuple: {
        List l;
        for (const auto& x : e.args) l.push_back(eval(*x, sc));
        return Value::make_list(std::move(l), e.kind == Expr::Kind::Tuple);
      }
      case Expr::Kind::DictLit: {
        Value d = Value::make_dict();
        for (size_t k = 0; k + 1 < e.args.size(); k += 2) {
          const std::string key = dict_key(eval(*e.args[k], sc));
          d.dict->set(key, eval(*e.args[k + 1], sc));
        }
        return d;
      }
      case Expr::Kind::Attr: {
        const Value obj = eval(*e.args[0], sc);
        need_defined(obj);
        return get_attr(obj, e.name);
      }
      case Expr::Kind::Index: {
        const Value obj = eval(*e.args[0], sc);
        need_defined(obj);
        return get_item(obj, eval(*e.args[1], sc));
      }
      case Expr::Kind::Slice:
        return slice(e, sc);
      case Expr::Kind::Call: {
        const Expr& callee = *e.args[0];
        CallArgs a = args_of(e, sc, 1);
        if (callee.kind == Expr::Kind::Attr) {
          const Value obj = eval(*callee.args[0], sc);
          need_defined(obj);
          Value out;
          if (call_method(obj, callee.name, a, out)) return out;
          const Value fn = get_attr(obj, callee.name);
          if (fn.is_undefined())
            fault(cat("'", type_name(obj), " object' has no attribute '", callee.name, "'"));
          return call(fn, a);
        }
        return call(eval(callee, sc), a);
      }
      case Expr::Kind::Filter: {
        Value subject = eval(*e.args[0], sc);
        CallArgs a = args_of(e, sc, 1);
        return apply_filter(*this, e.name, std::move(subject), a);
      }
      case Expr::Kind::Test: {
        const Value subject = eval(*e.args[0], sc);
        CallArgs a = args_of(e, sc, 1);
        return Value::boolean(apply_test(*this, e.name, subject, a) != e.negated);
      }
      case Expr::Kind::Unary: {
        const Value v = eval(*e.args[0], sc);
        need_defined(v);
        if (!v.is_number())
          fault("bad operand type for unary " + e.name + ": '" + type_name(v) + "'");
        if (e.name == "+") return v.type == Value::Type::Bool ? Value::integer(v.as_int()) : v;
        return v.type == Value::Type::Float ? Value::number(-v.f) : Value::integer(-v.as_int());
      }
      case Expr::Kind::Binary:
        return binary(e.name, eval(*e.args[0], sc), eval(*e.args[1], sc));
      case Expr::Kind::And: {
        Value l = eval(*e.args[0], sc);
        return l.truthy() ? eval(*e.args[1], sc) : l;
      }
      case Expr::Kind::Or: {
        Value l = eval(*e.args[0], sc);
        return l.truthy() ? l : eval(*e.args[1], sc);
      }
      case Expr::Kind::Not:
        return Value::boolean(!eval(*e.args[0], sc).truthy());
      case Expr::Kind::Compare: {
        Value l = eval(*e.args[0], sc);
        for (size_t k = 0; k < e.ops.size(); ++k) {
          Value r = eval(*e.args[k + 1], sc);
          if (!compare(e.ops[k], l, r)) return Value::boolean(false);
          l = std::move(r);
        }
        return Value::boolean(true);
      }
      case Expr::Kind::Cond:
        if (eval(*e.args[1], sc).truthy()) return eval(*e.args[0], sc);
        return e.args[2] ? eval(*e.args[2], sc) : Value::undefined();
    }
    return Value::undefined();
  }

  static bool contains(const Value& hay, const Value& needle) {
    switch (hay.type) {
      case Value::Type::String:
        if (!needle.is_string())
          fault("'in <string>' requires string as left operand, not " + type_name(needle));
        return hay.s.find(needle.s) != std::string::npos;
      case Value::Type::Seq:
        for (const Value& x : *hay.list)
          if (equal(x, needle)) return true;
        return false;
      case Value::Type::Dict:
        return hay.dict->find(dict_key(needle)) != nullptr;
      case Value::Type::Undefined:
        return false;
      default:
        fault("argument of type '" + type_name(hay) + "' is not iterable");
    }
  }

  static bool compare(const std::string& op, const Value& l, const Value& r) {
    if (op == "==") return equal(l, r);
    if (op == "!=") return !equal(l, r);
    if (op == "in") return contains(r, l);
    if (op == "notin") return !contains(r, l);
    if (op == "<") return less(l, r);
    if (op == ">") return less(r, l);
    if (op == "<=") return !less(r, l);
    return !less(l, r);  // >=
  }

  static Value binary(const std::string& op, const Value& l, const Value& r) {
    if (op == "~") return Value::str(to_str(l) + to_str(r));
    need_defined(l);
    need_defined(r);
    const auto unsupported = [&]() -> Value {
      fault("unsupported operand type(s) for " + op + ": '" + type_name(l) + "' and '" +
            type_name(r) + "'");
    };
    if (l.is_number() && r.is_number()) {
      const bool real = l.type == Value::Type::Float || r.type == Value::Type::Float;
      const double a = l.as_double(), b = r.as_double();
      const int64_t x = l.as_int(), y = r.as_int();
      if (op == "+") return real ? Value::number(a + b) : Value::integer(x + y);
      if (op == "-") return real ? Value::number(a - b) : Value::integer(x - y);
      if (op == "*") return real ? Value::number(a * b) : Value::integer(x * y);
      if (op == "/") {
        if (b == 0) fault("division by zero");
        return Value::number(a / b);
      }
      if (op == "//" || op == "%") {
        if (b == 0) fault(op == "%" ? "modulo by zero" : "integer division or modulo by zero");
        if (real) {
          const double q = std::floor(a / b);
          return op == "//" ? Value::number(q) : Value::number(a - q * b);
        }
        int64_t q = x / y;
        if ((x % y != 0) && ((x < 0) != (y < 0))) --q;
        return op == "//" ? Value::integer(q) : Value::integer(x - q * y);
      }
      if (op == "**") {
        if (!real && y >= 0) {
          int64_t p = 1;
          for (int64_t k = 0; k < y; ++k) p *= x;
          return Value::integer(p);
        }
        return Value::number(std::pow(a, b));
      }
    }
    if (op == "+" && l.is_string() && r.is_string()) {
      // jinja2's Markup escapes the plain string added to it, autoescape or not.
      Value out = Value::str((l.markup || !r.markup ? l.s : html_escape(l.s)) +
                             (r.markup || !l.markup ? r.s : html_escape(r.s)));
      out.markup = l.markup || r.markup;
      return out;
    }
    if (op == "+" && l.is_list() && r.is_list()) {
      List out = *l.list;
      out.insert(out.end(), r.list->begin(), r.list->end());
      return Value::make_list(std::move(out), l.tuple);
    }
    if (op == "*" && (l.is_string() || l.is_list()) && r.type == Value::Type::Int) {
      const size_t n = l.is_string() ? l.s.size() : l.list->size();
      if (r.i > 0 && n > 0 && static_cast<uint64_t>(r.i) > (64u << 20) / n)
        fault("the repetition would be larger than 64 MiB");
      Value out = l.is_string() ? Value::str("") : Value::make_list({}, l.tuple);
      for (int64_t k = 0; k < r.i; ++k) {
        if (l.is_string())
          out.s += l.s;
        else
          out.list->insert(out.list->end(), l.list->begin(), l.list->end());
      }
      return out;
    }
    if (op == "%" && l.is_string()) return format_percent(l.s, r);
    return unsupported();
  }

  // "%s and %d" % args: Python's printf-style formatting, its common conversions.
  static Value format_percent(const std::string& f, const Value& args) {
    const List a = args.is_list() && args.tuple ? *args.list : List{args};
    std::string out;
    size_t n = 0;
    for (size_t k = 0; k < f.size(); ++k) {
      if (f[k] != '%') {
        out += f[k];
        continue;
      }
      if (++k >= f.size()) fault("incomplete format");
      if (f[k] == '%') {
        out += '%';
        continue;
      }
      if (n >= a.size()) fault("not enough arguments for format string");
      const Value& v = a[n++];
      switch (f[k]) {
        case 's':
          out += to_str(v);
          break;
        case 'r':
          out += repr(v);
          break;
        case 'd':
        case 'i':
          if (!v.is_number()) fault("%d format: a real number is required, not " + type_name(v));
          out +=
              std::to_string(v.type == Value::Type::Float ? static_cast<int64_t>(v.f) : v.as_int());
          break;
        default:
          fault(std::string("unsupported format character '") + f[k] + "'");
      }
    }
    if (n < a.size()) fault("not all arguments converted during string formatting");
    return Value::str(std::move(out));
  }

  Value slice(const Expr& e, Scope& sc) {
    const Value obj = eval(*e.args[0], sc);
    need_defined(obj);
    int64_t part[3] = {0, 0, 1};
    bool given[3] = {false, false, false};
    for (int k = 0; k < 3; ++k) {
      if (!e.args[static_cast<size_t>(k) + 1]) continue;
      const Value v = eval(*e.args[static_cast<size_t>(k) + 1], sc);
      if (v.is_none()) continue;
      if (v.type != Value::Type::Int && v.type != Value::Type::Bool)
        fault("slice indices must be integers or None");
      part[k] = v.as_int();
      given[k] = true;
    }
    const int64_t step = part[2];
    if (step == 0) fault("slice step cannot be zero");
    std::u32string u;
    List src;
    int64_t n = 0;
    if (obj.is_string()) {
      u = to_u32(obj.s);
      n = static_cast<int64_t>(u.size());
    } else if (obj.is_list()) {
      src = *obj.list;
      n = static_cast<int64_t>(src.size());
    } else {
      fault(cat("'", type_name(obj), "' object is not subscriptable"));
    }
    // Python's slice.indices().
    auto clamp = [&](int64_t v, bool is_given, int64_t def) {
      if (!is_given) return def;
      if (v < 0) v += n;
      if (step > 0) return std::clamp<int64_t>(v, 0, n);
      return std::clamp<int64_t>(v, -1, n - 1);
    };
    const int64_t start = clamp(part[0], given[0], step > 0 ? 0 : n - 1);
    const int64_t stop = clamp(part[1], given[1], step > 0 ? n : -1);
    std::u32string su;
    List sl;
    for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step) {
      if (obj.is_string())
        su.push_back(u[static_cast<size_t>(k)]);
      else
        sl.push_back(src[static_cast<size_t>(k)]);
    }
    if (obj.is_string()) return Value::str(to_utf8(su));
    return Value::make_list(std::move(sl), obj.tuple);
  }

  static constexpr int kMaxCalls = 100;
  const Program& p_;
  const RenderOptions& o_;
  int calls_ = 0;
};

}  // namespace

Template::Template(std::string source, std::string name)
    : source_(source), name_(std::move(name)), program_(std::make_unique<Program>()) {
  program_->source = std::move(source);
  program_->name = name_;
  parse(*program_);
}
Template::~Template() = default;
Template::Template(Template&&) noexcept = default;
Template& Template::operator=(Template&&) noexcept = default;

std::string Template::render(const nlohmann::ordered_json& context, const RenderOptions& o) const {
  Renderer r(*program_, o);
  return r.run(context);
}

}  // namespace kvs::jinja
