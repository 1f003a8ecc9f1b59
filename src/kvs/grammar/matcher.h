// A grammar's state as a text grows, code point by code point, as llama.cpp's matcher: a set of
// parse stacks, each the elements still to match (its top always a character set, or empty: the
// grammar complete). A code point keeps the stacks whose top accepts it, each advanced and
// expanded through rule references into new stacks. Tokens are byte strings that may end inside
// a UTF-8 character; the bytes left over are carried into the next token, and a token ending
// that way is allowed where some stack's top accepts a character beginning with those bytes.
//
// Stacks are interned (equal stacks share one id, a stack = its top and its parent's id), so a
// set of stacks is a short sorted list of ints and an expansion is memoised per stack.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "kvs/grammar/gbnf.h"

namespace kvs {
class Tokenizer;
}

namespace kvs::grammar {

// The token texts a matcher reads, shared by every sequence of a tokenizer: built once, as
// sorting them lets one walk test every token sharing a prefix together.
struct Vocab {
  std::vector<std::string> pieces;  // id -> bytes; "" (control tokens): never allowed
  std::vector<uint8_t> eog;         // id -> end of generation: allowed where the grammar may end
  std::vector<int32_t> order;       // ids with a piece, sorted by piece
  std::vector<uint32_t> lcp;        // order[i]'s common prefix with order[i - 1], in bytes

  Vocab(std::vector<std::string> p, std::vector<uint8_t> e);
  // The tokenizer's vocab (control tokens as "", as they decode), cached while in use.
  static std::shared_ptr<const Vocab> of(const Tokenizer& tok);
};

// What a sampler needs to constrain a sequence.
struct Constraint {
  std::shared_ptr<const Grammar> grammar;
  std::shared_ptr<const Vocab> vocab;
};

class Matcher {
 public:
  explicit Matcher(std::shared_ptr<const Grammar> g);

  // Whether `bytes` can follow the text so far (what it leaves mid-character included).
  bool allows_text(std::string_view bytes);
  // Advances over `bytes`; false, the state unchanged, where the grammar refuses them.
  bool accept_text(std::string_view bytes);
  // Where the grammar may end here: some stack is complete and no character is left half.
  bool can_end() const;
  // Where nothing but the end can follow.
  bool must_end() const { return stacks_.size() == 1 && stacks_[0] == kDone && partial_.remain == 0; }

  bool allows(const Vocab& v, int32_t id);
  // Sets logits[id] = -inf for every id in [0, n) the grammar refuses here (ids past the vocab
  // too). Walks the vocab in sorted order, so a refused prefix refuses its whole subtree.
  void mask(const Vocab& v, float* logits, int32_t n);
  // Advances over token `id`; throws kvs::Error where the grammar refuses it. An end-of-
  // generation token changes nothing.
  void accept(const Vocab& v, int32_t id);
  void reset();

 private:
  static constexpr int32_t kDone = -1;  // the empty stack
  struct Node {
    uint32_t pos;    // into Grammar::code, a kChars or kRule element
    int32_t parent;  // the stack below, or kDone
  };
  struct Utf8 {
    uint32_t value = 0;
    int remain = 0;  // continuation bytes still to come; -1: invalid
  };
  struct Level {
    std::vector<int32_t> stacks;
    Utf8 partial;
  };

  int32_t intern(uint32_t pos, int32_t parent);
  // Appends the expansion of stack s (tops all character sets, or kDone) to out.
  void expand(int32_t s, std::vector<int32_t>& out);
  // The stacks after code point c, from `in`, into out (sorted, unique).
  void step(const std::vector<int32_t>& in, uint32_t c, std::vector<int32_t>& out);
  // One byte from `from` into `to`; false where the grammar refuses the text.
  bool feed(const Level& from, unsigned char b, Level& to);
  // Whether a character beginning with u's bytes could be accepted by a stack of `stacks`.
  bool partial_ok(const std::vector<int32_t>& stacks, const Utf8& u) const;
  // Whether the text that ends at `l` is allowed (its last character complete or possible).
  bool ends_ok(const Level& l) const;
  // Walks bytes from the current state into lv_: whether the grammar allows them.
  bool walk(std::string_view bytes);
  void compact();

  std::shared_ptr<const Grammar> g_;
  std::vector<Node> nodes_;
  std::unordered_map<uint64_t, int32_t> ids_;
  std::unordered_map<int32_t, std::vector<int32_t>> expanded_;  // memo of expand()
  std::vector<int32_t> initial_;
  std::vector<int32_t> stacks_;  // the state: sorted ids of the live stacks
  Utf8 partial_;                 // the last token's unfinished character
  std::vector<Level> lv_;        // scratch: the state after each byte of a walk
  std::vector<int32_t> todo_, seen_;
  std::vector<uint8_t> ok_;      // scratch: mask()'s verdict per id
};

}  // namespace kvs::grammar
