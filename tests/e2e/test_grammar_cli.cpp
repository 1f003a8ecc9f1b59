// `kvstream run --grammar/--grammar-file/--json-schema` on SmolLM2, greedy: the text follows the
// grammar, and where the unconstrained answer already does, the tokens are the same ones (the
// grammar only masks); bad grammars and schemas are refused naming the flag and the place.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "cli.h"
#include "kvs/grammar/gbnf.h"
#include "kvs/grammar/matcher.h"

namespace kvs::test {
namespace {

using json = nlohmann::json;

bool have_model() { return std::filesystem::exists(smollm2()); }

std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// `kvstream run` greedy on SmolLM2 with extra flags: its --json report.
json run(const std::string& prompt, int n, const std::string& extra) {
  static int k = 0;
  const auto out = temp_dir("grammar") / ("run" + std::to_string(k++) + ".json");
  const Outcome o = kvstream("run -m " + smollm2() + " -t 2 --temp 0 --chat -n " + std::to_string(n) +
                             " -p " + quote(prompt) + " --json " + out.string() + " " + extra);
  EXPECT_EQ(o.status, 0) << o.err;
  return o.status == 0 ? json::parse(slurp(out)) : json();
}

bool follows(const std::string& gbnf, const std::string& text) {
  grammar::Matcher m(std::make_shared<const grammar::Grammar>(grammar::parse_gbnf(gbnf)));
  return m.accept_text(text) && m.can_end();
}

// A grammar of the text's own characters, any number of times: at every step it refuses most
// of the vocab (any token with another character), never the text's token. In a file.
std::string own_chars(const std::string& text) {
  std::set<unsigned char> bytes(text.begin(), text.end());
  std::string cls;
  for (unsigned char c : bytes) {
    if (c >= 0x80) continue;  // multi-byte characters: allow all of them
    cls += c == '\n' ? std::string("\\n") : c == ']' || c == '\\' || c == '-' || c == '[' || c == '"'
                                                 ? std::string("\\") + static_cast<char>(c)
                                                 : std::string(1, static_cast<char>(c));
  }
  const std::string gbnf = "root ::= [" + cls + "\\x80-\\U0010FFFF]*\n";
  EXPECT_TRUE(follows(gbnf, text)) << gbnf;
  static int k = 0;
  const auto file = temp_dir("grammar") / ("own_chars" + std::to_string(k++) + ".gbnf");
  std::ofstream(file) << gbnf;
  return file.string();
}

TEST(GrammarCli, SameTokensWhereTheAnswerFits) {
  if (!have_model()) GTEST_SKIP() << "no " << smollm2();
  const std::string prompt = "Write two sentences about the sea.";
  const json plain = run(prompt, 40, "");
  const std::string text = plain["text"];
  ASSERT_GT(text.size(), 20u);
  const json constrained = run(prompt, 40, "--grammar-file " + own_chars(text));
  EXPECT_EQ(constrained["tokens"], plain["tokens"]) << constrained["text"] << "\n" << text;
  // With a repetition penalty every step masks the whole vocab (no best-token shortcut).
  const json pen = run(prompt, 40, "--repeat-penalty 1.3");
  EXPECT_EQ(run(prompt, 40, "--repeat-penalty 1.3 --grammar-file " + own_chars(pen["text"]))["tokens"],
            pen["tokens"]);
  // A grammar of the answer's first words then anything: the same tokens too.
  const std::string head = text.substr(0, 12);
  const std::string g2 = "root ::= " + grammar::gbnf_literal(head) + " .*\n";
  EXPECT_EQ(run(prompt, 40, "--grammar " + quote(g2))["tokens"], plain["tokens"]);
}

TEST(GrammarCli, TextFollowsTheGrammar) {
  if (!have_model()) GTEST_SKIP() << "no " << smollm2();
  const std::string prompt = "Is the sky blue? Answer with one word.";
  const std::string gbnf = "root ::= (\"Yes\" | \"No\") \".\"?";
  const json yn = run(prompt, 16, "--grammar " + quote(gbnf));
  EXPECT_TRUE(follows(gbnf, yn["text"])) << yn["text"];

  const std::string schema =
      R"({"type": "object", "properties": {"city": {"type": "string", "maxLength": 40},
          "population": {"type": "integer"}, "tags": {"type": "array", "items": {"enum": ["big", "old", "coastal"]}, "maxItems": 3}},
          "required": ["city", "population"], "additionalProperties": false})";
  const json r = run("Describe Paris as JSON with its population.", 160, "--json-schema " + quote(schema));
  const std::string text = r["text"];
  json j;
  ASSERT_NO_THROW(j = json::parse(text)) << text;
  ASSERT_TRUE(j.is_object()) << text;
  EXPECT_TRUE(j["city"].is_string()) << text;
  EXPECT_TRUE(j["population"].is_number_integer()) << text;
  for (const auto& [k, v] : j.items()) EXPECT_TRUE(k == "city" || k == "population" || k == "tags") << k;
  // Ended by the grammar (the end of generation), not by -n.
  EXPECT_LT(r["tokens"].size(), 160u) << text;
  // Drafts (prompt lookup) verified under the grammar: the same tokens.
  const json spec = run("Describe Paris as JSON with its population.", 160,
                        "--spec ngram --json-schema " + quote(schema));
  EXPECT_EQ(spec["tokens"], r["tokens"]) << spec["text"];

  const json obj = run("List three colors.", 120, "--json-schema '{}'");
  json any;
  EXPECT_NO_THROW(any = json::parse(std::string(obj["text"]))) << obj["text"];
}

TEST(GrammarCli, RefusesBadGrammars) {
  if (!have_model()) GTEST_SKIP() << "no " << smollm2();
  Outcome o = kvstream("run -m " + smollm2() + " -t 2 -n 4 -p hi --grammar 'root ::= foo'");
  EXPECT_NE(o.status, 0);
  EXPECT_TRUE(contains(o.err, "--grammar: line 1, column 10: undefined rule 'foo'")) << o.err;
  o = kvstream("run -m " + smollm2() + " -t 2 -n 4 -p hi --json-schema '{\"type\": \"string\", \"pattern\": \"a\"}'");
  EXPECT_NE(o.status, 0);
  EXPECT_TRUE(contains(o.err, "--json-schema: pattern: a pattern must be anchored")) << o.err;
  o = kvstream("run -m " + smollm2() + " -t 2 -n 4 -p hi --grammar 'root ::= \"a\"' -j '{}'");
  EXPECT_NE(o.status, 0);
  EXPECT_TRUE(contains(o.err, "give one of --grammar")) << o.err;
}

}  // namespace
}  // namespace kvs::test
