#include "kvs/engine/cache_link.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <utility>

#include "kvs/engine/cache_disk.h"
#include "kvs/engine/engine.h"
#include "kvs/util/error.h"
#include "kvs/util/threadpool.h"

namespace kvs {

std::unique_ptr<PromptCacheLink> PromptCacheLink::make(const Model& model, Device& dev,
                                                       const EngineOptions& o, const KvShape& shape,
                                                       const KvLayout& kv) {
  KVS_CHECK(o.cache_disk.empty() || o.cache_ram > 0,
            "--cache-disk needs the prompt cache in RAM too (--cache-ram above 0)");
  if (o.cache_ram == 0) return nullptr;
  const ModelConfig& cfg = model.config;
  const size_t avail = host_memory_available() / 10 * 9;
  size_t budget = o.cache_ram;
  if (avail != 0)
    budget = std::min(budget, avail > shape.full_bytes ? avail - shape.full_bytes : 0);
  PromptCacheShape c;
  c.page_tokens = o.page_size;
  c.page_bytes = kv.page_bytes() * static_cast<size_t>(shape.n_full);
  c.window_bytes = kv.page_bytes() * static_cast<size_t>(shape.n_window);
  c.state_bytes = shape.recurrent_bytes / static_cast<size_t>(o.n_seq);
  // Host mode keeps every window page; otherwise trim_windows's reach.
  c.window_back = o.kv_mode == KvMode::Host ? INT32_MAX / 2 : cfg.n_swa - 1 + o.n_verify - 1;
  auto link = std::make_unique<PromptCacheLink>(dev, cfg, budget, c, kv.page_bytes(), o.n_seq);
  // What a disk entry must match: the model's shape, the KV's types and pages, and samples of
  // its weights (the embedding's and the output's first and last 64 KiB).
  std::string id =
      cat(cfg.arch_name, cfg.n_layer, ' ', cfg.n_embd, ' ', cfg.n_ff, ' ', cfg.n_head, ' ',
          cfg.n_head_kv, ' ', cfg.head_dim, ' ', cfg.n_vocab, ' ', cfg.n_swa, ' ', cfg.ssm_state,
          ' ', cfg.ssm_v_heads, ' ', dtype_name(o.k_type), dtype_name(o.v_type), ' ', o.page_size,
          ' ', c.page_bytes, ' ', c.window_bytes, ' ', c.state_bytes);
  for (const LayerKind k : cfg.kinds) id += static_cast<char>('0' + static_cast<int>(k));
  for (const Matrix* m : {&model.weights.tok_embd, &model.weights.output}) {
    const size_t n = m->data ? m->bytes() : 0, sample = std::min<size_t>(n, 65536);
    if (sample == 0) continue;
    id.append(reinterpret_cast<const char*>(m->data), sample);
    id.append(reinterpret_cast<const char*>(m->data + n - sample), sample);
  }
  link->fingerprint_ = cache_fingerprint(id);
  if (!o.cache_disk.empty())
    link->cache_.use_disk(
        std::make_unique<CacheDisk>(o.cache_disk, o.cache_disk_bytes, link->fingerprint_, c));
  return link;
}

PromptCacheLink::PromptCacheLink(Device& dev, const ModelConfig& c, size_t budget,
                                 const PromptCacheShape& shape, size_t page_bytes, int32_t n_seq)
    : dev_(dev),
      cfg_(c),
      cache_(budget, shape),
      page_bytes_(page_bytes),
      seqs_(static_cast<size_t>(n_seq)) {}

void PromptCacheLink::open(int32_t s) {
  Seq& q = seqs_[static_cast<size_t>(s)];
  q.tokens.clear();
  q.checkpoints.clear();
}

void PromptCacheLink::record(int32_t s, const int32_t* tokens, int32_t n) {
  auto& t = seqs_[static_cast<size_t>(s)].tokens;
  t.insert(t.end(), tokens, tokens + n);
}

void PromptCacheLink::truncate(int32_t s, int32_t n) {
  Seq& q = seqs_[static_cast<size_t>(s)];
  if (static_cast<int32_t>(q.tokens.size()) > n) q.tokens.resize(static_cast<size_t>(n));
  std::erase_if(q.checkpoints, [&](const Checkpoint& c) { return c.pos > n; });
}

void PromptCacheLink::checkpoint(int32_t s, int32_t n_past, const RecurrentState& rec) {
  if (cache_.shape().state_bytes == 0) return;
  Seq& q = seqs_[static_cast<size_t>(s)];
  if (static_cast<int32_t>(q.tokens.size()) != n_past ||
      (!q.checkpoints.empty() && q.checkpoints.back().pos >= n_past))
    return;
  Checkpoint c{n_past, std::make_unique_for_overwrite<uint8_t[]>(rec.seq_bytes())};
  rec.download(s, c.state.get());
  q.checkpoints.push_back(std::move(c));
}

void PromptCacheLink::keep(int32_t s, int32_t n_past, const SlotPages& pages,
                           const RecurrentState& rec) {
  Seq& q = seqs_[static_cast<size_t>(s)];
  // Tokens are recorded as a step starts and n_past moves when it ends: a failed step, or a
  // random fill, leaves them apart, and such pages are not kept.
  if (static_cast<int32_t>(q.tokens.size()) != n_past || n_past == 0) return;
  checkpoint(s, n_past, rec);  // the end of the answer
  const int32_t P = cache_.shape().page_tokens, done = n_past / P;
  const size_t page = page_bytes_;
  // The window pages a later query may see; host mode keeps them all.
  const int32_t window_first =
      pages.host_mode ? 0 : std::max(0, n_past - cache_.shape().window_back) / P;
  std::vector<PoolCopy> copies;
  cache_.insert(
      q.tokens.data(), n_past, window_first,
      [&](int32_t p, uint8_t* kv, uint8_t* window) {
        for (int32_t il = 0, f = 0, w = 0; il < cfg_.n_layer; ++il) {
          if (recurrent(il)) continue;
          uint8_t* to = full(il) ? (kv ? kv + static_cast<size_t>(f++) * page : nullptr)
                                 : (window ? window + static_cast<size_t>(w++) * page : nullptr);
          if (!to) continue;
          // The host store's copy where it has one (written back: the engine synchronised
          // first); the tail page and the window pages are in frames.
          if (pages.host && (pages.host_mode || (full(il) && p < done)))
            copies.push_back(
                {to, pages.host->page(s, (*pages.store_layer)[static_cast<size_t>(il)], p), page});
          else
            dev_.download(
                to,
                pages.pool->frame((*pages.frames)[static_cast<size_t>(il)][static_cast<size_t>(p)]),
                page);
        }
      },
      std::move(q.checkpoints));
  copy_on_pool(copies);
  q.checkpoints.clear();
}

int32_t PromptCacheLink::reuse(int32_t s, const int32_t* tokens, int32_t n, SlotPages& pages,
                               RecurrentState& rec) {
  const int32_t P = cache_.shape().page_tokens;
  // At least one token is left to evaluate: its logits are the answer's first.
  const CacheHit hit = cache_.find(tokens, n - 1);
  if (hit.n == 0) return 0;
  const size_t page = page_bytes_;
  const int32_t n_pages = static_cast<int32_t>(hit.kv.size()), done = hit.n / P;
  const int32_t window_first =
      pages.host_mode ? 0 : std::max(0, hit.n - cache_.shape().window_back) / P;
  std::vector<PoolCopy> copies;
  for (int32_t il = 0, f = 0, w = 0; il < cfg_.n_layer; ++il) {
    if (recurrent(il)) continue;
    const bool is_full = full(il);
    const size_t at = static_cast<size_t>(is_full ? f++ : w++) * page;
    auto& fr = (*pages.frames)[static_cast<size_t>(il)];
    for (int32_t p = 0; p < n_pages; ++p) {
      const uint8_t* from = (is_full ? hit.kv : hit.window)[static_cast<size_t>(p)];
      if (pages.host && (pages.host_mode || (is_full && p < done))) {
        copies.push_back({pages.host->page(s, (*pages.store_layer)[static_cast<size_t>(il)], p),
                          from + at, page});
        if (pages.pool) fr.push_back(-1);  // the next plan fetches those under its caps
      } else if (!is_full && p < window_first) {
        fr.push_back(-1);  // behind the window
      } else {
        // A resident page, the partial tail page (its rows past hit.n are written before
        // anything reads them) or a window page.
        const int32_t fi = pages.take_frame();
        dev_.upload(pages.pool->frame(fi), from + at, page);
        fr.push_back(fi);
      }
    }
  }
  copy_on_pool(copies);
  if (hit.state) rec.upload(s, hit.state);
  seqs_[static_cast<size_t>(s)].tokens.assign(tokens, tokens + hit.n);
  cache_.count_hit(hit.n);
  return hit.n;
}

}  // namespace kvs
