// The engine's side of the prompt cache: each sequence's tokens and recurrent checkpoints so
// far, a closing sequence's pages copied into the cache, a new sequence's cached prefix copied
// out of it into the host store and the arena, and slot files (slot_file.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kvs/backend/device.h"
#include "kvs/engine/prompt_cache.h"
#include "kvs/engine/recurrent.h"
#include "kvs/kv/device_pool.h"
#include "kvs/kv/host_store.h"
#include "kvs/model/model.h"

namespace kvs {

struct EngineOptions;
struct KvShape;

// Where one sequence's pages live, as the engine places them: what the link copies a closing
// sequence's pages out of and a resumed one's into.
struct SlotPages {
  HostStore* host = nullptr;   // null: none (resident and unified modes)
  DevicePool* pool = nullptr;  // null: none (host mode)
  bool host_mode = false;      // the host store holds every attention layer's pages
  const std::vector<int32_t>* store_layer = nullptr;    // [layer]: its index in the host store
  std::vector<std::vector<int32_t>>* frames = nullptr;  // [layer][page] -> frame; -1: none
  std::function<int32_t()> take_frame;                  // a free frame of the arena
};

class PromptCacheLink {
 public:
  // The link of an engine of o on dev (null without --cache-ram): the cache takes at most
  // --cache-ram, and at most what host memory has left beside the whole KV history of every
  // sequence, so that a sequence never runs out of host memory mid-way.
  static std::unique_ptr<PromptCacheLink> make(const Model& model, Device& dev,
                                               const EngineOptions& o, const KvShape& shape,
                                               const KvLayout& kv);
  PromptCacheLink(Device& dev, const ModelConfig& c, size_t budget, const PromptCacheShape& shape,
                  size_t page_bytes, int32_t n_seq);
  PromptCacheLink(const PromptCacheLink&) = delete;
  PromptCacheLink& operator=(const PromptCacheLink&) = delete;

  PromptCache& cache() { return cache_; }
  const PromptCache& cache() const { return cache_; }

  // A sequence opens in slot s: nothing of it recorded yet.
  void open(int32_t s);
  // Slot s's step feeds it n tokens.
  void record(int32_t s, const int32_t* tokens, int32_t n);
  // Slot s keeps its first n positions.
  void truncate(int32_t s, int32_t n);
  // With recurrent layers: keeps slot s's states at n_past (its length), unless its tokens are
  // not all recorded or it has one there already.
  void checkpoint(int32_t s, int32_t n_past, const RecurrentState& rec);
  // Puts slot s's first n_past positions (and a checkpoint at n_past) into the cache; their
  // written-back pages' copies in the host store must have landed.
  void keep(int32_t s, int32_t n_past, const SlotPages& pages, const RecurrentState& rec);
  // Gives slot s, freshly open, copies of the cached pages that begin `tokens` (n of them),
  // leaving at least one token to evaluate, and the state there; returns the positions they
  // hold (0: none).
  int32_t reuse(int32_t s, const int32_t* tokens, int32_t n, SlotPages& pages, RecurrentState& rec);
  // Slot files (slot_file.cpp): Engine::save_prefix and load_prefix.
  int32_t save(const std::vector<int32_t>& tokens, const std::string& path, size_t* bytes);
  void load(const std::string& path, std::vector<int32_t>& tokens, size_t* bytes);

 private:
  struct Seq {
    std::vector<int32_t> tokens;          // the token of every position
    std::vector<Checkpoint> checkpoints;  // its recurrent states so far
  };
  bool full(int32_t il) const { return cfg_.kinds[static_cast<size_t>(il)] == LayerKind::Full; }
  bool recurrent(int32_t il) const {
    return cfg_.kinds[static_cast<size_t>(il)] == LayerKind::Recurrent;
  }

  Device& dev_;
  const ModelConfig& cfg_;
  PromptCache cache_;
  uint64_t fingerprint_ = 0;  // the model, KV types and pages a cache file must match
  size_t page_bytes_;         // a page of one layer
  std::vector<Seq> seqs_;     // [slot]
};

}  // namespace kvs
