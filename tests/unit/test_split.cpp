// Split attention (--kv-mode split) on the CPU backend: the CPU's side computes the partials
// of the pages it takes with the same kernels as the device's side, and the device folds them
// in logical order, so split logits are bit-identical to resident ones, run after run and
// whatever the CPU's thread count. The worker runs on a thread and a pool of its own, with the
// device's streams and fences as in a real run (races included: the tsan preset runs this).
#include <gtest/gtest.h>

#include <random>

#include "kvs/engine/engine.h"
#include "kvs/model/model.h"
#include "stream_cases.h"

namespace kvs {
namespace {

using namespace kvs::test;

TEST(SplitExact, RandomCasesAreBitIdenticalToResident) {
  std::mt19937 g(33);
  int split_cases = 0;
  for (int k = 0; k < 24; ++k) {
    Case c = random_case(g, k);
    c.mode = KvMode::Split;
    c.arena_frac /= 3;  // mostly streaming: pages for the CPU
    c.split_threads = 1 + k % 3;
    auto m = Model::load("synthetic:" + c.preset);
    SCOPED_TRACE(c.str());
    const Result want = run(*m, c, KvMode::Resident, 0);
    const Result got = run(*m, c, KvMode::Split, case_arena(*m, c));
    expect_same(want, got, c.str());
    if (got.totals.cpu_bytes > 0) ++split_cases;
  }
  EXPECT_GE(split_cases, 12);  // the CPU really took pages
}

// Several sequences, the later ones prefilling in the steps where the others decode (a pass of
// prompt rows and CPU pages), with the CPU's thread count changing the split but not the bits.
TEST(SplitExact, MixedPassesAndThreadCounts) {
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
  auto m = Model::load("synthetic:" + c.preset);
  const Result want = run(*m, c, KvMode::Resident, 0);
  for (int32_t threads : {1, 2, 4}) {
    c.split_threads = threads;
    const Result got = run(*m, c, KvMode::Split, min_arena(*m, c) + (64 << 10));
    expect_same(want, got, c.str() + " threads " + std::to_string(threads));
    EXPECT_GT(got.totals.cpu_bytes, 0u);
    EXPECT_GT(got.totals.bytes_in, 0u);  // and the ring streamed the rest
  }
}

}  // namespace
}  // namespace kvs
