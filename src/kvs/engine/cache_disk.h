// The prompt cache's disk tier (--cache-disk DIR): entries the RAM evicts (and all of them when
// the cache is destroyed), one file each, read back on a match, also by a later process. A file
// is a header (magic, version, the fingerprint of the model, KV types and page size, the
// entry's key, parent and sizes), its tokens and checkpoint positions, its pages and states,
// then a checksum of all that; it is written under a temporary name, flushed and renamed, so a
// kill leaves no partial entry under an entry's name. A file that is partial, corrupt or of
// another fingerprint is refused by name (a warning) and never loaded. One process holds the
// directory at a time (a lock file).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <unordered_map>
#include <vector>

#include "kvs/engine/prompt_cache.h"

namespace kvs {

// A checksum of pieces of bytes, 8 bytes at a time (a piece's tail zero-padded, then its
// length): the writer and the reader cut the file into the same pieces.
struct CacheChecksum {
  uint64_t h = 0x9E3779B97F4A7C15ull;
  void word(uint64_t w) {
    h = (h ^ w) * 0xBF58476D1CE4E5B9ull;
    h ^= h >> 29;
  }
  void add(const void* data, size_t n) {
    const auto* p = static_cast<const uint8_t*>(data);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      uint64_t w;
      std::memcpy(&w, p + i, 8);
      word(w);
    }
    uint64_t tail = 0;
    std::memcpy(&tail, p + i, n - i);
    word(tail);
    word(n);
  }
};

// What the index knows of an entry file without reading it whole.
struct DiskEntry {
  uint64_t key = 0, parent = 0;
  std::vector<int32_t> tokens;
  bool window = false;               // holds the window layers' page
  std::vector<int32_t> checkpoints;  // their positions
  size_t file_bytes = 0;
  uint64_t used = 0;  // the index's clock at its last write, for eviction
};

class CacheDisk {
 public:
  // Takes dir (made if missing) for this process, refused where another holds it, and indexes
  // its entry files of this fingerprint, at most `limit` bytes of them.
  CacheDisk(const std::string& dir, size_t limit, uint64_t fingerprint,
            const PromptCacheShape& shape);
  ~CacheDisk();
  CacheDisk(const CacheDisk&) = delete;
  CacheDisk& operator=(const CacheDisk&) = delete;

  const DiskEntry* find(uint64_t key) const;
  std::vector<const DiskEntry*> children(uint64_t parent) const;
  // Writes an entry (states: one per checkpoint), evicting the least recently written files
  // past the limit; a failure (disk full, unwritable) warns and turns writing off.
  void put(const DiskEntry& head, const uint8_t* kv, const uint8_t* window,
           const std::vector<const uint8_t*>& states);
  // Where take() puts an entry: kv [page_bytes], window [window_bytes] where it has one, and
  // one state per checkpoint; whether its file checked.
  struct Take {
    uint64_t key = 0;
    uint8_t *kv = nullptr, *window = nullptr;
    std::vector<uint8_t*> states;
    bool ok = false;
  };
  // Reads the entries (their files at once, on the thread pool: a long conversation is
  // hundreds of them), each after checking its file; an entry that does not check is not ok (a
  // warning). The files go either way: the entries move to RAM.
  void take(std::vector<Take>& takes);

  size_t bytes() const { return bytes_; }
  int64_t reads() const { return reads_; }
  int64_t writes() const { return writes_; }
  // Warnings since the last call (refused files, failed writes), for the caller to show.
  std::vector<std::string> take_warnings() { return std::move(warnings_); }

 private:
  std::string path_of(uint64_t key) const;
  void forget(uint64_t key);  // drops the index's entry and its file
  bool forget_oldest();       // the least recently written; false where none is left
  bool read(const DiskEntry& d, const Take& t) const;  // any thread
  void index_file(const std::string& path);

  std::string dir_;
  size_t limit_;
  uint64_t fingerprint_;
  PromptCacheShape shape_;
  int lock_fd_ = -1;
  bool writable_ = true;
  std::unordered_map<uint64_t, DiskEntry> index_;
  std::unordered_multimap<uint64_t, uint64_t> children_;  // parent key -> key
  size_t bytes_ = 0;
  uint64_t clock_ = 0;
  int64_t reads_ = 0, writes_ = 0;
  std::vector<std::string> warnings_;
};

}  // namespace kvs
