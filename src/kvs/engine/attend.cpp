// A layer's attention for each sequence of a pass: over its pages in the device's frames and
// the ring (attend), over the host store on the CPU (host mode: attend_host), or both, the CPU
// taking the last pages that would stream (split mode: cpu_pages, post_split; split.h's
// SplitAttention does the rest).
#include <algorithm>
#include <utility>

#include "kvs/backend/cpu/host_attention.h"
#include "kvs/engine/engine.h"
#include "kvs/util/error.h"

namespace kvs {

// Attention of one sequence at one layer: its pages in logical order, resident ones straight
// from their frames, streamed ones from the ring as each chunk lands, those the CPU attended
// (split) as the partials it made. A call to the kernel ends at every chunk boundary so the
// chunk can be released before the next one is needed, and before the CPU's pages.
void Engine::attend(int32_t il, const BatchEntry& e, int32_t entry, int32_t off, int32_t& cursor) {
  const int32_t P = opt_.page_size, s = e.seq->id;
  const int32_t total = e.seq->n_past + e.n;
  const auto& fr = pages_->frames(s, il);
  AttentionArgs a;
  a.q = act_.q + int64_t{off} * cfg_.q_dim();
  a.out = act_.att + int64_t{off} * cfg_.q_dim();
  a.acc = act_.acc + int64_t{off} * cfg_.n_head * 2;
  a.pos = pos_.data() + off;
  a.n_tok = e.n;
  a.kv = kv_;
  a.n_head = cfg_.n_head;
  a.scale = cfg_.attn_scale;
  a.first = true;
  if (!full(il)) {  // the window's pages, always resident
    a.window = cfg_.n_swa;
    spans_.clear();
    for (int32_t p = std::max(0, e.seq->n_past - cfg_.n_swa + 1) / P; p * P < total; ++p) {
      const int32_t f = fr[static_cast<size_t>(p)];
      KVS_CHECK(f >= 0, "window: page ", p, " of layer ", il, " has no frame; this is a bug");
      spans_.push_back({pages_->pool()->frame(f), p * P, std::min(P, total - p * P)});
    }
    a.spans = spans_.data();
    a.n_spans = static_cast<int32_t>(spans_.size());
    last_.gpu_pages += a.n_spans;
    dev_.attention(a);
    return;
  }
  // Every page resident: the layer's spans as last built, the last one lengthened (pages
  // before the last are full).
  SpanCache& sc = slots_[static_cast<size_t>(s)].spans[static_cast<size_t>(il)];
  const int32_t n_pages = (total + P - 1) / P;
  if (sc.epoch != pages_->epoch() || sc.pages != n_pages) {
    sc.epoch = pages_->epoch();
    sc.pages = n_pages;
    sc.spans.clear();
    sc.resident = static_cast<int32_t>(fr.size()) >= n_pages;
    for (int32_t p = 0; p < n_pages && sc.resident; ++p) {
      const int32_t f = fr[static_cast<size_t>(p)];
      sc.resident = f >= 0;
      if (sc.resident)
        sc.spans.push_back({pages_->pool()->frame(f), p * P, std::min(P, total - p * P)});
    }
  }
  if (sc.resident) {
    sc.spans.back().n = total - (n_pages - 1) * P;
    a.spans = sc.spans.data();
    a.n_spans = n_pages;
    a.last = true;
    last_.gpu_pages += n_pages;
    dev_.attention(a);
    return;
  }
  spans_.clear();
  int32_t chunk = -1;  // the ring chunk whose pages are in spans_
  auto flush = [&](bool last) {
    a.spans = spans_.data();
    a.n_spans = static_cast<int32_t>(spans_.size());
    a.last = last;
    last_.gpu_pages += a.n_spans;
    dev_.attention(a);
    a.first = false;
    spans_.clear();
    if (chunk >= 0) pages_->ring()->release(cursor);
    chunk = -1;
  };
  const auto [cpu_from, cpu_to] = cpu_pages(il, e, false);
  for (int32_t p = 0; p * P < total; ++p) {
    const Span sp{nullptr, p * P, std::min(P, total - p * P)};
    const int32_t f = fr[static_cast<size_t>(p)];
    if (p >= cpu_from && p < cpu_to) {
      if (p > cpu_from) continue;
      if (!spans_.empty()) flush(false);
      split_->fold(kv_index_[static_cast<size_t>(il)], entry, cpu_to - cpu_from, a);
      last_.cpu_pages += cpu_to - cpu_from;
      last_.cpu_draft_pages += int64_t{cpu_to - cpu_from} * (e.n - 1);
      continue;
    }
    if (f >= 0) {
      spans_.push_back({pages_->pool()->frame(f), sp.start, sp.n});
      continue;
    }
    KVS_CHECK(pages_->ring() && cursor < pages_->ring()->n_items() &&
                  pages_->ring()->item(cursor) == (RingItem{store_layer(il), s, p}),
              "ring: the schedule does not match the pages of layer ", il);
    if (chunk >= 0 && pages_->ring()->chunk_of(cursor) != chunk) flush(false);
    chunk = pages_->ring()->chunk_of(cursor);
    spans_.push_back({pages_->ring()->acquire(cursor), sp.start, sp.n});
    ++cursor;
  }
  flush(true);
}

// Host mode: K/V rows and attention on the host over the host store (cpu/host_attention.h).
void Engine::attend_host(int32_t il, const BatchEntry& e, int32_t off) {
  const int32_t P = opt_.page_size, s = e.seq->id;
  const int64_t qd = cfg_.q_dim(), kvd = cfg_.kv_dim();
  const size_t f = sizeof(float);
  dev_.sync();
  dev_.download(hq_.data(), act_.q + off * qd, static_cast<size_t>(e.n * qd) * f);
  dev_.download(hk_.data(), act_.k + off * kvd, static_cast<size_t>(e.n * kvd) * f);
  dev_.download(hv_.data(), act_.v + off * kvd, static_cast<size_t>(e.n * kvd) * f);
  for (int32_t j = 0; j < e.n; ++j)
    dst_[static_cast<size_t>(j)] =
        pages_->host()->page(s, store_layer(il), (e.seq->n_past + j) / P);
  cpu::kv_write(kv_, hk_.data(), hv_.data(), e.n, dst_.data(), page_slot_.data() + off);
  spans_.clear();
  const int32_t total = e.seq->n_past + e.n;
  const int32_t window = full(il) ? 0 : cfg_.n_swa;
  for (int32_t p = window > 0 ? std::max(0, e.seq->n_past - window + 1) / P : 0; p * P < total; ++p)
    spans_.push_back(
        {pages_->host()->page(s, store_layer(il), p), p * P, std::min(P, total - p * P)});
  AttentionArgs a;
  a.q = hq_.data();
  a.out = hatt_.data();
  a.acc = hacc_.data();
  a.pos = pos_.data() + off;
  a.n_tok = e.n;
  a.spans = spans_.data();
  a.n_spans = static_cast<int32_t>(spans_.size());
  a.kv = kv_;
  a.n_head = cfg_.n_head;
  a.scale = cfg_.attn_scale;
  a.window = window;
  cpu::attention(a);
  dev_.upload(act_.att + off * qd, hatt_.data(), static_cast<size_t>(e.n * qd) * f);
}

// ---- split ----

const std::vector<int>& Engine::split_cpus() const {
  static const std::vector<int> none;
  return split_ ? split_->placed().cpus : none;
}

// The CPU's pages (split_->pages) of full layers, for entries of a decode or verify step's
// size: every row sees all of them (they end before the first row's page), so the CPU attends
// to them once for each row; a prompt's rows stay on the device.
std::pair<int32_t, int32_t> Engine::cpu_pages(int32_t il, const BatchEntry& e, bool next) const {
  if (!split_ || !cpu_serves(e) || !full(il)) return {0, 0};
  return split_->pages(plan_, e.seq->id, kv_index_[static_cast<size_t>(il)],
                       (e.seq->n_past + (next ? e.n : 0)) / opt_.page_size);
}

// The layer's queries go to the host after the rope (its pages were written back in earlier
// steps, before the step began), and the worker gets the layer's pages.
void Engine::post_split(int32_t il, const Pass& p) {
  if (!split_) return;
  std::vector<SplitQuery> queries;
  for (size_t i = 0; i < p.batch.size(); ++i) {
    const BatchEntry& e = p.batch[i];
    const auto [from, to] = cpu_pages(il, e, false);
    queries.push_back({e.seq->id, e.seq->n_past, p.offs[i], e.n, from, to});
  }
  split_->post(kv_index_[static_cast<size_t>(il)], queries, act_.q, *pages_->host());
}

}  // namespace kvs
