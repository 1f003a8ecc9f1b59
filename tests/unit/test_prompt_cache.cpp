// The prompt cache: its chains and eviction, and the engine's contract with it on the CPU
// (tests/prompt_cache_cases.h).
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
#include "prompt_cache_cases.h"

namespace kvs {
namespace {

using namespace test;

std::vector<int32_t> page_of(int32_t v, int32_t n) {
  return std::vector<int32_t>(static_cast<size_t>(n), v);
}

PromptCacheShape shape_of(int32_t P) {
  PromptCacheShape s;
  s.page_tokens = P;
  s.page_bytes = 8;
  return s;
}

// Each cached page's bytes are its first token's value, so a find() says which pages it found.
void insert(PromptCache& c, const std::vector<int32_t>& t, int32_t n, int32_t P,
            std::vector<Checkpoint> checkpoints = {}, int32_t window_first = 0) {
  c.insert(
      t.data(), n, window_first,
      [&](int32_t i, uint8_t* kv, uint8_t* window) {
        if (kv) std::memset(kv, t[static_cast<size_t>(i * P)], 8);
        if (window) std::memset(window, t[static_cast<size_t>(i * P)] + 100, 8);
      },
      std::move(checkpoints));
}

std::vector<int32_t> found(PromptCache& c, const std::vector<int32_t>& t, int32_t* n = nullptr) {
  std::vector<int32_t> out;
  const CacheHit h = c.find(t.data(), static_cast<int32_t>(t.size()));
  for (const uint8_t* p : h.kv) out.push_back(*p);
  if (n) *n = h.n;
  return out;
}

Checkpoint checkpoint_at(int32_t pos, size_t bytes) {
  Checkpoint c{pos, std::make_unique<uint8_t[]>(bytes)};
  std::memset(c.state.get(), pos, bytes);
  return c;
}

TEST(PromptCache, ChainsMatchPrefixesUpToTheLastToken) {
  const int32_t P = 4;
  PromptCache c(100 * (8 + P * 4), shape_of(P));
  const auto a = join({page_of(1, P), page_of(2, P), page_of(3, P)});
  insert(c, a, 3 * P, P);
  int32_t n = 0;
  EXPECT_EQ(found(c, a, &n), (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(n, 3 * P);
  // The same page after another prefix is another entry; a different first page finds nothing.
  EXPECT_EQ(found(c, join({page_of(1, P), page_of(3, P)}), &n), (std::vector<int32_t>{1}));
  EXPECT_EQ(n, P);
  EXPECT_TRUE(found(c, join({page_of(2, P), page_of(3, P)}), &n).empty());
  EXPECT_EQ(n, 0);
  // One token differing inside page 2 ends the match there: page 2's first token is reused.
  auto b = a;
  b[static_cast<size_t>(P + 1)] = 9;
  EXPECT_EQ(found(c, b, &n), (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(n, P + 1);
  // Pages already cached are not filled again.
  int fills = 0;
  c.insert(a.data(), 3 * P, 0, [&](int32_t, uint8_t*, uint8_t*) { ++fills; }, {});
  EXPECT_EQ(fills, 0);
  EXPECT_EQ(c.stats().inserted, 3);
  // A sequence ending inside a page leaves a partial entry, found up to its last token.
  const auto d = join({page_of(5, P), {6, 7}});
  insert(c, d, P + 2, P);
  EXPECT_EQ(found(c, join({d, {8, 8, 8}}), &n), (std::vector<int32_t>{5, 6}));
  EXPECT_EQ(n, P + 2);
  EXPECT_EQ(found(c, join({page_of(5, P), {6, 8}}), &n), (std::vector<int32_t>{5, 6}));
  EXPECT_EQ(n, P + 1);
  EXPECT_EQ(c.find(d.data(), P + 1).n, P + 1);  // at most max_n
}

TEST(PromptCache, EvictsLeastRecentLeavesBeforeTheirParents) {
  const int32_t P = 2;
  PromptCache c(5 * (8 + P * 4), shape_of(P));  // 5 entries
  const auto a = join({page_of(1, P), page_of(2, P), page_of(3, P)});
  const auto b = join({page_of(1, P), page_of(5, P), page_of(6, P)});
  insert(c, a, 3 * P, P);
  insert(c, b, 3 * P, P);  // shares page 1: 5 entries in all
  EXPECT_EQ(c.stats().bytes, 5 * c.entry_bytes(P, false));
  EXPECT_EQ(found(c, a), (std::vector<int32_t>{1, 2, 3}));  // a is now the most recent
  const auto d = join({page_of(7, P), page_of(8, P)});
  insert(c, d, 2 * P, P);  // evicts b's leaves (6, then 5), never page 1 under a
  EXPECT_EQ(c.stats().evicted, 2);
  EXPECT_EQ(found(c, a), (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(found(c, b), (std::vector<int32_t>{1}));
  EXPECT_EQ(found(c, d), (std::vector<int32_t>{7, 8}));
  // A chain longer than the budget keeps its first pages.
  PromptCache small(2 * (8 + P * 4), shape_of(P));
  insert(small, a, 3 * P, P);
  EXPECT_EQ(found(small, a), (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(small.stats().bytes, 2 * small.entry_bytes(P, false));
}

// Recurrent models resume only where a state was kept: the last checkpoint at or before the
// match, whose bytes come back; checkpoints count in the cache's bytes and leave with their page.
TEST(PromptCache, RecurrentHitsRoundDownToCheckpoints) {
  const int32_t P = 4;
  const size_t S = 32;
  PromptCacheShape sh = shape_of(P);
  sh.state_bytes = S;
  PromptCache c(1000, sh);
  const auto a = join({page_of(1, P), page_of(2, P), {3, 3}});  // 10 positions
  std::vector<Checkpoint> cps;
  cps.push_back(checkpoint_at(3, S));
  cps.push_back(checkpoint_at(10, S));
  insert(c, a, 10, P, std::move(cps));
  EXPECT_EQ(c.stats().checkpoints, 2);
  EXPECT_EQ(c.stats().checkpoint_bytes, 2 * S);
  EXPECT_EQ(c.stats().bytes, 2 * c.entry_bytes(P, false) + c.entry_bytes(2, false) + 2 * S);
  int32_t n = 0;
  EXPECT_EQ(found(c, join({a, {9}}), &n).size(), 3u);
  EXPECT_EQ(n, 10);
  CacheHit h = c.find(a.data(), 9);  // the match stops before 10: back to 3
  EXPECT_EQ(h.n, 3);
  ASSERT_NE(h.state, nullptr);
  EXPECT_EQ(h.state[0], 3);
  EXPECT_EQ(h.state[S - 1], 3);
  EXPECT_EQ(h.kv.size(), 1u);
  EXPECT_EQ(c.find(a.data(), 2).n, 0);  // before the first checkpoint: nothing
  // Evicting every entry takes their checkpoints too.
  PromptCache tiny(3 * c.entry_bytes(P, false) + S, sh);
  std::vector<Checkpoint> one;
  one.push_back(checkpoint_at(10, S));
  insert(tiny, a, 10, P, std::move(one));
  EXPECT_EQ(tiny.stats().checkpoints, 1);
  insert(tiny, join({page_of(7, P), page_of(7, P), page_of(7, P)}), 3 * P, P);
  EXPECT_EQ(tiny.stats().checkpoints, 0);
  EXPECT_EQ(tiny.stats().checkpoint_bytes, 0u);
  EXPECT_EQ(tiny.find(a.data(), 10).n, 0);
}

// A later turn extends a conversation whose earlier prompt ended inside a page: the earlier
// turn's checkpoint lives in its partial page, beside the later turn's whole page that begins
// alike, and a prompt that leaves the conversation after the earlier turn resumes there.
TEST(PromptCache, RecurrentHitsFindCheckpointsOfEarlierTurns) {
  const int32_t P = 4;
  const size_t S = 16;
  PromptCacheShape sh = shape_of(P);
  sh.state_bytes = S;
  PromptCache c(1000, sh);
  const auto turn1 = join({page_of(1, P), {2, 2}});          // 6 positions
  const auto turn2 = join({turn1, {5, 5}, page_of(6, P)});   // 12: page 1 is {2, 2, 5, 5}
  std::vector<Checkpoint> one, two;
  one.push_back(checkpoint_at(5, S));  // before turn 1's last token
  two.push_back(checkpoint_at(11, S));
  insert(c, turn1, 6, P, std::move(one));
  insert(c, turn2, 12, P, std::move(two));
  CacheHit h = c.find(join({turn1, {9, 9}}).data(), 7);
  EXPECT_EQ(h.n, 5);
  ASSERT_NE(h.state, nullptr);
  EXPECT_EQ(h.state[0], 5);
  EXPECT_EQ(c.find(join({turn2, {9}}).data(), 12).n, 11);
}

// Window layers: a resume needs the window pages its first query can see; a sequence keeps
// them from window_first on, so a match far before its end is not usable.
TEST(PromptCache, WindowPagesBoundWhereAResumeCanStart) {
  const int32_t P = 4;
  PromptCacheShape sh = shape_of(P);
  sh.window_bytes = 8;
  sh.window_back = 5;
  PromptCache c(1000, sh);
  std::vector<int32_t> a;
  for (int32_t i = 0; i < 6; ++i) a = join({a, page_of(i + 1, P)});  // 24 positions
  // window pages 4 and 5 kept
  insert(c, a, 24, P, {}, 4);
  int32_t n = 0;
  EXPECT_EQ(found(c, join({a, {0}}), &n).size(), 6u);
  EXPECT_EQ(n, 24);
  CacheHit h = c.find(a.data(), 22);  // needs pages (22 - 5) / 4 = 4 on: kept
  EXPECT_EQ(h.n, 22);
  EXPECT_EQ(h.window[4][0], 105);
  EXPECT_EQ(h.window[0], nullptr);
  EXPECT_EQ(c.find(a.data(), 19).n, 0);  // needs page 3's window, which went
  // A later sequence that ends there brings them.
  insert(c, a, 19, P, {}, 3);
  EXPECT_EQ(c.find(a.data(), 19).n, 19);
}

TEST(PromptCache, CheckpointsAreEvenlySpacedInsideAPrompt) {
  int due = 0;
  for (int32_t at = 0; at < 990; at += 10) due += checkpoint_due(at, at + 10, 1000, 4);
  EXPECT_EQ(due, 4);
  EXPECT_TRUE(checkpoint_due(990, 999, 1000, 4));  // before the last token, read alone
  EXPECT_TRUE(checkpoint_due(990, 999, 1000, 0));
  EXPECT_FALSE(checkpoint_due(999, 1000, 1000, 4));
  EXPECT_FALSE(checkpoint_due(0, 500, 1000, 0));
}

MakeDevice cpu() {
  return [] { return make_cpu_device(0); };
}

TEST(PromptCacheExact, CachedPrefixesGiveTheColdLogits) {
  cached_prefixes_give_the_cold_logits(cpu(), {"tiny", "tiny-qwen2", "tiny-qwen3", "tiny:q4_0"},
                                       20261231, 24, 18, 4);
}

// Gemma 3: window layers beside the full ones (a window of 32 positions: pages behind it
// are gone when the first sequence closes).
TEST(PromptCacheExact, WindowLayersGiveTheColdLogits) {
  cached_prefixes_give_the_cold_logits(cpu(), {"tiny-gemma3"}, 20261207, 16, 9, 3);
}

// Qwen3.5: Gated DeltaNet layers resume from a checkpoint's state.
TEST(PromptCacheExact, RecurrentLayersGiveTheColdLogits) {
  cached_prefixes_give_the_cold_logits(cpu(), {"tiny-qwen35", "tiny-qwen35:q4_0"}, 20261208, 16,
                                       9, 3);
}

TEST(PromptCacheExact, RecurrentCheckpointsWhereTheyAreTaken) {
  recurrent_checkpoints_where_they_are_taken(cpu(), 32);
}

TEST(PromptCacheExact, SequencesShareACachedPrefixAtOnce) {
  sequences_share_a_cached_prefix_at_once(cpu(), 13);
}

// Engine::publish (serve's n choices): a sequence's prompt goes into the cache while it lives;
// a second sequence reuses all of it but the last token and has the cold logits, and the first
// goes on as if nothing happened; every layer kind, resident and streamed.
TEST(PromptCacheExact, PublishedPromptsServeOtherSequencesAtOnce) {
  for (const char* preset : {"tiny", "tiny-gemma3", "tiny-qwen35"})
    for (const KvMode mode : {KvMode::Resident, KvMode::Stream}) {
      SCOPED_TRACE(std::string(preset) + " " + kv_mode_name(mode));
      auto m = Model::load(std::string("synthetic:") + preset);
      std::mt19937 g(5);
      const int32_t V = m->config.n_vocab;
      const auto prompt = random_tokens(g, 70, V);
      const int32_t n = static_cast<int32_t>(prompt.size());
      const int32_t next = 3;
      std::vector<float> want[2], got[2];  // [the second sequence, the first's next step]
      for (const bool cached : {true, false}) {
        auto dev = cpu()();
        Engine e(*m, *dev, small_options(*m, mode, 2, cached));
        Sequence a = e.open_sequence();
        e.eval(a, prompt.data(), n);
        if (cached) e.publish(a);
        Sequence b = e.open_sequence();
        const int32_t reused = e.reuse_prefix(b, prompt.data(), n);
        if (cached) {
          EXPECT_EQ(reused, n - 1);
        }
        const float* lb = e.eval(b, prompt.data() + reused, n - reused);
        (cached ? got : want)[0].assign(lb, lb + V);
        e.step({BatchEntry{&a, &next, 1}});
        const float* la = e.logits(0);
        (cached ? got : want)[1].assign(la, la + V);
      }
      for (int i = 0; i < 2; ++i)
        ASSERT_EQ(std::memcmp(got[i].data(), want[i].data(), got[i].size() * sizeof(float)), 0)
            << (i ? "the first sequence's next step" : "the second sequence");
    }
}

}  // namespace
}  // namespace kvs
