// The correctness contract of streaming: whatever the arena, the ring, the page size, the cache
// types and the mix of sequences, streamed logits are bit-identical to resident ones. Host mode
// runs the same CPU kernels over the host store, so on the CPU backend it is exact too
// (tolerance 0). Cases are random but seeded; a failure prints the case.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <random>
#include <sstream>
#include <vector>

#include "kvs/backend/device.h"
#include "kvs/engine/engine.h"
#include "kvs/model/model.h"
#include "kvs/util/error.h"
#include "stream_cases.h"

namespace kvs {
namespace {

using namespace kvs::test;

TEST(StreamExact, RandomCasesAreBitIdenticalToResident) {
  std::mt19937 g(20261203);
  int streamed_cases = 0, repartitioned_cases = 0;
  for (int k = 0; k < 28; ++k) {
    const Case c = random_case(g, k);
    auto m = Model::load("synthetic:" + c.preset);
    const size_t arena = case_arena(*m, c);
    SCOPED_TRACE(c.str());
    const Result want = run(*m, c, KvMode::Resident, 0);
    const Result got = run(*m, c, c.mode, arena);
    expect_same(want, got, c.str());
    if (got.totals.bytes_in > 0) ++streamed_cases;
    if (got.totals.repartitions > 1) ++repartitioned_cases;
  }
  // The cases must really exercise the mechanism, not fit everything.
  EXPECT_GE(streamed_cases, 14);
  EXPECT_GE(repartitioned_cases, 3);
}

// With the phase arena too, and with the later sequences' prompts going in while the first
// decodes: every prefill takes the workspace back and the next decode step lends it again.
TEST(StreamExact, LongerContextsCrossManyRepartitions) {
  Case c;
  c.preset = "tiny-qwen2";
  c.page = 8;
  c.batch = 32;
  c.n_ctx = 1024;
  c.kt = DType::Q8_0;
  c.vt = DType::Q4_0;
  c.prompt_len = {300, 40, 120};
  c.gen_len = {120, 200, 60};
  c.chunk = 4096;
  auto m = Model::load("synthetic:" + c.preset);
  for (int32_t stagger : {0, 30}) {
    c.stagger = stagger;
    const Result want = run(*m, c, KvMode::Resident, 0);
    for (double frac : {0.0, 0.05, 0.2, 0.5, 1.0}) {
      const size_t lo = min_arena(*m, c), hi = full_arena(*m, c);
      const size_t arena = lo + static_cast<size_t>(frac * static_cast<double>(hi - lo));
      for (KvMode mode : {KvMode::Auto, KvMode::Stream})
        for (bool phase : {false, true}) {
          c.phase_arena = phase;
          const std::string what = cat(kv_mode_name(mode), " arena fraction ", frac,
                                       " phase arena ", phase, " stagger ", stagger);
          const Result got = run(*m, c, mode, arena);
          expect_same(want, got, what);
          if (mode == KvMode::Auto && frac == 1.0) {
            EXPECT_EQ(got.totals.bytes_in, 0u) << "everything fits: nothing may stream";
            EXPECT_FALSE(got.plan.streams());
          }
          if (frac < (phase ? 0.1 : 0.5)) {
            EXPECT_GT(got.totals.bytes_in, 0u) << what;
          }
          // A prompt after decode steps takes the workspace back: once when the prompts go
          // first, once a sequence when they start later.
          EXPECT_EQ(got.totals.workspace_taken, phase ? (stagger ? 3 : 1) : 0) << what;
        }
    }
  }
}

TEST(StreamExact, HostModeEqualsResident) {
  for (const char* preset : {"tiny", "tiny-qwen3"}) {
    Case c;
    c.preset = preset;
    c.page = 16;
    c.batch = 48;
    c.kt = DType::Q8_0;
    c.vt = DType::F16;
    c.prompt_len = {100, 37};
    c.gen_len = {20, 30};
    auto m = Model::load(std::string("synthetic:") + preset);
    expect_same(run(*m, c, KvMode::Resident, 0), run(*m, c, KvMode::Host, 0), preset);
  }
}

// Window layers keep their last n_swa positions resident and never stream, while the full
// layers stream as before. Random windows (below a page to past the context), layer kinds
// (tiny presets with patterns of two layers, and tiny-gemma3), arenas and 1-4 sequences. The
// resident run's pool holds exactly the windows' frames, so a frame the window does not give back
// fails it.
TEST(StreamExact, WindowLayersAreBitIdenticalToResident) {
  std::mt19937 g(20261205);
  const LayerKind W = LayerKind::Window, F = LayerKind::Full;
  const std::vector<LayerKind> patterns[] = {{W, F}, {F, W}, {W, W}};
  int streamed_cases = 0;
  for (int k = 0; k < 24; ++k) {
    Case c = random_case(g, k);
    if (k % 3 == 1) c.preset = k % 2 ? "tiny-gemma3" : "tiny-gemma3:q4_0";  // 5 window, 1 full
    auto m = Model::load("synthetic:" + c.preset);
    const int p = static_cast<int>(g() % 3);
    if (m->config.arch != Arch::Gemma3) m->config.kinds = patterns[p];
    // Mostly windows well behind the history, whose pages must be recycled; some past it.
    m->config.n_swa = static_cast<int32_t>(k % 4 == 3 ? 1 + g() % 600 : 1 + g() % 64);
    c.n_ctx = 512;
    c.gen_len[0] += 250;
    const size_t arena = case_arena(*m, c);
    SCOPED_TRACE(cat(c.str(), " window ", m->config.n_swa, " pattern ", p));
    const Result want = run(*m, c, KvMode::Resident, 0);
    const Result got = run(*m, c, c.mode, arena);
    expect_same(want, got, c.str());
    if (got.totals.bytes_in > 0) ++streamed_cases;
    if (p == 2 && m->config.arch != Arch::Gemma3) {
      EXPECT_EQ(got.totals.bytes_in, 0u) << "window layers only: nothing may stream";
    }
    if (k % 4 == 0) expect_same(want, run(*m, c, KvMode::Host, 0), "host");
  }
  EXPECT_GE(streamed_cases, 8);
}

// Recurrent layers (tiny-qwen35: 6 Gated DeltaNet layers, 2 full) keep one resident state per
// sequence beside the arena while the full layers stream: random arenas, page sizes, cache
// types, 1-4 sequences that close as they end, staggered starts, prompts over several of the
// prefill's delta-rule chunks, host mode too.
TEST(StreamExact, RecurrentLayersAreBitIdenticalToResident) {
  std::mt19937 g(20261206);
  int streamed_cases = 0;
  for (int k = 0; k < 16; ++k) {
    Case c = random_case(g, k);
    c.preset = k % 2 ? "tiny-qwen35" : "tiny-qwen35:q4_0";
    c.prompt_len[0] += 100;  // past a chunk of 64 whatever the draw
    c.n_ctx = 512;
    auto m = Model::load("synthetic:" + c.preset);
    const size_t arena = case_arena(*m, c);
    SCOPED_TRACE(c.str());
    const Result want = run(*m, c, KvMode::Resident, 0);
    const Result got = run(*m, c, c.mode, arena);
    expect_same(want, got, c.str());
    if (got.totals.bytes_in > 0) ++streamed_cases;
    if (k % 4 == 0) expect_same(want, run(*m, c, KvMode::Host, 0), "host");
  }
  EXPECT_GE(streamed_cases, 6);
}

// A sequence opened in a slot another one closed starts from zero recurrent states: its logits
// are those of the same tokens in a fresh engine, while the slot beside it stays open.
TEST(StreamExact, AReopenedSequenceStartsFromZeroRecurrentState) {
  auto m = Model::load("synthetic:tiny-qwen35");
  const int32_t V = m->config.n_vocab;
  const std::vector<int32_t> a = test::tokens(1, 90, V), b = test::tokens(2, 70, V),
                             other = test::tokens(3, 40, V);
  for (KvMode mode : {KvMode::Resident, KvMode::Stream, KvMode::Host}) {
    const auto engine = [&](Device& dev) {
      EngineOptions o;
      o.n_ctx = 256;
      o.n_batch = 32;
      o.page_size = 16;
      o.n_seq = 2;
      o.kv_mode = mode;
      return std::make_unique<Engine>(*m, dev, o);
    };
    auto dev = make_cpu_device(0), dev2 = make_cpu_device(0);
    auto fresh = engine(*dev);
    Sequence s = fresh->open_sequence();
    const float* l = fresh->eval(s, b.data(), static_cast<int32_t>(b.size()));
    const std::vector<float> want(l, l + V);

    auto e = engine(*dev2);
    Sequence s0 = e->open_sequence(), s1 = e->open_sequence();
    e->eval(s0, a.data(), static_cast<int32_t>(a.size()));
    e->eval(s1, other.data(), static_cast<int32_t>(other.size()));
    e->close_sequence(s0);
    Sequence s2 = e->open_sequence();
    ASSERT_EQ(s2.id, 0);
    l = e->eval(s2, b.data(), static_cast<int32_t>(b.size()));
    EXPECT_EQ(std::memcmp(l, want.data(), want.size() * sizeof(float)), 0)
        << kv_mode_name(mode) << ": the reopened sequence's state was not zero";
  }
}

// A window as long as the history masks nothing: the logits are those of full layers, bit for
// bit; one token shorter, the first token drops out and they differ.
TEST(StreamExact, AWindowMasksOnlyWhatIsBehindIt) {
  Case c;
  c.preset = "tiny";
  c.page = 8;
  c.prompt_len = {60};
  c.gen_len = {0};
  auto m = Model::load("synthetic:tiny");
  const Result full = run(*m, c, KvMode::Resident, 0);
  m->config.kinds = {LayerKind::Window, LayerKind::Window};
  m->config.n_swa = 60;
  expect_same(full, run(*m, c, KvMode::Resident, 0), "window 60");
  m->config.n_swa = 59;
  EXPECT_NE(run(*m, c, KvMode::Resident, 0).logits, full.logits);
}

// bench --fill random: random K/V rows written straight into the cache, then decode steps. The
// rows land where a prefill would put them, so every mode decodes the same logits, and the same
// seed gives the same cache.
TEST(StreamExact, RandomFillDecodesAlikeInEveryMode) {
  auto m = Model::load("synthetic:tiny-qwen3");
  const KvLayout l =
      KvLayout::make(DType::Q8_0, DType::Q4_0, 16, m->config.n_head_kv, m->config.head_dim);
  const auto decode = [&](KvMode mode, size_t arena, uint32_t seed, bool phase = false) {
    auto dev = make_cpu_device(0);
    EngineOptions o;
    o.phase_arena = phase;
    o.n_ctx = 700;
    o.n_batch = 64;
    o.page_size = 16;
    o.k_type = DType::Q8_0;
    o.v_type = DType::Q4_0;
    o.kv_mode = mode;
    o.kv_arena = arena;
    o.ring_chunk_bytes = 2 * l.page_bytes();
    Engine e(*m, *dev, o);
    Sequence s = e.open_sequence();
    e.fill_random(s, 300, seed);
    e.fill_random(s, 301, seed + 1);  // continues the sequence, across a partial page
    EXPECT_EQ(s.n_past, 601);
    std::vector<float> out;
    int32_t t = 7;
    for (int i = 0; i < 12; ++i) {
      const float* lg = e.eval(s, &t, 1);
      out.insert(out.end(), lg, lg + m->config.n_vocab);
      t = static_cast<int32_t>(std::max_element(lg, lg + m->config.n_vocab) - lg);
    }
    return std::make_pair(out, e.totals().bytes_in);
  };
  const auto want = decode(KvMode::Resident, 0, 5);
  // 2 layers x 38 pages of KV; the arena holds the 14 fixed frames and 30 more.
  const size_t small = 44 * l.page_bytes();
  for (KvMode mode : {KvMode::Auto, KvMode::Stream, KvMode::Host}) {
    const auto got = decode(mode, mode == KvMode::Host ? 0 : small, 5);
    ASSERT_EQ(got.first.size(), want.first.size());
    EXPECT_EQ(std::memcmp(got.first.data(), want.first.data(), want.first.size() * sizeof(float)),
              0)
        << kv_mode_name(mode);
    if (mode != KvMode::Host) {
      EXPECT_GT(got.second, 0u) << kv_mode_name(mode) << " must stream";
    }
    // The fill's chunks of -b rows take the workspace; the decode lends it to the KV.
    EXPECT_EQ(decode(mode, mode == KvMode::Host ? 0 : small, 5, true).first, want.first)
        << kv_mode_name(mode) << " with the phase arena";
  }
  EXPECT_NE(decode(KvMode::Resident, 0, 6).first, want.first) << "the seed must matter";
}

// The smallest rings: one slot of one page (the minimum arena) and two slots; the copy engine
// must wait for every consumed fence and the compute for every ready fence, or the logits differ
// (or, under ThreadSanitizer, a race is reported).
TEST(StreamRing, SmallestRingsNeitherOverwriteNorDeadlock) {
  Case c;
  c.preset = "tiny";
  c.page = 4;
  c.batch = 16;
  c.prompt_len = {70, 23};
  c.gen_len = {25, 40};
  auto m = Model::load("synthetic:tiny");
  const Result want = run(*m, c, KvMode::Resident, 0);
  const KvLayout l = KvLayout::make(c.kt, c.vt, c.page, m->config.n_head_kv, m->config.head_dim);
  c.phase_arena = false;          // the decode's arena as small as the prefill's
  for (int32_t extra : {0, 3}) {  // one slot of one page; two slots of one page
    const Result got = run(*m, c, KvMode::Stream, min_arena(*m, c) + extra * l.page_bytes());
    expect_same(want, got, cat("minimum arena + ", extra, " pages"));
    EXPECT_EQ(got.max_slots, extra == 0 ? 1 : 2);
    EXPECT_GT(got.totals.chunks, 100);
  }
}

// Unified mode needs managed memory: the CPU backend refuses it by name.
TEST(StreamErrors, UnifiedOnTheCpuBackendIsAClearError) {
  auto m = Model::load("synthetic:tiny");
  auto cpu = make_cpu_device(0);
  EngineOptions o;
  o.n_ctx = 64;
  o.kv_mode = KvMode::Unified;
  const std::string w = refusal(*m, *cpu, o);
  EXPECT_NE(w.find("unified needs the cuda backend"), std::string::npos) << w;
}

TEST(StreamErrors, ArenaBelowTheMinimumIsRefused) {
  auto m = Model::load("synthetic:tiny");
  auto dev = make_cpu_device(0);
  EngineOptions o;
  o.kv_mode = KvMode::Stream;
  o.kv_arena = 1000;
  const std::string w = refusal(*m, *dev, o);
  EXPECT_NE(w.find("minimum"), std::string::npos) << w;
  EXPECT_NE(w.find("--kv-arena"), std::string::npos) << w;
}

TEST(StreamErrors, ResidentModeThatDoesNotFitIsRefused) {
  auto m = Model::load("synthetic:tiny");
  auto dev = make_cpu_device(0);
  EngineOptions o;
  o.kv_mode = KvMode::Resident;
  o.kv_arena = 64 << 10;
  const std::string w = refusal(*m, *dev, o);
  EXPECT_NE(w.find("--kv-mode auto"), std::string::npos) << w;
}

TEST(StreamErrors, VramLimitBelowTheWeightsIsRefused) {
  auto m = Model::load("synthetic:tiny");
  auto dev = make_cpu_device(1 << 10);
  EXPECT_THROW(Engine(*m, *dev, EngineOptions{}), Error);
}

TEST(StreamErrors, HistoryThatCannotFitInHostMemoryIsRefused) {
  auto m = Model::load("synthetic:tiny");
  auto dev = make_cpu_device(0);
  EngineOptions o;
  o.n_ctx = 2000000000;
  o.kv_arena = 8 << 20;
  const std::string w = refusal(*m, *dev, o);
  EXPECT_NE(w.find("host memory"), std::string::npos) << w;
}

TEST(StreamErrors, PastTheContextIsAClearErrorAndTheEngineGoesOn) {
  auto m = Model::load("synthetic:tiny");
  auto dev = make_cpu_device(0);
  EngineOptions o;
  o.n_ctx = 40;
  o.page_size = 4;
  o.kv_mode = KvMode::Stream;
  Engine e(*m, *dev, o);
  Sequence s = e.open_sequence();
  std::vector<int32_t> p(30, 3);
  e.eval(s, p.data(), 30);
  EXPECT_THROW(e.eval(s, p.data(), 11), Error);
  EXPECT_NO_THROW(e.eval(s, p.data(), 10));
}

}  // namespace
}  // namespace kvs
