// A JSON schema's `pattern` (an ECMAScript regular expression) as GBNF for the inside of a JSON
// string: what the characters look like once written in JSON, so `"` and `\` as their escapes,
// control characters never (a subset of the strings the pattern accepts).
//
// Supported: ^...$ anchored patterns (as llama.cpp asks) of literals, escapes (\d \w \s \D \W
// \S \. \n \t \uXXXX ...), `.`, classes with ranges and negation, groups ( ) and (?: ),
// alternation, quantifiers * + ? {m} {m,} {m,n} (lazy ones as greedy). Refused by name:
// unanchored patterns, backreferences, lookaround, \b, anchors inside.
#pragma once

#include <string>
#include <string_view>

namespace kvs::grammar {

// The GBNF expression of a JSON string's content matching `pattern`; throws kvs::Error.
std::string pattern_to_gbnf(std::string_view pattern);

}  // namespace kvs::grammar
