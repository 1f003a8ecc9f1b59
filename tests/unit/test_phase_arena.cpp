// The phase arena: the prefill's workspace (activations of -b tokens and the backend's prefill
// scratch) is the top of the KV arena, lent to the KV between prefills and taken back by each
// prefill. It changes where pages live, never the arithmetic: logits stay bit-identical to
// resident ones with and without it, while the decode's arena grows by the workspace.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kvs/backend/device.h"
#include "kvs/engine/engine.h"
#include "kvs/model/model.h"
#include "kvs/util/error.h"
#include "stream_cases.h"

namespace kvs {
namespace {

using namespace kvs::test;

// Three sequences, each starting while the one before decodes: the phase switches at every
// prompt chunk and back at the next decode step.
Case staggered(const char* preset) {
  Case c;
  c.preset = preset;
  c.page = 8;
  c.batch = 40;
  c.n_ctx = 384;
  c.kt = DType::Q8_0;
  c.vt = DType::F16;
  c.prompt_len = {130, 75, 96};
  c.gen_len = {60, 45, 30};
  c.chunk = 2048;
  c.stagger = 12;
  return c;
}

TEST(PhaseArena, LogitsAreTheSameWithAndWithoutItInEveryMode) {
  for (const char* preset : {"tiny", "tiny-qwen3", "tiny-gemma3"}) {
    Case c = staggered(preset);
    auto m = Model::load(std::string("synthetic:") + preset);
    c.phase_arena = false;
    const Result want = run(*m, c, KvMode::Resident, 0);
    for (KvMode mode : {KvMode::Resident, KvMode::Host, KvMode::Auto, KvMode::Stream})
      for (bool phase : {false, true}) {
        c.phase_arena = phase;
        const bool streams = mode == KvMode::Auto || mode == KvMode::Stream;
        const Result got = run(*m, c, mode, streams ? min_arena(*m, c) + (64 << 10) : 0);
        expect_same(want, got, cat(preset, " ", kv_mode_name(mode), " phase arena ", phase));
        // Only the streaming modes have a workspace to lend.
        EXPECT_EQ(got.totals.workspace_taken > 0, phase && streams) << kv_mode_name(mode);
        if (phase && streams) {
          EXPECT_GE(got.totals.workspace_taken, 3) << "a prefill after decode takes it back";
        }
      }
  }
}

// Under a bounded device the arena is what the weights and buffers leave: with the phase arena
// the prefill's activations are not buffers of their own, so the decode's arena is larger by
// them, and more of the KV stays resident while decoding.
TEST(PhaseArena, TheDecodeArenaIsLargerByTheWorkspace) {
  auto m = Model::load("synthetic:tiny");
  EngineOptions o;
  o.n_ctx = 2048;
  o.n_batch = 128;
  o.page_size = 16;
  const size_t page =
      KvLayout::make(o.k_type, o.v_type, o.page_size, m->config.n_head_kv, m->config.head_dim)
          .page_bytes();
  size_t cap = 0;
  {
    auto dev = make_cpu_device(0);
    o.phase_arena = false;
    Engine e(*m, *dev, o);
    cap = dev->used() - e.arena_bytes() / 2;  // half the KV fits
  }
  struct Seen {
    size_t arena = 0, work = 0;
    int64_t decode_resident = 0;
    bool prefill_phase = false, decode_phase = true;
  };
  const auto seen = [&](bool phase) {
    auto dev = make_cpu_device(cap);
    o.phase_arena = phase;
    Engine e(*m, *dev, o);
    Seen s;
    s.arena = e.arena_bytes();
    s.work = e.workspace_bytes();
    Sequence q = e.open_sequence();
    e.fill_random(q, 1800, 3);
    s.prefill_phase = e.in_prefill_phase();
    int32_t t = 1;
    e.eval(q, &t, 1);
    s.decode_phase = !e.in_prefill_phase();
    s.decode_resident = e.plan().resident[0];
    EXPECT_LE(dev->used(), cap);
    return s;
  };
  const Seen off = seen(false), on = seen(true);
  EXPECT_EQ(off.work, 0u);
  EXPECT_FALSE(off.prefill_phase);
  const size_t acts = Engine::pass_bytes(m->config, o.n_batch);
  EXPECT_GE(on.work, acts);
  EXPECT_LT(on.work, acts + 256 + page);
  // What the decode's buffers of one row leave of the prefill's activations, to a page.
  const size_t gain = acts - Engine::pass_bytes(m->config, o.n_seq);
  EXPECT_GE(on.arena + page, off.arena + gain);
  EXPECT_LE(on.arena, off.arena + gain + page);
  EXPECT_TRUE(on.prefill_phase);
  EXPECT_TRUE(on.decode_phase);
  EXPECT_GT(on.decode_resident, off.decode_resident + 5);
}

// At the smallest arena a prefill can run in, every prefill after a decode step must clear the
// workspace's frames again (relocating the ring, evicting resident copies, moving the pages
// being written) and still give the resident logits.
TEST(PhaseArena, APrefillAfterDecodeTakesItBackAtTheMinimumArena) {
  for (const char* preset : {"tiny", "tiny-qwen2:q4_0"}) {
    Case c = staggered(preset);
    c.stagger = 5;
    auto m = Model::load(std::string("synthetic:") + preset);
    const Result want = run(*m, c, KvMode::Resident, 0);
    for (KvMode mode : {KvMode::Auto, KvMode::Stream}) {
      const Result got = run(*m, c, mode, min_arena(*m, c));
      expect_same(want, got, cat(preset, " ", kv_mode_name(mode)));
      EXPECT_GE(got.totals.workspace_taken, 3);
      EXPECT_GT(got.totals.bytes_in, 0u);
    }
  }
  // The phases seen from outside: a prompt chunk holds the workspace, a decode step lends it.
  auto m = Model::load("synthetic:tiny");
  const Case c = staggered("tiny");
  auto dev = make_cpu_device(0);
  EngineOptions o = options(c);
  o.kv_mode = KvMode::Stream;
  o.kv_arena = min_arena(*m, c);
  Engine e(*m, *dev, o);
  EXPECT_EQ(e.arena_bytes(), o.kv_arena + e.workspace_bytes());
  const std::vector<int32_t> p = tokens(9, 100, m->config.n_vocab);
  Sequence a = e.open_sequence();
  e.eval(a, p.data(), 100);
  EXPECT_TRUE(e.in_prefill_phase());
  const Plan prefill = e.plan();
  e.eval(a, p.data(), 1);
  EXPECT_FALSE(e.in_prefill_phase());
  // The decode's plan has the workspace's frames for resident pages.
  EXPECT_GT(e.plan().resident[0], prefill.resident[0]);
  Sequence b = e.open_sequence();
  e.step({{&a, p.data(), 1}, {&b, p.data(), 30}});
  EXPECT_TRUE(e.in_prefill_phase());
  e.step({{&a, p.data(), 1}, {&b, p.data(), 1}});
  EXPECT_FALSE(e.in_prefill_phase());
  EXPECT_EQ(e.totals().workspace_taken, 2);
}

TEST(PhaseArena, ArenasBelowTheMinimumNameTheWorkspace) {
  auto m = Model::load("synthetic:tiny");
  const Case c = staggered("tiny");
  EngineOptions o = options(c);
  o.kv_mode = KvMode::Auto;
  const auto error = [&](size_t capacity) {
    auto dev = make_cpu_device(capacity);
    return refusal(*m, *dev, o);
  };
  o.kv_arena = min_arena(*m, c) - 1;
  std::string w = error(0);
  EXPECT_NE(w.find("--kv-arena"), std::string::npos) << w;
  EXPECT_NE(w.find("workspace"), std::string::npos) << w;
  // A device that holds exactly the minimum arena beside the workspace runs; a byte less does
  // not, and says why.
  o.kv_arena = min_arena(*m, c);
  size_t exact = 0;
  {
    auto dev = make_cpu_device(0);
    Engine e(*m, *dev, o);
    exact = dev->used();
  }
  o.kv_arena = 0;
  EXPECT_EQ(error(exact), "");
  w = error(exact - 1);
  EXPECT_NE(w.find("--vram-limit"), std::string::npos) << w;
  EXPECT_NE(w.find("workspace"), std::string::npos) << w;
  EXPECT_NE(w.find("minimum"), std::string::npos) << w;
}

}  // namespace
}  // namespace kvs
