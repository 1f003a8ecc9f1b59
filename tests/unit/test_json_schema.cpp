// JSON Schema -> GBNF: each schema's grammar, run through the matcher, accepts the JSON texts
// the schema accepts (in the converter's order and spacing) and refuses the others; keywords it
// cannot enforce are refused by name.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kvs/grammar/gbnf.h"
#include "kvs/grammar/json_schema.h"
#include "kvs/grammar/matcher.h"

namespace kvs::grammar {
namespace {

using json = nlohmann::ordered_json;

struct Case {
  json schema;
  std::vector<std::string> good, bad;
};

void check(const Case& c) {
  const std::string gbnf = json_schema_to_gbnf(c.schema);
  std::shared_ptr<const Grammar> g;
  ASSERT_NO_THROW(g = std::make_shared<const Grammar>(parse_gbnf(gbnf))) << gbnf;
  for (const std::string& s : c.good) {
    Matcher m(g);
    EXPECT_TRUE(m.accept_text(s) && m.can_end()) << c.schema.dump() << " refused " << s << "\n" << gbnf;
    json parsed;
    EXPECT_NO_THROW(parsed = json::parse(s)) << s;  // the cases themselves are JSON
  }
  for (const std::string& s : c.bad) {
    Matcher m(g);
    EXPECT_FALSE(m.accept_text(s) && m.can_end()) << c.schema.dump() << " accepted " << s << "\n" << gbnf;
  }
}

TEST(JsonSchema, Primitives) {
  check({{{"type", "string"}}, {"\"\"", "\"a b\\n\\u00e9\"", "\"é\""}, {"1", "\"a", "\"\x01\"", "\"\\q\""}});
  check({{{"type", "integer"}}, {"0", "-12", "7 "}, {"1.5", "01", "\"1\"", "-"}});
  check({{{"type", "number"}}, {"0", "-1.25", "3e10", "2.5E-3"}, {"1.", ".5", "+1", "NaN"}});
  check({{{"type", "boolean"}}, {"true", "false"}, {"True", "1"}});
  check({{{"type", "null"}}, {"null"}, {"nil", "\"null\""}});
  check({{{"type", json::array({"string", "null"})}}, {"\"x\"", "null"}, {"1"}});
  check({json::object(), {"1", "\"s\"", "{\"a\": [true, null]}", "[]"}, {"{", "tru"}});
  check({{{"type", "string"}, {"minLength", 2}, {"maxLength", 3}},
         {"\"ab\"", "\"abc\"", "\"\\n\\t\""}, {"\"a\"", "\"abcd\""}});
  check({{{"type", "string"}, {"format", "date"}}, {"\"2024-02-29\""}, {"\"2024-13-01\"", "\"x\""}});
  check({{{"type", "string"}, {"format", "uuid"}},
         {"\"123e4567-e89b-12d3-a456-426614174000\""}, {"\"123e4567\""}});
}

TEST(JsonSchema, Patterns) {
  auto pat = [](const char* p) { return json{{"type", "string"}, {"pattern", p}}; };
  check({pat("^[A-Z]{2}-\\d{3}$"), {"\"AB-123\""}, {"\"ab-123\"", "\"AB-12\"", "\"AB-1234\""}});
  check({pat("^(foo|bar)+x?$"), {"\"foo\"", "\"foobarx\""}, {"\"fo\"", "\"x\"", "\"\""}});
  check({pat("^a\"b\\\\c$"), {"\"a\\\"b\\\\c\""}, {"\"ab\\\\c\""}});  // " and \ as JSON escapes
  check({pat("^.{2}$"), {"\"é!\"", "\"ab\""}, {"\"\\n\\n\"", "\"abc\""}});
  check({pat("^\\d+(\\.\\d+)?$"), {"\"12\"", "\"1.50\""}, {"\"1.\"", "\".5\""}});
  check({pat("^[^a-z]\\s[\\n]$"), {"\"A \\n\""}, {"\"a \\n\"", "\"A  \""}});
  check({pat("^(?:ab)*?c{1,2}$"), {"\"c\"", "\"ababcc\""}, {"\"abc c\"", "\"ccc\""}});
}

TEST(JsonSchema, EnumConstAnyOf) {
  check({{{"enum", {"red", "green", 3, nullptr}}}, {"\"red\"", "\"green\"", "3", "null"}, {"\"blue\"", "\"Red\"", "4"}});
  check({{{"const", {{"a", 1}}}}, {"{\"a\":1}"}, {"{\"a\": 1}", "{}"}});
  check({{{"anyOf", {{{"type", "integer"}}, {{"type", "string"}, {"maxLength", 1}}}}},
         {"5", "\"x\""}, {"\"xy\"", "true"}});
  check({{{"oneOf", {{{"type", "boolean"}}, {{"type", "null"}}}}}, {"true", "null"}, {"0"}});
  check({{{"type", "integer"}, {"nullable", true}}, {"1", "null"}, {"\"1\""}});
}

TEST(JsonSchema, Objects) {
  const json person = {{"type", "object"},
                       {"properties",
                        {{"name", {{"type", "string"}}},
                         {"age", {{"type", "integer"}}},
                         {"email", {{"type", "string"}}}}},
                       {"required", {"name", "email"}}};
  // In the schema's order: name, age, email.
  check({person,
         {"{\"name\": \"n\", \"email\": \"e\"}", "{\"name\": \"n\", \"age\": 3, \"email\": \"e\"}",
          "{ \"name\":\"n\",\"age\":3,\"email\":\"e\" }", "{\n  \"name\": \"n\",\n  \"email\": \"e\"\n}"},
         {"{\"name\": \"n\"}", "{}", "{\"name\": \"n\", \"email\": \"e\", \"x\": 1}",
          "{\"name\": 1, \"email\": \"e\"}", "{\"age\": 3}", "{\"email\": \"e\", \"name\": \"n\"}"}});
  const json opt = {{"type", "object"},
                    {"properties", {{"a", {{"type", "integer"}}}, {"b", {{"type", "integer"}}}}}};
  check({opt, {"{}", "{\"a\": 1}", "{\"b\": 2}", "{\"a\": 1, \"b\": 2}"}, {"{,}", "{\"a\": 1,}", "{\"b\": 2, \"a\": 1}"}});
  check({{{"type", "object"}, {"additionalProperties", {{"type", "integer"}}}},
         {"{}", "{\"x\": 1, \"y\": 2}"}, {"{\"x\": \"s\"}"}});
  check({{{"type", "object"},
          {"properties", {{"a", {{"type", "integer"}}}}},
          {"required", {"a"}},
          {"additionalProperties", true}},
         {"{\"a\": 1}", "{\"a\": 1, \"z\": [null]}"}, {"{\"z\": 1}"}});
  check({{{"type", "object"}}, {"{}", "{\"k\": {\"n\": [1]}}"}, {"[]", "{\"k\"}"}});
}

TEST(JsonSchema, Arrays) {
  check({{{"type", "array"}, {"items", {{"type", "integer"}}}}, {"[]", "[1]", "[1, 2, 3]"}, {"[1,]", "[\"a\"]", "["}});
  check({{{"type", "array"}, {"items", {{"type", "boolean"}}}, {"minItems", 1}, {"maxItems", 2}},
         {"[true]", "[true, false]"}, {"[]", "[true, true, true]"}});
  check({{{"type", "array"}, {"maxItems", 0}}, {"[]"}, {"[1]"}});
  check({{{"type", "array"},
          {"prefixItems", {{{"type", "string"}}, {{"type", "integer"}}}},
          {"items", false}},
         {"[]", "[\"a\"]", "[\"a\", 1]"}, {"[1]", "[\"a\", 1, 2]"}});
  check({{{"type", "array"}, {"prefixItems", {{{"type", "string"}}}}, {"minItems", 1}},
         {"[\"a\"]", "[\"a\", 2, null]"}, {"[]", "[2]"}});  // Draft 4's tuple, items as a list: exactly those elements.
  check({{{"items", {{{"type", "integer"}}, {{"type", "string"}}}}},
         {"[1, \"a\"]"}, {"[]", "[1]", "[1, \"a\", 2]", "[\"a\", 1]"}});
}

TEST(JsonSchema, Refs) {
  const json tree = {{"$defs",
                      {{"node",
                        {{"type", "object"},
                         {"properties",
                          {{"v", {{"type", "integer"}}},
                           {"kids", {{"type", "array"}, {"items", {{"$ref", "#/$defs/node"}}}}}}},
                         {"required", {"v"}}}}}},
                     {"$ref", "#/$defs/node"}};
  check({tree, {"{\"v\": 1, \"kids\": [{\"v\": 2}, {\"v\": 3, \"kids\": []}]}", "{\"v\": 1}"},
         {"{\"v\": 1, \"kids\": [{}]}", "{\"kids\": [], \"v\": 1}"}});
  const json defs = {{"definitions", {{"c", {{"enum", {"x", "y"}}}}}},
                     {"type", "array"},
                     {"items", {{"$ref", "#/definitions/c"}}}};
  check({defs, {"[\"x\", \"y\"]"}, {"[\"z\"]"}});
}

TEST(JsonSchema, RefusesWhatItCannotEnforceByName) {
  auto refused = [](const json& s) -> std::string {
    try {
      json_schema_to_gbnf(s);
    } catch (const Error& e) {
      return e.what();
    }
    return "accepted";
  };
  EXPECT_NE(refused({{"type", "string"}, {"pattern", "a+"}}).find("pattern: a pattern must be anchored"), std::string::npos);
  EXPECT_NE(refused({{"type", "string"}, {"pattern", "^(?=a)a$"}}).find("lookaround"), std::string::npos);
  EXPECT_NE(refused({{"type", "string"}, {"pattern", "^(a)\\1$"}}).find("backreferences"), std::string::npos);
  EXPECT_NE(refused({{"type", "integer"}, {"minimum", 0}}).find("'minimum'"), std::string::npos);
  EXPECT_NE(refused({{"not", {{"type", "null"}}}}).find("'not'"), std::string::npos);
  EXPECT_NE(refused({{"$ref", "https://x/y.json"}}).find("not local"), std::string::npos);
  EXPECT_NE(refused({{"$ref", "#/$defs/missing"}}).find("points at nothing"), std::string::npos);
  EXPECT_NE(refused({{"type", "string"}, {"format", "email"}}).find("'email'"), std::string::npos);
  EXPECT_NE(refused({{"properties", {{"a", {{"type", "object"}, {"properties", {{"b", {{"multipleOf", 2}}}}}}}}}})
                .find("/properties/a/properties/b"),
            std::string::npos);
  // Annotations are no constraint.
  EXPECT_EQ(refused({{"title", "T"}, {"description", "d"}, {"type", "integer"}, {"default", 1}}), "accepted");
}

TEST(JsonSchema, JsonObject) {
  const auto g = std::make_shared<const Grammar>(parse_gbnf(json_object_gbnf()));
  for (const char* s : {"{}", "{\"a\": {\"b\": [1, \"x\", null, false]}}"}) {
    Matcher m(g);
    EXPECT_TRUE(m.accept_text(s) && m.can_end()) << s;
  }
  for (const char* s : {"[]", "1", "\"s\"", "{\"a\": }"}) {
    Matcher m(g);
    EXPECT_FALSE(m.accept_text(s) && m.can_end()) << s;
  }
}

}  // namespace
}  // namespace kvs::grammar
