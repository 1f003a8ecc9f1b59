// The Jinja engine's insides, shared by its parser (jinja_parse.cpp), evaluator
// (jinja_eval.cpp), values (jinja_value.cpp) and built-ins (jinja_builtins.cpp).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kvs/chat/jinja.h"

namespace kvs::jinja {

struct Value;
struct Dict;
struct CallArgs;
using List = std::vector<Value>;
using Func = std::function<Value(CallArgs&)>;

// A Python value as a template sees it. Lists, dicts and functions are shared, as Python's
// objects are: a namespace() changed in a loop is the one outside it.
struct Value {
  enum class Type { Undefined, None, Bool, Int, Float, String, Seq, Dict, Callable };
  Type type = Type::Undefined;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;  // String; for Undefined, the name that was missing (for the message)
  std::shared_ptr<List> list;
  std::shared_ptr<Dict> dict;
  std::shared_ptr<Func> func;
  bool tuple = false;   // a List written as a tuple: repr "(1, 2)"
  bool markup = false;  // a String made safe (|safe, |escape): what is added to it is escaped

  static Value none() { return with(Type::None); }
  static Value undefined(std::string what = "") {
    Value v;
    v.s = std::move(what);
    return v;
  }
  static Value boolean(bool x) {
    Value v = with(Type::Bool);
    v.b = x;
    return v;
  }
  static Value integer(int64_t x) {
    Value v = with(Type::Int);
    v.i = x;
    return v;
  }
  static Value number(double x) {
    Value v = with(Type::Float);
    v.f = x;
    return v;
  }
  static Value str(std::string x) {
    Value v = with(Type::String);
    v.s = std::move(x);
    return v;
  }
  static Value make_list(List l = {}, bool is_tuple = false) {
    Value v = with(Type::Seq);
    v.list = std::make_shared<List>(std::move(l));
    v.tuple = is_tuple;
    return v;
  }
  static Value make_dict();
  static Value function(Func fn) {
    Value v = with(Type::Callable);
    v.func = std::make_shared<Func>(std::move(fn));
    return v;
  }
  static Value from_json(const nlohmann::ordered_json& j);

  bool is_undefined() const { return type == Type::Undefined; }
  bool is_none() const { return type == Type::None; }
  bool is_string() const { return type == Type::String; }
  bool is_list() const { return type == Type::Seq; }
  bool is_dict() const { return type == Type::Dict; }
  bool is_number() const { return type == Type::Int || type == Type::Float || type == Type::Bool; }
  bool truthy() const;
  double as_double() const { return type == Type::Float ? f : static_cast<double>(as_int()); }
  int64_t as_int() const { return type == Type::Bool ? (b ? 1 : 0) : i; }

 private:
  static Value with(Type t) {
    Value v;
    v.type = t;
    return v;
  }
};

// Insertion-ordered, as Python's dicts; templates' dicts are small, so a vector.
struct Dict {
  std::vector<std::pair<std::string, Value>> items;
  bool ns = false;  // a namespace(): attributes may be set
  const Value* find(std::string_view key) const;
  void set(const std::string& key, Value v);
};

struct CallArgs {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
  // The argument named `name`, or else the one at `index`, or else `def`.
  Value get(const char* name, size_t index, Value def = Value::undefined()) const;
  // Fails where more positional arguments are given than `max` or a keyword is not in `names`.
  void check(const char* what, size_t max, std::initializer_list<const char*> names) const;
};

// A dict's key as stored: a string as it is, a number, bool or None tagged so that 1, 1.0 and
// True are one key as in Python; key_value reads a stored key back.
std::string dict_key(const Value& k);
Value key_value(const std::string& stored);

// A fault with no position yet; the evaluator adds the position of the node it was in.
struct Fault : std::runtime_error {
  explicit Fault(const std::string& m) : std::runtime_error(m) {}
};
[[noreturn]] void fault(const std::string& message);

// Python's str(), repr(), json.dumps(ensure_ascii=False, indent) and type names.
std::string to_str(const Value& v);
std::string repr(const Value& v);
std::string to_json(const Value& v, int indent, const std::string& item_sep,
                    const std::string& key_sep);
std::string type_name(const Value& v);
std::string float_repr(double x);
std::string html_escape(const std::string& s);
bool equal(const Value& a, const Value& b);
// a < b (Python's ordering of numbers, strings and lists); faults on other types.
bool less(const Value& a, const Value& b);
// The items a for-loop visits: a list's, a dict's keys, a string's characters; undefined none.
List iterate(const Value& v);

// UTF-8 strings as Python's sequences of code points.
std::u32string to_u32(std::string_view s);
std::string to_utf8(std::u32string_view s);
bool py_space(char32_t c);

// The syntax tree.
struct Expr;
using ExprP = std::unique_ptr<Expr>;
struct Expr {
  enum class Kind {
    Literal,
    Name,
    ListLit,
    Tuple,
    DictLit,
    Attr,
    Index,
    Slice,
    Call,
    Filter,
    Test,
    Unary,
    Binary,
    And,
    Or,
    Not,
    Compare,
    Cond
  };
  explicit Expr(Kind k) : kind(k) {}
  Kind kind;
  size_t pos = 0;
  std::string name;  // Name, Attr, Filter, Test, Unary/Binary operator
  Value literal;
  std::vector<ExprP> args;  // operands; Dict: key, value, key, value...; Slice: obj, a, b, c
  std::vector<std::pair<std::string, ExprP>> kwargs;
  std::vector<std::string> ops;  // Compare: the operators between args
  bool negated = false;          // Test: "is not"
};

struct Stmt;
using StmtP = std::unique_ptr<Stmt>;
using Body = std::vector<StmtP>;
struct Stmt {
  enum class Kind {
    Text,
    Output,
    If,
    For,
    Set,
    SetBlock,
    Macro,
    CallBlock,
    FilterBlock,
    Break,
    Continue
  };
  explicit Stmt(Kind k) : kind(k) {}
  Kind kind;
  size_t pos = 0;
  std::string text;                  // Text; Macro's and Set's name
  ExprP expr;                        // Output, For's iterable, Set's value, CallBlock's call
  std::vector<std::string> targets;  // For's and Set's names (more than one: unpacked)
  ExprP attr_of;                     // Set ns.attr: the object (text = attr)
  std::vector<std::pair<ExprP, Body>> branches;  // If: condition, body (else: null condition)
  Body body, else_body;
  ExprP filter;  // For ... if COND; FilterBlock: the filter (a Filter with a null subject)
  std::vector<std::pair<std::string, ExprP>> params;  // Macro's, CallBlock's caller's
};

struct Program {
  std::string source, name;
  Body body;
};

// A token of jinja_lex.cpp: text between tags, a tag's ends, or a token inside a tag.
struct Tok {
  enum Type { Text, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, Str, Int, Float, Op, End };
  Type type;
  std::string v;
  size_t pos;
  int64_t i = 0;
  double f = 0;
};
std::vector<Tok> lex(const std::string& source, const std::string& name);

// "line L, column C" of a byte offset.
std::string where(const std::string& source, size_t pos);
void parse(Program& p);

// Filters, tests and methods (jinja_builtins.cpp); `self` is the filter's subject.
class Evaluator;
Value apply_filter(Evaluator& ev, const std::string& name, Value self, CallArgs& args);
bool apply_test(Evaluator& ev, const std::string& name, const Value& self, CallArgs& args);
// obj.name(args): Python's str, dict and list methods; false where obj has no such method.
bool call_method(const Value& obj, const std::string& name, CallArgs& args, Value& out);
// obj.name without a call: a dict's key, else an undefined.
Value get_attr(const Value& obj, const std::string& name);
Value get_item(const Value& obj, const Value& key);
Value builtin_global(const std::string& name, const RenderOptions& o);

// String helpers of jinja_methods.cpp that the filters share.
const Value& need_str(const Value& v, const char* what);
int64_t need_int(const Value& v, const char* what);
char32_t up(char32_t c);
char32_t down(char32_t c);
std::string map_chars(const std::string& s, char32_t (*f)(char32_t));
// str.strip(chars) on either side.
std::string strip(const std::string& s, const Value& chars, bool left, bool right);
// str.split(sep, maxsplit) / str.rsplit; sep not a string: runs of whitespace.
List split(const std::string& s, const Value& sep, int64_t maxsplit, bool from_right);
std::string replace(const std::string& s, const std::string& from, const std::string& to,
                    int64_t count);
std::string capitalize(const std::string& s);
// dict.items() as a list of (key, value) tuples; an undefined gives none.
Value items_of(const Value& v);

class Evaluator {
 public:
  virtual ~Evaluator() = default;
  virtual Value call(const Value& fn, CallArgs& args) = 0;
};

}  // namespace kvs::jinja
