// Prompt lookup: drafts for speculative decoding found in the sequence itself. When the last n
// tokens (n from n_max down to n_min) occurred earlier, the tokens that followed that
// occurrence are proposed: long documents, code edits, retrieved context and agents copy
// stretches of what the sequence already holds, and those drafts cost no second model.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

namespace kvs {

class NgramDrafter {
 public:
  // Throws kvs::Error unless 1 <= n_min <= n_max <= kMaxN. The defaults are the apps' (run,
  // chat, serve): a match of 2 tokens is already a good guess in copied text.
  explicit NgramDrafter(int32_t n_min = 2, int32_t n_max = 4);
  static constexpr int32_t kMaxN = 8;

  // Appends a token of the sequence (prompt and accepted tokens alike).
  void accept(int32_t token);
  void accept(const int32_t* tokens, int32_t n);
  // Forgets the last n tokens (rejected ones a caller added before verifying them).
  void truncate(int32_t n_tokens);
  // Up to max tokens that followed the most recent earlier occurrence of the longest suffix
  // of length in [n_min, n_max] that has one; empty when none has.
  std::vector<int32_t> propose(int32_t max) const;

  const std::vector<int32_t>& history() const { return hist_; }

 private:
  uint64_t key(int32_t end, int32_t n) const;  // of hist_[end - n, end) and n
  // Records that hist_[end - n, end) is followed by hist_[end], for every n.
  void index(int32_t end);

  int32_t n_min_, n_max_;
  std::vector<int32_t> hist_;
  // key -> the latest `end` whose n-gram has it and is followed by a token; prev_[n - n_min]
  // [end]: the `end` before it with the same key, or -1 (so truncation restores the older one).
  std::unordered_map<uint64_t, int32_t> last_;
  std::vector<std::vector<int32_t>> prev_;
};

}  // namespace kvs
