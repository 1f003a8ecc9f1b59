// Random streaming cases shared by the CPU (tests/unit/test_stream.cpp) and CUDA
// (tests/cuda/test_cuda.cpp) exactness tests: prefill every sequence, decode them together (or
// start each sequence later, its prompt in the steps where the others decode), and compare the
// logits of every step bit for bit.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "kvs/backend/device.h"
#include "kvs/engine/engine.h"
#include "kvs/model/model.h"
#include "kvs/util/error.h"

namespace kvs::test {

struct Case {
  std::string preset;
  int32_t page = 16, batch = 64, n_ctx = 512;
  DType kt = DType::F16, vt = DType::F16;
  std::vector<int32_t> prompt_len, gen_len;  // per sequence
  double arena_frac = 0;                     // 0: the minimum arena; 1: everything fits
  KvMode mode = KvMode::Stream;
  size_t chunk = 64 << 10;
  uint32_t seed = 1;
  bool phase_arena = true;    // EngineOptions::phase_arena
  int32_t stagger = 0;        // > 0: sequence i starts after i x stagger steps
  int32_t n_verify = 1;       // EngineOptions::n_verify
  int32_t split_threads = 0;  // EngineOptions::split_threads (--kv-mode split)
  double split_share = 0;     // EngineOptions::split_share
  double h2d_limit = 0;       // EngineOptions::h2d_limit
  double cpu_rate = 0;        // EngineOptions::cpu_bytes_per_s
  std::string str() const {
    std::ostringstream o;
    o << preset << " page " << page << " batch " << batch << " kv " << dtype_name(kt) << "/"
      << dtype_name(vt) << " mode " << kv_mode_name(mode) << " arena " << arena_frac << " chunk "
      << chunk << " phase arena " << phase_arena << " stagger " << stagger << " seqs";
    for (size_t i = 0; i < prompt_len.size(); ++i) o << " " << prompt_len[i] << "+" << gen_len[i];
    return o.str();
  }
};

struct Result {
  std::vector<std::vector<float>> logits;  // every step's logits, in a fixed order
  EngineStats totals;
  Plan plan;
  int32_t max_slots = 0;
};

// The engine's options for a case, but its mode and arena.
inline EngineOptions options(const Case& c) {
  EngineOptions o;
  o.n_ctx = c.n_ctx;
  o.n_batch = c.batch;
  o.page_size = c.page;
  o.k_type = c.kt;
  o.v_type = c.vt;
  o.n_seq = static_cast<int32_t>(c.prompt_len.size());
  o.ring_chunk_bytes = c.chunk;
  o.phase_arena = c.phase_arena;
  o.n_verify = c.n_verify;
  o.split_threads = c.split_threads;
  o.split_share = c.split_share;
  o.h2d_limit = c.h2d_limit;
  o.cpu_bytes_per_s = c.cpu_rate;
  return o;
}

// What the engine says when it refuses options o on dev; empty where it accepts them.
inline std::string refusal(const Model& m, Device& dev, const EngineOptions& o) {
  try {
    Engine e(m, dev, o);
  } catch (const Error& err) {
    return err.what();
  }
  return "";
}

inline std::vector<int32_t> tokens(uint32_t seed, int32_t n, int32_t vocab) {
  std::mt19937 g(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = static_cast<int32_t>(g() % static_cast<uint32_t>(vocab));
  return t;
}

// Prefills every sequence (in -b chunks), then decodes the live ones together, one token each
// per step; a sequence that reaches its length closes and gives its pages back while the others
// go on. With a stagger, sequence i opens at step i x stagger and its prompt goes in chunks of
// what -b leaves beside the others' decode tokens, in the same steps. Decode tokens are fixed in
// advance so every mode sees the same inputs.
// On `dev`, or on a fresh CPU device when it is null.
inline Result run(const Model& m, const Case& c, KvMode mode, size_t arena, Device* dev = nullptr) {
  std::unique_ptr<Device> own;
  if (!dev) {
    own = make_cpu_device(0);
    dev = own.get();
  }
  EngineOptions o = options(c);
  o.kv_mode = mode;
  o.kv_arena = arena;
  Engine e(m, *dev, o);
  const int32_t V = m.config.n_vocab, N = o.n_seq;
  Result r;
  std::vector<Sequence> seqs(static_cast<size_t>(N));
  std::vector<std::vector<int32_t>> prompt, gen;
  for (int32_t i = 0; i < N; ++i) {
    const uint32_t s = c.seed * 100 + static_cast<uint32_t>(i);
    prompt.push_back(tokens(s, c.prompt_len[static_cast<size_t>(i)], V));
    gen.push_back(tokens(s + 50, c.gen_len[static_cast<size_t>(i)], V));
  }
  if (c.stagger == 0)
    for (int32_t i = 0; i < N; ++i) {
      Sequence& s = seqs[static_cast<size_t>(i)];
      s = e.open_sequence();
      const auto& p = prompt[static_cast<size_t>(i)];
      const float* l = e.eval(s, p.data(), static_cast<int32_t>(p.size()));
      r.logits.emplace_back(l, l + V);
    }
  std::vector<int32_t> fed(static_cast<size_t>(N), c.stagger == 0 ? INT32_MAX : 0);
  std::vector<int32_t> done(static_cast<size_t>(N), 0);  // decode tokens
  for (int32_t t = 0;; ++t) {
    std::vector<BatchEntry> batch;
    int32_t room = c.batch;
    bool waiting = false;              // a sequence yet to start
    for (int32_t i = 0; i < N; ++i) {  // the decode tokens first
      const size_t u = static_cast<size_t>(i);
      if (t < i * c.stagger) waiting = true;
      if (t < i * c.stagger || fed[u] < static_cast<int32_t>(prompt[u].size())) continue;
      if (done[u] < static_cast<int32_t>(gen[u].size())) {
        batch.push_back({&seqs[u], &gen[u][static_cast<size_t>(done[u]++)], 1});
        --room;
      } else if (seqs[u].id >= 0) {
        e.close_sequence(seqs[u]);
      }
    }
    for (int32_t i = 0; i < N && room > 0; ++i) {  // then prompt chunks in what is left
      const size_t u = static_cast<size_t>(i);
      const int32_t left = static_cast<int32_t>(prompt[u].size()) - fed[u];
      if (t < i * c.stagger || left <= 0) continue;
      if (fed[u] == 0) seqs[u] = e.open_sequence();
      const int32_t n = std::min(left, room);
      batch.push_back({&seqs[u], prompt[u].data() + fed[u], n});
      fed[u] += n;
      room -= n;
    }
    if (batch.empty() && !waiting) break;
    if (batch.empty()) continue;
    e.step(batch);
    r.max_slots = std::max(r.max_slots, e.plan().n_slots);
    for (size_t j = 0; j < batch.size(); ++j) {
      const float* l = e.logits(static_cast<int32_t>(j));
      r.logits.emplace_back(l, l + V);
    }
  }
  r.totals = e.totals();
  r.plan = e.plan();
  return r;
}

// A case's page bytes and the frames streaming always keeps.
inline std::pair<size_t, int32_t> page_and_fixed(const Model& m, const Case& c) {
  const KvLayout l = KvLayout::make(c.kt, c.vt, c.page, m.config.n_head_kv, m.config.head_dim);
  return {l.page_bytes(), Engine::fixed_frames(m.config, options(c))};
}

// Bytes of the whole KV (every sequence at -c in the full layers) plus the frames streaming
// always keeps (the windows among them).
inline size_t full_arena(const Model& m, const Case& c) {
  const auto [page, fixed] = page_and_fixed(m, c);
  return Engine::kv_shape(m.config, options(c)).full_bytes + static_cast<size_t>(fixed) * page;
}

inline size_t min_arena(const Model& m, const Case& c) {
  const auto [page, fixed] = page_and_fixed(m, c);
  return min_arena_bytes(page, fixed);
}

inline void expect_same(const Result& want, const Result& got, const std::string& what) {
  ASSERT_EQ(want.logits.size(), got.logits.size()) << what;
  for (size_t i = 0; i < want.logits.size(); ++i)
    ASSERT_EQ(std::memcmp(want.logits[i].data(), got.logits[i].data(),
                          want.logits[i].size() * sizeof(float)),
              0)
        << what << ": logits of step " << i << " differ";
}

// Case k of a seeded sequence: preset, page size, cache types, batch, 1-4 sequences of random
// prompt and decode lengths, mode auto or stream, ring chunk and arena fraction.
inline Case random_case(std::mt19937& g, int k) {
  const char* presets[] = {"tiny", "tiny-qwen2", "tiny-qwen3", "tiny:q4_0", "tiny-qwen3:q8_0"};
  const DType types[] = {DType::F16, DType::Q8_0, DType::Q4_0};
  const int32_t pages[] = {4, 8, 16, 32};
  Case c;
  c.seed = static_cast<uint32_t>(k + 1);
  c.preset = presets[g() % 5];
  c.page = pages[g() % 4];
  c.kt = types[g() % 3];
  c.vt = types[g() % 3];
  c.batch = static_cast<int32_t>(8 + g() % 57);
  const int32_t n_seq = static_cast<int32_t>(1 + g() % 4);
  for (int32_t i = 0; i < n_seq; ++i) {
    c.prompt_len.push_back(static_cast<int32_t>(1 + g() % 150));
    c.gen_len.push_back(static_cast<int32_t>(g() % 40));
  }
  c.n_ctx = 256;
  c.mode = g() % 3 == 0 ? KvMode::Auto : KvMode::Stream;
  c.chunk = size_t{1} << (10 + g() % 8);  // 1 KiB to 128 KiB: slots of one to many pages
  c.arena_frac = (g() % 4 == 0) ? 0.0 : (g() % 1000) / 1000.0;
  // Without drawing from g, so the cases above stay what they were.
  c.phase_arena = k % 4 == 1;
  c.stagger = k % 3 == 1 ? 1 + k % 7 : 0;
  return c;
}

// The arena for a case: its fraction of the way from the minimum to everything.
inline size_t case_arena(const Model& m, const Case& c) {
  const size_t lo = min_arena(m, c), hi = full_arena(m, c);
  return lo + static_cast<size_t>(c.arena_frac * static_cast<double>(hi - lo));
}

}  // namespace kvs::test
