// The prompt cache's exactness cases, shared by the CPU (tests/unit/test_prompt_cache.cpp) and
// CUDA (tests/cuda/test_cuda_prompt_cache.cpp) tests: a sequence whose prompt begins with cached
// pages (and, with recurrent layers, a checkpoint's states) gets, for every later token, logits
// bit-identical to a cold run of the same tokens, whatever the mode (resident, streamed through
// the smallest arena, host), page size, cache types and chunking, with other sequences in the
// same steps. On CUDA the steps stay within kCudaInvariantTokens, where every token's bits are
// those of a step of it alone.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "kvs/backend/device.h"
#include "kvs/engine/engine.h"
#include "kvs/engine/prompt_cache.h"
#include "kvs/model/model.h"
#include "kvs/util/error.h"

namespace kvs::test {

using MakeDevice = std::function<std::unique_ptr<Device>()>;

inline std::vector<int32_t> join(std::initializer_list<std::vector<int32_t>> parts) {
  std::vector<int32_t> out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

struct CacheCase {
  const char* preset = "tiny";
  KvMode mode = KvMode::Resident;
  int32_t page = 16, batch = 32, n_ctx = 256;
  DType kt = DType::F16, vt = DType::F16;
  bool small_arena = false;
  bool neighbour = false;  // another sequence decodes in the same steps
  std::string str() const {
    std::ostringstream o;
    o << preset << " " << kv_mode_name(mode) << (small_arena ? " (smallest arena)" : "") << " page "
      << page << " batch " << batch << " kv " << dtype_name(kt) << "/" << dtype_name(vt)
      << (neighbour ? " with a neighbour" : "");
    return o.str();
  }
};

inline std::vector<int32_t> random_tokens(std::mt19937& g, int32_t n, int32_t vocab) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = static_cast<int32_t>(g() % static_cast<uint32_t>(vocab));
  return t;
}

struct Turns {
  std::vector<std::vector<float>> logits;  // after the second prompt, then each decode token
  int32_t reused = 0;
  int32_t first_pages = 0;  // pages the first sequence completed
  size_t streamed = 0;
};

// A sequence of the engine fed in chunks of random sizes, each step with one token of the
// neighbour (when there is one) before it.
struct Feeder {
  Engine& e;
  Sequence* neighbour;
  std::mt19937 chunks;
  const float* step(Sequence& s, const int32_t* t, int32_t m) {
    static const int32_t filler = 7;
    std::vector<BatchEntry> b;
    if (neighbour && neighbour->n_past + 1 < e.options().n_ctx)
      b.push_back({neighbour, &filler, 1});
    b.push_back({&s, t, m});
    e.step(b);
    return e.logits(static_cast<int32_t>(b.size()) - 1);
  }
  const float* prompt(Sequence& s, const std::vector<int32_t>& t, int32_t from) {
    const float* l = nullptr;
    const int32_t room = e.options().n_batch - (neighbour ? 1 : 0);
    for (int32_t i = from; i < static_cast<int32_t>(t.size());) {
      const int32_t m =
          std::min<int32_t>(static_cast<int32_t>(t.size()) - i,
                            1 + static_cast<int32_t>(chunks() % static_cast<uint32_t>(room)));
      l = step(s, t.data() + i, m);
      i += m;
    }
    return l;
  }
};

// With `cached`: a first sequence reads prompt1, decodes gen1 and closes; a second one reads
// prompt2 (which begins with part of the first's tokens) from what the cache gives, then
// decodes. Without: the second alone, on an engine without a cache, chunked differently.
inline Turns run(const MakeDevice& make, const Model& m, const CacheCase& c, bool cached,
                 const std::vector<int32_t>& prompt1, const std::vector<int32_t>& gen1,
                 const std::vector<int32_t>& prompt2, const std::vector<int32_t>& gen2) {
  EngineOptions o;
  o.n_ctx = c.n_ctx;
  o.n_batch = c.batch;
  o.page_size = c.page;
  o.k_type = c.kt;
  o.v_type = c.vt;
  o.n_seq = 2;
  o.kv_mode = c.mode;
  o.ring_chunk_bytes = 1024;
  o.cache_ram = cached ? size_t{64} << 20 : 0;
  if (c.small_arena) {
    const KvLayout l = KvLayout::make(c.kt, c.vt, c.page, m.config.n_head_kv, m.config.head_dim);
    o.kv_arena = min_arena_bytes(l.page_bytes(), Engine::fixed_frames(m.config, o));
  }
  auto dev = make();
  Engine e(m, *dev, o);
  Sequence n;
  if (c.neighbour) {
    n = e.open_sequence();
    const std::vector<int32_t> t(12, 3);
    e.eval(n, t.data(), static_cast<int32_t>(t.size()));
  }
  Feeder f{e, c.neighbour ? &n : nullptr, std::mt19937(cached ? 11u : 12u)};
  Turns r;
  if (cached) {
    Sequence s = e.open_sequence();
    f.prompt(s, prompt1, 0);
    for (int32_t t : gen1) f.step(s, &t, 1);
    r.first_pages = s.n_past / c.page;
    e.close_sequence(s);
  }
  Sequence s = e.open_sequence();
  if (cached) r.reused = e.reuse_prefix(s, prompt2.data(), static_cast<int32_t>(prompt2.size()));
  EXPECT_EQ(s.n_past, r.reused);
  const int32_t V = m.config.n_vocab;
  const float* l = f.prompt(s, prompt2, r.reused);
  r.logits.emplace_back(l, l + V);
  for (int32_t t : gen2) {
    l = f.step(s, &t, 1);
    r.logits.emplace_back(l, l + V);
  }
  r.streamed = e.totals().bytes_in;
  return r;
}

inline int32_t shared_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  const auto [ia, ib] = std::mismatch(a.begin(), a.end(), b.begin(), b.end());
  return static_cast<int32_t>(ia - a.begin());
}

// Random cases in every mode: the second prompt continues the first sequence's tokens, or
// leaves them at a random point (inside a page, at its edge, before the first page ends). The
// second sequence reuses up to the last token both share (leaving one to read); with window
// layers, where the first sequence kept the window pages that position needs; with recurrent
// layers, back to a checkpoint, at the latest the first sequence's end.
inline void cached_prefixes_give_the_cold_logits(const MakeDevice& make,
                                                 std::vector<const char*> presets, uint32_t seed,
                                                 int n_cases, int min_hits, int min_streamed,
                                                 int32_t max_batch = 64) {
  std::mt19937 g(seed);
  const DType types[] = {DType::F16, DType::Q8_0, DType::Q4_0};
  const int32_t pages[] = {4, 8, 16, 32};
  int hits = 0, streamed = 0;
  for (int k = 0; k < n_cases; ++k) {
    CacheCase c;
    c.preset = presets[g() % presets.size()];
    c.page = pages[g() % 4];
    c.kt = types[g() % 3];
    c.vt = types[g() % 3];
    c.batch = static_cast<int32_t>(8 + g() % static_cast<uint32_t>(max_batch - 7));
    c.neighbour = g() % 2 == 0;
    const int mode = k % 4;  // resident, auto, stream through the smallest arena, host
    c.mode = mode == 0   ? KvMode::Resident
             : mode == 1 ? KvMode::Auto
             : mode == 2 ? KvMode::Stream
                         : KvMode::Host;
    c.small_arena = mode == 2;
    auto m = Model::load(std::string("synthetic:") + c.preset);
    const ModelConfig& cfg = m->config;
    const int32_t V = cfg.n_vocab;
    const auto prompt1 = random_tokens(g, static_cast<int32_t>(1 + g() % 150), V);
    const auto gen1 = random_tokens(g, static_cast<int32_t>(g() % 20), V);
    const std::vector<int32_t> first = join({prompt1, gen1});
    std::vector<int32_t> prompt2 = first;
    const int32_t kept = g() % 3 == 0 ? static_cast<int32_t>(g() % (prompt2.size() + 1))
                                      : static_cast<int32_t>(prompt2.size());
    prompt2.resize(static_cast<size_t>(kept));
    const auto more = random_tokens(g, static_cast<int32_t>(1 + g() % 60), V);
    prompt2.insert(prompt2.end(), more.begin(), more.end());
    const auto gen2 = random_tokens(g, 5, V);
    SCOPED_TRACE(c.str() + " prompts " + std::to_string(prompt1.size()) + "+" +
                 std::to_string(gen1.size()) + ", " + std::to_string(kept) + "+" +
                 std::to_string(more.size()));
    const Turns warm = run(make, *m, c, true, prompt1, gen1, prompt2, gen2);
    const Turns cold = run(make, *m, c, false, prompt1, gen1, prompt2, gen2);
    const auto n1 = static_cast<int32_t>(first.size());
    const int32_t limit =
        std::min(shared_prefix(prompt2, first), static_cast<int32_t>(prompt2.size()) - 1);
    if (cfg.n_layers_of(LayerKind::Recurrent) > 0) {
      EXPECT_LE(warm.reused, limit);
      if (kept == n1) {
        EXPECT_EQ(warm.reused, n1) << "the answer's end is a checkpoint";
      }
    } else if (cfg.n_layers_of(LayerKind::Window) > 0 && c.mode != KvMode::Host) {
      // The first sequence kept the window pages from window_first on.
      const int32_t back = cfg.n_swa - 1, window_first = std::max(0, n1 - back) / c.page;
      const auto usable = [&](int32_t n) {
        return n > 0 && std::max(0, n - back) / c.page >= window_first;
      };
      const int32_t whole = limit / c.page * c.page;
      EXPECT_EQ(warm.reused, usable(limit) ? limit : usable(whole) ? whole : 0);
    } else {
      EXPECT_EQ(warm.reused, limit);
    }
    ASSERT_EQ(warm.logits.size(), cold.logits.size());
    for (size_t i = 0; i < warm.logits.size(); ++i)
      ASSERT_EQ(std::memcmp(warm.logits[i].data(), cold.logits[i].data(),
                            warm.logits[i].size() * sizeof(float)),
                0)
          << "logits " << i << " differ (" << warm.reused << " positions from the cache)";
    hits += warm.reused > 0;
    streamed += c.small_arena && warm.streamed > 0;
  }
  EXPECT_GE(hits, min_hits);          // the cases must reuse pages, not miss
  EXPECT_GE(streamed, min_streamed);  // and the smallest arenas must stream them
}

inline EngineOptions small_options(const Model& m, KvMode mode, int32_t n_seq, bool cached,
                                   int32_t n_batch = 32) {
  EngineOptions o;
  o.n_ctx = 512;
  o.n_batch = n_batch;
  o.page_size = 16;
  o.n_seq = n_seq;
  o.kv_mode = mode;
  o.ring_chunk_bytes = 1024;
  o.ctx_checkpoints = 4;
  o.cache_ram = cached ? size_t{64} << 20 : 0;
  if (mode == KvMode::Stream) {
    const KvLayout l =
        KvLayout::make(o.k_type, o.v_type, o.page_size, m.config.n_head_kv, m.config.head_dim);
    o.kv_arena = min_arena_bytes(l.page_bytes(), Engine::fixed_frames(m.config, o));
  }
  return o;
}

// Where a recurrent model keeps states: before the last token of a prompt read by eval()
// (which reads it alone), at the prompt's evenly spaced points (--ctx-checkpoints: 4 in 10
// chunks of -b, at 2b, 4b, 6b and 8b), at the end of the answer; a prompt that leaves the first
// one's tokens, or repeats it, resumes from the last of them before it, with the cold logits.
inline void recurrent_checkpoints_where_they_are_taken(const MakeDevice& make, int32_t b) {
  auto m = Model::load("synthetic:tiny-qwen35");
  std::mt19937 g(7);
  const int32_t V = m->config.n_vocab;
  const auto prompt1 = random_tokens(g, 10 * b, V);
  const auto gen1 = random_tokens(g, 3, V);
  const auto other = random_tokens(g, 9, V);
  struct Want {
    int32_t leave;
    bool more;  // other tokens after those kept
    int32_t reused;
  };
  for (const Want w :
       {Want{10 * b + 3, true, 10 * b + 3}, Want{10 * b, true, 10 * b - 1},
        Want{10 * b, false, 10 * b - 1}, Want{10 * b - 1, true, 10 * b - 1},
        Want{10 * b - 2, true, 8 * b}, Want{7 * b + 5, true, 6 * b}, Want{b, true, 0}}) {
    SCOPED_TRACE("leaves at " + std::to_string(w.leave) + (w.more ? " for others" : ""));
    std::vector<int32_t> prompt2 = join({prompt1, gen1});
    prompt2.resize(static_cast<size_t>(w.leave));
    if (w.more) prompt2.insert(prompt2.end(), other.begin(), other.end());
    std::vector<float> want, got;
    for (const bool cached : {true, false}) {
      auto dev = make();
      Engine e(*m, *dev, small_options(*m, KvMode::Resident, 1, cached, b));
      if (cached) {
        Sequence s = e.open_sequence();
        e.eval(s, prompt1.data(), static_cast<int32_t>(prompt1.size()));
        for (const int32_t t : gen1) e.step({BatchEntry{&s, &t, 1}});
        e.close_sequence(s);
        const PromptCacheStats* st = e.prompt_cache_stats();
        ASSERT_NE(st, nullptr);
        EXPECT_EQ(st->checkpoints, 6);
      }
      Sequence s = e.open_sequence();
      const int32_t reused =
          e.reuse_prefix(s, prompt2.data(), static_cast<int32_t>(prompt2.size()));
      if (cached) {
        EXPECT_EQ(reused, w.reused);
      }
      const float* l =
          e.eval(s, prompt2.data() + reused, static_cast<int32_t>(prompt2.size()) - reused);
      (cached ? got : want).assign(l, l + V);
    }
    ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0);
  }
}

// -np 3: two requests extend one cached conversation at once, read in the same steps (chunk
// tokens each) and decode together, each with the logits it has alone on an engine without a
// cache; resident and streamed through the smallest arena, for every layer kind.
inline void sequences_share_a_cached_prefix_at_once(const MakeDevice& make, int32_t chunk) {
  for (const char* preset : {"tiny", "tiny-gemma3", "tiny-qwen35"})
    for (const KvMode mode : {KvMode::Resident, KvMode::Stream}) {
      SCOPED_TRACE(std::string(preset) + " " + kv_mode_name(mode));
      auto m = Model::load(std::string("synthetic:") + preset);
      std::mt19937 g(11);
      const int32_t V = m->config.n_vocab;
      const auto prompt = random_tokens(g, 75, V);
      const auto gen = random_tokens(g, 6, V);
      const std::vector<int32_t> conv = join({prompt, gen});
      const std::vector<int32_t> p[2] = {join({conv, random_tokens(g, 40, V)}),
                                         join({conv, random_tokens(g, 23, V)})};
      const auto next = random_tokens(g, 4, V);
      std::vector<std::vector<float>> logits[2];  // [cached][request * steps]
      size_t streamed = 0;
      for (const bool cached : {true, false}) {
        auto dev = make();
        Engine e(*m, *dev, small_options(*m, mode, 3, cached));
        if (cached) {
          Sequence s = e.open_sequence();
          const auto n = static_cast<int32_t>(prompt.size());
          for (int32_t j = 0; j < n; j += chunk)  // steps no larger than the cold run's
            e.step({BatchEntry{&s, prompt.data() + j, std::min(chunk, n - j)}});
          for (const int32_t t : gen) e.step({BatchEntry{&s, &t, 1}});
          e.close_sequence(s);
        }
        Sequence s[2] = {e.open_sequence(), e.open_sequence()};
        int32_t at[2] = {0, 0};
        for (int i = 0; i < 2; ++i)
          if (cached) {
            at[i] = e.reuse_prefix(s[i], p[i].data(), static_cast<int32_t>(p[i].size()));
            EXPECT_EQ(at[i], static_cast<int32_t>(conv.size()));
          }
        auto& out = logits[cached ? 0 : 1];
        std::vector<float> last[2];
        while (at[0] < static_cast<int32_t>(p[0].size()) ||
               at[1] < static_cast<int32_t>(p[1].size())) {
          std::vector<BatchEntry> batch;
          int who[2], k = 0;
          for (int i = 0; i < 2; ++i) {
            const int32_t m_i = std::min(chunk, static_cast<int32_t>(p[i].size()) - at[i]);
            if (m_i == 0) continue;
            batch.push_back({&s[i], p[i].data() + at[i], m_i});
            at[i] += m_i;
            who[k++] = i;
          }
          e.step(batch);
          for (int j = 0; j < k; ++j) {
            const float* l = e.logits(j);
            last[who[j]].assign(l, l + V);
          }
        }
        out.push_back(last[0]);
        out.push_back(last[1]);
        for (const int32_t t : next) {
          e.step({BatchEntry{&s[0], &t, 1}, BatchEntry{&s[1], &t, 1}});
          for (int j = 0; j < 2; ++j) out.emplace_back(e.logits(j), e.logits(j) + V);
        }
        if (cached) streamed = e.totals().bytes_in;
      }
      if (mode == KvMode::Stream) {
        EXPECT_GT(streamed, 0u);
      }
      ASSERT_EQ(logits[0].size(), logits[1].size());
      for (size_t i = 0; i < logits[0].size(); ++i)
        ASSERT_EQ(std::memcmp(logits[0][i].data(), logits[1][i].data(), V * sizeof(float)), 0)
            << "logits " << i;
    }
}

}  // namespace kvs::test
