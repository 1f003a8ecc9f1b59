// Split attention (--kv-mode split) on the CPU backend: the CPU's side computes the partials of
// the pages it takes with the same kernels as the device's side, and the device folds them, a
// row per span, in their logical place: split logits are resident ones bit for bit, whatever
// the share and the CPU's thread count. The worker runs on a thread and a pool of its own, with
// the device's streams and fences as in a real run (races included: the tsan preset runs this).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "kvs/engine/engine.h"
#include "kvs/model/model.h"
#include "kvs/util/error.h"
#include "kvs/util/parse.h"
#include "kvs/util/threadpool.h"
#include "speculative_cases.h"
#include "stream_cases.h"

namespace kvs {
namespace {

using namespace kvs::test;

TEST(Split, RandomCasesAreBitIdenticalToResident) {
  std::mt19937 g(33);
  int split_cases = 0;
  for (int k = 0; k < 24; ++k) {
    Case c = random_case(g, k);
    c.mode = KvMode::Split;
    c.arena_frac /= 3;  // mostly streaming: pages for the CPU
    c.split_threads = 1 + k % 3;
    c.h2d_limit = 50e6;  // a slow link beside the CPU backend's compute: the CPU takes pages
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
// prompt rows and CPU pages); a fixed share, whatever the CPU's thread count.
TEST(Split, PromptsBesideSplitStepsAreBitIdenticalToResident) {
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
  for (int32_t threads : {1, 2, 4}) {
    c.split_threads = threads;
    const Result got = run(*m, c, KvMode::Split, arena);
    EXPECT_GT(got.totals.cpu_bytes, 0u);
    EXPECT_GT(got.totals.bytes_in, 0u);  // and the ring streamed the rest
    expect_same(want, got, c.str() + " threads " + std::to_string(threads));
  }
}

// Verify steps (a token and its drafts) beside the CPU's share: the CPU attends to its pages for
// every row of the step and the device folds each row's partials in their place, so every
// row's logits are resident one-token decoding's, on full and hybrid models, shares fixed and
// from the rates.
TEST(Split, VerifyStepsAreBitIdenticalToOneTokenResidentSteps) {
  int64_t draft_pages = 0;
  for (const char* preset : {"tiny-qwen3:q8_0", "tiny-qwen35:q4_k"}) {
    for (double share : {0.0, 0.6}) {
      Case c;
      c.preset = preset;
      c.page = 8;
      c.batch = 64;
      c.n_ctx = 1024;
      c.kt = DType::Q8_0;
      c.vt = DType::Q4_0;
      c.prompt_len = {300, 170};
      c.gen_len = {60, 70};
      c.chunk = 4096;
      c.phase_arena = false;  // the prefill's workspace would hold these histories
      c.split_share = share;
      c.split_threads = 2;
      c.h2d_limit = 50e6;  // the rates' share: a slow link, the CPU takes pages
      const int32_t draft_max = 4;
      c.n_verify = draft_max + 1;
      auto m = Model::load(std::string("synthetic:") + preset);
      SCOPED_TRACE(cat(c.str(), " share ", share));
      const Decoded want = decode(*m, *make_cpu_device(0), c, KvMode::Resident, 0, 0, nullptr);
      const Decoded got = decode(*m, *make_cpu_device(0), c, KvMode::Split,
                                 min_arena(*m, c) + (64 << 10), draft_max, &want);
      expect_same(want, got);
      EXPECT_GT(got.accepted, 20);
      EXPECT_GT(got.drafted - got.accepted, 10);
      EXPECT_GT(got.totals.cpu_draft_pages, 0) << "the CPU took no page of a draft's row";
      draft_pages += got.totals.cpu_draft_pages;
    }
  }
  EXPECT_GT(draft_pages, 1000);
}

Case streaming_case() {
  Case c;
  c.preset = "tiny-qwen3:q8_0";
  c.page = 8;
  c.batch = 48;
  c.n_ctx = 512;
  c.kt = DType::Q8_0;
  c.vt = DType::Q4_0;
  c.prompt_len = {300};
  c.gen_len = {40};
  c.chunk = 4096;
  return c;
}

// --h2d-limit: the ring's copies move no faster than the limit, measured by the wall clock and
// by the copy stream's busy time (what the planner reads), and the logits keep their bits.
TEST(H2dLimit, TheRingMovesNoFasterThanTheLimitAndTheBitsStay) {
  Case c = streaming_case();
  auto m = Model::load("synthetic:" + c.preset);
  const size_t arena = min_arena(*m, c) + (64 << 10);
  const auto t0 = std::chrono::steady_clock::now();
  const Result free = run(*m, c, KvMode::Stream, arena);
  const double free_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_GT(free.totals.bytes_in, 0u);
  // A limit at which the copies alone take half a second.
  c.h2d_limit = static_cast<double>(free.totals.bytes_in) / 0.5;
  const auto t1 = std::chrono::steady_clock::now();
  const Result slow = run(*m, c, KvMode::Stream, arena);
  const double slow_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  const auto bytes = static_cast<double>(slow.totals.bytes_in);
  std::printf(
      "--h2d-limit %.3g B/s: %.3g bytes in %.3f s (%.3g B/s; unlimited %.3f s), busy %.3f s\n",
      c.h2d_limit, bytes, slow_s, bytes / slow_s, free_s, slow.totals.copy_busy_s);
  EXPECT_LE(bytes / slow_s, c.h2d_limit * 1.02);
  EXPECT_LE(bytes / slow.totals.copy_busy_s, c.h2d_limit * 1.01);
  // The copy engine's time, not the wall clock's: a sanitizer's compute swamps both runs' walls.
  EXPECT_GT(slow.totals.copy_busy_s, 10 * free.totals.copy_busy_s);
  expect_same(free, slow, c.str());
}

// Split, its rates measured: from a CPU assumed thousands of times slower than it is (the first
// plan gives it next to nothing) behind a link limited to a crawl, the CPU takes most of the
// pages that would stream from the second decode step on and four in five once the averages
// settle (the rest: what its side's share of the device's time leaves to the ring, which a
// sanitizer on a loaded 2-core machine swells), its share
// moving one way meanwhile, not back and forth with the jitter of the measured rates.
TEST(Split, TheShareFollowsTheMeasuredRatesAndSettles) {
  Case c = streaming_case();
  c.cpu_rate = 1e5;
  c.h2d_limit = 1e6;
  c.phase_arena = false;  // no workspace lent to the pages: they stream
  c.prompt_len = {400};
  auto m = Model::load("synthetic:" + c.preset);
  const size_t arena = min_arena(*m, c);
  auto dev = make_cpu_device(0);
  EngineOptions o = options(c);
  o.kv_mode = KvMode::Split;
  o.kv_arena = arena;
  Engine e(*m, *dev, o);
  const int32_t V = m->config.n_vocab;
  Sequence s = e.open_sequence();
  const auto prompt = tokens(7, c.prompt_len[0], V), gen = tokens(8, 30, V);
  e.eval(s, prompt.data(), static_cast<int32_t>(prompt.size()));
  // Between page boundaries the CPU's pages may move as the averages settle, always the same
  // way: a move back would be the jitter of the measurements.
  int32_t last_cpu = -1, last_pages = -1, direction = 0, reversals = 0;
  for (size_t i = 0; i < gen.size(); ++i) {
    e.eval(s, &gen[i], 1);
    const Plan& p = e.plan();
    ASSERT_TRUE(p.streams());
    ASSERT_EQ(p.cpu.size(), 1u);
    const int32_t pages = (s.n_past + c.page - 1) / c.page;
    const int32_t past = pages - 1 - p.resident[0];
    if (i == 0) {
      EXPECT_LT(p.cpu[0], past / 4) << "the first plan: the assumed rate";
    } else {  // the device's time, measured on a shared machine, settles over a few steps
      EXPECT_GE(p.cpu[0], i < 10 ? past / 2 : past * 4 / 5) << "step " << i;
    }
    if (pages != last_pages) direction = 0;
    if (pages == last_pages && p.cpu[0] != last_cpu) {
      const int32_t d = p.cpu[0] > last_cpu ? 1 : -1;
      reversals += direction != 0 && d != direction;
      direction = d;
    }
    last_cpu = p.cpu[0];
    last_pages = pages;
  }
  EXPECT_EQ(reversals, 0);
  EXPECT_GT(e.totals().cpu_pages, 0);
  EXPECT_GT(e.totals().gpu_pages, 0);
}

// The split threads run on the CPUs given (--split-cpus), by default on the last of the
// process's CPUs with the first left to the thread that drives the device, and unpinned where
// none would be left or with --split-cpus none; CPUs the process may not use, listed twice or
// at odds with --split-threads are refused by name.
TEST(Split, ThreadsRunOnTheirCpus) {
  const Case c = streaming_case();
  auto m = Model::load("synthetic:" + c.preset);
  auto dev = make_cpu_device(0);
  EngineOptions o = options(c);
  o.kv_mode = KvMode::Split;
  o.kv_arena = min_arena(*m, c);
  o.split_share = 0.5;  // no calibration: the CPUs are what is tested
  const std::vector<int> all = allowed_cpus();
  const auto engine_cpus = [&](std::vector<int> cpus, int32_t threads) {
    o.split_cpus = std::move(cpus);
    o.split_threads = threads;
    Engine e(*m, *dev, o);
    Sequence s = e.open_sequence();
    const auto t = tokens(3, 40, m->config.n_vocab);
    e.eval(s, t.data(), static_cast<int32_t>(t.size()));
    return std::make_pair(e.split_threads(), e.split_cpus());
  };
  EXPECT_EQ(engine_cpus({all.back()}, 0), std::make_pair(1, std::vector<int>{all.back()}));
  EXPECT_EQ(engine_cpus({all.front()}, 1), std::make_pair(1, std::vector<int>{all.front()}));
  EXPECT_EQ(engine_cpus({}, 1),
            std::make_pair(1, all.size() > 1 ? std::vector<int>{all.back()} : std::vector<int>{}));
  const auto n = static_cast<int32_t>(all.size());
  EXPECT_EQ(engine_cpus({}, n), std::make_pair(n, std::vector<int>{}));
  o.split_pinned = false;  // --split-cpus none
  EXPECT_EQ(engine_cpus({}, 1), std::make_pair(1, std::vector<int>{}));
  o.split_pinned = true;
  const auto refused = [&](std::vector<int> cpus, int32_t threads, const std::string& what) {
    try {
      engine_cpus(std::move(cpus), threads);
      ADD_FAILURE() << "accepted: " << what;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  refused({all.back() + 1}, 0,
          cat("--split-cpus: CPU ", all.back() + 1, " is not one this process may run on (",
              cpu_list_name(all), ")"));
  refused({all.front(), all.front()}, 0, cat("CPU ", all.front(), " is listed twice"));
  refused({all.front()}, 2, "--split-threads 2 with --split-cpus of 1 CPUs");
}

}  // namespace
}  // namespace kvs
