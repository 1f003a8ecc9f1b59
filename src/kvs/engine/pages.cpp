// The engine's pages: the plan and its repartitions and the ring's schedule (Engine), and
// where each page lives (PagePlacement): frames of the pool taken and given back, the windows'
// recycling, the write-back of completed pages.
#include "kvs/engine/pages.h"

#include <algorithm>
#include <utility>

#include "kvs/engine/engine.h"
#include "kvs/util/error.h"

namespace kvs {

void Engine::replan(const std::vector<BatchEntry>& batch) {
  const int32_t P = opt_.page_size;
  // A pass of more rows than the decode's buffers hold takes the workspace back from the KV;
  // the next pass that fits them lends it again.
  int32_t n_tok = 0;
  for (const BatchEntry& e : batch) n_tok += e.n;
  const int32_t top = n_tok > decode_rows(opt_) ? work_frames_ : 0;
  const bool switches = top != pages_->pool()->top();
  bool grows = plan_dirty_ || switches;
  std::vector<int32_t> pages(slots_.size(), 0);
  for (size_t i = 0; i < slots_.size(); ++i)
    if (slots_[i].live) pages[i] = (slots_[i].n_past + P - 1) / P;
  for (const BatchEntry& e : batch) {
    const int32_t after = (e.seq->n_past + e.n + P - 1) / P;
    grows |= after > pages[static_cast<size_t>(e.seq->id)];
    pages[static_cast<size_t>(e.seq->id)] = after;
  }
  PlanInput in;
  in.arena_bytes = static_cast<size_t>(pages_->pool()->n_frames() - top) * kv_.page_bytes();
  in.page_bytes = kv_.page_bytes();
  in.n_layer = shape_.n_full;
  in.fixed_frames = fixed_frames_;
  in.seq_pages = pages;
  in.h2d_bytes_per_s = h2d_ > 0 ? h2d_ : h2d_assumed_;
  in.layer_s = layer_s_;
  in.stall_s = grows ? stall_s_ : ring_stall_s_;  // not the average, which a cold step swells
  in.min_chunk_bytes = opt_.ring_chunk_bytes;
  in.min_slots = opt_.ring_slots;
  in.force_ring = opt_.kv_mode == KvMode::Stream;
  in.split = split_ != nullptr;
  in.cpu_bytes_per_s = split_ ? split_->rate() : 0;
  for (const BatchEntry& e : batch)  // the rows of the step's entries the CPU serves
    if (cpu_serves(e)) in.cpu_rows = std::max(in.cpu_rows, e.n);
  in.split_share = opt_.split_share;
  // Repartition at page boundaries and phase changes; between them only to grow the ring, once
  // decode steps have measured what it must cover (the first plan of a decode knows nothing).
  Plan p;
  if (grows || ring_check_) p = kvs::plan(in, &plan_);
  const bool repartition = grows || (ring_check_ && p.ring_frames() > plan_.ring_frames());
  ring_check_ = false;
  if (!repartition) {
    // Split: the CPU's share follows the rates every step (it moves no page between frames).
    if (split_) plan_ = resplit(in, plan_);
    return;
  }
  plan_dirty_ = false;
  if (switches && top == 0) set_phase(false);  // before pages move into the workspace
  if (switches || relayout_ || p.resident != plan_.resident || p.extra != plan_.extra ||
      p.slot_pages != plan_.slot_pages || p.n_slots != plan_.n_slots) {
    std::vector<int32_t> lengths(slots_.size(), -1);
    for (size_t i = 0; i < slots_.size(); ++i)
      if (slots_[i].live) lengths[i] = slots_[i].n_past;
    pages_->apply(p, top, lengths);
    ++totals_.repartitions;
    last_.repartitioned = true;
    relayout_ = false;
  }
  plan_ = p;
  if (switches && top > 0) set_phase(true);
}

void Engine::set_phase(bool prefill) {
  if (!prefill) {
    if (work_scratch_) dev_.lend_prefill_scratch(nullptr);
    scratch_at_ = nullptr;
    carve(cfg_, decode_rows(opt_), act_mem_.as(), &act_);
    return;
  }
  uint8_t* base = pages_->pool()->top_memory();
  base += (256 - reinterpret_cast<uintptr_t>(base) % 256) % 256;
  const size_t acts = carve(cfg_, opt_.n_batch, base, &act_);  // a multiple of 256
  if (work_scratch_) scratch_at_ = base + acts;
  lend_scratch();
  ++totals_.workspace_taken;
}

void Engine::lend_scratch() {
  if (!scratch_at_) return;
  dev_.prefill_scratch(w_, opt_.n_batch, max_spans_, kv_);  // this engine's geometry
  dev_.lend_prefill_scratch(scratch_at_);
}

void Engine::truncate(Sequence& s, int32_t n_past) {
  KVS_CHECK(s.id >= 0 && s.id < opt_.n_seq && slots_[static_cast<size_t>(s.id)].live,
            "truncate: a sequence that is not open");
  KVS_CHECK(n_past >= 0 && n_past <= s.n_past, "truncate: to ", n_past, " of ", s.n_past,
            " positions");
  if (n_past == s.n_past) return;
  Slot& sl = slots_[static_cast<size_t>(s.id)];
  if (shape_.n_recurrent > 0) rec_->roll_back(s.id, s.n_past - n_past, w_, act_.y);
  KVS_CHECK(shape_.n_window == 0 || host_mode() || s.n_past - n_past < opt_.n_verify,
            "truncate: ", s.n_past - n_past, " positions back, more than the windows keep (",
            opt_.n_verify - 1, ")");
  pages_->truncate(s.id, n_past);
  if (cache_) cache_->truncate(s.id, n_past);
  sl.n_past = s.n_past = n_past;
  plan_dirty_ = true;
}

// The non-resident pages of a pass in visiting order: layer, then sequence, then page, but for
// those the CPU attends (split). With `next`, those of the pass after it, if every sequence
// goes on.
std::vector<RingItem> Engine::ring_items(const std::vector<BatchEntry>& batch, bool next) const {
  std::vector<RingItem> items;
  const int32_t P = opt_.page_size;
  for (int32_t l = 0; l < cfg_.n_layer; ++l) {
    if (!full(l)) continue;
    for (const BatchEntry& e : batch) {
      const int32_t s = e.seq->id;
      const int32_t done = (e.seq->n_past + (next ? e.n : 0)) / P;
      const auto [cpu_from, cpu_to] = cpu_pages(l, e, next);  // split: the CPU's, not streamed
      for (int32_t q = std::min(done, cap(s, l)); q < done; ++q)
        if (q < cpu_from || q >= cpu_to) items.push_back({store_layer(l), s, q});
    }
  }
  return items;
}

// ---- where each page lives ----

PagePlacement::PagePlacement(Device& dev, const ModelConfig& c, const KvLayout& kv, int32_t n_seq,
                             int32_t n_verify, bool host_mode, std::vector<int32_t> store_index,
                             std::vector<int32_t> kv_index)
    : dev_(dev),
      cfg_(c),
      kv_(kv),
      n_verify_(n_verify),
      host_mode_(host_mode),
      store_index_(std::move(store_index)),
      kv_index_(std::move(kv_index)),
      frames_(static_cast<size_t>(n_seq),
              std::vector<std::vector<int32_t>>(static_cast<size_t>(c.n_layer))) {}

void PagePlacement::own(std::unique_ptr<HostStore> host, std::unique_ptr<DevicePool> pool,
                        bool ring) {
  host_ = std::move(host);
  pool_ = std::move(pool);
  if (!ring) return;
  ring_ = std::make_unique<Ring>(dev_, *host_, *pool_, kv_.page_bytes());
  wb_ = dev_.make_fence();
  computed_ = dev_.make_fence();
}

SlotPages PagePlacement::slot(int32_t s) {
  return {host_.get(),
          pool_.get(),
          host_mode_,
          &store_index_,
          &frames_[static_cast<size_t>(s)],
          [this] { return take(); }};
}

void PagePlacement::reclaim(bool wait) {
  if (pending_.empty()) return;
  if (!dev_.done(wb_)) {
    if (!wait) return;
    dev_.wait_host(wb_);
  }
  for (int32_t f : pending_) pool_->give(f);
  pending_.clear();
}

int32_t PagePlacement::take() {
  reclaim(false);
  int32_t f = pool_->take();
  if (f < 0) {
    reclaim(true);
    f = pool_->take();
  }
  KVS_CHECK(f >= 0, "the KV arena has no free frame (", pool_->n_frames(), " frames, ",
            pool_->ring_frames(), " in the ring); this is a bug in the plan");
  return f;
}

// Pages past the new caps leave the device (the host store has them), frames the ring or the
// workspace take are relocated, pages under raised caps are fetched back.
void PagePlacement::apply(const Plan& p, int32_t top, const std::vector<int32_t>& lengths) {
  dev_.sync();
  reclaim(true);
  ++epoch_;
  const int32_t L = cfg_.n_layer, P = kv_.page_size;
  const int32_t boundary = pool_->n_frames() - top - p.ring_frames();
  for (size_t s = 0; s < frames_.size(); ++s) {
    if (lengths[s] < 0) continue;
    const int32_t done = lengths[s] / P;  // complete pages; the tail keeps its frame
    for (int32_t l = 0; l < L; ++l) {
      if (!full(l)) continue;
      auto& fr = frames_[s][static_cast<size_t>(l)];
      for (int32_t q = 0; q < done; ++q)
        if (fr[static_cast<size_t>(q)] >= 0 && q >= resident_cap(p, s, store_layer(l))) {
          pool_->give(fr[static_cast<size_t>(q)]);
          fr[static_cast<size_t>(q)] = -1;
        }
    }
  }
  for (size_t s = 0; s < frames_.size(); ++s) {
    if (lengths[s] < 0) continue;
    for (auto& fr : frames_[s])
      for (int32_t& f : fr)
        if (f >= boundary) {
          const int32_t g = pool_->take();
          KVS_CHECK(g >= 0 && g < boundary, "repartition: no frame below the ring for a page");
          dev_.copy(Stream::Compute, pool_->frame(g), pool_->frame(f), kv_.page_bytes());
          pool_->give(f);
          f = g;
        }
  }
  pool_->set_ring(p.slot_pages, p.n_slots, top);
  for (size_t s = 0; s < frames_.size(); ++s) {
    if (lengths[s] < 0) continue;
    const int32_t done = lengths[s] / P;
    for (int32_t l = 0; l < L; ++l) {
      if (!full(l)) continue;
      auto& fr = frames_[s][static_cast<size_t>(l)];
      for (int32_t q = 0; q < std::min(done, resident_cap(p, s, store_layer(l))); ++q)
        if (fr[static_cast<size_t>(q)] < 0) {
          const int32_t g = pool_->take();
          KVS_CHECK(g >= 0, "repartition: no frame for a page the plan makes resident");
          dev_.copy(Stream::Compute, pool_->frame(g),
                    host_->page(static_cast<int32_t>(s), store_layer(l), q), kv_.page_bytes());
          fr[static_cast<size_t>(q)] = g;
        }
    }
  }
  ring_->configure(p.slot_pages, p.n_slots);
}

// Resident frames under the cap, transient ones above it (given back after their write-back).
// Allocated layer by layer, so a prompt chunk needs transient frames for one layer at a time.
void PagePlacement::add(int32_t il, const std::vector<BatchEntry>& batch) {
  const int32_t P = kv_.page_size;
  for (const BatchEntry& e : batch) {
    auto& fr = frames_[static_cast<size_t>(e.seq->id)][static_cast<size_t>(il)];
    const int32_t last = (e.seq->n_past + e.n - 1) / P;
    while (static_cast<int32_t>(fr.size()) <= last) fr.push_back(take()), ++epoch_;
  }
}

// On the CopyOut stream, after the compute that wrote them; transient ones give their frame
// back once the copy is done.
size_t PagePlacement::write_back(int32_t il, const std::vector<BatchEntry>& batch,
                                 const Plan& plan) {
  const int32_t P = kv_.page_size;
  size_t bytes = 0;
  bool any = false;
  for (const BatchEntry& e : batch) {
    const int32_t s = e.seq->id;
    auto& fr = frames_[static_cast<size_t>(s)][static_cast<size_t>(il)];
    const int32_t done = (e.seq->n_past + e.n) / P;
    for (int32_t p = e.seq->n_past / P; p < done; ++p) {
      if (!any) {
        dev_.record(Stream::Compute, computed_);
        dev_.wait(Stream::CopyOut, computed_);
        any = true;
      }
      const int32_t f = fr[static_cast<size_t>(p)];
      dev_.copy(Stream::CopyOut, host_->page(s, store_layer(il), p), pool_->frame(f),
                kv_.page_bytes());
      bytes += kv_.page_bytes();
      if (p >= resident_cap(plan, static_cast<size_t>(s), kv_index_[static_cast<size_t>(il)])) {
        pending_.push_back(f);
        fr[static_cast<size_t>(p)] = -1;
        ++epoch_;
      }
    }
  }
  if (!any) return bytes;
  dev_.record(Stream::CopyOut, wb_);
  ring_->after_writeback(wb_);
  return bytes;
}

void PagePlacement::trim_windows(int32_t s, int32_t n_past) {
  if (host_mode_) return;  // host mode keeps every page on the host
  const int32_t keep = std::max(0, n_past - cfg_.n_swa + 1 - (n_verify_ - 1)) / kv_.page_size;
  for (int32_t il = 0; il < cfg_.n_layer; ++il) {
    if (cfg_.kinds[static_cast<size_t>(il)] != LayerKind::Window) continue;
    auto& fr = frames_[static_cast<size_t>(s)][static_cast<size_t>(il)];
    for (int32_t p = std::min(keep, static_cast<int32_t>(fr.size())) - 1; p >= 0; --p) {
      int32_t& f = fr[static_cast<size_t>(p)];
      if (f < 0) break;  // the pages before it went earlier
      pool_->give(f);
      f = -1;
    }
  }
}

void PagePlacement::truncate(int32_t s, int32_t n_past) {
  const int32_t P = kv_.page_size;
  const int32_t pages = (n_past + P - 1) / P;  // those holding a kept position
  if (pool_) {
    // Write-backs and prefetches may still read the pages that go. Without a ring (a resident
    // engine, a draft model's) there are none, and the compute stream orders the last step's
    // reads before the next one's writes: nothing to wait for, nor to keep a draft model's
    // rollback from overlapping the target's prefetches.
    if (ring_) {
      dev_.sync();
      reclaim(true);
    }
    for (int32_t il = 0; il < cfg_.n_layer; ++il) {
      auto& fr = frames_[static_cast<size_t>(s)][static_cast<size_t>(il)];
      while (static_cast<int32_t>(fr.size()) > pages) {
        if (fr.back() >= 0) pool_->give(fr.back());
        fr.pop_back();
      }
      // The tail page is written again: it needs its frame back where its completion let the
      // frame go after the write-back (the host store has its kept rows). A chunk the ring
      // prefetched with it no longer matches the next step's pages and is dropped.
      if (n_past % P == 0 || fr.empty() || fr.back() >= 0) continue;
      KVS_CHECK(full(il) && host_, "truncate: a window page behind the window");
      fr.back() = take();
      dev_.copy(Stream::Compute, pool_->frame(fr.back()),
                host_->page(s, store_layer(il), pages - 1), kv_.page_bytes());
    }
  }
  ++epoch_;
}

void PagePlacement::release(int32_t s) {
  for (auto& layer : frames_[static_cast<size_t>(s)]) {
    for (int32_t f : layer)
      if (f >= 0 && pool_) pool_->give(f);
    layer.clear();
  }
  ++epoch_;
}

}  // namespace kvs
