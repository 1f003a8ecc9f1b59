// The prompt cache (--cache-ram): KV pages and recurrent checkpoints of closed sequences kept in
// host memory, found again by the tokens they hold. An entry is one page of positions (the last
// of a sequence may be partial): its tokens, that page of every full layer, near the sequence's
// end that page of every window layer (what later queries' windows reach), and the recurrent
// checkpoints taken inside it. Entry i of a prompt is keyed by a hash chain (the hash of entry
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
#include <string>
#include <unordered_map>
#include <vector>

namespace kvs {

class CacheDisk;

struct PromptCacheStats {
  int64_t lookups = 0, hits = 0;      // sequences that asked; those that reused a position
  int64_t tokens_reused = 0;          // positions not prefilled thanks to the cache
  int64_t inserted = 0, evicted = 0;  // entries
  size_t bytes = 0;                   // held now (pages, tokens and checkpoints)
  size_t budget = 0;
  int64_t checkpoints = 0;      // recurrent checkpoints held now
  size_t checkpoint_bytes = 0;  // their part of `bytes`
  // The disk tier (--cache-disk): bytes of its files, entries written and read back.
  size_t disk_bytes = 0;
  int64_t disk_writes = 0, disk_reads = 0;
};

// What one entry holds, by the model's layer kinds.
struct PromptCacheShape {
  int32_t page_tokens = 0;
  size_t page_bytes = 0;    // a page of every full layer
  size_t window_bytes = 0;  // a page of every window layer (0: no window layers)
  size_t state_bytes = 0;   // a checkpoint: every recurrent layer's state of a sequence (0: none)
  // Positions before m that queries from m on may still see in window layers: a resume at m
  // needs the window pages from page (m - window_back) / P on.
  int32_t window_back = 0;
};

// A recurrent checkpoint: the state after the first `pos` positions.
struct Checkpoint {
  int32_t pos = 0;
  std::unique_ptr<uint8_t[]> state;  // [state_bytes]
};

// What find() returns: the first n positions' pages (the last one partial where n is not a
// multiple of the page size) and, for recurrent models, the state at n. Valid until the next
// insert().
struct CacheHit {
  int32_t n = 0;
  std::vector<const uint8_t*> kv;      // [ceil(n / P)]: the full layers' page
  std::vector<const uint8_t*> window;  // [ceil(n / P)]: the window layers' page, or null
  const uint8_t* state = nullptr;
};

class PromptCache {
 public:
  PromptCache(size_t budget, const PromptCacheShape& shape);
  // With a disk tier: every entry still held goes to it.
  ~PromptCache();
  PromptCache(const PromptCache&) = delete;
  PromptCache& operator=(const PromptCache&) = delete;
  // Entries evicted from RAM go to `disk` from now on, and a lookup reads back those it holds.
  void use_disk(std::unique_ptr<CacheDisk> disk);
  // Warnings of the disk tier since the last call (refused files, failed writes).
  std::vector<std::string> take_warnings();

  // The longest usable cached prefix of `tokens`, at most max_n positions: up to the last
  // matching token, the window pages it needs all cached, and, for recurrent models, rounded
  // down to the last checkpoint. Counts a lookup.
  CacheHit find(const int32_t* tokens, int32_t max_n);
  // Keeps the first n positions of a sequence that holds `tokens`: fill(i, kv, window) copies
  // page i of every full layer into kv and, where window is not null (pages from window_first
  // on), of every window layer, for what is not cached yet; and the checkpoints. A chain
  // longer than the budget keeps its first pages.
  void insert(const int32_t* tokens, int32_t n, int32_t window_first,
              const std::function<void(int32_t, uint8_t*, uint8_t*)>& fill,
              std::vector<Checkpoint> checkpoints);
  // Drops the entries of the first n positions of `tokens` that no other cached entry
  // continues, leaf first (slot erase); returns the positions dropped.
  int32_t erase(const int32_t* tokens, int32_t n);
  // A sequence reused n positions (after find()).
  void count_hit(int32_t n) {
    ++stats_.hits;
    stats_.tokens_reused += n;
  }

  const PromptCacheStats& stats() const { return stats_; }
  const PromptCacheShape& shape() const { return shape_; }
  // Bytes of an entry of n tokens, with or without the window layers' page.
  size_t entry_bytes(int32_t n, bool window) const {
    return shape_.page_bytes + (window ? shape_.window_bytes : 0) +
           static_cast<size_t>(n) * sizeof(int32_t);
  }

 private:
  struct Entry {
    uint64_t key = 0, parent = 0;
    std::vector<int32_t> tokens;        // [1, page_tokens]
    std::unique_ptr<uint8_t[]> kv;      // [page_bytes]: the page of every full layer, in order
    std::unique_ptr<uint8_t[]> window;  // [window_bytes] or null
    std::vector<Checkpoint> checkpoints;
    size_t bytes = 0;
    uint64_t pinned = 0;  // insert()'s generation while it holds the entry in its chain
  };
  using Iter = std::list<Entry>::iterator;
  // The entry of `n` tokens under `parent`, or lru_.end().
  Iter lookup(uint64_t parent, uint64_t key, const int32_t* tokens, int32_t n);
  // Moves a chain to the front, root last.
  void touch(const std::vector<Iter>& chain);
  // Evicts least recently used entries not pinned until `more` bytes fit; false if they can't.
  bool make_room(size_t more);
  void evict_back();
  void drop(Iter victim);  // out of the index, its parent's children and the LRU list
  void to_disk(const Entry& e);
  // The disk's entries `keys` as RAM entries (pinned), read at once; lru_.end() for each that
  // could not be (a corrupt file, no room) and for those after the first such.
  std::vector<Iter> from_disk(const std::vector<uint64_t>& keys);
  // The disk's entry of `n` tokens under `parent` equal to `tokens`, if it has one.
  bool on_disk(uint64_t parent, uint64_t key, const int32_t* tokens, int32_t n) const;
  void disk_stats();

  size_t budget_;
  PromptCacheShape shape_;
  std::list<Entry> lru_;  // most recently used first
  std::unordered_map<uint64_t, Iter> index_;
  std::unordered_multimap<uint64_t, Iter> children_;  // by parent key
  uint64_t generation_ = 0;
  std::unique_ptr<CacheDisk> disk_;
  PromptCacheStats stats_;
};

// Whether a prefill of a prompt of n_prompt positions that moved from `before` to `after` (both
// counted from the prompt's start) reached a point where a recurrent checkpoint is taken: one
// of the max_points evenly spaced inside it (--ctx-checkpoints), or the position before its
// last token (which the caller reads alone: Engine::keeps_checkpoints), where the same prompt
// again can resume.
bool checkpoint_due(int32_t before, int32_t after, int32_t n_prompt, int32_t max_points);

// A 64-bit digest of bytes: of what a cache file's model, KV types and pages must match.
uint64_t cache_fingerprint(const std::string& bytes);

}  // namespace kvs
