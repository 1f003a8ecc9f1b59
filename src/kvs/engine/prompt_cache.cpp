// The prompt cache, and the engine's side of it: a closed sequence's completed pages go into
// the cache, a new sequence whose prompt begins with cached pages takes copies of them.
#include "kvs/engine/prompt_cache.h"

#include <algorithm>
#include <cstring>

#include "kvs/engine/engine.h"
#include "kvs/util/error.h"

namespace kvs {
namespace {

// The key of a page: its parent's key and its tokens, mixed (splitmix64's finaliser per token).
uint64_t chain_key(uint64_t parent, const int32_t* tokens, int32_t n) {
  uint64_t h = parent ^ 0x243F6A8885A308D3ull;
  for (int32_t i = 0; i < n; ++i) {
    h += 0x9E3779B97F4A7C15ull + static_cast<uint32_t>(tokens[i]);
    h = (h ^ (h >> 30)) * 0xBF58476D1CE4E5B9ull;
    h = (h ^ (h >> 27)) * 0x94D049BB133111EBull;
    h ^= h >> 31;
  }
  return h;
}

}  // namespace

PromptCache::PromptCache(size_t budget, int32_t page_tokens, size_t page_bytes)
    : budget_(budget), page_tokens_(page_tokens), page_bytes_(page_bytes) {
  stats_.budget = budget;
}

PromptCache::Iter PromptCache::lookup(uint64_t parent, uint64_t key, const int32_t* tokens) {
  const auto it = index_.find(key);
  if (it == index_.end()) return lru_.end();
  const Entry& e = *it->second;
  if (e.parent != parent || !std::equal(e.tokens.begin(), e.tokens.end(), tokens))
    return lru_.end();
  return it->second;
}

void PromptCache::touch(const std::vector<Iter>& chain) {
  for (auto it = chain.rbegin(); it != chain.rend(); ++it) lru_.splice(lru_.begin(), lru_, *it);
}

std::vector<const uint8_t*> PromptCache::find(const int32_t* tokens, int32_t max_pages) {
  ++stats_.lookups;
  std::vector<Iter> chain;
  uint64_t parent = 0;
  for (int32_t i = 0; i < max_pages; ++i) {
    const int32_t* t = tokens + static_cast<size_t>(i) * page_tokens_;
    const uint64_t key = chain_key(parent, t, page_tokens_);
    const Iter it = lookup(parent, key, t);
    if (it == lru_.end()) break;
    chain.push_back(it);
    parent = key;
  }
  touch(chain);
  std::vector<const uint8_t*> out;
  for (const Iter& it : chain) out.push_back(it->kv.get());
  return out;
}

void PromptCache::insert(const int32_t* tokens, int32_t n_pages,
                         const std::function<void(int32_t, uint8_t*)>& fill) {
  const size_t cap = budget_ / entry_bytes();
  n_pages = static_cast<int32_t>(std::min<size_t>(static_cast<size_t>(n_pages), cap));
  std::vector<Iter> chain;
  uint64_t parent = 0;
  for (int32_t i = 0; i < n_pages; ++i) {
    const int32_t* t = tokens + static_cast<size_t>(i) * page_tokens_;
    const uint64_t key = chain_key(parent, t, page_tokens_);
    Iter it = lookup(parent, key, t);
    if (it == lru_.end()) {
      if (index_.count(key)) break;  // a 64-bit collision with another prefix: keep that one
      // The chain so far sits at the front and is shorter than the budget: the oldest entry
      // is another chain's leaf.
      if (lru_.size() >= cap) {
        const auto old = index_.find(lru_.back().key);  // not indexed if its fill failed
        if (old != index_.end() && old->second == std::prev(lru_.end())) index_.erase(old);
        lru_.splice(lru_.begin(), lru_, std::prev(lru_.end()));
        ++stats_.evicted;
      } else {
        lru_.emplace_front();
        lru_.front().tokens.resize(static_cast<size_t>(page_tokens_));
        lru_.front().kv = std::make_unique_for_overwrite<uint8_t[]>(page_bytes_);
        stats_.bytes += entry_bytes();
      }
      it = lru_.begin();
      it->key = key;
      it->parent = parent;
      std::copy(t, t + page_tokens_, it->tokens.begin());
      fill(i, it->kv.get());
      index_[key] = it;
      ++stats_.inserted;
    } else {
      lru_.splice(lru_.begin(), lru_, it);
    }
    chain.push_back(it);
    parent = key;
  }
  touch(chain);
}

// ---- the engine's side ----

// The cache takes at most --cache-ram, and at most what host memory has left beside the whole
// KV history of every sequence, so that a sequence never runs out of host memory mid-way.
void Engine::make_prompt_cache() {
  if (opt_.cache_ram == 0) return;
  KVS_CHECK(shape_.n_full == cfg_.n_layer, "--cache-ram: ", cfg_.arch_name,
            " has window or recurrent layers, whose state at a page boundary the prompt cache "
            "does not keep; give --cache-ram 0");
  const size_t avail = host_memory_available() / 10 * 9;
  size_t budget = opt_.cache_ram;
  if (avail != 0)
    budget = std::min(budget, avail > shape_.full_bytes ? avail - shape_.full_bytes : 0);
  const size_t entry = kv_.page_bytes() * static_cast<size_t>(shape_.n_full);
  cache_ = std::make_unique<PromptCache>(budget, opt_.page_size, entry);
}

void Engine::keep_pages(int32_t s) {
  Slot& sl = slots_[static_cast<size_t>(s)];
  // Tokens are recorded as a step starts and n_past moves when it ends: a failed step, or a
  // random fill, leaves them apart, and such pages are not kept.
  if (!cache_ || static_cast<int32_t>(sl.tokens.size()) != sl.n_past) return;
  const size_t page = kv_.page_bytes();
  cache_->insert(sl.tokens.data(), sl.n_past / opt_.page_size, [&](int32_t p, uint8_t* dst) {
    for (int32_t il = 0; il < cfg_.n_layer; ++il) {
      if (!full(il)) continue;
      uint8_t* to = dst + static_cast<size_t>(kv_index_[static_cast<size_t>(il)]) * page;
      if (host_)  // the authoritative copy, written back (close_sequence synchronised first)
        std::memcpy(to, host_->page(s, store_layer(il), p), page);
      else
        dev_.download(to, pool_->frame(sl.frames[static_cast<size_t>(il)][static_cast<size_t>(p)]),
                      page);
    }
  });
}

int32_t Engine::reuse_prefix(Sequence& s, const int32_t* tokens, int32_t n) {
  KVS_CHECK(
      s.id >= 0 && s.id < opt_.n_seq && slots_[static_cast<size_t>(s.id)].live && s.n_past == 0,
      "reuse_prefix: a sequence that is not freshly open");
  if (!cache_ || n < 2) return 0;
  const int32_t P = opt_.page_size;
  // At least one token is left to evaluate: its logits are the answer's first.
  const std::vector<const uint8_t*> hit = cache_->find(tokens, (n - 1) / P);
  if (hit.empty()) return 0;
  Slot& sl = slots_[static_cast<size_t>(s.id)];
  const size_t page = kv_.page_bytes();
  const int32_t k = static_cast<int32_t>(hit.size());
  for (int32_t il = 0; il < cfg_.n_layer; ++il) {
    if (!full(il)) continue;
    auto& fr = sl.frames[static_cast<size_t>(il)];
    for (int32_t p = 0; p < k; ++p) {
      const uint8_t* from = hit[static_cast<size_t>(p)] +
                            static_cast<size_t>(kv_index_[static_cast<size_t>(il)]) * page;
      if (host_) {
        std::memcpy(host_->page(s.id, store_layer(il), p), from, page);
        if (pool_) fr.push_back(-1);  // the next plan fetches those under its caps
      } else {
        const int32_t f = take_frame();
        dev_.upload(pool_->frame(f), from, page);
        fr.push_back(f);
      }
    }
  }
  sl.tokens.assign(tokens, tokens + static_cast<size_t>(k) * P);
  sl.n_past = s.n_past = k * P;
  ++frames_epoch_;
  // The next step lays the pages out anew, which also drops chunks the ring prefetched from
  // this slot's previous sequence.
  plan_dirty_ = relayout_ = true;
  cache_->count_hit(k * P);
  return k * P;
}

}  // namespace kvs
