// Split attention (--kv-mode split) on the CPU backend: the CPU's side computes the partials of
// the pages it takes with the same kernels as the device's side and folds them, in logical
// order, into one partial that the device folds in their place. The logits differ from
// resident ones only by that regrouping of the fold, which the products' int8 activations turn
// into a quantization step wherever an element crosses a rounding boundary: within 1e-3 of the
// logits' scale (the regrouping alone: 2e-6; with the steps: up to 4.3e-4 measured). The same
// plan gives the same bits run after run, whatever the CPU's thread count. The worker runs on a
// thread and a pool of its own, with the device's streams and fences as in a real run (races
// included: the tsan preset runs this).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>

#include "kvs/engine/engine.h"
#include "kvs/model/model.h"
#include "stream_cases.h"

namespace kvs {
namespace {

using namespace kvs::test;

// max |a - b| / max |a| over every step's logits.
double rel_diff(const Result& a, const Result& b) {
  double worst = 0;
  for (size_t i = 0; i < a.logits.size(); ++i) {
    double scale = 1e-6, diff = 0;
    for (size_t j = 0; j < a.logits[i].size(); ++j) {
      scale = std::max(scale, std::fabs(static_cast<double>(a.logits[i][j])));
      diff = std::max(diff, std::fabs(static_cast<double>(a.logits[i][j]) -
                                      static_cast<double>(b.logits[i][j])));
    }
    worst = std::max(worst, diff / scale);
  }
  return worst;
}

constexpr double kTol = 1e-3;  // of the logits' scale

TEST(Split, RandomCasesWithinTheToleranceOfResident) {
  std::mt19937 g(33);
  int split_cases = 0;
  double worst = 0;
  for (int k = 0; k < 24; ++k) {
    Case c = random_case(g, k);
    c.mode = KvMode::Split;
    c.arena_frac /= 3;  // mostly streaming: pages for the CPU
    c.split_threads = 1 + k % 3;
    auto m = Model::load("synthetic:" + c.preset);
    SCOPED_TRACE(c.str());
    const Result want = run(*m, c, KvMode::Resident, 0);
    const Result got = run(*m, c, KvMode::Split, case_arena(*m, c));
    ASSERT_EQ(want.logits.size(), got.logits.size());
    const double d = rel_diff(want, got);
    EXPECT_LT(d, kTol);
    worst = std::max(worst, d);
    if (got.totals.cpu_bytes > 0) ++split_cases;
  }
  std::printf("split against resident: worst %.3g of the logits' scale\n", worst);
  EXPECT_GE(split_cases, 12);  // the CPU really took pages
}

// Several sequences, the later ones prefilling in the steps where the others decode (a pass of
// prompt rows and CPU pages); a fixed share, so the plan and the bits are the same whatever
// the CPU's thread count.
TEST(Split, TheSamePlanGivesTheSameBits) {
  Case c;
  c.preset = "tiny-qwen3:q8_0";
  c.page = 8;
  c.batch = 48;
  c.n_ctx = 512;
  c.kt = DType::Q8_0;
  c.vt = DType::Q4_0;
  c.prompt_len = {200, 90, 150};
  c.gen_len = {80, 120, 60};
  c.chunk = 4096;
  c.stagger = 20;
  c.split_share = 0.6;
  auto m = Model::load("synthetic:" + c.preset);
  const size_t arena = min_arena(*m, c) + (64 << 10);
  const Result want = run(*m, c, KvMode::Resident, 0);
  Result first;
  for (int32_t threads : {1, 2, 4, 2}) {
    c.split_threads = threads;
    const Result got = run(*m, c, KvMode::Split, arena);
    EXPECT_GT(got.totals.cpu_bytes, 0u);
    EXPECT_GT(got.totals.bytes_in, 0u);  // and the ring streamed the rest
    EXPECT_LT(rel_diff(want, got), kTol);
    if (first.logits.empty())
      first = got;
    else
      expect_same(first, got, c.str() + " threads " + std::to_string(threads));
  }
}

}  // namespace
}  // namespace kvs
