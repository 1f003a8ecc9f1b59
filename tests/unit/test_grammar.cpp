// GBNF grammars: the parser (good grammars, and bad ones refused at the right line and column),
// the matcher on texts (incl. characters cut mid-UTF-8) and on token vocabularies (the sorted
// walk of mask() against one token at a time), and the sampler's masking.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kvs/engine/sampler.h"
#include "kvs/grammar/gbnf.h"
#include "kvs/grammar/matcher.h"

namespace kvs::grammar {
namespace {

std::shared_ptr<const Grammar> compile(const std::string& g) {
  return std::make_shared<const Grammar>(parse_gbnf(g));
}

// Whether the whole text is a sentence of the grammar.
bool full(const std::shared_ptr<const Grammar>& g, const std::string& text) {
  Matcher m(g);
  return m.accept_text(text) && m.can_end();
}
// Whether the text can begin a sentence.
bool prefix(const std::shared_ptr<const Grammar>& g, const std::string& text) {
  Matcher m(g);
  return m.accept_text(text);
}

// Where parsing fails: "line:column".
std::string where(const std::string& g) {
  try {
    parse_gbnf(g);
  } catch (const GrammarError& e) {
    return std::to_string(e.line()) + ":" + std::to_string(e.column());
  }
  return "ok";
}

const char* kJson = R"(# JSON, as llama.cpp's grammars/json.gbnf
root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws

object ::=
  "{" ws (
            string ":" ws value
    ("," ws string ":" ws value)*
  )? "}" ws

array  ::=
  "[" ws (
            value
    ("," ws value)*
  )? "]" ws

string ::=
  "\"" (
    [^"\\\x7F\x00-\x1F] |
    "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) # escapes
  )* "\"" ws

number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws

ws ::= | " " | "\n" [ \t]{0,20}
)";

TEST(Gbnf, ParsesLlamaCppSyntax) {
  EXPECT_NO_THROW(parse_gbnf(kJson));
  EXPECT_NO_THROW(parse_gbnf("root ::= \"a\" | \"b\"  # comment\n\n# more\nx ::= [^a-z\\n]\n"));
  EXPECT_NO_THROW(parse_gbnf("root ::= (\"a\"\n  | \"b\")* x{2} x{1,} x{0,3} x? x+ .\nx ::= \"x\""));
  EXPECT_NO_THROW(parse_gbnf("root ::= \"a\" |\n  \"b\"\n"));  // a line may end after '|'
  EXPECT_NO_THROW(parse_gbnf("root ::= \"\\x41\\u00e9\\U0001F600\\t\\r\\n\\\\\\\"\" [\\[\\]\\-]"));
  EXPECT_NO_THROW(parse_gbnf("root ::= my_rule\nmy_rule ::= \"é日本\"\r\n"));
}

TEST(Gbnf, RefusesBadGrammarsWhereTheyGoWrong) {
  EXPECT_EQ(where("root ::= \"a"), "1:10");                    // unterminated literal
  EXPECT_EQ(where("root ::= foo\n"), "1:10");                  // undefined rule
  EXPECT_EQ(where("root := \"a\""), "1:6");                    // not ::=
  EXPECT_EQ(where("root ::= \"a\"\nx ::= [z-a]"), "2:7");       // reversed range
  EXPECT_EQ(where("root ::= \"a\" )"), "1:14");                // stray ')'
  EXPECT_EQ(where("x ::= \"a\"\n"), "2:1");                    // no root
  EXPECT_EQ(where("root ::= root \"a\""), "1:1");              // left recursion
  EXPECT_EQ(where("root ::= x\nx ::= \"a\"? root"), "2:1");    // through a nullable prefix
  EXPECT_EQ(where("root ::= (\"a\"?)*"), "1:1");              // a repeated empty match
  EXPECT_EQ(where("root ::= <think>"), "1:10");               // token references
  EXPECT_EQ(where("root ::= \"\\q\""), "1:11");                // unknown escape
  EXPECT_EQ(where("root ::= \"a\"{3,2}"), "1:13");             // max < min
  EXPECT_EQ(where("root ::= * \"a\""), "1:10");                // nothing to repeat
  EXPECT_EQ(where("root ::= \"a\"{99999}"), "1:13");           // too many repetitions
  EXPECT_EQ(where("root ::= \"a\"\nroot ::= \"b\""), "2:1");   // defined twice
  EXPECT_EQ(where("root ::= (\"a\""), "1:14");                 // unclosed group
  EXPECT_EQ(where("root ::= [a"), "1:10");                     // unclosed class
  EXPECT_EQ(where("root ::= \"é\" foo"), "1:14");              // columns count characters
  EXPECT_EQ(where("root ::= \"x\"\n  \"y\""), "2:3");           // a rule ends at a newline
  try {
    parse_gbnf("root ::= foo");
    FAIL();
  } catch (const GrammarError& e) {
    EXPECT_NE(std::string(e.what()).find("undefined rule 'foo'"), std::string::npos) << e.what();
  }
}

TEST(Matcher, AcceptsTheLanguage) {
  const auto g = compile(
      "root ::= greet \" \" name (\"!\" | \"?\")? num{0,2}\n"
      "greet ::= \"hi\" | \"hello\"\nname ::= [A-Z] [a-z]*\nnum ::= [0-9]\n");
  for (const char* s : {"hi Bob", "hello Alice!", "hi X?7", "hi Ann42"}) EXPECT_TRUE(full(g, s)) << s;
  for (const char* s : {"hi bob", "hey Bob", "hi Bob!!", "hi Bob123", "hiBob", ""})
    EXPECT_FALSE(full(g, s)) << s;
  EXPECT_TRUE(prefix(g, "hel"));
  EXPECT_FALSE(full(g, "hel"));
  EXPECT_FALSE(prefix(g, "hex"));

  const auto rep = compile("root ::= \"ab\"{2,3} [^x]+ .\n");
  EXPECT_TRUE(full(rep, "ababcz"));
  EXPECT_TRUE(full(rep, "abababyy\n"));
  EXPECT_FALSE(full(rep, "abcz"));
  EXPECT_FALSE(full(rep, "ababxz"));
  EXPECT_FALSE(full(rep, "ababc"));

  const auto json = compile(kJson);
  for (const char* s : {"{}", "{\"a\": [1, 2.5e3, \"x\\n\", true, null, {}]}", "{ \"k\" : -0.5 }"})
    EXPECT_TRUE(full(json, s)) << s;
  for (const char* s : {"[]", "{\"a\" 1}", "{\"a\": 01}", "{\"a\": \"\x01\"}", "{\"a\": tru}"})
    EXPECT_FALSE(full(json, s)) << s;

  const auto right = compile("root ::= \"a\" root | \"b\"\n");  // right recursion stays flat
  EXPECT_TRUE(full(right, std::string(20000, 'a') + "b"));
}

TEST(Matcher, Unicode) {
  const auto g = compile("root ::= [à-ÿ]+ \"日本\" [^a-z]\n");
  EXPECT_TRUE(full(g, "éü日本É"));
  EXPECT_FALSE(full(g, "e日本É"));
  // Cut mid-character: the first byte of é (C3 A9) is allowed as a start of [à-ÿ].
  Matcher m(g);
  EXPECT_TRUE(m.accept_text("\xC3"));
  EXPECT_FALSE(m.can_end());
  EXPECT_FALSE(m.allows_text("a"));  // a continuation byte must come
  EXPECT_TRUE(m.accept_text("\xA9\xE6"));
  EXPECT_TRUE(m.accept_text("\x97\xA5\xE6\x9C\xAC"));  // 日 then 本
  EXPECT_TRUE(m.accept_text("!"));
  EXPECT_TRUE(m.can_end());
  // A first byte no character of the set begins with: 日 starts E6, [à-ÿ] needs C3.
  Matcher n(g);
  EXPECT_FALSE(n.allows_text("\xE6"));
  EXPECT_FALSE(n.allows_text("\xFF"));  // never valid UTF-8
  const auto ascii = compile("root ::= [a-z]*\n");
  Matcher a(ascii);
  EXPECT_FALSE(a.allows_text("\xC3"));
  EXPECT_FALSE(a.allows_text("\xC1"));  // overlong form of ASCII
  EXPECT_TRUE(a.allows_text("abc"));
}

// A vocab of random short pieces over a small alphabet (with multi-byte characters cut at every
// byte), so that many share prefixes.
Vocab random_vocab(uint64_t seed, size_t n) {
  std::mt19937_64 rng(seed);
  const std::vector<std::string> atoms = {"{", "}", "\"", ":", ",", " ", "a", "b", "1", "0",
                                          "-", ".", "e", "[", "]", "\\", "n", "\n", "\xC3",
                                          "\xA9", "é", "true", "null", "\x01"};
  std::vector<std::string> pieces;
  std::vector<uint8_t> eog;
  for (size_t i = 0; i < n; ++i) {
    std::string p;
    const size_t len = 1 + rng() % 4;
    for (size_t k = 0; k < len; ++k) p += atoms[rng() % atoms.size()];
    pieces.push_back(i % 97 == 5 ? "" : p);  // a few control tokens
    eog.push_back(i == 3);
  }
  return Vocab(std::move(pieces), std::move(eog));
}

TEST(Matcher, MaskEqualsOneTokenAtATime) {
  const auto g = compile(kJson);
  const Vocab v = random_vocab(1, 3000);
  const auto n = static_cast<int32_t>(v.pieces.size()) + 5;  // ids past the vocab: refused
  std::mt19937_64 rng(2);
  Matcher m(g);
  int allowed_total = 0;
  for (int step = 0; step < 60; ++step) {
    std::vector<float> logits(static_cast<size_t>(n), 0.0f);
    m.mask(v, logits.data(), n);
    std::vector<int32_t> ok;
    for (int32_t id = 0; id < n; ++id) {
      const bool one = m.allows(v, id);
      EXPECT_EQ(one, std::isfinite(logits[static_cast<size_t>(id)])) << "step " << step << " id " << id;
      if (one && !v.eog[static_cast<size_t>(id)]) ok.push_back(id);
    }
    allowed_total += static_cast<int>(ok.size());
    if (ok.empty()) break;
    m.accept(v, ok[rng() % ok.size()]);
  }
  EXPECT_GT(allowed_total, 100);
}

TEST(Matcher, EndOfGenerationOnlyWhereTheGrammarEnds) {
  const auto g = compile("root ::= \"ab\" \"c\"?\n");
  const Vocab v({"a", "b", "c", "</s>", "abc", ""}, {0, 0, 0, 1, 0, 0});
  Matcher m(g);
  auto allowed = [&] {
    std::vector<float> l(6, 1.0f);
    m.mask(v, l.data(), 6);
    std::string s;
    for (int i = 0; i < 6; ++i) s += std::isfinite(l[static_cast<size_t>(i)]) ? '1' : '0';
    return s;
  };
  EXPECT_EQ(allowed(), "100010");
  m.accept(v, 0);
  EXPECT_EQ(allowed(), "010000");
  m.accept(v, 1);
  EXPECT_EQ(allowed(), "001100");  // "c" or the end
  m.accept(v, 2);
  EXPECT_TRUE(m.must_end());
  EXPECT_EQ(allowed(), "000100");
  EXPECT_THROW(m.accept(v, 0), Error);
  m.reset();
  EXPECT_THROW(m.accept(v, 3), Error);  // the end before the grammar's
}

SamplerParams greedy(std::shared_ptr<const Constraint> c) {
  SamplerParams p;
  p.temp = 0.0f;
  p.grammar = std::move(c);
  return p;
}

TEST(Matcher, SamplerMasksAndOtherwiseChangesNothing) {
  auto c = std::make_shared<Constraint>();
  c->grammar = compile("root ::= [0-9]+ \".\"\n");
  c->vocab = std::make_shared<const Vocab>(
      std::vector<std::string>{"a", "1", "22", ".", "b.", "</s>", "3."},
      std::vector<uint8_t>{0, 0, 0, 0, 0, 1, 0});
  Sampler s(greedy(c));
  // The best token allowed, wherever it ranks.
  std::vector<float> l = {9, 1, 2, 8, 7, 6, 0};
  EXPECT_EQ(s.sample(l.data(), 7), 2);  // "22"
  EXPECT_EQ(s.sample(l.data(), 7), 3);  // "."
  EXPECT_EQ(s.sample(l.data(), 7), 5);  // only the end is left
  // Where the best token is allowed, the same token as without a grammar.
  Sampler plain(greedy(nullptr)), constrained(greedy(c));
  std::vector<float> l2 = {0, 5, 4, 3, 2, 1, 0};
  EXPECT_EQ(constrained.sample(l2.data(), 7), plain.sample(l2.data(), 7));
  // Sampled: only allowed tokens are ever drawn.
  SamplerParams hot = greedy(c);
  hot.temp = 1.0f;
  hot.top_k = 0;
  hot.min_p = 0.0f;
  hot.top_p = 1.0f;
  hot.seed = 7;
  for (int r = 0; r < 20; ++r) {
    Sampler h(hot);
    std::vector<float> flat(7, 0.0f);
    const int32_t t = h.sample(flat.data(), 7);
    EXPECT_TRUE(t == 1 || t == 2 || t == 6) << t;
  }
  // reset() restarts the grammar.
  s.reset();
  EXPECT_EQ(s.sample(l.data(), 7), 2);
  // Greedy verification of a draft the grammar refuses: the best allowed token instead.
  Sampler v(greedy(c));
  bool ok = true;
  EXPECT_EQ(v.verify(l.data(), 7, 0, nullptr, &ok), 2);
  EXPECT_FALSE(ok);
}

}  // namespace
}  // namespace kvs::grammar
