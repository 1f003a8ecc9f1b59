// The prompt cache: pages and recurrent checkpoints of closed sequences by the tokens they
// hold (the engine's side of it is cache_link.cpp).
#include "kvs/engine/prompt_cache.h"

#include <algorithm>
#include <cstring>

#include "kvs/engine/cache_disk.h"

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

// The chain's mixing, 4 bytes a step; the tail zero-padded.
uint64_t cache_fingerprint(const std::string& bytes) {
  std::vector<int32_t> words((bytes.size() + 3) / 4, 0);
  std::memcpy(words.data(), bytes.data(), bytes.size());
  return chain_key(bytes.size(), words.data(), static_cast<int32_t>(words.size()));
}

bool checkpoint_due(int32_t before, int32_t after, int32_t n_prompt, int32_t max_points) {
  if (after >= n_prompt || after <= before) return false;
  if (after == n_prompt - 1) return true;
  if (max_points <= 0) return false;
  const int64_t k = int64_t{max_points} + 1;
  return after * k / n_prompt > before * k / n_prompt;
}

PromptCache::PromptCache(size_t budget, const PromptCacheShape& shape)
    : budget_(budget), shape_(shape) {
  stats_.budget = budget;
}

PromptCache::~PromptCache() {
  if (!disk_) return;
  for (auto it = lru_.rbegin(); it != lru_.rend(); ++it) to_disk(*it);  // the oldest first
}

void PromptCache::use_disk(std::unique_ptr<CacheDisk> disk) {
  disk_ = std::move(disk);
  disk_stats();
}

std::vector<std::string> PromptCache::take_warnings() {
  return disk_ ? disk_->take_warnings() : std::vector<std::string>{};
}

void PromptCache::disk_stats() {
  stats_.disk_bytes = disk_->bytes();
  stats_.disk_writes = disk_->writes();
  stats_.disk_reads = disk_->reads();
}

void PromptCache::to_disk(const Entry& e) {
  DiskEntry head;
  head.key = e.key;
  head.parent = e.parent;
  head.tokens = e.tokens;
  std::vector<const uint8_t*> states;
  for (const Checkpoint& c : e.checkpoints) {
    head.checkpoints.push_back(c.pos);
    states.push_back(c.state.get());
  }
  disk_->put(head, e.kv.get(), e.window.get(), states);
  disk_stats();
}

bool PromptCache::on_disk(uint64_t parent, uint64_t key, const int32_t* tokens, int32_t n) const {
  const DiskEntry* d = disk_ ? disk_->find(key) : nullptr;
  return d && d->parent == parent && static_cast<int32_t>(d->tokens.size()) == n &&
         std::equal(d->tokens.begin(), d->tokens.end(), tokens);
}

std::vector<PromptCache::Iter> PromptCache::from_disk(const std::vector<uint64_t>& keys) {
  std::vector<Iter> out(keys.size(), lru_.end());
  std::vector<CacheDisk::Take> takes;
  for (size_t i = 0; i < keys.size(); ++i) {
    const DiskEntry* d = disk_->find(keys[i]);
    if (!d || index_.count(keys[i])) break;
    const DiskEntry head = *d;  // make_room may write others, and the disk forget this one
    const size_t bytes = entry_bytes(static_cast<int32_t>(head.tokens.size()), head.window) +
                         head.checkpoints.size() * shape_.state_bytes;
    if (!make_room(bytes) || !disk_->find(keys[i])) break;
    lru_.emplace_front();
    const Iter it = lru_.begin();
    it->key = keys[i];
    it->parent = head.parent;
    it->tokens = head.tokens;
    it->bytes = bytes;
    it->pinned = generation_;
    stats_.bytes += bytes;  // counted now: the next make_room must see it
    CacheDisk::Take& t = takes.emplace_back();
    t.key = keys[i];
    t.kv = (it->kv = std::make_unique_for_overwrite<uint8_t[]>(shape_.page_bytes)).get();
    if (head.window)
      t.window =
          (it->window = std::make_unique_for_overwrite<uint8_t[]>(shape_.window_bytes)).get();
    for (const int32_t pos : head.checkpoints) {
      it->checkpoints.push_back(
          {pos, std::make_unique_for_overwrite<uint8_t[]>(shape_.state_bytes)});
      t.states.push_back(it->checkpoints.back().state.get());
    }
    out[i] = it;
  }
  disk_->take(takes);
  disk_stats();
  bool chained = true;
  for (size_t i = 0; i < takes.size(); ++i) {
    const Iter it = out[i];
    if (!takes[i].ok || !chained) {
      // A file that did not check, or an entry past it: kept where it read, but not in this
      // chain.
      if (!takes[i].ok) {
        stats_.bytes -= it->bytes;
        lru_.erase(it);
      }
      out[i] = lru_.end();
      chained = false;
      if (!takes[i].ok) continue;
    }
    stats_.checkpoints += static_cast<int64_t>(it->checkpoints.size());
    stats_.checkpoint_bytes += it->checkpoints.size() * shape_.state_bytes;
    index_[it->key] = it;
    children_.emplace(it->parent, it);
  }
  return out;
}

PromptCache::Iter PromptCache::lookup(uint64_t parent, uint64_t key, const int32_t* tokens,
                                      int32_t n) {
  const auto it = index_.find(key);
  if (it == index_.end()) return lru_.end();
  const Entry& e = *it->second;
  if (e.parent != parent || static_cast<int32_t>(e.tokens.size()) != n ||
      !std::equal(e.tokens.begin(), e.tokens.end(), tokens))
    return lru_.end();
  return it->second;
}

void PromptCache::touch(const std::vector<Iter>& chain) {
  for (auto it = chain.rbegin(); it != chain.rend(); ++it) lru_.splice(lru_.begin(), lru_, *it);
}

void PromptCache::drop(Iter victim) {
  if (const auto it = index_.find(victim->key); it != index_.end() && it->second == victim)
    index_.erase(it);
  for (auto [it, end] = children_.equal_range(victim->parent); it != end; ++it)
    if (it->second == victim) {
      children_.erase(it);
      break;
    }
  stats_.bytes -= victim->bytes;
  stats_.checkpoints -= static_cast<int64_t>(victim->checkpoints.size());
  stats_.checkpoint_bytes -= victim->checkpoints.size() * shape_.state_bytes;
  lru_.erase(victim);
}

void PromptCache::evict_back() {
  const Iter victim = std::prev(lru_.end());
  if (disk_) to_disk(*victim);
  drop(victim);
  ++stats_.evicted;
}

int32_t PromptCache::erase(const int32_t* tokens, int32_t n) {
  const int32_t P = shape_.page_tokens;
  std::vector<Iter> chain;
  uint64_t parent = 0;
  for (int32_t i = 0; i * P < n; ++i) {
    const int32_t* t = tokens + static_cast<size_t>(i) * P;
    const int32_t len = std::min(P, n - i * P);
    const uint64_t key = chain_key(parent, t, len);
    const Iter it = lookup(parent, key, t, len);
    if (it == lru_.end()) break;
    chain.push_back(it);
    parent = key;
  }
  int32_t dropped = 0;
  for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
    if (children_.count((*it)->key) > 0) break;  // another sequence goes on from here
    dropped += static_cast<int32_t>((*it)->tokens.size());
    drop(*it);
  }
  return dropped;
}

bool PromptCache::make_room(size_t more) {
  while (stats_.bytes + more > budget_) {
    if (lru_.empty() || lru_.back().pinned == generation_) return false;
    evict_back();
  }
  return true;
}

CacheHit PromptCache::find(const int32_t* tokens, int32_t max_n) {
  ++stats_.lookups;
  ++generation_;  // entries read back from disk must not evict those matched before them
  const int32_t P = shape_.page_tokens;
  std::vector<Iter> chain;          // pages matched whole
  std::vector<uint64_t> keys;       // of the chain's pages
  std::vector<uint64_t> disk_keys;  // of those on disk only, read back all at once below
  uint64_t parent = 0;
  for (int32_t i = 0; (i + 1) * P <= max_n; ++i) {
    const int32_t* t = tokens + static_cast<size_t>(i) * P;
    const uint64_t key = chain_key(parent, t, P);
    const Iter it = lookup(parent, key, t, P);
    if (it != lru_.end()) {
      it->pinned = generation_;  // at the front: eviction takes from the back
      lru_.splice(lru_.begin(), lru_, it);
    } else if (on_disk(parent, key, t, P)) {
      disk_keys.push_back(key);
    } else {
      break;
    }
    chain.push_back(it);
    keys.push_back(key);
    parent = key;
  }
  if (!disk_keys.empty()) {
    const std::vector<Iter> read = from_disk(disk_keys);
    for (size_t i = 0, d = 0; i < chain.size(); ++i) {
      if (chain[i] == lru_.end()) chain[i] = read[d++];
      if (chain[i] == lru_.end()) {  // not read back: the chain ends before it
        chain.resize(i);
        parent = i > 0 ? keys[i - 1] : 0;
        break;
      }
    }
  }
  // The next page: of the children sharing leading tokens (a page that differs later, or a
  // sequence's partial last page), the one a resume reaches furthest with: the most tokens, or
  // for recurrent models the latest checkpoint within them (a sequence that went on from this
  // prefix keeps its page, but the checkpoint may be in an earlier sequence's partial page).
  const int32_t whole = static_cast<int32_t>(chain.size()) * P;
  const int32_t room = std::min(P, max_n - whole);
  const auto matched = [&](const std::vector<int32_t>& t) {
    const int32_t lim = std::min(room, static_cast<int32_t>(t.size()));
    int32_t l = 0;
    while (l < lim && t[static_cast<size_t>(l)] == tokens[whole + l]) ++l;
    return l;
  };
  const auto reach = [&](int32_t l, auto&& checkpoint_positions) {
    if (shape_.state_bytes == 0) return l;
    int32_t r = 0;
    checkpoint_positions([&](int32_t pos) {
      if (pos <= whole + l) r = std::max(r, pos - whole);
    });
    return r;
  };
  Iter tail = lru_.end();
  int32_t tail_n = 0, tail_reach = 0;
  const auto better = [&](int32_t l, int32_t r) {
    return l > 0 && (r > tail_reach || (r == tail_reach && l > tail_n));
  };
  for (auto [it, end] = children_.equal_range(parent); room > 0 && it != end; ++it) {
    const Entry& e = *it->second;
    const int32_t l = matched(e.tokens);
    const int32_t r = reach(l, [&](auto&& f) {
      for (const Checkpoint& c : e.checkpoints) f(c.pos);
    });
    if (better(l, r)) tail = it->second, tail_n = l, tail_reach = r;
  }
  if (disk_ && room > 0) {  // a better match on disk
    uint64_t best = 0;
    int32_t best_n = 0, best_reach = 0;
    for (const DiskEntry* d : disk_->children(parent)) {
      const int32_t l = matched(d->tokens);
      const int32_t r = reach(l, [&](auto&& f) {
        for (const int32_t pos : d->checkpoints) f(pos);
      });
      if (better(l, r) && (r > best_reach || (r == best_reach && l > best_n)))
        best = d->key, best_n = l, best_reach = r;
    }
    if (best_n > 0) {
      if (tail != lru_.end()) tail->pinned = generation_, lru_.splice(lru_.begin(), lru_, tail);
      if (const Iter it = from_disk({best})[0]; it != lru_.end()) tail = it, tail_n = best_n;
    }
  }
  // Where a resume could start, best first: for recurrent models the checkpoints, else the
  // last matching token and the last whole page.
  std::vector<int32_t> at;
  if (shape_.state_bytes > 0) {
    for (const Iter& e : chain)
      for (const Checkpoint& c : e->checkpoints) at.push_back(c.pos);
    if (tail != lru_.end())
      for (const Checkpoint& c : tail->checkpoints)
        if (c.pos <= whole + tail_n) at.push_back(c.pos);
    std::sort(at.rbegin(), at.rend());
  } else {
    at = {whole + tail_n, whole};
  }
  const auto page = [&](int32_t i) {
    return i < static_cast<int32_t>(chain.size()) ? chain[static_cast<size_t>(i)] : tail;
  };
  CacheHit hit;
  for (const int32_t n : at) {
    if (n <= 0) break;
    const int32_t pages = (n + P - 1) / P;
    bool windows = true;
    if (shape_.window_bytes > 0)
      for (int32_t i = std::max(0, n - shape_.window_back) / P; i < pages; ++i)
        windows &= page(i)->window != nullptr;
    if (!windows) continue;
    hit.n = n;
    std::vector<Iter> used;
    for (int32_t i = 0; i < pages; ++i) {
      used.push_back(page(i));
      hit.kv.push_back(page(i)->kv.get());
      hit.window.push_back(page(i)->window.get());
    }
    if (shape_.state_bytes > 0)
      for (const Checkpoint& c : page(pages - 1)->checkpoints)
        if (c.pos == n) hit.state = c.state.get();
    touch(used);
    break;
  }
  return hit;
}

void PromptCache::insert(const int32_t* tokens, int32_t n, int32_t window_first,
                         const std::function<void(int32_t, uint8_t*, uint8_t*)>& fill,
                         std::vector<Checkpoint> checkpoints) {
  const int32_t P = shape_.page_tokens;
  ++generation_;
  std::vector<Iter> chain;
  uint64_t parent = 0;
  for (int32_t i = 0; i * P < n; ++i) {
    const int32_t* t = tokens + static_cast<size_t>(i) * P;
    const int32_t len = std::min(P, n - i * P);
    const bool window = shape_.window_bytes > 0 && i >= window_first;
    const uint64_t key = chain_key(parent, t, len);
    Iter it = lookup(parent, key, t, len);
    if (it == lru_.end()) {
      if (index_.count(key)) break;  // a 64-bit collision with another prefix: keep that one
      const size_t bytes = entry_bytes(len, window);
      if (!make_room(bytes)) break;
      lru_.emplace_front();
      it = lru_.begin();
      it->key = key;
      it->parent = parent;
      it->tokens.assign(t, t + len);
      it->kv = std::make_unique_for_overwrite<uint8_t[]>(shape_.page_bytes);
      if (window) it->window = std::make_unique_for_overwrite<uint8_t[]>(shape_.window_bytes);
      it->bytes = bytes;
      it->pinned = generation_;
      stats_.bytes += bytes;
      fill(i, it->kv.get(), it->window.get());
      index_[key] = it;
      children_.emplace(parent, it);
      ++stats_.inserted;
    } else {
      lru_.splice(lru_.begin(), lru_, it);
      it->pinned = generation_;
      if (window && !it->window) {  // cached by a sequence that ended further on
        if (!make_room(shape_.window_bytes)) break;
        it->window = std::make_unique_for_overwrite<uint8_t[]>(shape_.window_bytes);
        it->bytes += shape_.window_bytes;
        stats_.bytes += shape_.window_bytes;
        fill(i, nullptr, it->window.get());
      }
    }
    chain.push_back(it);
    parent = key;
    // The checkpoints after a position of this page.
    for (Checkpoint& c : checkpoints) {
      if (!c.state || c.pos <= i * P || c.pos > i * P + len) continue;
      const bool have = std::any_of(it->checkpoints.begin(), it->checkpoints.end(),
                                    [&](const Checkpoint& x) { return x.pos == c.pos; });
      if (have || !make_room(shape_.state_bytes)) continue;
      it->checkpoints.push_back(std::move(c));
      it->bytes += shape_.state_bytes;
      stats_.bytes += shape_.state_bytes;
      ++stats_.checkpoints;
      stats_.checkpoint_bytes += shape_.state_bytes;
    }
  }
  touch(chain);
}

}  // namespace kvs
