#include "kvs/engine/ngram_draft.h"

#include <algorithm>
#include <utility>

#include "kvs/util/error.h"

namespace kvs {

NgramDrafter::NgramDrafter(int32_t n_min, int32_t n_max) : n_min_(n_min), n_max_(n_max) {
  KVS_CHECK(n_min >= 1 && n_min <= n_max && n_max <= kMaxN,
            "ngram drafter: the n-gram sizes must satisfy 1 <= min <= max <= ", kMaxN, ", got ",
            n_min, " and ", n_max);
  prev_.resize(static_cast<size_t>(n_max - n_min + 1));
}

uint64_t NgramDrafter::key(int32_t end, int32_t n) const {
  uint64_t h = 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(n);
  for (int32_t i = end - n; i < end; ++i) {
    h ^= static_cast<uint32_t>(hist_[static_cast<size_t>(i)]);
    h *= 0xFF51AFD7ED558CCDull;
    h ^= h >> 32;
  }
  return h;
}

void NgramDrafter::index(int32_t end) {
  for (int32_t n = n_min_; n <= n_max_; ++n) {
    std::vector<int32_t>& prev = prev_[static_cast<size_t>(n - n_min_)];
    prev.push_back(-1);
    if (n > end) continue;
    const auto [it, fresh] = last_.try_emplace(key(end, n), end);
    if (!fresh) prev.back() = std::exchange(it->second, end);
  }
}

void NgramDrafter::accept(int32_t token) {
  hist_.push_back(token);
  index(static_cast<int32_t>(hist_.size()) - 1);
}

void NgramDrafter::accept(const int32_t* tokens, int32_t n) {
  for (int32_t i = 0; i < n; ++i) accept(tokens[i]);
}

void NgramDrafter::truncate(int32_t n_tokens) {
  const auto len = static_cast<int32_t>(hist_.size());
  KVS_CHECK(n_tokens >= 0 && n_tokens <= len, "ngram drafter: cannot drop ", n_tokens, " of ",
            len, " tokens");
  // Latest first, so each key's latest occurrence is the dropped one and goes back to the one
  // it replaced.
  for (int32_t end = len - 1; end >= len - n_tokens; --end)
    for (int32_t n = n_min_; n <= n_max_; ++n) {
      std::vector<int32_t>& prev = prev_[static_cast<size_t>(n - n_min_)];
      if (n <= end) {
        const auto it = last_.find(key(end, n));
        if (prev.back() < 0)
          last_.erase(it);
        else
          it->second = prev.back();
      }
      prev.pop_back();
    }
  hist_.resize(static_cast<size_t>(len - n_tokens));
}

std::vector<int32_t> NgramDrafter::propose(int32_t max) const {
  const auto len = static_cast<int32_t>(hist_.size());
  for (int32_t n = std::min(n_max_, len); n >= n_min_; --n) {
    const auto it = last_.find(key(len, n));
    // The latest occurrence whose tokens match (another n-gram may share the hash).
    const std::vector<int32_t>& prev = prev_[static_cast<size_t>(n - n_min_)];
    for (int32_t end = it == last_.end() ? -1 : it->second; end >= 0;
         end = prev[static_cast<size_t>(end)]) {
      if (!std::equal(hist_.begin() + end - n, hist_.begin() + end, hist_.end() - n)) continue;
      const int32_t stop = std::min(len, end + std::max(max, 0));
      return {hist_.begin() + end, hist_.begin() + stop};
    }
  }
  return {};
}

}  // namespace kvs
