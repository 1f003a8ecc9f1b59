// The correctness contract of streaming: whatever the arena, the ring, the page size, the cache
// types and the mix of sequences, streamed logits are bit-identical to resident ones. Host mode
// runs the same CPU kernels over the host store, so on the CPU backend it is exact too
// (tolerance 0). Cases are random but seeded; a failure prints the case.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <sstream>
#include <vector>

#include "kvs/backend/device.h"
#include "kvs/engine/engine.h"
#include "kvs/model/model.h"
#include "kvs/util/error.h"

namespace kvs {
namespace {

struct Case {
  std::string preset;
  int32_t page = 16, batch = 64, n_ctx = 512;
  DType kt = DType::F16, vt = DType::F16;
  std::vector<int32_t> prompt_len, gen_len;  // per sequence
  double arena_frac = 0;  // 0: the minimum arena; 1: everything fits
  KvMode mode = KvMode::Stream;
  size_t chunk = 64 << 10;
  uint32_t seed = 1;
  std::string str() const {
    std::ostringstream o;
    o << preset << " page " << page << " batch " << batch << " kv " << dtype_name(kt) << "/"
      << dtype_name(vt) << " mode " << kv_mode_name(mode) << " arena " << arena_frac << " chunk "
      << chunk << " seqs";
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

std::vector<int32_t> tokens(uint32_t seed, int32_t n, int32_t vocab) {
  std::mt19937 g(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = static_cast<int32_t>(g() % static_cast<uint32_t>(vocab));
  return t;
}

// Prefills every sequence (in -b chunks), then decodes the live ones together, one token each
// per step; a sequence that reaches its length closes and gives its pages back while the others
// go on. Decode tokens are fixed in advance so every mode sees the same inputs.
Result run(const Model& m, const Case& c, KvMode mode, size_t arena) {
  auto dev = make_cpu_device(0);
  EngineOptions o;
  o.n_ctx = c.n_ctx;
  o.n_batch = c.batch;
  o.page_size = c.page;
  o.k_type = c.kt;
  o.v_type = c.vt;
  o.n_seq = static_cast<int32_t>(c.prompt_len.size());
  o.kv_mode = mode;
  o.kv_arena = arena;
  o.ring_chunk_bytes = c.chunk;
  Engine e(m, *dev, o);
  const int32_t V = m.config.n_vocab, N = o.n_seq;
  Result r;
  std::vector<Sequence> seqs;
  for (int32_t i = 0; i < N; ++i) {
    seqs.push_back(e.open_sequence());
    auto p = tokens(c.seed * 100 + static_cast<uint32_t>(i), c.prompt_len[static_cast<size_t>(i)], V);
    const float* l = e.eval(seqs.back(), p.data(), static_cast<int32_t>(p.size()));
    r.logits.emplace_back(l, l + V);
  }
  std::vector<std::vector<int32_t>> gen;
  for (int32_t i = 0; i < N; ++i)
    gen.push_back(tokens(c.seed * 100 + 50 + static_cast<uint32_t>(i),
                         c.gen_len[static_cast<size_t>(i)], V));
  for (int32_t t = 0;; ++t) {
    std::vector<BatchEntry> batch;
    for (int32_t i = 0; i < N; ++i) {
      const auto& g = gen[static_cast<size_t>(i)];
      if (t < static_cast<int32_t>(g.size()))
        batch.push_back({&seqs[static_cast<size_t>(i)], &g[static_cast<size_t>(t)], 1});
      else if (seqs[static_cast<size_t>(i)].id >= 0)
        e.close_sequence(seqs[static_cast<size_t>(i)]);
    }
    if (batch.empty()) break;
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

// Bytes of the whole KV (every sequence at -c) plus the frames streaming always keeps.
size_t full_arena(const Model& m, const Case& c) {
  const KvLayout l = KvLayout::make(c.kt, c.vt, c.page, m.config.n_head_kv, m.config.head_dim);
  const int32_t n_seq = static_cast<int32_t>(c.prompt_len.size());
  EngineOptions o;
  o.n_seq = n_seq;
  o.n_batch = c.batch;
  o.page_size = c.page;
  const int32_t fixed = Engine::fixed_frames(m.config, o);
  const size_t pages = static_cast<size_t>((c.n_ctx + c.page - 1) / c.page) * m.config.n_layer *
                       static_cast<size_t>(n_seq);
  return (pages + static_cast<size_t>(fixed)) * l.page_bytes();
}

size_t min_arena(const Model& m, const Case& c) {
  const KvLayout l = KvLayout::make(c.kt, c.vt, c.page, m.config.n_head_kv, m.config.head_dim);
  const int32_t n_seq = static_cast<int32_t>(c.prompt_len.size());
  EngineOptions o;
  o.n_seq = n_seq;
  o.n_batch = c.batch;
  o.page_size = c.page;
  const int32_t fixed = Engine::fixed_frames(m.config, o);
  return min_arena_bytes(l.page_bytes(), fixed);
}

void expect_same(const Result& want, const Result& got, const std::string& what) {
  ASSERT_EQ(want.logits.size(), got.logits.size()) << what;
  for (size_t i = 0; i < want.logits.size(); ++i)
    ASSERT_EQ(std::memcmp(want.logits[i].data(), got.logits[i].data(),
                          want.logits[i].size() * sizeof(float)),
              0)
        << what << ": logits of step " << i << " differ";
}

TEST(StreamExact, RandomCasesAreBitIdenticalToResident) {
  std::mt19937 g(20261203);
  const char* presets[] = {"tiny", "tiny-qwen2", "tiny-qwen3", "tiny:q4_0", "tiny-qwen3:q8_0"};
  const DType types[] = {DType::F16, DType::Q8_0, DType::Q4_0};
  const int32_t pages[] = {4, 8, 16, 32};
  int streamed_cases = 0, repartitioned_cases = 0;
  for (int k = 0; k < 28; ++k) {
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
    auto m = Model::load("synthetic:" + c.preset);
    const size_t lo = min_arena(*m, c), hi = full_arena(*m, c);
    const size_t arena = lo + static_cast<size_t>(c.arena_frac * static_cast<double>(hi - lo));
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
  const Result want = run(*m, c, KvMode::Resident, 0);
  for (double frac : {0.0, 0.05, 0.2, 0.5, 1.0}) {
    const size_t lo = min_arena(*m, c), hi = full_arena(*m, c);
    const size_t arena = lo + static_cast<size_t>(frac * static_cast<double>(hi - lo));
    for (KvMode mode : {KvMode::Auto, KvMode::Stream}) {
      const Result got = run(*m, c, mode, arena);
      expect_same(want, got, cat(kv_mode_name(mode), " arena fraction ", frac));
      if (mode == KvMode::Auto && frac == 1.0) {
        EXPECT_EQ(got.totals.bytes_in, 0u) << "everything fits: nothing may stream";
        EXPECT_FALSE(got.plan.streams());
      }
      if (frac < 0.5) {
        EXPECT_GT(got.totals.bytes_in, 0u) << frac;
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
  for (int32_t extra : {0, 3}) {  // one slot of one page; two slots of one page
    const Result got = run(*m, c, KvMode::Stream, min_arena(*m, c) + extra * l.page_bytes());
    expect_same(want, got, cat("minimum arena + ", extra, " pages"));
    EXPECT_EQ(got.max_slots, extra == 0 ? 1 : 2);
    EXPECT_GT(got.totals.chunks, 100);
  }
}

TEST(StreamErrors, ArenaBelowTheMinimumIsRefused) {
  auto m = Model::load("synthetic:tiny");
  auto dev = make_cpu_device(0);
  EngineOptions o;
  o.kv_mode = KvMode::Stream;
  o.kv_arena = 1000;
  try {
    Engine e(*m, *dev, o);
    FAIL() << "a 1000-byte arena was accepted";
  } catch (const Error& err) {
    const std::string w = err.what();
    EXPECT_NE(w.find("minimum"), std::string::npos) << w;
    EXPECT_NE(w.find("--kv-arena"), std::string::npos) << w;
  }
}

TEST(StreamErrors, ResidentModeThatDoesNotFitIsRefused) {
  auto m = Model::load("synthetic:tiny");
  auto dev = make_cpu_device(0);
  EngineOptions o;
  o.kv_mode = KvMode::Resident;
  o.kv_arena = 64 << 10;
  try {
    Engine e(*m, *dev, o);
    FAIL() << "resident mode accepted an arena smaller than the KV";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("--kv-mode auto"), std::string::npos) << err.what();
  }
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
  try {
    Engine e(*m, *dev, o);
    FAIL() << "a history of 2e9 tokens was accepted";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("host memory"), std::string::npos) << err.what();
  }
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
