#include "structured.h"

#include <fstream>
#include <sstream>

#include "kvs/grammar/json_schema.h"
#include "kvs/tokenizer/tokenizer.h"
#include "kvs/util/error.h"
#include "request.h"

namespace kvs::cli {

using json = nlohmann::json;

namespace {

// Not options.h's read_file: the request fuzzer links this file without the CLI's.
std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  KVS_CHECK(f, "cannot read '", path, "'");
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace

void add_grammar(CLI::App* c, GrammarArgs& g) {
  c->add_option("--grammar", g.grammar, "A GBNF grammar the generated text follows");
  c->add_option("--grammar-file", g.grammar_file, "Read the GBNF grammar from a file");
  c->add_option("-j,--json-schema", g.json_schema,
                "A JSON schema the generated text follows (as JSON text; {} for any JSON)");
  c->add_option("--json-schema-file", g.json_schema_file, "Read the JSON schema from a file");
}

std::shared_ptr<const grammar::Constraint> constraint_of(const std::string& gbnf,
                                                         const Tokenizer& tok) {
  auto c = std::make_shared<grammar::Constraint>();
  c->grammar = std::make_shared<const grammar::Grammar>(grammar::parse_gbnf(gbnf));
  c->vocab = grammar::Vocab::of(tok);
  return c;
}

std::shared_ptr<const grammar::Constraint> grammar_of(const GrammarArgs& g, const Tokenizer& tok) {
  const int given = int(!g.grammar.empty()) + int(!g.grammar_file.empty()) +
                    int(!g.json_schema.empty()) + int(!g.json_schema_file.empty());
  if (given == 0) return nullptr;
  KVS_CHECK(given == 1, "give one of --grammar, --grammar-file, --json-schema and "
                        "--json-schema-file");
  const char* flag = !g.grammar.empty()        ? "--grammar"
                     : !g.grammar_file.empty() ? "--grammar-file"
                     : !g.json_schema.empty()  ? "--json-schema"
                                               : "--json-schema-file";
  try {
    std::string gbnf = g.grammar;
    if (!g.grammar_file.empty()) gbnf = slurp(g.grammar_file);
    if (!g.json_schema.empty() || !g.json_schema_file.empty()) {
      const std::string text = !g.json_schema.empty() ? g.json_schema : slurp(g.json_schema_file);
      nlohmann::ordered_json schema;  // ordered: properties come in the schema's order
      try {
        schema = nlohmann::ordered_json::parse(text);
      } catch (const json::exception& e) {
        fail("not valid JSON: ", e.what());
      }
      gbnf = grammar::json_schema_to_gbnf(schema);
    }
    return constraint_of(gbnf, tok);
  } catch (const Error& e) {
    fail(flag, ": ", e.what());
  }
}

namespace {

// A schema field's grammar, refusals naming `field`.
std::string schema_gbnf(const json& schema, const char* field) {
  if (!schema.is_object() && !schema.is_boolean())
    bad(cat("'", field, "' must be a JSON schema object"), field);
  try {
    // The body was read unordered; properties come in name order.
    return grammar::json_schema_to_gbnf(nlohmann::ordered_json::parse(schema.dump()));
  } catch (const Error& e) {
    bad(cat("'", field, "': ", e.what()), field);
  }
}

}  // namespace

std::shared_ptr<const grammar::Constraint> request_grammar(const json& b, const Tokenizer& tok) {
  std::string gbnf;
  const char* field = nullptr;
  auto set = [&](std::string g, const char* f) {
    if (field)
      bad(cat("give one of 'grammar', 'json_schema' and 'response_format' (got '", field,
              "' and '", f, "')"),
          f);
    gbnf = std::move(g);
    field = f;
  };
  if (b.contains("grammar") && !b["grammar"].is_null()) {
    if (!b["grammar"].is_string()) bad("'grammar' must be a string of GBNF", "grammar");
    if (!b["grammar"].get_ref<const std::string&>().empty()) set(b["grammar"].get<std::string>(), "grammar");
  }
  if (b.contains("json_schema") && !b["json_schema"].is_null())
    set(schema_gbnf(b["json_schema"], "json_schema"), "json_schema");
  if (b.contains("response_format") && !b["response_format"].is_null()) {
    const json& rf = b["response_format"];
    if (!rf.is_object()) bad("'response_format' must be an object", "response_format");
    const std::string type = text_of(rf, "type");
    if (type == "json_object") {
      // llama-server also takes a schema beside json_object.
      set(rf.contains("schema") ? schema_gbnf(rf["schema"], "response_format")
                                : grammar::json_object_gbnf(),
          "response_format");
    } else if (type == "json_schema") {
      const json* js = rf.contains("json_schema") ? &rf["json_schema"] : nullptr;
      if (!js || !js->is_object() || !js->contains("schema"))
        bad("response_format json_schema needs 'json_schema': {'schema': {...}}", "response_format");
      set(schema_gbnf((*js)["schema"], "response_format"), "response_format");
    } else if (!type.empty() && type != "text") {
      bad(cat("response_format type '", type, "' is not supported (text, json_object, json_schema)"),
          "response_format");
    }
  }
  if (!field) return nullptr;
  try {
    return constraint_of(gbnf, tok);
  } catch (const Error& e) {
    bad(cat("'", field, "': ", e.what()), field);
  }
}

}  // namespace kvs::cli
