// The Jinja parser: a recursive descent over jinja2's grammar, operator precedence included,
// from jinja_lex.cpp's tokens.
#include <cstdlib>
#include <string>
#include <utility>

#include "kvs/chat/jinja_impl.h"

namespace kvs::jinja {

std::string where(const std::string& source, size_t pos) {
  size_t line = 1, col = 1;
  for (size_t k = 0; k < pos && k < source.size(); ++k) {
    if (source[k] == '\n') {
      ++line;
      col = 1;
    } else {
      ++col;
    }
  }
  return "line " + std::to_string(line) + ", column " + std::to_string(col);
}

namespace {

class Parser {
 public:
  Parser(Program& p, std::vector<Tok> toks) : p_(p), t_(std::move(toks)) {}

  void run() {
    std::string end;
    p_.body = body({}, end);
  }

 private:
  const Tok& cur() const { return t_[k_]; }
  const Tok& peek(size_t n = 1) const { return t_[std::min(k_ + n, t_.size() - 1)]; }
  bool is_op(const char* o) const { return cur().type == Tok::Op && cur().v == o; }
  bool is_name(const char* n) const { return cur().type == Tok::Name && cur().v == n; }
  [[noreturn]] void fail(size_t pos, const std::string& m) const {
    throw Error("template '" + p_.name + "' at " + where(p_.source, pos) + ": " + m);
  }
  std::string describe(const Tok& t) const {
    switch (t.type) {
      case Tok::End:
        return "the end of the template";
      case Tok::BlockEnd:
        return "the end of the tag";
      case Tok::VarEnd:
        return "'}}'";
      case Tok::Text:
        return "text";
      default:
        return "'" + t.v + "'";
    }
  }
  void expect_op(const char* o) {
    if (!is_op(o)) fail(cur().pos, std::string("expected '") + o + "', found " + describe(cur()));
    ++k_;
  }
  std::string expect_name() {
    if (cur().type != Tok::Name) fail(cur().pos, "expected a name, found " + describe(cur()));
    return t_[k_++].v;
  }
  void expect_block_end() {
    if (cur().type != Tok::BlockEnd)
      fail(cur().pos, "expected the end of the tag, found " + describe(cur()));
    ++k_;
  }

  // Statements up to one of the `ends` tags (its name in `end`, the tag consumed up to its
  // name), or to the end of the template where `ends` is empty.
  Body body(std::initializer_list<const char*> ends, std::string& end) {
    const Nest nest(*this, depth_, cur().pos);
    Body out;
    while (true) {
      const Tok& t = cur();
      if (t.type == Tok::End) {
        if (ends.size() == 0) return out;
        std::string want;
        for (const char* e : ends) want += (want.empty() ? "" : " or ") + std::string(e);
        fail(t.pos, "the template ended where " + want + " was expected");
      }
      if (t.type == Tok::Text) {
        auto s = std::make_unique<Stmt>(Stmt::Kind::Text);
        s->pos = t.pos;
        s->text = t.v;
        out.push_back(std::move(s));
        ++k_;
        continue;
      }
      if (t.type == Tok::VarBegin) {
        ++k_;
        auto s = std::make_unique<Stmt>(Stmt::Kind::Output);
        s->pos = t.pos;
        s->expr = tuple(true);
        if (cur().type != Tok::VarEnd) fail(cur().pos, "expected '}}', found " + describe(cur()));
        ++k_;
        out.push_back(std::move(s));
        continue;
      }
      // A block tag.
      ++k_;
      if (cur().type != Tok::Name) fail(cur().pos, "expected a tag name, found " + describe(cur()));
      const std::string name = cur().v;
      for (const char* e : ends)
        if (name == e) {
          ++k_;
          end = name;
          return out;
        }
      if (name == "generation") {
        // transformers' {% generation %} marks the assistant's text; it renders as its body.
        ++k_;
        expect_block_end();
        std::string e;
        Body inner = body({"endgeneration"}, e);
        expect_block_end();
        for (auto& s : inner) out.push_back(std::move(s));
        continue;
      }
      out.push_back(statement());
    }
  }

  StmtP statement() {
    const Tok& t = cur();
    const std::string name = t.v;
    const size_t pos = t.pos;
    ++k_;
    auto s = std::make_unique<Stmt>(Stmt::Kind::Text);
    s->pos = pos;
    std::string end;
    if (name == "if") {
      s->kind = Stmt::Kind::If;
      ExprP cond = tuple(true);
      expect_block_end();
      while (true) {
        Body b = body({"elif", "else", "endif"}, end);
        s->branches.emplace_back(std::move(cond), std::move(b));
        if (end == "elif") {
          cond = tuple(true);
          expect_block_end();
        } else if (end == "else") {
          expect_block_end();
          s->branches.emplace_back(nullptr, body({"endif"}, end));
          expect_block_end();
          break;
        } else {
          expect_block_end();
          break;
        }
      }
    } else if (name == "for") {
      s->kind = Stmt::Kind::For;
      const bool paren = is_op("(");
      if (paren) ++k_;
      s->targets.push_back(expect_name());
      while (is_op(",")) {
        ++k_;
        s->targets.push_back(expect_name());
      }
      if (paren) expect_op(")");
      if (!is_name("in"))
        fail(cur().pos, "expected 'in' in the for loop, found " + describe(cur()));
      ++k_;
      s->expr = tuple(false);
      if (is_name("if")) {
        ++k_;
        s->filter = expression(true);
      }
      if (is_name("recursive")) fail(cur().pos, "recursive for loops are not supported");
      expect_block_end();
      s->body = body({"else", "endfor"}, end);
      expect_block_end();
      if (end == "else") {
        s->else_body = body({"endfor"}, end);
        expect_block_end();
      }
    } else if (name == "set") {
      s->kind = Stmt::Kind::Set;
      s->targets.push_back(expect_name());
      if (is_op(".")) {
        ++k_;
        auto obj = std::make_unique<Expr>(Expr::Kind::Name);
        obj->pos = pos;
        obj->name = s->targets[0];
        s->attr_of = std::move(obj);
        s->text = expect_name();
      }
      while (!s->attr_of && is_op(",")) {
        ++k_;
        s->targets.push_back(expect_name());
      }
      if (cur().type == Tok::BlockEnd && !s->attr_of && s->targets.size() == 1) {
        ++k_;
        s->kind = Stmt::Kind::SetBlock;
        s->body = body({"endset"}, end);
        expect_block_end();
      } else {
        expect_op("=");
        s->expr = tuple(true);
        expect_block_end();
      }
    } else if (name == "macro") {
      s->kind = Stmt::Kind::Macro;
      s->text = expect_name();
      params(*s);
      expect_block_end();
      s->body = body({"endmacro"}, end);
      expect_block_end();
    } else if (name == "call") {
      s->kind = Stmt::Kind::CallBlock;
      if (is_op("(")) params(*s);
      s->expr = expression(true);
      if (s->expr->kind != Expr::Kind::Call) fail(pos, "{% call %} needs a macro call");
      expect_block_end();
      s->body = body({"endcall"}, end);
      expect_block_end();
    } else if (name == "filter") {
      s->kind = Stmt::Kind::FilterBlock;
      s->filter = filter(nullptr);
      while (is_op("|")) {
        ++k_;
        s->filter = filter(std::move(s->filter));
      }
      expect_block_end();
      s->body = body({"endfilter"}, end);
      expect_block_end();
    } else if (name == "break" || name == "continue") {
      s->kind = name == "break" ? Stmt::Kind::Break : Stmt::Kind::Continue;
      expect_block_end();
    } else {
      fail(pos, "unknown tag '" + name + "'");
    }
    return s;
  }

  // (a, b=default, ...)
  void params(Stmt& s) {
    expect_op("(");
    while (!is_op(")")) {
      std::string n = expect_name();
      ExprP def;
      if (is_op("=")) {
        ++k_;
        def = expression(true);
      }
      s.params.emplace_back(std::move(n), std::move(def));
      if (!is_op(",")) break;
      ++k_;
    }
    expect_op(")");
  }

  ExprP node(Expr::Kind k, size_t pos) {
    auto e = std::make_unique<Expr>(k);
    e->pos = pos;
    return e;
  }

  // Expressions separated by commas make a tuple (in {{ }}, set and for).
  ExprP tuple(bool condexpr) {
    const size_t pos = cur().pos;
    ExprP first = expression(condexpr);
    if (!is_op(",")) return first;
    auto t = node(Expr::Kind::Tuple, pos);
    t->args.push_back(std::move(first));
    while (is_op(",")) {
      ++k_;
      if (cur().type == Tok::BlockEnd || cur().type == Tok::VarEnd || is_op(")")) break;
      t->args.push_back(expression(condexpr));
    }
    return t;
  }

  // Nesting deeper than this is refused rather than exhausting the stack (templates nest a few
  // levels; a fuzzer, thousands).
  static constexpr int kMaxDepth = 256;
  struct Nest {
    Nest(const Parser& p, int& d, size_t pos) : depth(d) {
      if (++depth > kMaxDepth) p.fail(pos, "expressions or blocks nested too deeply");
    }
    ~Nest() { --depth; }
    int& depth;
  };

  ExprP expression(bool condexpr) {
    const Nest nest(*this, depth_, cur().pos);
    ExprP e = or_expr();
    while (condexpr && is_name("if")) {
      auto c = node(Expr::Kind::Cond, cur().pos);
      ++k_;
      c->args.push_back(std::move(e));
      c->args.push_back(or_expr());
      if (is_name("else")) {
        ++k_;
        c->args.push_back(expression(true));
      } else {
        c->args.push_back(nullptr);
      }
      e = std::move(c);
    }
    return e;
  }

  ExprP or_expr() {
    ExprP e = and_expr();
    while (is_name("or")) {
      auto o = node(Expr::Kind::Or, cur().pos);
      ++k_;
      o->args.push_back(std::move(e));
      o->args.push_back(and_expr());
      e = std::move(o);
    }
    return e;
  }

  ExprP and_expr() {
    ExprP e = not_expr();
    while (is_name("and")) {
      auto a = node(Expr::Kind::And, cur().pos);
      ++k_;
      a->args.push_back(std::move(e));
      a->args.push_back(not_expr());
      e = std::move(a);
    }
    return e;
  }

  ExprP not_expr() {
    if (is_name("not")) {
      auto n = node(Expr::Kind::Not, cur().pos);
      ++k_;
      n->args.push_back(not_expr());
      return n;
    }
    return compare();
  }

  ExprP compare() {
    const size_t pos = cur().pos;
    ExprP e = math1();
    ExprP c;
    while (true) {
      std::string op;
      if (cur().type == Tok::Op && (cur().v == "==" || cur().v == "!=" || cur().v == "<" ||
                                    cur().v == "<=" || cur().v == ">" || cur().v == ">=")) {
        op = cur().v;
        ++k_;
      } else if (is_name("in")) {
        op = "in";
        ++k_;
      } else if (is_name("not") && peek().type == Tok::Name && peek().v == "in") {
        op = "notin";
        k_ += 2;
      } else {
        break;
      }
      if (!c) {
        c = node(Expr::Kind::Compare, pos);
        c->args.push_back(std::move(e));
      }
      c->ops.push_back(op);
      c->args.push_back(math1());
    }
    return c ? std::move(c) : std::move(e);
  }

  ExprP binary(ExprP l, ExprP (Parser::*next)(), std::initializer_list<const char*> ops) {
    while (cur().type == Tok::Op) {
      bool hit = false;
      for (const char* o : ops) hit = hit || cur().v == o;
      if (!hit) break;
      auto b = node(Expr::Kind::Binary, cur().pos);
      b->name = cur().v;
      ++k_;
      b->args.push_back(std::move(l));
      b->args.push_back((this->*next)());
      l = std::move(b);
    }
    return l;
  }
  ExprP math1() { return binary(concat(), &Parser::concat, {"+", "-"}); }
  ExprP concat() { return binary(math2(), &Parser::math2, {"~"}); }
  ExprP math2() { return binary(power(), &Parser::power, {"*", "/", "//", "%"}); }
  ExprP power() { return binary(unary_f(), &Parser::unary_f, {"**"}); }
  ExprP unary_f() { return unary(true); }

  ExprP unary(bool with_filter) {
    ExprP e;
    if (is_op("-") || is_op("+")) {
      const Nest nest(*this, depth_, cur().pos);
      e = node(Expr::Kind::Unary, cur().pos);
      e->name = cur().v;
      ++k_;
      e->args.push_back(unary(false));
    } else {
      e = primary();
    }
    e = postfix(std::move(e));
    if (with_filter) e = filters(std::move(e));
    return e;
  }

  ExprP primary() {
    const Tok& t = cur();
    const size_t pos = t.pos;
    if (t.type == Tok::Name) {
      ++k_;
      auto e = node(Expr::Kind::Literal, pos);
      if (t.v == "true" || t.v == "True") {
        e->literal = Value::boolean(true);
      } else if (t.v == "false" || t.v == "False") {
        e->literal = Value::boolean(false);
      } else if (t.v == "none" || t.v == "None") {
        e->literal = Value::none();
      } else {
        e->kind = Expr::Kind::Name;
        e->name = t.v;
      }
      return e;
    }
    if (t.type == Tok::Str) {
      std::string v;
      while (cur().type == Tok::Str) v += t_[k_++].v;  // adjacent strings join, as in Python
      auto e = node(Expr::Kind::Literal, pos);
      e->literal = Value::str(std::move(v));
      return e;
    }
    if (t.type == Tok::Int || t.type == Tok::Float) {
      ++k_;
      auto e = node(Expr::Kind::Literal, pos);
      e->literal = t.type == Tok::Int ? Value::integer(t.i) : Value::number(t.f);
      return e;
    }
    if (is_op("(")) {
      ++k_;
      if (is_op(")")) {
        ++k_;
        return node(Expr::Kind::Tuple, pos);
      }
      ExprP first = expression(true);
      if (is_op(")")) {
        ++k_;
        return first;
      }
      auto tup = node(Expr::Kind::Tuple, pos);
      tup->args.push_back(std::move(first));
      while (is_op(",")) {
        ++k_;
        if (is_op(")")) break;
        tup->args.push_back(expression(true));
      }
      expect_op(")");
      return tup;
    }
    if (is_op("[")) {
      ++k_;
      auto l = node(Expr::Kind::ListLit, pos);
      while (!is_op("]")) {
        l->args.push_back(expression(true));
        if (!is_op(",")) break;
        ++k_;
      }
      expect_op("]");
      return l;
    }
    if (is_op("{")) {
      ++k_;
      auto d = node(Expr::Kind::DictLit, pos);
      while (!is_op("}")) {
        d->args.push_back(expression(true));
        expect_op(":");
        d->args.push_back(expression(true));
        if (!is_op(",")) break;
        ++k_;
      }
      expect_op("}");
      return d;
    }
    fail(pos, "expected an expression, found " + describe(t));
  }

  void call_args(Expr& call) {
    expect_op("(");
    while (!is_op(")")) {
      if (cur().type == Tok::Name && peek().type == Tok::Op && peek().v == "=") {
        std::string n = t_[k_].v;
        k_ += 2;
        call.kwargs.emplace_back(std::move(n), expression(true));
      } else {
        if (!call.kwargs.empty()) fail(cur().pos, "a positional argument after a keyword one");
        call.args.push_back(expression(true));
      }
      if (!is_op(",")) break;
      ++k_;
    }
    expect_op(")");
  }

  ExprP postfix(ExprP e) {
    while (true) {
      if (is_op(".")) {
        const size_t pos = cur().pos;
        ++k_;
        if (cur().type == Tok::Int) {
          auto ix = node(Expr::Kind::Index, pos);
          auto lit = node(Expr::Kind::Literal, pos);
          lit->literal = Value::integer(t_[k_++].i);
          ix->args.push_back(std::move(e));
          ix->args.push_back(std::move(lit));
          e = std::move(ix);
          continue;
        }
        auto a = node(Expr::Kind::Attr, pos);
        a->name = expect_name();
        a->args.push_back(std::move(e));
        e = std::move(a);
      } else if (is_op("[")) {
        const size_t pos = cur().pos;
        ++k_;
        ExprP parts[3];
        bool slice = false;
        for (int n = 0; n < 3; ++n) {
          if (!is_op(":") && !is_op("]")) parts[n] = expression(true);
          if (n < 2 && is_op(":")) {
            slice = true;
            ++k_;
          } else {
            break;
          }
        }
        expect_op("]");
        auto ix = node(slice ? Expr::Kind::Slice : Expr::Kind::Index, pos);
        ix->args.push_back(std::move(e));
        if (!slice && !parts[0]) fail(pos, "an empty subscript");
        for (int n = 0; n < (slice ? 3 : 1); ++n) ix->args.push_back(std::move(parts[n]));
        e = std::move(ix);
      } else if (is_op("(")) {
        auto c = node(Expr::Kind::Call, cur().pos);
        c->args.push_back(std::move(e));
        call_args(*c);
        e = std::move(c);
      } else {
        return e;
      }
    }
  }

  ExprP filter(ExprP subject) {
    auto f = node(Expr::Kind::Filter, cur().pos);
    f->name = expect_name();
    while (is_op(".")) {
      ++k_;
      f->name += '.';
      f->name += expect_name();
    }
    f->args.push_back(std::move(subject));
    if (is_op("(")) call_args(*f);
    return f;
  }

  ExprP filters(ExprP e) {
    while (true) {
      if (is_op("|")) {
        ++k_;
        e = filter(std::move(e));
      } else if (is_name("is")) {
        auto t = node(Expr::Kind::Test, cur().pos);
        ++k_;
        if (is_name("not")) {
          ++k_;
          t->negated = true;
        }
        t->name = expect_name();
        t->args.push_back(std::move(e));
        if (is_op("(")) {
          call_args(*t);
        } else if ((cur().type == Tok::Name && cur().v != "else" && cur().v != "or" &&
                    cur().v != "and") ||
                   cur().type == Tok::Str || cur().type == Tok::Int || cur().type == Tok::Float ||
                   is_op("[") || is_op("{")) {
          // One argument without parentheses: "x is divisibleby 3", "x is sameas none".
          t->args.push_back(postfix(primary()));
        }
        e = std::move(t);
      } else if (is_op("(")) {
        auto c = node(Expr::Kind::Call, cur().pos);
        c->args.push_back(std::move(e));
        call_args(*c);
        e = std::move(c);
      } else {
        return e;
      }
    }
  }

  Program& p_;
  std::vector<Tok> t_;
  size_t k_ = 0;
  int depth_ = 0;
};

}  // namespace

void parse(Program& p) {
  // As jinja2 reads a template: newlines as "\n", one final newline dropped
  // (keep_trailing_newline off).
  std::string s;
  s.reserve(p.source.size());
  for (size_t k = 0; k < p.source.size(); ++k) {
    if (p.source[k] == '\r') {
      s += '\n';
      if (k + 1 < p.source.size() && p.source[k + 1] == '\n') ++k;
    } else {
      s += p.source[k];
    }
  }
  if (!s.empty() && s.back() == '\n') s.pop_back();
  p.source = std::move(s);
  Parser ps(p, lex(p.source, p.name));
  ps.run();
}

}  // namespace kvs::jinja
