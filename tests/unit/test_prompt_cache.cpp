// The prompt cache: its chains and eviction, and the engine's contract with it: a sequence
// whose prompt begins with cached pages gets, for every later token, logits bit-identical to a
// cold run of the same tokens, whatever the mode (resident, streamed through the smallest
// arena, host), page size, cache types and chunking, with other sequences in the same steps.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <random>
#include <sstream>
#include <vector>

#include "kvs/backend/device.h"
#include "kvs/engine/engine.h"
#include "kvs/engine/prompt_cache.h"
#include "kvs/model/model.h"
#include "kvs/util/error.h"

namespace kvs {
namespace {

std::vector<int32_t> page_of(int32_t v, int32_t n) {
  return std::vector<int32_t>(static_cast<size_t>(n), v);
}

std::vector<int32_t> join(std::initializer_list<std::vector<int32_t>> parts) {
  std::vector<int32_t> out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

// Each cached page's bytes are its first token's value, so a find() says which pages it found.
void insert(PromptCache& c, const std::vector<int32_t>& t, int32_t pages, int32_t P) {
  c.insert(t.data(), pages,
           [&](int32_t i, uint8_t* dst) { std::memset(dst, t[static_cast<size_t>(i * P)], 8); });
}

std::vector<int32_t> found(PromptCache& c, const std::vector<int32_t>& t, int32_t P) {
  std::vector<int32_t> out;
  for (const uint8_t* p : c.find(t.data(), static_cast<int32_t>(t.size()) / P)) out.push_back(*p);
  return out;
}

TEST(PromptCache, ChainsMatchWholePrefixesOnly) {
  const int32_t P = 4;
  PromptCache c(100 * (8 + P * 4), P, 8);
  const auto a = join({page_of(1, P), page_of(2, P), page_of(3, P)});
  insert(c, a, 3, P);
  EXPECT_EQ(found(c, a, P), (std::vector<int32_t>{1, 2, 3}));
  // The same page after another prefix is another entry; a different first page finds nothing.
  EXPECT_EQ(found(c, join({page_of(1, P), page_of(3, P)}), P), (std::vector<int32_t>{1}));
  EXPECT_TRUE(found(c, join({page_of(2, P), page_of(3, P)}), P).empty());
  // One token differing inside page 2 stops the chain there.
  auto b = a;
  b[static_cast<size_t>(P + 1)] = 9;
  EXPECT_EQ(found(c, b, P), (std::vector<int32_t>{1}));
  // Pages already cached are not filled again.
  int fills = 0;
  c.insert(a.data(), 3, [&](int32_t, uint8_t*) { ++fills; });
  EXPECT_EQ(fills, 0);
  EXPECT_EQ(c.stats().inserted, 3);
}

TEST(PromptCache, EvictsLeastRecentLeavesBeforeTheirParents) {
  const int32_t P = 2;
  PromptCache c(5 * (8 + P * 4), P, 8);  // 5 entries
  const auto a = join({page_of(1, P), page_of(2, P), page_of(3, P)});
  const auto b = join({page_of(1, P), page_of(5, P), page_of(6, P)});
  insert(c, a, 3, P);
  insert(c, b, 3, P);  // shares page 1: 5 entries in all
  EXPECT_EQ(c.stats().bytes, 5 * c.entry_bytes());
  EXPECT_EQ(found(c, a, P), (std::vector<int32_t>{1, 2, 3}));  // a is now the most recent
  const auto d = join({page_of(7, P), page_of(8, P)});
  insert(c, d, 2, P);  // evicts b's leaves (6, then 5), never page 1 under a
  EXPECT_EQ(c.stats().evicted, 2);
  EXPECT_EQ(found(c, a, P), (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(found(c, b, P), (std::vector<int32_t>{1}));
  EXPECT_EQ(found(c, d, P), (std::vector<int32_t>{7, 8}));
  // A chain longer than the budget keeps its first pages.
  PromptCache small(2 * (8 + P * 4), P, 8);
  insert(small, a, 3, P);
  EXPECT_EQ(found(small, a, P), (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(small.stats().bytes, 2 * small.entry_bytes());
}

struct Case {
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

std::vector<int32_t> random_tokens(std::mt19937& g, int32_t n, int32_t vocab) {
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
Turns run(const Model& m, const Case& c, bool cached, const std::vector<int32_t>& prompt1,
          const std::vector<int32_t>& gen1, const std::vector<int32_t>& prompt2,
          const std::vector<int32_t>& gen2) {
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
  auto dev = make_cpu_device(0);
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

// Random cases in every mode: the second prompt continues the first sequence's tokens, or
// leaves them at a random point (inside a page, at its edge, before the first page ends).
TEST(PromptCacheExact, CachedPrefixesGiveTheColdLogits) {
  std::mt19937 g(20261231);
  const char* presets[] = {"tiny", "tiny-qwen2", "tiny-qwen3", "tiny:q4_0"};
  const DType types[] = {DType::F16, DType::Q8_0, DType::Q4_0};
  const int32_t pages[] = {4, 8, 16, 32};
  int hits = 0, streamed = 0;
  for (int k = 0; k < 24; ++k) {
    Case c;
    c.preset = presets[g() % 4];
    c.page = pages[g() % 4];
    c.kt = types[g() % 3];
    c.vt = types[g() % 3];
    c.batch = static_cast<int32_t>(8 + g() % 57);
    c.neighbour = g() % 2 == 0;
    const int mode = k % 4;  // resident, auto, stream through the smallest arena, host
    c.mode = mode == 0   ? KvMode::Resident
             : mode == 1 ? KvMode::Auto
             : mode == 2 ? KvMode::Stream
                         : KvMode::Host;
    c.small_arena = mode == 2;
    auto m = Model::load(std::string("synthetic:") + c.preset);
    const int32_t V = m->config.n_vocab;
    const auto prompt1 = random_tokens(g, static_cast<int32_t>(1 + g() % 150), V);
    const auto gen1 = random_tokens(g, static_cast<int32_t>(g() % 20), V);
    std::vector<int32_t> prompt2 = join({prompt1, gen1});
    const int32_t kept = g() % 3 == 0 ? static_cast<int32_t>(g() % (prompt2.size() + 1))
                                      : static_cast<int32_t>(prompt2.size());
    prompt2.resize(static_cast<size_t>(kept));
    const auto more = random_tokens(g, static_cast<int32_t>(1 + g() % 60), V);
    prompt2.insert(prompt2.end(), more.begin(), more.end());
    const auto gen2 = random_tokens(g, 5, V);
    SCOPED_TRACE(c.str() + " prompts " + std::to_string(prompt1.size()) + "+" +
                 std::to_string(gen1.size()) + ", " + std::to_string(kept) + "+" +
                 std::to_string(more.size()));
    const Turns warm = run(*m, c, true, prompt1, gen1, prompt2, gen2);
    const Turns cold = run(*m, c, false, prompt1, gen1, prompt2, gen2);
    // Whole pages, both sequences' tokens alike, at least the last token left to read.
    const int32_t want = std::min({warm.first_pages, kept / c.page,
                                   (static_cast<int32_t>(prompt2.size()) - 1) / c.page}) *
                         c.page;
    ASSERT_EQ(warm.reused, want);
    ASSERT_EQ(warm.logits.size(), cold.logits.size());
    for (size_t i = 0; i < warm.logits.size(); ++i)
      ASSERT_EQ(std::memcmp(warm.logits[i].data(), cold.logits[i].data(),
                            warm.logits[i].size() * sizeof(float)),
                0)
          << "logits " << i << " differ (" << warm.reused << " positions from the cache)";
    hits += warm.reused > 0;
    streamed += c.small_arena && warm.streamed > 0;
  }
  EXPECT_GE(hits, 14);     // the cases must reuse pages, not miss
  EXPECT_GE(streamed, 4);  // and the smallest arenas must stream them
}

// The cache on a model with window layers is refused by name, not silently inexact.
TEST(PromptCacheExact, WindowAndRecurrentModelsAreRefused) {
  for (const char* preset : {"tiny-gemma3", "tiny-qwen35"}) {
    auto m = Model::load(std::string("synthetic:") + preset);
    auto dev = make_cpu_device(0);
    EngineOptions o;
    o.n_ctx = 128;
    o.cache_ram = size_t{1} << 20;
    try {
      Engine e(*m, *dev, o);
      FAIL() << preset << ": accepted";
    } catch (const Error& err) {
      EXPECT_NE(std::string(err.what()).find("--cache-ram"), std::string::npos) << err.what();
    }
  }
}

}  // namespace
}  // namespace kvs
