#include "kvs/engine/engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <string_view>
#include <tuple>
#include <utility>

#include "kvs/backend/cpu/host_attention.h"
#include "kvs/util/error.h"
#include "kvs/util/parse.h"

namespace kvs {
namespace {

double now() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

}  // namespace

KvMode parse_kv_mode(const char* text) {
  std::string_view s(text);
  if (s == "auto") return KvMode::Auto;
  if (s == "resident") return KvMode::Resident;
  if (s == "stream") return KvMode::Stream;
  if (s == "host") return KvMode::Host;
  if (s == "unified") return KvMode::Unified;
  if (s == "split") return KvMode::Split;
  fail("--kv-mode: '", s, "' is not a mode (auto, resident, stream, host, unified, split)");
}

const char* kv_mode_name(KvMode m) {
  switch (m) {
    case KvMode::Auto:
      return "auto";
    case KvMode::Resident:
      return "resident";
    case KvMode::Stream:
      return "stream";
    case KvMode::Host:
      return "host";
    case KvMode::Unified:
      return "unified";
    case KvMode::Split:
      return "split";
  }
  return "?";
}

Engine::Engine(const Model& model, Device& dev, const EngineOptions& opt, const Engine* shared)
    : cfg_(model.config), dev_(dev), opt_(opt) {
  KVS_CHECK(opt.n_ctx >= 1, "-c/--ctx-size must be at least 1");
  KVS_CHECK(opt.n_batch >= 1, "-b/--batch-size must be at least 1");
  KVS_CHECK(opt.n_seq >= 1 && opt.n_seq <= 4096, "--parallel must be 1 to 4096");
  KVS_CHECK(opt.n_verify >= 1 && opt.n_verify <= 64, "--draft-max must be 0 to 63, got ",
            opt.n_verify - 1);
  KVS_CHECK(decode_rows(opt) <= opt.n_batch, "--parallel ", opt.n_seq, " x (--draft-max ",
            opt.n_verify - 1, " + 1) tokens are more than -b/--batch-size ", opt.n_batch);
  KVS_CHECK(opt.n_seq <= opt.n_batch, "--parallel ", opt.n_seq, " is more than -b/--batch-size ",
            opt.n_batch, ": a decode step of every sequence must fit one batch");
  KVS_CHECK(cfg_.n_layers_of(LayerKind::Recurrent) == 0 || dev.caps().gated_delta_net,
            cfg_.arch_name, ": the ", dev.name(),
            " backend has no gated_delta_net (the Gated "
            "DeltaNet layers' operation) yet; run this model on the cpu backend");
  place(model, shared);
  kv_ = KvLayout::make(opt.k_type, opt.v_type, opt.page_size, cfg_.n_head_kv, cfg_.head_dim);
  rope_.mode = cfg_.rope_mode;
  rope_.head_dim = cfg_.head_dim;
  rope_.rope_dim = cfg_.rope_dim;
  rope_.base = cfg_.rope_base;
  rope_.linear_scale = cfg_.rope_linear_scale;
  rope_.freq_factors = w_.rope_freqs.empty() ? nullptr : w_.rope_freqs.data();
  rope_swa_ = rope_;
  rope_swa_.base = cfg_.rope_base_swa;
  rope_swa_.linear_scale = 1.0f;
  rope_swa_.freq_factors = nullptr;
  kv_index_.assign(static_cast<size_t>(cfg_.n_layer), -1);
  attn_index_.assign(static_cast<size_t>(cfg_.n_layer), -1);
  for (int32_t il = 0, n = 0, a = 0; il < cfg_.n_layer; ++il) {
    if (full(il)) kv_index_[static_cast<size_t>(il)] = n++;
    if (!recurrent(il)) attn_index_[static_cast<size_t>(il)] = a++;
  }
  shape_ = kv_shape(cfg_, opt);
  pages_ = std::make_unique<PagePlacement>(dev, cfg_, kv_, opt.n_seq, opt.n_verify, host_mode(),
                                           host_mode() ? attn_index_ : kv_index_, kv_index_);

  const int32_t L = cfg_.n_layer;
  max_pages_ = shape_.max_pages;
  slots_.resize(static_cast<size_t>(opt.n_seq));
  for (Slot& s : slots_) s.spans.resize(static_cast<size_t>(L));

  const size_t b = static_cast<size_t>(opt.n_batch), f = sizeof(float);
  // With a phase arena the decode's activations are the only ones of their own; a prefill's
  // live in the workspace.
  const bool phase = phase_arena(cfg_, opt);
  const int64_t rows = phase ? decode_rows(opt) : opt.n_batch;
  act_mem_ = dev.alloc(carve(cfg_, rows, nullptr, nullptr), "activations");
  carve(cfg_, rows, act_mem_.as(), &act_);
  const auto out_rows = static_cast<size_t>(decode_rows(opt));
  logits_ = dev.alloc(out_rows * cfg_.n_vocab * f, "logits");
  // Pinned, so the step's last copy runs at the bus's speed (a pageable one goes through the
  // driver's staging buffers, on the step's critical path).
  hlogits_ = dev.alloc_host(out_rows * cfg_.n_vocab * f, "logits (host)");
  // Before the arena is sized, which takes what is left.
  rec_ = std::make_unique<RecurrentState>(dev, cfg_, shape_.n_recurrent,
                                          shape_.recurrent_layer_bytes, opt.n_seq, opt.n_verify);
  ids_.resize(b);
  pos_.resize(b);
  page_slot_.resize(b);
  dst_.resize(b);
  spans_.reserve(static_cast<size_t>(max_pages_));

  cache_ = PromptCacheLink::make(model, dev, opt, shape_, kv_);
  const ScratchArgs sa = scratch_args(cfg_, opt);
  max_spans_ = sa.max_spans;
  dev.reserve(w_, sa.n_tok, sa.n_out_tok, sa.max_spans, sa.n_head, sa.head_dim);
  if (phase) {
    work_scratch_ = dev.prefill_scratch(w_, sa.n_batch, sa.max_spans, kv_);
    // 256 bytes more: the workspace starts at a frame's address, aligned up.
    const size_t work = carve(cfg_, opt.n_batch, nullptr, nullptr) + work_scratch_ + 256;
    work_frames_ = static_cast<int32_t>((work + kv_.page_bytes() - 1) / kv_.page_bytes());
  }
  const size_t page = kv_.page_bytes();
  const int64_t all_frames =
      (int64_t{max_pages_} * shape_.n_full + int64_t{shape_.window_pages} * shape_.n_window) *
      opt.n_seq;
  KVS_CHECK(all_frames < (int64_t{1} << 31), "the KV cache has too many pages; raise --page-size");
  const size_t all_bytes = static_cast<size_t>(all_frames) * page;
  if (opt.kv_mode == KvMode::Split) {
    split_ = std::make_unique<SplitAttention>(
        dev, cfg_, kv_, opt.n_seq, opt.n_verify, shape_.n_full, max_pages_,
        place_split_threads(opt.split_cpus, opt.split_threads, opt.split_pinned));
    // The first plan's share from the pool's rate on pages of the cache's types (more of them
    // than the caches hold, where the store is that large), unless given or fixed.
    split_->assume_rate(opt.cpu_bytes_per_s, opt.split_share != 0,
                        std::min(size_t{256} << 20, shape_.full_bytes));
  }
  const size_t free_bytes = dev.capacity() == 0 ? SIZE_MAX : dev.capacity() - dev.used();
  if (opt.kv_mode == KvMode::Host) {
    pages_->own(std::make_unique<HostStore>(dev, page, shape_.n_full + shape_.n_window, opt.n_seq,
                                            max_pages_),
                nullptr, false);
    const size_t hb = b * static_cast<size_t>(std::max(cfg_.q_dim(), cfg_.kv_dim()));
    hq_.resize(hb);
    hk_.resize(hb);
    hv_.resize(hb);
    hatt_.resize(hb);
    hacc_.resize(b * cfg_.n_head * 2);
    plan_.resident.assign(slots_.size(), 0);
    plan_.extra.assign(slots_.size(), 0);
    return;
  }
  if (opt.kv_mode == KvMode::Unified) {
    // As resident, but the driver pages the cache in and out of what the limit leaves free.
    pages_->own(nullptr, std::make_unique<DevicePool>(dev, all_bytes, page, true), false);
    plan_.resident.assign(slots_.size(), kUnlimited);
    plan_.extra.assign(slots_.size(), 0);
    dev.set_balloon(true);
    return;
  }
  // Without full layers nothing can stream: everything is resident.
  if (opt.kv_mode == KvMode::Resident ||
      (shape_.n_full == 0 && opt.kv_mode != KvMode::Host && opt.kv_mode != KvMode::Unified)) {
    const size_t arena = opt.kv_arena ? opt.kv_arena : std::min(all_bytes, free_bytes);
    if (arena < all_bytes)
      fail("--kv-mode resident: the KV cache of -c ", opt.n_ctx, " x --parallel ", opt.n_seq,
           " needs ", format_bytes(all_bytes), " but the arena holds ", format_bytes(arena), " (",
           opt.kv_arena ? "--kv-arena" : "what the device has left",
           "); use --kv-mode auto or stream, or lower -c/--ctx-size");
    pages_->own(nullptr, std::make_unique<DevicePool>(dev, all_bytes, page), false);
    plan_.resident.assign(slots_.size(), kUnlimited);
    plan_.extra.assign(slots_.size(), 0);
    return;
  }
  // Auto, stream and split: the host store holds everything; the arena what it can.
  fixed_frames_ = fixed_frames(cfg_, opt);
  const size_t min_arena = min_arena_bytes(page, fixed_frames_);
  const int32_t chunk_pages =
      static_cast<int32_t>(std::max<size_t>(1, (opt.ring_chunk_bytes + page - 1) / page));
  // `arena`: the KV's during a prefill; the pool adds the workspace's frames, the KV's between
  // prefills.
  const size_t work = static_cast<size_t>(work_frames_) * page;
  size_t arena = opt.kv_arena;
  if (arena == 0) {
    const size_t want = opt.kv_mode == KvMode::Stream
                            ? min_arena + 2 * static_cast<size_t>(chunk_pages) * page
                            : all_bytes + static_cast<size_t>(fixed_frames_) * page;
    arena = std::min(want, free_bytes > work ? free_bytes - work : 0);
  }
  if (arena < min_arena)
    fail("the KV arena of ", format_bytes(arena), " (",
         opt.kv_arena ? "--kv-arena" : "what --vram-limit leaves after weights and buffers",
         work ? cat(", beside the prefill's workspace of ", format_bytes(work)) : std::string(),
         ") is below the minimum of ", format_bytes(min_arena), ": ", fixed_frames_,
         " frames for the pages being written plus one ring slot, ", format_bytes(page),
         " each; raise --kv-arena or --vram-limit, or lower --page-size, -b or --parallel");
  {  // the host store first, then the arena, the ring and its fences
    auto host = std::make_unique<HostStore>(dev, page, shape_.n_full, opt.n_seq, max_pages_);
    pages_->own(std::move(host),
                std::make_unique<DevicePool>(dev, arena / page * page + work, page), true);
  }
  h2d_assumed_ = opt.h2d_bytes_per_s;
  if (opt.h2d_limit > 0) {  // the link is no faster than the limit
    h2d_assumed_ = h2d_assumed_ > 0 ? std::min(h2d_assumed_, opt.h2d_limit) : opt.h2d_limit;
    dev.limit_copy_in(opt.h2d_limit);
  }
  plan_.resident.assign(slots_.size(), kUnlimited);
  plan_.extra.assign(slots_.size(), 0);
}

// qwen35's attention gate: attn_q's rows regrouped [q of every head; gate of every head] (the
// file has them per head), so that each is one product; then the weights on the device, but for
// the embedding and output matrices `shared` has placed already (as matrices of no rows).
void Engine::place(const Model& model, const Engine* shared) {
  host_embd_ = model.weights.tok_embd.data;
  host_output_ = model.weights.output.data;
  const bool share_embd = shared && shared->host_embd_ == host_embd_;
  const bool share_output = shared && shared->host_output_ == host_output_;
  if (cfg_.attn_gate || share_embd || share_output) {
    Weights host = model.weights;
    if (share_embd) host.tok_embd.n_out = 0;
    if (share_output) host.output.n_out = 0;
    if (cfg_.attn_gate) gated_q_.resize(static_cast<size_t>(cfg_.n_layer));
    const int64_t hd = cfg_.head_dim;
    for (int32_t il = 0; cfg_.attn_gate && il < cfg_.n_layer; ++il) {
      if (recurrent(il)) continue;
      Matrix& wq = host.layers[static_cast<size_t>(il)].wq;
      std::vector<uint8_t>& rows = gated_q_[static_cast<size_t>(il)];
      rows.resize(wq.bytes());
      for (int64_t r = 0; r < wq.n_out; ++r) {
        const int64_t half = r / cfg_.q_dim(), h = r % cfg_.q_dim() / hd, j = r % hd;
        std::memcpy(rows.data() + static_cast<size_t>(r) * wq.row_bytes,
                    wq.row(h * 2 * hd + half * hd + j), wq.row_bytes);
      }
      wq.data = rows.data();
    }
    w_ = dev_.place_weights(host);
    if (share_embd) w_.tok_embd = shared->w_.tok_embd;
    if (share_output) w_.output = shared->w_.output;
  } else {
    w_ = dev_.place_weights(model.weights);
  }
}

Engine::~Engine() {
  // The worker finishes its posted jobs first: they read the split buffers and the pages.
  if (split_) split_->stop();
  dev_.sync();
}

size_t Engine::carve(const ModelConfig& c, int64_t rows, uint8_t* base, Activations* a) {
  Activations sizes_only{};
  Activations& t = a ? *a : sizes_only;
  const bool rec = c.n_layers_of(LayerKind::Recurrent) > 0;
  const std::pair<float**, int64_t> arrays[] = {{&t.x, c.n_embd},
                                                {&t.h, std::max(c.n_embd, c.q_dim())},
                                                {&t.q, c.q_dim()},
                                                {&t.k, c.kv_dim()},
                                                {&t.v, c.kv_dim()},
                                                {&t.att, c.q_dim()},
                                                {&t.acc, 2 * c.n_head},
                                                {&t.gate, c.n_ff},
                                                {&t.up, c.n_ff},
                                                {&t.attn_gate, c.attn_gate ? c.q_dim() : 0},
                                                {&t.mix, rec ? c.ssm_conv_dim() : 0},
                                                {&t.z, rec ? c.ssm_value_dim() : 0},
                                                {&t.alpha, rec ? c.ssm_v_heads : 0},
                                                {&t.beta, rec ? c.ssm_v_heads : 0},
                                                {&t.y, rec ? c.ssm_value_dim() : 0}};
  size_t off = 0;
  for (const auto& [array, width] : arrays) {
    if (base) *array = reinterpret_cast<float*>(base + off);
    off += (static_cast<size_t>(rows * width) * sizeof(float) + 255) / 256 * 256;
  }
  return off;
}

size_t Engine::pass_bytes(const ModelConfig& c, int64_t rows) {
  return carve(c, rows, nullptr, nullptr);
}

size_t Engine::activation_bytes(const ModelConfig& c, const EngineOptions& o) {
  return pass_bytes(c, o.n_batch) +
         static_cast<size_t>(decode_rows(o)) * static_cast<size_t>(c.n_vocab) * sizeof(float);
}

bool Engine::phase_arena(const ModelConfig& c, const EngineOptions& o) {
  return o.phase_arena &&
         (o.kv_mode == KvMode::Auto || o.kv_mode == KvMode::Stream || o.kv_mode == KvMode::Split) &&
         c.n_layers_of(LayerKind::Full) > 0 && o.n_batch > decode_rows(o);
}

ScratchArgs Engine::scratch_args(const ModelConfig& c, const EngineOptions& o) {
  const bool phase = phase_arena(c, o);
  ScratchArgs a;
  a.n_tok = phase ? decode_rows(o) : o.n_batch;
  a.n_out_tok = decode_rows(o);
  a.max_spans = o.kv_mode == KvMode::Host ? 0 : kv_shape(c, o).max_pages;
  a.n_batch = phase ? o.n_batch : 0;
  a.n_head = c.n_head;
  a.head_dim = c.head_dim;
  a.kv = KvLayout::make(o.k_type, o.v_type, o.page_size, c.n_head_kv, c.head_dim);
  return a;
}

// Each sequence's tail page in every full layer, plus twice the pages one prompt chunk can fill
// in a layer (one layer's write-backs may still run while the next layer fills its pages), plus
// every sequence's window in every window layer.
int32_t Engine::fixed_frames(const ModelConfig& c, const EngineOptions& o) {
  const KvShape k = kv_shape(c, o);
  const int32_t P = o.page_size;
  return o.n_seq * (k.n_full + k.n_window * k.window_pages) +
         2 * ((o.n_batch + P - 1) / P + o.n_seq);
}

// A window layer's pages hold the last n_swa - 1 positions between steps (n_verify - 1 more, to
// roll back to) and the step's own n (at most -b) during one: ceil((n_swa - 1 + n_verify - 1 +
// n_batch) / P) pages, one more where they straddle.
KvShape Engine::kv_shape(const ModelConfig& c, const EngineOptions& o) {
  KvShape k;
  const int64_t P = o.page_size;
  k.n_full = c.n_layers_of(LayerKind::Full);
  k.n_window = c.n_layers_of(LayerKind::Window);
  k.max_pages = static_cast<int32_t>((o.n_ctx + P - 1) / P);
  if (k.n_window > 0)
    k.window_pages = static_cast<int32_t>(std::min<int64_t>(
        k.max_pages, (int64_t{c.n_swa} - 1 + (o.n_verify - 1) + o.n_batch + P - 1) / P + 1));
  const KvLayout l = KvLayout::make(o.k_type, o.v_type, o.page_size, c.n_head_kv, c.head_dim);
  k.page_bytes = l.page_bytes();
  const size_t seqs = static_cast<size_t>(o.n_seq);
  k.full_bytes =
      static_cast<size_t>(k.max_pages) * static_cast<size_t>(k.n_full) * seqs * k.page_bytes;
  k.window_bytes =
      static_cast<size_t>(k.window_pages) * static_cast<size_t>(k.n_window) * seqs * k.page_bytes;
  k.n_recurrent = c.n_layers_of(LayerKind::Recurrent);
  if (k.n_recurrent > 0)
    k.recurrent_layer_bytes =
        (static_cast<size_t>(c.ssm_conv - 1) * static_cast<size_t>(c.ssm_conv_dim()) +
         static_cast<size_t>(c.ssm_v_heads) * static_cast<size_t>(c.ssm_state) *
             static_cast<size_t>(c.ssm_state)) *
        sizeof(float);
  k.recurrent_bytes = k.recurrent_layer_bytes * static_cast<size_t>(k.n_recurrent) * seqs;
  return k;
}

size_t Engine::kv_bytes_per_token() const {
  return static_cast<size_t>(shape_.n_full) * (kv_.k_row + kv_.v_row);
}

Sequence Engine::open_sequence() {
  for (size_t i = 0; i < slots_.size(); ++i)
    if (!slots_[i].live) {
      slots_[i].live = true;
      slots_[i].n_past = 0;
      slots_[i].reading = false;
      if (cache_) cache_->open(static_cast<int32_t>(i));
      rec_->reset(static_cast<int32_t>(i));  // a new sequence's recurrent layers start from zero
      plan_dirty_ = true;
      return Sequence{static_cast<int32_t>(i), 0};
    }
  fail("all ", opt_.n_seq, " sequences are in use (--parallel)");
}

void Engine::close_sequence(Sequence& s) {
  if (s.id < 0 || s.id >= opt_.n_seq || !slots_[static_cast<size_t>(s.id)].live) return;
  // Prefetches may still read this slot's host pages, which a new sequence would overwrite.
  dev_.sync();
  pages_->reclaim(false);
  Slot& sl = slots_[static_cast<size_t>(s.id)];
  if (cache_) cache_->keep(s.id, sl.n_past, pages_->slot(s.id), *rec_);
  pages_->release(s.id);
  sl.live = false;
  sl.n_past = 0;
  plan_dirty_ = true;
  s.id = -1;
  s.n_past = 0;
}

// ---- the prompt cache's calls (cache_link.cpp) ----

void Engine::checkpoint(const Sequence& s) {
  if (cache_ && s.n_past > 0)
    cache_->checkpoint(s.id, slots_[static_cast<size_t>(s.id)].n_past, *rec_);
}

void Engine::publish(const Sequence& s) {
  if (!cache_ || s.id < 0 || s.id >= opt_.n_seq || !slots_[static_cast<size_t>(s.id)].live) return;
  dev_.sync();  // the link reads the host copies of the written-back pages
  pages_->reclaim(false);
  cache_->keep(s.id, slots_[static_cast<size_t>(s.id)].n_past, pages_->slot(s.id), *rec_);
}

int32_t Engine::reuse_prefix(Sequence& s, const int32_t* tokens, int32_t n) {
  KVS_CHECK(
      s.id >= 0 && s.id < opt_.n_seq && slots_[static_cast<size_t>(s.id)].live && s.n_past == 0,
      "reuse_prefix: a sequence that is not freshly open");
  if (!cache_ || n < 2) return 0;
  SlotPages pages = pages_->slot(s.id);
  const int32_t hit = cache_->reuse(s.id, tokens, n, pages, *rec_);
  if (hit == 0) return 0;
  slots_[static_cast<size_t>(s.id)].n_past = s.n_past = hit;
  pages_->touched();
  // The next step lays the pages out anew, which also drops chunks the ring prefetched from
  // this slot's previous sequence.
  plan_dirty_ = relayout_ = true;
  return hit;
}

int32_t Engine::save_prefix(const std::vector<int32_t>& tokens, const std::string& path,
                            size_t* bytes) {
  KVS_CHECK(cache_, "saving a slot needs the prompt cache (--cache-ram above 0)");
  return cache_->save(tokens, path, bytes);
}

void Engine::load_prefix(const std::string& path, std::vector<int32_t>& tokens, size_t* bytes) {
  KVS_CHECK(cache_, "restoring a slot needs the prompt cache (--cache-ram above 0)");
  cache_->load(path, tokens, bytes);
}

const float* Engine::eval(Sequence& s, const int32_t* tokens, int32_t n) {
  KVS_CHECK(n >= 1, "nothing to evaluate: the prompt is empty");
  KVS_CHECK(int64_t{s.n_past} + n <= opt_.n_ctx, "the sequence would hold ", int64_t{s.n_past} + n,
            " tokens, more than the context size ", opt_.n_ctx, " (raise -c/--ctx-size)");
  const int32_t body = keeps_checkpoints() && n > 1 ? n - 1 : n;  // then the last one alone
  for (int32_t i = 0, m = 0; i < n; i += m) {
    m = std::min(opt_.n_batch, (i < body ? body : n) - i);
    step({BatchEntry{&s, tokens + i, m}});
    if (checkpoint_due(i, i + m, n, opt_.ctx_checkpoints)) checkpoint(s);
  }
  return logits(0);
}

const float* Engine::logits(int32_t i) const {
  const auto& [first, rows] = lrows_[static_cast<size_t>(i)];
  return hlogits_.as<float>() + static_cast<size_t>(first + rows - 1) * cfg_.n_vocab;
}

const float* Engine::logits(int32_t i, int32_t j) const {
  const auto& [first, rows] = lrows_[static_cast<size_t>(i)];
  KVS_CHECK(j >= 0 && j < rows, "logits: entry ", i, " has ", rows, " rows of logits, not ", j + 1);
  return hlogits_.as<float>() + static_cast<size_t>(first + j) * cfg_.n_vocab;
}

void Engine::fill_random(Sequence& s, int32_t n, uint32_t seed) {
  KVS_CHECK(s.id >= 0 && s.id < opt_.n_seq && slots_[static_cast<size_t>(s.id)].live,
            "fill: a sequence that is not open");
  KVS_CHECK(n >= 0 && int64_t{s.n_past} + n <= opt_.n_ctx, "fill: the sequence would hold ",
            int64_t{s.n_past} + n, " tokens, more than the context size ", opt_.n_ctx);
  Ring* const ring = pages_->ring();  // null: nothing streams
  const int64_t kvd = cfg_.kv_dim();
  const int32_t P = opt_.page_size;
  std::vector<float> hk(static_cast<size_t>(opt_.n_batch * kvd)), hv(hk.size());
  uint64_t x = 0x9E3779B97F4A7C15ull ^ seed;
  const auto uniform = [&x] {  // xorshift64*, top 24 bits
    x ^= x >> 12, x ^= x << 25, x ^= x >> 27;
    return static_cast<float>((x * 0x2545F4914F6CDD1Dull) >> 40) * (2.0f / 16777216.0f) - 1.0f;
  };
  for (int32_t i = 0; i < n; i += opt_.n_batch) {
    const int32_t m = std::min(opt_.n_batch, n - i);
    const std::vector<BatchEntry> batch{BatchEntry{&s, nullptr, m}};
    for (int32_t j = 0; j < m; ++j) page_slot_[static_cast<size_t>(j)] = (s.n_past + j) % P;
    const size_t rows = static_cast<size_t>(m * kvd);
    for (size_t j = 0; j < rows; ++j) hk[j] = uniform(), hv[j] = uniform();
    if (opt_.kv_mode == KvMode::Host) {
      for (int32_t il = 0; il < cfg_.n_layer; ++il) {
        if (recurrent(il)) continue;
        for (int32_t j = 0; j < m; ++j)
          dst_[static_cast<size_t>(j)] =
              pages_->host()->page(s.id, store_layer(il), (s.n_past + j) / P);
        cpu::kv_write(kv_, hk.data(), hv.data(), m, dst_.data(), page_slot_.data());
      }
    } else {
      if (ring) {
        replan(batch);
        ring->begin_step({}, {});
      }
      dev_.upload(act_.k, hk.data(), rows * sizeof(float));
      dev_.upload(act_.v, hv.data(), rows * sizeof(float));
      for (int32_t il = 0; il < cfg_.n_layer; ++il) {
        if (recurrent(il)) continue;
        pages_->add(il, batch);
        dev_.kv_write(kv_, act_.k, act_.v, m, kv_pages(il, batch), page_slot_.data());
        if (ring && full(il)) {
          last_.bytes_out += pages_->write_back(il, batch, plan_);
          ring->layers_done(store_layer(il) + 1);
        }
      }
    }
    s.n_past += m;
    slots_[static_cast<size_t>(s.id)].n_past = s.n_past;
    pages_->trim_windows(s.id, s.n_past);
  }
}

// ---- the forward pass ----

void Engine::step(const std::vector<BatchEntry>& batch) {
  KVS_CHECK(!batch.empty(), "nothing to evaluate");
  KVS_CHECK(static_cast<int32_t>(batch.size()) <= opt_.n_seq, "more entries than --parallel");
  int32_t n_tok = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    const BatchEntry& e = batch[i];
    KVS_CHECK(e.seq && e.seq->id >= 0 && e.seq->id < opt_.n_seq &&
                  slots_[static_cast<size_t>(e.seq->id)].live,
              "step: a sequence that is not open");
    KVS_CHECK(e.n >= 1, "nothing to evaluate: the prompt is empty");
    KVS_CHECK(int64_t{e.seq->n_past} + e.n <= opt_.n_ctx, "the sequence would hold ",
              int64_t{e.seq->n_past} + e.n, " tokens, more than the context size ", opt_.n_ctx,
              " (raise -c/--ctx-size)");
    for (size_t j = 0; j < i; ++j)
      KVS_CHECK(batch[j].seq->id != e.seq->id, "step: a sequence appears twice in one batch");
    KVS_CHECK(!e.all_logits || e.n <= opt_.n_verify, "step: the logits of ", e.n,
              " tokens of one sequence, more than n_verify ", opt_.n_verify);
    KVS_CHECK(!e.embd || cfg_.arch != Arch::Gemma3, "step: gemma3 takes no input rows");
    n_tok += e.n;
  }
  KVS_CHECK(n_tok <= opt_.n_batch, "step: ", n_tok, " tokens are more than -b ", opt_.n_batch);

  Ring* const ring = pages_->ring();  // null: nothing streams
  const double t0 = now();
  const double busy0 = dev_.busy_seconds(Stream::CopyIn), wait0 = dev_.wait_seconds(),
               flag0 = split_ ? dev_.flag_wait_seconds() : 0.0;
  const RingStats r0 = ring ? ring->stats() : RingStats{};
  last_ = StepStats{};
  for (const BatchEntry& e : batch) {  // a prompt ends where its sequence's decoding begins
    Slot& sl = slots_[static_cast<size_t>(e.seq->id)];
    const bool reading = e.n > 1 && !e.all_logits;
    if (sl.reading && !reading) checkpoint(*e.seq);
    sl.reading = reading;
  }
  if (cache_)
    for (const BatchEntry& e : batch) cache_->record(e.seq->id, e.tokens, e.n);
  last_.n_tokens = n_tok;
  last_.n_seqs = static_cast<int32_t>(batch.size());
  last_.decode = std::all_of(batch.begin(), batch.end(), [&](const BatchEntry& e) {
    return e.n == 1 || (e.all_logits && e.n <= opt_.n_verify);
  });

  const int64_t P = opt_.page_size;
  Pass pass{batch, std::vector<int32_t>(batch.size()), n_tok, 0};
  for (size_t i = 0, t = 0; i < batch.size(); ++i) {
    const BatchEntry& e = batch[i];
    pass.offs[i] = static_cast<int32_t>(t);
    for (int32_t j = 0; j < e.n; ++j, ++t) {
      ids_[t] = e.tokens[j];
      pos_[t] = e.seq->n_past + j;
      page_slot_[t] = static_cast<int32_t>((e.seq->n_past + j) % P);
    }
  }
  for (const BatchEntry& e : batch) rec_->begin_step(e.seq->id, e.n, e.all_logits, e.extend_verify);
  if (ring) replan(batch);
  lend_scratch();
  if (ring) ring->begin_step(ring_items(batch, false), ring_items(batch, true));
  if (split_) split_->begin_step();

  // Decode steps with nothing to stream touch only the compute stream (a write-back cuts the
  // recording): the device may record and replay them (prefill steps are few and long,
  // launches do not matter there).
  struct Capture {
    Device* dev;
    ~Capture() {
      if (dev) dev->end_step(false);
    }
  } capture{(!ring || !plan_.streams()) && opt_.kv_mode != KvMode::Host &&
                    n_tok == static_cast<int32_t>(batch.size())
                ? &dev_
                : nullptr};
  if (capture.dev) dev_.begin_step();
  switch (cfg_.arch) {
    case Arch::Llama:
    case Arch::Qwen2:
    case Arch::Qwen3:
    case Arch::Qwen35:
      forward_llama(pass);
      break;
    case Arch::Gemma3:
      forward_gemma3(pass);
      break;
  }
  KVS_CHECK(!ring || pass.cursor == ring->n_items(), "ring: ", ring->n_items() - pass.cursor,
            " streamed pages were not read");
  output_logits(pass);
  hidden_ = act_.x;
  offs_ = pass.offs;
  if (capture.dev) {
    capture.dev = nullptr;
    dev_.end_step(true);
  }
  last_.issue_s = now() - t0;
  const auto& [first, rows] = lrows_.back();
  dev_.download(
      hlogits_.as(), logits_.as<float>(),
      static_cast<size_t>(first + rows) * static_cast<size_t>(cfg_.n_vocab) * sizeof(float));
  for (const BatchEntry& e : batch) {
    e.seq->n_past += e.n;
    slots_[static_cast<size_t>(e.seq->id)].n_past = e.seq->n_past;
    pages_->trim_windows(e.seq->id, e.seq->n_past);
  }

  last_.seconds = now() - t0;
  if (split_) {
    std::tie(last_.cpu_s, last_.cpu_bytes) = split_->end_step();
    last_.cpu_wait_s = dev_.flag_wait_seconds() - flag0;
  }
  if (ring) {
    const RingStats& r = ring->stats();
    last_.bytes_in = r.bytes_in - r0.bytes_in;
    last_.chunks = r.chunks - r0.chunks;
    last_.ready_wait_s = dev_.wait_seconds() - wait0;
    const int64_t on = r.occupancy_n - r0.occupancy_n;
    last_.occupancy = on > 0 ? (r.occupancy_sum - r0.occupancy_sum) / static_cast<double>(on) : 0;
    last_.copy_busy_s = dev_.busy_seconds(Stream::CopyIn) - busy0;
    totals_.prefetch_kept = r.prefetch_kept;
    totals_.prefetch_dropped = r.prefetch_dropped;
  }
  measure(last_);
  ++totals_.steps;
  totals_.tokens += n_tok;
  totals_.seconds += last_.seconds;
  totals_.bytes_in += last_.bytes_in;
  totals_.bytes_out += last_.bytes_out;
  totals_.chunks += last_.chunks;
  totals_.ready_wait_s += last_.ready_wait_s;
  totals_.issue_s += last_.issue_s;
  totals_.copy_busy_s += last_.copy_busy_s;
  totals_.cpu_s += last_.cpu_s;
  totals_.cpu_bytes += last_.cpu_bytes;
  totals_.cpu_pages += last_.cpu_pages;
  totals_.cpu_draft_pages += last_.cpu_draft_pages;
  totals_.gpu_pages += last_.gpu_pages;
  totals_.cpu_wait_s += last_.cpu_wait_s;
  if (observer_) observer_->stepped(*this, batch);
}

const char* step_bound(double step_s, double copy_s, double cpu_s) {
  if (std::max(copy_s, cpu_s) < 0.9 * step_s) return "gpu";
  return copy_s >= cpu_s ? "pcie" : "cpu";
}

void Engine::measure(const StepStats& st) {
  if (st.copy_busy_s > 0 && st.bytes_in > 0)
    h2d_ = ema(h2d_, static_cast<double>(st.bytes_in) / st.copy_busy_s);
  if (split_) split_->measured(st.cpu_s, st.cpu_bytes);
  // Decode and verify steps: the figures the plan is for (a verify step's rows make its compute
  // between layers longer, which the ring must cover too); but not one that repartitioned, whose
  // time includes waiting for the copies in flight.
  if (st.decode && !st.repartitioned) {
    // Per full layer, the window layers' time between them included: what the ring must cover.
    layer_s_ = ema(layer_s_, std::max(0.0, st.seconds - st.ready_wait_s - st.cpu_wait_s) /
                                 std::max(1, shape_.n_full));
    stall_s_ = ema(stall_s_, st.ready_wait_s);
    // The compute waited while the copy engine idled: the ring, not the link, held it back. Two
    // such steps in a row, so that a step starting cold (nothing prefetched) does not count.
    const bool short_ring =
        plan_.streams() && st.ready_wait_s > 0.05 * st.seconds && st.copy_busy_s < 0.9 * st.seconds;
    short_ring_steps_ = short_ring ? short_ring_steps_ + 1 : 0;
    ring_check_ = short_ring_steps_ >= 2;
    ring_stall_s_ = st.ready_wait_s;
  } else {
    short_ring_steps_ = 0;
  }
}

void Engine::self_attention(Pass& p, int32_t il) {
  const ModelConfig& c = cfg_;
  const LayerWeights& L = w_.layers[static_cast<size_t>(il)];
  const int32_t n = p.n_tok;
  float *h = act_.h, *q = act_.q, *k = act_.k, *v = act_.v;
  const auto bias = [](const Vec& b) { return b.empty() ? nullptr : b.data(); };
  if (c.attn_gate) {  // wq's rows regrouped [q; gate] at construction
    Matrix wq = L.wq, wg = L.wq;
    wq.n_out = wg.n_out = c.q_dim();
    wg.data = L.wq.row(c.q_dim());
    const MatJob qkv[] = {{&wq, q}, {&wg, act_.attn_gate}, {&L.wk, k}, {&L.wv, v}};
    dev_.matmuls(h, n, qkv, 4);
  } else {
    const MatJob qkv[] = {{&L.wq, q, bias(L.bq)}, {&L.wk, k, bias(L.bk)}, {&L.wv, v, bias(L.bv)}};
    dev_.matmuls(h, n, qkv, 3);
  }
  // The batch's K and V rows go to their pages in the rope's own pass (host mode: attend_host),
  // which normalizes the q and k heads first where the model has it.
  const RopeParams& rope = full(il) ? rope_ : rope_swa_;
  const QkNorm norm{L.q_norm.data(), L.k_norm.data(), c.norm_eps};
  const bool host = opt_.kv_mode == KvMode::Host;
  if (host) {
    if (c.qk_norm) {
      dev_.rmsnorm(q, norm.q, q, int64_t{n} * c.n_head, c.head_dim, c.norm_eps);
      dev_.rmsnorm(k, norm.k, k, int64_t{n} * c.n_head_kv, c.head_dim, c.norm_eps);
    }
    dev_.rope(q, k, pos_.data(), n, c.n_head, c.n_head_kv, rope);
  } else {
    pages_->add(il, p.batch);
    dev_.rope_kv_write(q, k, v, pos_.data(), n, c.n_head, rope, kv_, kv_pages(il, p.batch),
                       page_slot_.data(), c.qk_norm ? &norm : nullptr);
    if (full(il)) post_split(il, p);
  }
  for (size_t i = 0; i < p.batch.size(); ++i) {
    if (host)
      attend_host(il, p.batch[i], p.offs[i]);
    else
      attend(il, p.batch[i], static_cast<int32_t>(i), p.offs[i], p.cursor);
  }
  if (c.attn_gate) dev_.sigmoid_mul(act_.att, act_.attn_gate, int64_t{n} * c.q_dim());
  if (pages_->ring() && full(il)) {
    last_.bytes_out += pages_->write_back(il, p.batch, plan_);
    pages_->ring()->layers_done(store_layer(il) + 1);
  }
}

void Engine::output_logits(Pass& p) {
  const int64_t d = cfg_.n_embd;
  const float* x = act_.x;
  float* h = act_.h;
  lrows_.clear();
  int32_t rows = 0;
  for (size_t i = 0; i < p.batch.size(); ++i) {
    const BatchEntry& e = p.batch[i];
    const int32_t n = e.all_logits ? e.n : 1;
    const float* first = x + (p.offs[i] + e.n - n) * d;
    dev_.rmsnorm(first, w_.output_norm.data(), h + int64_t{rows} * d, n, d, cfg_.norm_eps);
    lrows_.emplace_back(rows, n);
    rows += n;
  }
  dev_.matmul(w_.output, h, logits_.as<float>(), rows, nullptr);
}

uint8_t* const* Engine::kv_pages(int32_t il, const std::vector<BatchEntry>& batch) {
  const int32_t P = opt_.page_size;
  size_t t = 0;
  for (const BatchEntry& e : batch) {
    const auto& fr = pages_->frames(e.seq->id, il);
    for (int32_t j = 0; j < e.n; ++j)
      dst_[t++] = pages_->pool()->frame(fr[static_cast<size_t>((e.seq->n_past + j) / P)]);
  }
  return dst_.data();
}

}  // namespace kvs
