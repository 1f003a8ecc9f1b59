// A layer's attention for each sequence of a pass: over its pages in the device's frames and
// the ring (attend), over the host store on the CPU (host mode: attend_host), or both, the CPU
// taking the last pages that would stream (split mode: cpu_pages, post_split, fold_cpu).
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
  const auto& fr = slots_[static_cast<size_t>(s)].frames[static_cast<size_t>(il)];
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
      spans_.push_back({pool_->frame(f), p * P, std::min(P, total - p * P)});
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
  if (sc.epoch != frames_epoch_ || sc.pages != n_pages) {
    sc.epoch = frames_epoch_;
    sc.pages = n_pages;
    sc.spans.clear();
    sc.resident = static_cast<int32_t>(fr.size()) >= n_pages;
    for (int32_t p = 0; p < n_pages && sc.resident; ++p) {
      const int32_t f = fr[static_cast<size_t>(p)];
      sc.resident = f >= 0;
      if (sc.resident) sc.spans.push_back({pool_->frame(f), p * P, std::min(P, total - p * P)});
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
    if (chunk >= 0) ring_->release(cursor);
    chunk = -1;
  };
  const auto [cpu_from, cpu_to] = cpu_pages(il, e, false);
  for (int32_t p = 0; p * P < total; ++p) {
    const Span sp{nullptr, p * P, std::min(P, total - p * P)};
    const int32_t f = fr[static_cast<size_t>(p)];
    if (p >= cpu_from && p < cpu_to) {
      if (p > cpu_from) continue;
      if (!spans_.empty()) flush(false);
      fold_cpu(il, entry, cpu_to - cpu_from, a);
      continue;
    }
    if (f >= 0) {
      spans_.push_back({pool_->frame(f), sp.start, sp.n});
      continue;
    }
    KVS_CHECK(ring_ && cursor < ring_->n_items() &&
                  ring_->item(cursor) == (RingItem{store_layer(il), s, p}),
              "ring: the schedule does not match the pages of layer ", il);
    if (chunk >= 0 && ring_->chunk_of(cursor) != chunk) flush(false);
    chunk = ring_->chunk_of(cursor);
    spans_.push_back({ring_->acquire(cursor), sp.start, sp.n});
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
    dst_[static_cast<size_t>(j)] = host_->page(s, store_layer(il), (e.seq->n_past + j) / P);
  cpu::kv_write(kv_, hk_.data(), hv_.data(), e.n, dst_.data(), page_slot_.data() + off);
  spans_.clear();
  const int32_t total = e.seq->n_past + e.n;
  const int32_t window = full(il) ? 0 : cfg_.n_swa;
  for (int32_t p = window > 0 ? std::max(0, e.seq->n_past - window + 1) / P : 0; p * P < total; ++p)
    spans_.push_back({host_->page(s, store_layer(il), p), p * P, std::min(P, total - p * P)});
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

void Engine::make_split() {
  split_ = std::make_unique<Split>();
  Split& sp = *split_;
  sp.per_span = dev_.caps().cpu_partials;
  const size_t rows = static_cast<size_t>(opt_.n_seq) *
                      static_cast<size_t>(sp.per_span ? std::max(1, max_pages_) : 1);
  const size_t row = static_cast<size_t>(cfg_.n_head) * cpu::part_stride(cfg_.head_dim);
  const size_t f = sizeof(float);
  sp.q = dev_.alloc_host(static_cast<size_t>(shape_.n_full) * static_cast<size_t>(opt_.n_seq) *
                             static_cast<size_t>(cfg_.q_dim()) * f,
                         "split attention: queries");
  for (DeviceBuffer& b : sp.part) b = dev_.alloc_host(rows * row * f, "split attention: partials");
  for (int32_t l = 0; l < shape_.n_full; ++l) sp.q_ready.push_back(dev_.make_fence());
  sp.stored = dev_.make_fence();
  sp.flag = dev_.make_flag();
  sp.tickets.assign(static_cast<size_t>(opt_.n_seq), 0);
  sp.place.assign(static_cast<size_t>(opt_.n_seq), 0);
  sp.placed = place_split_threads(opt_.split_cpus, opt_.split_threads, opt_.split_pinned);
  sp.worker = std::make_unique<SplitWorker>(dev_, kv_, cfg_.n_head, cfg_.attn_scale,
                                            sp.placed.threads, sp.placed.cpus);
  // The first plan's share from the pool's rate on pages of the cache's types (more of them
  // than the caches hold, where the store is that large), unless given or fixed.
  if (opt_.cpu_bytes_per_s > 0)
    cpu_assumed_ = opt_.cpu_bytes_per_s;
  else if (opt_.split_share == 0)
    cpu_assumed_ = sp.worker->calibrate(std::min(size_t{256} << 20, shape_.full_bytes));
}

const std::vector<int>& Engine::split_cpus() const {
  static const std::vector<int> none;
  return split_ ? split_->placed.cpus : none;
}

// The last plan_.cpu[s] complete pages that the device does not hold (one-token entries of a
// full layer): the tail page, always on the device, follows them.
std::pair<int32_t, int32_t> Engine::cpu_pages(int32_t il, const BatchEntry& e, bool next) const {
  const int32_t s = e.seq->id;
  if (!split_ || e.n != 1 || !full(il) || plan_.cpu.empty() ||
      plan_.cpu[static_cast<size_t>(s)] == 0)
    return {0, 0};
  const int32_t done = (e.seq->n_past + (next ? e.n : 0)) / opt_.page_size;
  const int32_t from =
      std::max(std::min(done, cap(s, il)), done - plan_.cpu[static_cast<size_t>(s)]);
  return {from, done};
}

// The layer's queries go to the host after the rope (its pages were written back in earlier
// steps: `stored`, recorded as the step began), and the worker gets the layer's pages.
void Engine::post_split(int32_t il, const Pass& p) {
  if (!split_) return;
  Split& sp = *split_;
  const int32_t layer = kv_index_[static_cast<size_t>(il)], P = opt_.page_size;
  const size_t row = static_cast<size_t>(cfg_.n_head) * cpu::part_stride(cfg_.head_dim);
  float* out = sp.part[layer % 2].as<float>();
  size_t place = 0;
  SplitJob job;
  job.per_span = sp.per_span;
  for (size_t i = 0; i < p.batch.size(); ++i) {
    const BatchEntry& e = p.batch[i];
    const auto [from, to] = cpu_pages(il, e, false);
    sp.tickets[i] = 0;
    if (from >= to) continue;
    SplitEntry se;
    se.pos = e.seq->n_past;
    for (int32_t q = from; q < to; ++q)
      se.spans.push_back({host_->page(e.seq->id, layer, q), q * P, P});
    se.out = out + place;
    sp.place[i] = place;
    place += row * (sp.per_span ? se.spans.size() : 1);
    sp.tickets[i] = sp.ticket + 1 + job.entries.size();
    job.entries.push_back(std::move(se));
  }
  if (job.entries.empty()) return;
  // Each entry's query row, in job order (a pass with prompts has more rows than the buffer).
  const auto qd = static_cast<size_t>(cfg_.q_dim());
  float* q = sp.q.as<float>() + static_cast<size_t>(layer) * static_cast<size_t>(opt_.n_seq) * qd;
  for (size_t i = 0, k = 0; i < p.batch.size(); ++i)
    if (sp.tickets[i] != 0)
      dev_.copy(Stream::Compute, q + qd * k++, act_.q + static_cast<size_t>(p.offs[i]) * qd,
                qd * sizeof(float));
  dev_.record(Stream::Compute, sp.q_ready[static_cast<size_t>(layer)]);
  job.stored = sp.stored;
  job.q_ready = sp.q_ready[static_cast<size_t>(layer)];
  job.q = q;
  job.flag = sp.flag;
  job.ticket = sp.ticket + 1;
  sp.ticket += job.entries.size();
  sp.worker->post(std::move(job));
}

// Entry i's partial of its CPU pages at layer il into a's state: once the worker has raised
// the flag, folded on the device (after the device's own pages before them).
void Engine::fold_cpu(int32_t il, int32_t i, int32_t pages, AttentionArgs& a) {
  Split& sp = *split_;
  const int32_t layer = kv_index_[static_cast<size_t>(il)];
  dev_.wait_flag(Stream::Compute, sp.flag, sp.tickets[static_cast<size_t>(i)]);
  AttentionArgs g = a;
  g.spans = nullptr;
  g.n_spans = sp.per_span ? pages : 1;
  g.last = false;
  dev_.fold(g, sp.part[layer % 2].as<float>() + sp.place[static_cast<size_t>(i)]);
  a.first = false;
  last_.cpu_pages += pages;
}

}  // namespace kvs
