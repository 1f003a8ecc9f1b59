// The prompt cache (--cache-ram): completed KV pages of closed sequences kept in host memory,
// found again by the tokens they hold. An entry is one page of positions: its tokens and that
// page of every full layer. Entry i of a prompt is keyed by a hash chain (the hash of entry
// i - 1 and the tokens of page i), so a key stands for the whole prefix up to its page; a hit
// also compares the tokens and the parent, so a hash collision can never reuse wrong pages.
// Least recently used entries go first; every use touches a chain leaf first and root last, so
// an entry is never older than its children and eviction takes leaves before their parents.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <unordered_map>
#include <vector>

namespace kvs {

struct PromptCacheStats {
  int64_t lookups = 0, hits = 0;      // sequences that asked; those that reused at least one page
  int64_t tokens_reused = 0;          // positions not prefilled thanks to the cache
  int64_t inserted = 0, evicted = 0;  // entries
  size_t bytes = 0;                   // held now (pages and tokens)
  size_t budget = 0;
};

class PromptCache {
 public:
  // Entries of `page_tokens` positions and `page_bytes` bytes (every full layer's page), at most
  // `budget` bytes in all.
  PromptCache(size_t budget, int32_t page_tokens, size_t page_bytes);

  // The memory of the cached entries that begin `tokens`, in order, at most `max_pages` of
  // them; valid until the next insert(). Counts a lookup.
  std::vector<const uint8_t*> find(const int32_t* tokens, int32_t max_pages);
  // Keeps the first n_pages pages of a sequence whose positions hold `tokens`: fill(i, dst)
  // copies page i of every full layer into dst for each page not cached yet. A chain longer
  // than the budget keeps its first pages.
  void insert(const int32_t* tokens, int32_t n_pages,
              const std::function<void(int32_t, uint8_t*)>& fill);
  // A sequence reused n positions (after find()).
  void count_hit(int32_t n) {
    ++stats_.hits;
    stats_.tokens_reused += n;
  }

  const PromptCacheStats& stats() const { return stats_; }
  size_t entry_bytes() const {
    return page_bytes_ + static_cast<size_t>(page_tokens_) * sizeof(int32_t);
  }

 private:
  struct Entry {
    uint64_t key = 0, parent = 0;
    std::vector<int32_t> tokens;    // [page_tokens]
    std::unique_ptr<uint8_t[]> kv;  // [page_bytes]: the page of every full layer, in order
  };
  using Iter = std::list<Entry>::iterator;
  // The entry of page `tokens` under `parent`, or lru_.end().
  Iter lookup(uint64_t parent, uint64_t key, const int32_t* tokens);
  // Moves a chain to the front, root last.
  void touch(const std::vector<Iter>& chain);

  size_t budget_;
  int32_t page_tokens_;
  size_t page_bytes_;
  std::list<Entry> lru_;  // most recently used first
  std::unordered_map<uint64_t, Iter> index_;
  PromptCacheStats stats_;
};

}  // namespace kvs
