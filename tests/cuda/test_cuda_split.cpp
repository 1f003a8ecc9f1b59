// Split attention on the CUDA backend (skipped without a GPU): the CPU attends to a share of
// the pages that would stream and the GPU folds their partial, merged by the CPU into one row
// per head, with its own in logical order. Split logits against resident ones, relative to the
// logits' scale: within 1e-3 where both sides compute partials in f32 (f16 keys; heads of 32,
// which the GPU's decode takes on CUDA cores: the fold's regrouping, turned into quantization
// steps by the products' int8 activations; the CPU backend, which folds the CPU's row of each
// span, is exact: test_split.cpp), and within the CUDA-vs-CPU tolerance where the GPU rounds q
// and the probabilities to f16 for its tensor cores while the CPU takes q as int16 levels
// against quantized keys (each figure printed). With the same plan (a fixed share) a split run
// is bit-identical to the next; SmolLM2's greedy text at 2K with a tiny arena is that of
// resident decoding.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "common.h"
#include "kvs/backend/cuda/backend.h"
#include "kvs/backend/device.h"
#include "kvs/engine/engine.h"
#include "kvs/model/model.h"
#include "kvs/util/error.h"
#include "rel_diff.h"

namespace kvs {
namespace {

std::unique_ptr<Device> cuda_or_null() {
  try {
    return make_cuda_device(0, CudaOptions{});
  } catch (const Error&) {
    return nullptr;
  }
}

#define NEED_GPU(dev)        \
  auto dev = cuda_or_null(); \
  if (!dev) GTEST_SKIP() << "no CUDA device";

std::vector<int32_t> tokens(uint32_t seed, int n, int vocab) {
  std::mt19937 g(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = static_cast<int32_t>(g() % static_cast<uint32_t>(vocab));
  return t;
}

struct Trace {
  std::vector<std::vector<float>> logits;  // after the prompt, then after each decode step
  std::vector<int32_t> greedy;
  EngineStats totals;
};

// The prompt, then n_gen decode steps: the tokens of `feed` where given (so that two runs see
// the same inputs), else greedy.
Trace run(const Model& m, Device& dev, const EngineOptions& o, const std::vector<int32_t>& prompt,
          int n_gen, const std::vector<int32_t>& feed = {}) {
  Engine e(m, dev, o);
  Sequence s = e.open_sequence();
  Trace r;
  const int V = m.config.n_vocab;
  const float* l = e.eval(s, prompt.data(), static_cast<int32_t>(prompt.size()));
  for (int i = 0;; ++i) {
    r.logits.emplace_back(l, l + V);
    if (i == n_gen) break;
    const int32_t best = static_cast<int32_t>(std::max_element(l, l + V) - l);
    r.greedy.push_back(best);
    const int32_t id = feed.empty() ? best : feed[static_cast<size_t>(i)];
    l = e.eval(s, &id, 1);
  }
  r.totals = e.totals();
  return r;
}

// Context, batch and page of a case; the arena leaves most pages to stream.
EngineOptions options(DType kt, DType vt, KvMode mode) {
  EngineOptions o;
  o.n_ctx = 2048;
  o.n_batch = 256;
  o.page_size = 32;
  o.k_type = kt;
  o.v_type = vt;
  o.kv_mode = mode;
  o.ring_chunk_bytes = 64 << 10;
  o.split_share = 0.5;
  o.phase_arena = false;  // the prefill's workspace would hold these short histories when decoding
  return o;
}

size_t small_arena(const Model& m, const EngineOptions& o) {
  const KvLayout l =
      KvLayout::make(o.k_type, o.v_type, o.page_size, m.config.n_head_kv, m.config.head_dim);
  return min_arena_bytes(l.page_bytes(), Engine::fixed_frames(m.config, o)) +
         8 * l.page_bytes() * static_cast<size_t>(m.config.n_layer);
}

constexpr double kF32 = 1e-3;  // f32 partials on both sides
constexpr double kTol = 2e-2;  // test_cuda.cpp's CUDA against CPU

TEST(CudaSplit, LogitsAgainstResident) {
  NEED_GPU(gpu);
  struct Shape {
    const char* model;
    DType kt, vt;
    double tol;
  };
  const Shape shapes[] = {{"tiny", DType::F16, DType::F16, kF32},
                          {"tiny", DType::Q8_0, DType::Q4_0, kTol},
                          {"tiny-h128", DType::F16, DType::F16, kTol},
                          {"tiny-h128", DType::Q8_0, DType::Q4_0, kTol},
                          {"tiny-qwen3", DType::Q8_0, DType::Q8_0, kTol}};
  for (const Shape& sh : shapes) {
    auto m = Model::load(std::string("synthetic:") + sh.model);
    const auto prompt = tokens(5, 1500, m->config.n_vocab);
    EngineOptions o = options(sh.kt, sh.vt, KvMode::Resident);
    const Trace want = run(*m, *gpu, o, prompt, 24);
    o.kv_mode = KvMode::Split;
    o.kv_arena = small_arena(*m, o);
    const Trace got = run(*m, *gpu, o, prompt, 24, want.greedy);
    const double d = test::rel_diff(want.logits, got.logits);
    std::printf(
        "%s kv %s/%s: split against resident %.3g of the logits' scale (the CPU read "
        "%.1f MiB, the ring %.1f MiB)\n",
        sh.model, dtype_name(sh.kt), dtype_name(sh.vt), d,
        static_cast<double>(got.totals.cpu_bytes) / (1 << 20),
        static_cast<double>(got.totals.bytes_in) / (1 << 20));
    EXPECT_GT(got.totals.cpu_bytes, 0u) << sh.model;
    EXPECT_GT(got.totals.bytes_in, 0u) << sh.model;
    EXPECT_LT(d, sh.tol) << sh.model << " " << dtype_name(sh.kt) << "/" << dtype_name(sh.vt);
  }
}

// Verify steps of 4 rows (the resident run's greedy tokens, every draft kept) with the CPU
// taking its share for every row: each row's logits against resident one-token steps', within
// the tolerance of one-token split steps (the CPU's pages of a row may group differently).
TEST(CudaSplit, VerifyStepsAgainstResident) {
  NEED_GPU(gpu);
  for (const char* model : {"tiny-h128:q4_0", "tiny-qwen3"}) {
    auto m = Model::load(std::string("synthetic:") + model);
    const auto prompt = tokens(7, 1500, m->config.n_vocab);
    EngineOptions o = options(DType::Q8_0, DType::Q4_0, KvMode::Resident);
    constexpr int kRows = 4, kSteps = 6;
    o.n_verify = kRows;
    const Trace want = run(*m, *gpu, o, prompt, kRows * kSteps);
    o.kv_mode = KvMode::Split;
    o.kv_arena = small_arena(*m, o);
    Engine e(*m, *gpu, o);
    Sequence s = e.open_sequence();
    const int V = m->config.n_vocab;
    std::vector<std::vector<float>> got;
    const float* l = e.eval(s, prompt.data(), static_cast<int32_t>(prompt.size()));
    got.emplace_back(l, l + V);
    for (int i = 0; i < kSteps; ++i) {
      e.step({{&s, want.greedy.data() + i * kRows, kRows, true}});
      for (int32_t k = 0; k < kRows; ++k) got.emplace_back(e.logits(0, k), e.logits(0, k) + V);
    }
    const double d = test::rel_diff(want.logits, got);
    std::printf("%s: split verify steps against resident %.3g of the logits' scale (the CPU "
                "took %lld pages for draft rows)\n",
                model, d, static_cast<long long>(e.totals().cpu_draft_pages));
    EXPECT_GT(e.totals().cpu_draft_pages, 0) << model;
    EXPECT_LT(d, kTol) << model;
  }
}

TEST(CudaSplit, TheSamePlanGivesTheSameBits) {
  NEED_GPU(gpu);
  auto m = Model::load("synthetic:tiny-h128:q4_0");
  const auto prompt = tokens(9, 1200, m->config.n_vocab);
  EngineOptions o = options(DType::Q8_0, DType::Q4_0, KvMode::Split);
  o.kv_arena = small_arena(*m, o);
  const Trace a = run(*m, *gpu, o, prompt, 32);
  for (int32_t threads : {1, 3}) {
    o.split_threads = threads;
    const Trace b = run(*m, *gpu, o, prompt, 32, a.greedy);
    ASSERT_EQ(a.logits.size(), b.logits.size());
    for (size_t i = 0; i < a.logits.size(); ++i)
      ASSERT_EQ(std::memcmp(a.logits[i].data(), b.logits[i].data(), a.logits[i].size() * 4), 0)
          << "step " << i << " with " << threads << " CPU threads";
  }
}

TEST(CudaSplit, SmolLM2GreedyTextAt2KIsResidents) {
  NEED_GPU(gpu);
  const std::string path = test::smollm2();
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "no " << path;
  auto m = Model::load(path);
  const auto prompt = tokens(11, 2048 - 128, m->config.n_vocab);
  EngineOptions o = options(DType::F16, DType::F16, KvMode::Resident);
  o.split_share = 0;  // the planner's share, from the measured rates
  const Trace want = run(*m, *gpu, o, prompt, 128);
  o.kv_mode = KvMode::Split;
  o.kv_arena = small_arena(*m, o);
  const Trace got = run(*m, *gpu, o, prompt, 128);
  std::printf("SmolLM2 at 2K: the CPU read %.1f MiB, the ring %.1f MiB\n",
              static_cast<double>(got.totals.cpu_bytes) / (1 << 20),
              static_cast<double>(got.totals.bytes_in) / (1 << 20));
  EXPECT_GT(got.totals.cpu_bytes, 0u);
  EXPECT_EQ(want.greedy, got.greedy);
}

}  // namespace
}  // namespace kvs
