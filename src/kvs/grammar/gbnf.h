// GBNF grammars (llama.cpp's format) parsed into a flat program a matcher walks code point by
// code point: rules of alternatives, each a run of elements ending at kEnd.
//
//   root  ::= item ("," item)*        # a rule: name ::= alternatives, ended by a newline
//   item  ::= [a-z]+ | "\"" [^"]* "\"" | num{1,3} | (x | y)? | .
//
// Repetitions are rewritten into helper rules (x* -> r ::= x r | "") and groups into rules of
// their own, as llama.cpp does, so the program only knows character sets and rule references.
// Token references (<...>, !<...>) are refused: their texts would bind a grammar to one vocab.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kvs/util/error.h"

namespace kvs::grammar {

// A grammar that does not parse, with the line and column (both from 1) where it went wrong.
class GrammarError : public Error {
 public:
  GrammarError(int line, int column, const std::string& what)
      : Error(cat("line ", line, ", column ", column, ": ", what)), line_(line), column_(column) {}
  int line() const { return line_; }
  int column() const { return column_; }

 private:
  int line_, column_;
};

// Code points a set accepts, as sorted disjoint inclusive ranges (negation resolved at parse).
struct CharSet {
  std::vector<std::pair<uint32_t, uint32_t>> ranges;
  uint64_t ascii[2] = {0, 0};  // the ranges below 128 as bits, the common case in one test

  bool contains(uint32_t c) const;
  // Whether any code point of [lo, hi] is in the set (for a character cut mid-UTF-8).
  bool intersects(uint32_t lo, uint32_t hi) const;
};

struct Grammar {
  enum Op : uint8_t { kChars, kRule, kEnd };
  struct Elem {
    Op op;
    uint32_t arg;  // kChars: index into sets; kRule: rule id
  };
  std::vector<Elem> code;                   // every alternative's elements, each run ending at kEnd
  std::vector<std::vector<uint32_t>> alts;  // rule id -> where each alternative starts in code
  std::vector<std::string> names;           // rule id -> name (helpers: parent-name_N)
  std::vector<CharSet> sets;
  uint32_t root = 0;

  // The program as text, one rule a line (for debugging and tests).
  std::string dump() const;
};

// Parses GBNF text; throws GrammarError naming the line and column of what is wrong: bad
// syntax, an undefined rule, no `root`, left recursion, repetitions beyond kMaxRepeat.
Grammar parse_gbnf(std::string_view text);

inline constexpr uint64_t kMaxRepeat = 10000;  // the most copies a {m,n} may ask for

// Writes `s` as a GBNF string literal, quotes included (for grammars built from text).
std::string gbnf_literal(std::string_view s);

}  // namespace kvs::grammar
