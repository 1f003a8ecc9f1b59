// Structured output: a grammar (GBNF) or a JSON schema turned into the constraint a sampler
// masks logits by (SamplerParams::grammar). From run's flags (llama-cli's --grammar,
// --grammar-file, --json-schema, --json-schema-file) and from a request's fields (llama-server's
// `grammar` and `json_schema`, OpenAI's `response_format` json_object / json_schema).
#pragma once

#include <CLI/CLI.hpp>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "kvs/grammar/matcher.h"

namespace kvs {
class Tokenizer;
}

namespace kvs::cli {

struct GrammarArgs {
  std::string grammar, grammar_file, json_schema, json_schema_file;
};
void add_grammar(CLI::App* c, GrammarArgs& g);

// The constraint the flags ask for, or null; throws kvs::Error naming the flag and, for a bad
// grammar, the line and column.
std::shared_ptr<const grammar::Constraint> grammar_of(const GrammarArgs& g, const Tokenizer& tok);

// The constraint a request body asks for, or null (response_format text or absent); a 400
// (ApiError) naming the field where it is malformed or asks for what is not supported.
std::shared_ptr<const grammar::Constraint> request_grammar(const nlohmann::json& b,
                                                           const Tokenizer& tok);

// A constraint of GBNF text; throws grammar::GrammarError or kvs::Error.
std::shared_ptr<const grammar::Constraint> constraint_of(const std::string& gbnf,
                                                         const Tokenizer& tok);

}  // namespace kvs::cli
