#include "kvs/engine/engine.h"

#include <algorithm>
#include <cmath>

#include "kvs/util/error.h"
#include "kvs/util/parse.h"

namespace kvs {

Engine::Engine(const Model& model, Device& dev, const EngineOptions& opt)
    : cfg_(model.config), dev_(dev), opt_(opt) {
  KVS_CHECK(opt.n_ctx >= 1, "-c/--ctx-size must be at least 1");
  KVS_CHECK(opt.n_batch >= 1, "-b/--batch-size must be at least 1");
  KVS_CHECK(opt.n_seq >= 1, "--parallel must be at least 1");
  w_ = dev.place_weights(model.weights);
  kv_ = KvLayout::make(opt.k_type, opt.v_type, opt.page_size, cfg_.n_head_kv, cfg_.head_dim);
  rope_.mode = cfg_.rope_mode;
  rope_.head_dim = cfg_.head_dim;
  rope_.rope_dim = cfg_.rope_dim;
  rope_.base = cfg_.rope_base;
  rope_.linear_scale = cfg_.rope_linear_scale;
  rope_.freq_factors = w_.rope_freqs.empty() ? nullptr : w_.rope_freqs.data();

  max_pages_ = (opt.n_ctx + opt.page_size - 1) / opt.page_size;
  const int64_t n_frames = int64_t{max_pages_} * cfg_.n_layer * opt.n_seq;
  KVS_CHECK(n_frames < (int64_t{1} << 31), "the KV cache has too many pages; raise --page-size");
  frames_ = dev.alloc(static_cast<size_t>(n_frames) * kv_.page_bytes(), "the KV cache");
  free_frames_.resize(static_cast<size_t>(n_frames));
  for (int64_t i = 0; i < n_frames; ++i)
    free_frames_[static_cast<size_t>(i)] = static_cast<int32_t>(n_frames - 1 - i);
  for (int32_t i = opt.n_seq - 1; i >= 0; --i) free_ids_.push_back(i);

  const size_t b = static_cast<size_t>(opt.n_batch), f = sizeof(float);
  x_ = dev.alloc(b * cfg_.n_embd * f, "activations");
  h_ = dev.alloc(b * std::max(cfg_.n_embd, cfg_.q_dim()) * f, "activations");
  q_ = dev.alloc(b * cfg_.q_dim() * f, "activations");
  k_ = dev.alloc(b * cfg_.kv_dim() * f, "activations");
  v_ = dev.alloc(b * cfg_.kv_dim() * f, "activations");
  att_ = dev.alloc(b * cfg_.q_dim() * f, "activations");
  gate_ = dev.alloc(b * cfg_.n_ff * f, "activations");
  up_ = dev.alloc(b * cfg_.n_ff * f, "activations");
  logits_ = dev.alloc(static_cast<size_t>(cfg_.n_vocab) * f, "logits");
  pos_.resize(b);
  slots_.resize(b);
  dst_.resize(b);
  spans_.reserve(static_cast<size_t>(max_pages_));
}

size_t Engine::kv_bytes_per_token() const {
  return static_cast<size_t>(cfg_.n_layer) * (kv_.k_row + kv_.v_row);
}

Sequence Engine::open_sequence() {
  KVS_CHECK(!free_ids_.empty(), "all ", opt_.n_seq, " sequences are in use (--parallel)");
  Sequence s;
  s.id = free_ids_.back();
  free_ids_.pop_back();
  s.pages.resize(static_cast<size_t>(cfg_.n_layer));
  return s;
}

void Engine::close_sequence(Sequence& s) {
  for (auto& layer : s.pages)
    for (int32_t f : layer) free_frames_.push_back(f);
  s.pages.clear();
  if (s.id >= 0) free_ids_.push_back(s.id);
  s.id = -1;
  s.n_past = 0;
}

const float* Engine::eval(Sequence& s, const int32_t* tokens, int32_t n) {
  KVS_CHECK(n >= 1, "nothing to evaluate: the prompt is empty");
  KVS_CHECK(int64_t{s.n_past} + n <= opt_.n_ctx, "the sequence would hold ", int64_t{s.n_past} + n,
            " tokens, more than the context size ", opt_.n_ctx, " (raise -c/--ctx-size)");
  for (int32_t i = 0; i < n; i += opt_.n_batch) {
    const int32_t m = std::min(opt_.n_batch, n - i);
    forward(s, tokens + i, m, i + m == n);
  }
  return logits_.as<float>();
}

void Engine::forward(Sequence& s, const int32_t* tokens, int32_t n, bool want_logits) {
  const ModelConfig& c = cfg_;
  const int64_t d = c.n_embd, P = opt_.page_size;
  float *x = x_.as<float>(), *h = h_.as<float>(), *q = q_.as<float>(), *k = k_.as<float>(),
        *v = v_.as<float>(), *att = att_.as<float>(), *gate = gate_.as<float>(),
        *up = up_.as<float>();
  for (int32_t t = 0; t < n; ++t) {
    pos_[static_cast<size_t>(t)] = s.n_past + t;
    slots_[static_cast<size_t>(t)] = static_cast<int32_t>((s.n_past + t) % P);
  }
  // New pages for every layer before any work, so a full pool fails cleanly.
  const int32_t pages_needed = static_cast<int32_t>((s.n_past + n + P - 1) / P);
  for (auto& layer : s.pages)
    while (static_cast<int32_t>(layer.size()) < pages_needed) {
      KVS_CHECK(!free_frames_.empty(), "the KV cache is full");
      layer.push_back(free_frames_.back());
      free_frames_.pop_back();
    }

  dev_.embed(w_.tok_embd, tokens, n, x);
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  for (int32_t il = 0; il < c.n_layer; ++il) {
    const LayerWeights& L = w_.layers[static_cast<size_t>(il)];
    const std::vector<int32_t>& pages = s.pages[static_cast<size_t>(il)];
    dev_.rmsnorm(x, L.attn_norm.data(), h, n, d, c.norm_eps);
    dev_.matmul(L.wq, h, q, n, L.bq.empty() ? nullptr : L.bq.data());
    dev_.matmul(L.wk, h, k, n, L.bk.empty() ? nullptr : L.bk.data());
    dev_.matmul(L.wv, h, v, n, L.bv.empty() ? nullptr : L.bv.data());
    if (c.qk_norm) {
      dev_.rmsnorm(q, L.q_norm.data(), q, int64_t{n} * c.n_head, c.head_dim, c.norm_eps);
      dev_.rmsnorm(k, L.k_norm.data(), k, int64_t{n} * c.n_head_kv, c.head_dim, c.norm_eps);
    }
    dev_.rope(q, pos_.data(), n, c.n_head, rope_);
    dev_.rope(k, pos_.data(), n, c.n_head_kv, rope_);
    for (int32_t t = 0; t < n; ++t)
      dst_[static_cast<size_t>(t)] = frame(pages[static_cast<size_t>((s.n_past + t) / P)]);
    dev_.kv_write(kv_, k, v, n, dst_.data(), slots_.data());

    spans_.clear();
    const int32_t total = s.n_past + n;
    for (int32_t p = 0; p * P < total; ++p)
      spans_.push_back({frame(pages[static_cast<size_t>(p)]), static_cast<int32_t>(p * P),
                        static_cast<int32_t>(std::min<int64_t>(P, total - p * P))});
    AttentionArgs a;
    a.q = q;
    a.out = att;
    a.pos = pos_.data();
    a.n_tok = n;
    a.spans = spans_.data();
    a.n_spans = static_cast<int32_t>(spans_.size());
    a.kv = kv_;
    a.n_head = c.n_head;
    a.scale = scale;
    dev_.attention(a);
    dev_.matmul(L.wo, att, h, n, nullptr);
    dev_.add(x, h, int64_t{n} * d);

    dev_.rmsnorm(x, L.ffn_norm.data(), h, n, d, c.norm_eps);
    dev_.matmul(L.gate, h, gate, n, nullptr);
    dev_.matmul(L.up, h, up, n, nullptr);
    dev_.swiglu(gate, up, int64_t{n} * c.n_ff);
    dev_.matmul(L.down, gate, h, n, nullptr);
    dev_.add(x, h, int64_t{n} * d);
  }
  s.n_past += n;
  if (!want_logits) return;
  const float* last = x + (n - 1) * d;
  dev_.rmsnorm(last, w_.output_norm.data(), h, 1, d, c.norm_eps);
  dev_.matmul(w_.output, h, logits_.as<float>(), 1, nullptr);
  dev_.sync();
}

}  // namespace kvs
