// The planner is a pure function: these tests pin its policy (fits entirely -> no ring; caps
// shrink monotonically as contexts grow; hysteresis; the ring sized by the bandwidth-delay
// product; the predicted bound) with hand-computed figures.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "kvs/kv/planner.h"
#include "kvs/util/error.h"

namespace kvs {
namespace {

constexpr size_t kPage = 1 << 20;  // 1 MiB pages keep the arithmetic readable

PlanInput input(int64_t arena_pages, std::vector<int32_t> seq_pages) {
  PlanInput in;
  in.arena_bytes = static_cast<size_t>(arena_pages) * kPage;
  in.page_bytes = kPage;
  in.n_layer = 4;
  in.fixed_frames = 6;
  in.seq_pages = std::move(seq_pages);
  in.h2d_bytes_per_s = 50e9;
  in.layer_s = 100e-6;
  in.min_chunk_bytes = 4 * kPage;
  return in;
}

int64_t resident_total(const Plan& p, const std::vector<int32_t>& pages, int32_t L) {
  int64_t n = 0;
  for (size_t s = 0; s < pages.size(); ++s)
    for (int32_t l = 0; l < L; ++l) n += std::min(pages[s], resident_cap(p, s, l));
  return n;
}

TEST(Planner, EverythingThatFitsIsResidentWithAnEmptyRing) {
  // 2 sequences x 10 pages x 4 layers = 80 frames; 6 fixed + 80 = 86 frames fit exactly.
  const Plan p = plan(input(86, {10, 10}));
  EXPECT_FALSE(p.streams());
  EXPECT_EQ(p.ring_frames(), 0);
  EXPECT_EQ(p.streamed_bytes, 0u);
  EXPECT_EQ(p.resident, (std::vector<int32_t>{kUnlimited, kUnlimited}));
  // One page more no longer fits: the ring appears and pages stream.
  const Plan q = plan(input(86, {11, 10}));
  EXPECT_TRUE(q.streams());
  EXPECT_GT(q.streamed_bytes, 0u);
}

TEST(Planner, StreamModeAlwaysHasARing) {
  PlanInput in = input(1000, {10});
  in.force_ring = true;
  const Plan p = plan(in);
  EXPECT_TRUE(p.streams());
  EXPECT_EQ(p.streamed_pages, 0);  // the rest of the arena still holds every page
}

TEST(Planner, PartitionIsMonotoneAsTheContextGrows) {
  const int32_t L = 4;
  Plan prev;
  bool have = false;
  int32_t last_cap = kUnlimited;
  size_t last_streamed = 0;
  int changes = 0;
  for (int32_t pages = 1; pages <= 400; ++pages) {
    const PlanInput in = input(206, {pages});
    const Plan p = plan(in, have ? &prev : nullptr);
    // Every frame not in the ring or the fixed reserve holds a page, once pages stream.
    if (p.streams()) {
      EXPECT_EQ(resident_total(p, in.seq_pages, L), 206 - 6 - p.ring_frames());
    }
    const int32_t cap = p.resident[0];
    EXPECT_LE(cap, last_cap) << pages;
    EXPECT_GE(p.streamed_bytes, last_streamed) << pages;
    if (have && (p.resident != prev.resident || p.extra != prev.extra ||
                 p.n_slots != prev.n_slots || p.slot_pages != prev.slot_pages))
      ++changes;
    last_cap = cap;
    last_streamed = p.streamed_bytes;
    prev = p;
    have = true;
  }
  // 200 frames over 4 layers: resident until 50 pages, then one change to streaming (the
  // ring's frames leave the resident share) and no more: longer contexts only stream more.
  EXPECT_LE(changes, 3);
  EXPECT_TRUE(prev.streams());
}

TEST(Planner, HysteresisKeepsTheRingAndTheCaps) {
  PlanInput in = input(206, {100});
  const Plan p = plan(in);
  ASSERT_TRUE(p.streams());
  // Measured figures wobble by 10 %: the layout stays.
  for (double f : {0.9, 1.1, 0.95, 1.05}) {
    PlanInput j = in;
    j.h2d_bytes_per_s *= f;
    j.layer_s *= f;
    const Plan q = plan(j, &p);
    EXPECT_EQ(q.n_slots, p.n_slots) << f;
    EXPECT_EQ(q.resident, p.resident) << f;
  }
  // The context shrinks (a sequence ended) until it would just fit without the ring: the
  // plan keeps streaming instead of flipping at the page; well below, it goes resident.
  const int32_t just_fits = (206 - 6) / 4;
  const Plan q = plan(input(206, {just_fits}), &p);
  EXPECT_TRUE(q.streams());
  const Plan r = plan(input(206, {just_fits - p.ring_frames() / 4 - 1}), &p);
  EXPECT_FALSE(r.streams());
}

TEST(Planner, RingCoversTheBandwidthDelayProductNotALayer) {
  // B = 50 GB/s, 100 us per layer: 1.5 x 5 MB = 7.5 MB in flight, slots of 4 MiB -> 2 slots.
  PlanInput in = input(100000, {30000});
  const Plan p = plan(in);
  EXPECT_EQ(p.slot_pages, 4);
  EXPECT_EQ(p.n_slots, 2);
  // A layer of 30000 pages does not make the ring larger; ten times the compute time does.
  in.layer_s = 1e-3;  // 75 MB in flight -> ceil(75e6 / 4 MiB) = 18 slots
  const Plan q = plan(in);
  EXPECT_EQ(q.n_slots, 18);
  // Stalls reported by the engine add their per-layer share.
  in.layer_s = 100e-6;
  in.stall_s = 4 * 400e-6;  // 400 us per layer -> 50e9 * 550e-6 = 27.5 MB -> 7 slots
  EXPECT_EQ(plan(in).n_slots, 7);
}

TEST(Planner, PredictedBoundMatchesAHandComputation) {
  // 1 sequence x 100 pages x 4 layers; arena 206 frames: 200 for pages, the ring 2 x 4 = 8.
  // 192 resident frames = 48 per layer; 51 pages per layer stream (the 100th is being written,
  // in its fixed frame): S = 204 MiB.
  const Plan p = plan(input(206, {100}));
  EXPECT_EQ(p.ring_frames(), 8);
  EXPECT_EQ(p.resident[0], 48);
  EXPECT_EQ(p.extra[0], 0);
  EXPECT_EQ(p.streamed_pages, 4 * 51);
  EXPECT_EQ(p.streamed_bytes, 204 * kPage);
  const double s_over_b = 204.0 * kPage / 50e9;
  EXPECT_DOUBLE_EQ(p.copy_s, s_over_b);
  EXPECT_DOUBLE_EQ(p.gpu_s, 4 * 100e-6);
  EXPECT_DOUBLE_EQ(p.predicted_step_s, s_over_b);
  // Compute-bound when the copy is short: T_gpu wins.
  PlanInput in = input(206, {100});
  in.layer_s = 10e-3;
  EXPECT_DOUBLE_EQ(plan(in).predicted_step_s, 40e-3);
}

TEST(Planner, LeftoverFramesGoToTheFirstLayers) {
  // 200 frames - 8 ring = 192 = 4 layers x 47 + 4: one more page in every layer... of 47 pages,
  // with 3 sequences of 30, 30 and 100 pages: caps water-fill.
  const Plan p = plan(input(206, {30, 30, 100}));
  const std::vector<int32_t> pages{30, 30, 100};
  EXPECT_EQ(resident_total(p, pages, 4), 192);
  EXPECT_EQ(p.resident[0], p.resident[2]);
}

TEST(Planner, BelowTheMinimumArenaIsRefused) {
  EXPECT_EQ(min_arena_bytes(kPage, 6), 7 * kPage);
  EXPECT_NO_THROW(plan(input(7, {100})));
  try {
    plan(input(6, {100}));
    FAIL() << "an arena of only the fixed frames was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("minimum of 7.00 MiB"), std::string::npos) << e.what();
  }
  // The minimum arena: a single slot of a single page.
  const Plan p = plan(input(7, {100}));
  EXPECT_EQ(p.n_slots, 1);
  EXPECT_EQ(p.slot_pages, 1);
  EXPECT_EQ(p.resident[0], 0);
}

}  // namespace
}  // namespace kvs

namespace kvs {
namespace {

// Split: the CPU takes the share of the pages past the cap before the tail page whose time, with
// the device's (T_gpu: each layer's CPU partial waits for the layer's queries), matches the
// ring's copy of the rest: B_cpu / (B_cpu + B) without T_gpu. The predicted step is the
// largest of T_gpu, the copy and the CPU's side.
TEST(Planner, SplitSharesTheStreamedPagesByTheRates) {
  PlanInput in = input(60, {50});  // 4 layers x 50 pages, 54 frames for pages: most stream
  in.layer_s = 0;
  const Plan stream = plan(in);
  in.split = true;
  in.cpu_bytes_per_s = 150e9;  // three times B: the CPU takes 3/4
  const Plan p = plan(in);
  ASSERT_EQ(p.cpu.size(), 1u);
  EXPECT_EQ(p.resident, stream.resident);
  const int32_t past = 50 - 1 - p.resident[0];
  EXPECT_EQ(p.cpu[0], static_cast<int32_t>(std::lround(0.75 * past)));
  // The pages the CPU takes no longer stream: per layer, the layers with a page more have one
  // page fewer past their cap.
  int64_t taken = 0;
  for (int32_t l = 0; l < in.n_layer; ++l)
    taken += std::min(p.cpu[0], past - (l < p.extra[0] ? 1 : 0));
  EXPECT_EQ(p.streamed_pages, stream.streamed_pages - taken);
  EXPECT_EQ(p.cpu_bytes, static_cast<size_t>(taken) * kPage);
  EXPECT_DOUBLE_EQ(p.cpu_s, static_cast<double>(p.cpu_bytes) / 150e9);
  EXPECT_DOUBLE_EQ(p.predicted_step_s, std::max(p.copy_s, p.cpu_s));
  EXPECT_LT(p.predicted_step_s, stream.predicted_step_s / 3);
  // With T_gpu the CPU takes fewer: x / B_cpu + T_gpu = (S - x) / B.
  in.layer_s = 20e-6;
  const double s_bytes = static_cast<double>(stream.streamed_pages) * kPage, t_gpu = 4 * 20e-6;
  const double x = (s_bytes / 50e9 - t_gpu) / (1 / 150e9 + 1 / 50e9);
  const Plan q = plan(in);
  EXPECT_EQ(q.cpu[0], static_cast<int32_t>(std::lround(x / s_bytes * past)));
  EXPECT_LT(q.cpu[0], p.cpu[0]);
  EXPECT_DOUBLE_EQ(q.cpu_side_s(), q.cpu_s + t_gpu);
  EXPECT_DOUBLE_EQ(q.predicted_step_s, std::max(q.copy_s, q.cpu_side_s()));
  // Unmeasured, the CPU takes half.
  in.cpu_bytes_per_s = 0;
  EXPECT_EQ(plan(in).cpu[0], static_cast<int32_t>(std::lround(0.5 * past)));
}

TEST(Planner, SplitKeepsItsShareWhileTheRatesMoveLittle) {
  PlanInput in = input(60, {50});
  in.split = true;
  in.cpu_bytes_per_s = 50e9;
  const Plan p = plan(in);
  in.cpu_bytes_per_s = 53e9;  // a share a page or so larger: kept
  EXPECT_EQ(plan(in, &p).cpu, p.cpu);
  in.cpu_bytes_per_s = 150e9;  // much faster: taken
  EXPECT_GT(plan(in, &p).cpu[0], p.cpu[0] + 2);
  // Nothing streams, nothing to split.
  EXPECT_EQ(plan(input(1000, {50}), &p).cpu_bytes, 0u);
}

// Between repartitions the CPU's share follows the rates, the layout (caps, ring) as it was.
TEST(Planner, ResplitMovesOnlyTheCpuPages) {
  PlanInput in = input(300, {400});
  in.layer_s = 0;  // the share B_cpu / (B_cpu + B)
  in.split = true;
  in.h2d_bytes_per_s = 52e9;
  in.cpu_bytes_per_s = 75e9;
  const Plan p = plan(in);
  in.cpu_bytes_per_s = 46e9;
  const Plan q = resplit(in, p);
  EXPECT_EQ(q.resident, p.resident);
  EXPECT_EQ(q.extra, p.extra);
  EXPECT_EQ(q.ring_frames(), p.ring_frames());
  const int32_t past = 400 - 1 - p.resident[0];
  EXPECT_EQ(q.cpu[0], static_cast<int32_t>(std::lround(46.0 / 98.0 * past)));
  EXPECT_LT(q.cpu[0], p.cpu[0]);
  // The pages the CPU gave back stream: the two add up to the same.
  EXPECT_EQ(q.streamed_pages + static_cast<int64_t>(q.cpu_bytes / kPage),
            p.streamed_pages + static_cast<int64_t>(p.cpu_bytes / kPage));
  EXPECT_DOUBLE_EQ(q.cpu_s, static_cast<double>(q.cpu_bytes) / 46e9);
  EXPECT_STREQ(q.bound(), q.copy_s >= q.cpu_side_s() ? "pcie" : "cpu");
  // Rates within the hysteresis: kept; the same rates: the same plan.
  in.cpu_bytes_per_s = 46.5e9;
  EXPECT_EQ(resplit(in, q).cpu, q.cpu);
  in.cpu_bytes_per_s = 46e9;
  EXPECT_EQ(resplit(in, q), q);
  // A fixed share ignores the rates.
  in.split_share = 0.25;
  EXPECT_EQ(resplit(in, q).cpu[0], static_cast<int32_t>(std::lround(0.25 * past)));
}

// The step a plan gives at rates b_cpu and b (its pages, whatever rates it was made for).
double true_step(const PlanInput& in, const Plan& p, double b_cpu, double b) {
  const double t_gpu = in.layer_s * in.n_layer;
  return std::max({t_gpu, static_cast<double>(p.streamed_bytes) / b,
                   static_cast<double>(p.cpu_bytes) / b_cpu + t_gpu});
}

// The engine's loop: a plan from the rates it assumes, then every step a resplit from the
// exponential averages of the rates measured (true rates with a jitter of a few percent).
// From a CPU assumed 60 % faster than it is, the plan is within the hysteresis of the best
// split from the second step on and then stays put.
TEST(Planner, SplitShareConvergesToTheMeasuredRatesAndSettles) {
  const double b_cpu = 46e9, b = 52e9;
  PlanInput in = input(300, {400});
  in.layer_s = 50e-6;
  in.split = true;
  in.h2d_bytes_per_s = 50e9;
  in.cpu_bytes_per_s = 75e9;
  Plan p = plan(in);
  PlanInput best_in = in;
  best_in.cpu_bytes_per_s = b_cpu;
  best_in.h2d_bytes_per_s = b;
  const double best = true_step(in, plan(best_in), b_cpu, b);
  EXPECT_GT(true_step(in, p, b_cpu, b), best * 1.1);  // the wrong assumption costs
  double cpu_rate = 0, h2d = 0;
  int changes = 0;
  for (int step = 0; step < 40; ++step) {
    const double jitter = 1 + 0.03 * ((step * 7) % 5 - 2) / 2;  // -3 % .. +3 %
    cpu_rate = ema(cpu_rate, b_cpu * jitter);
    h2d = ema(h2d, b / jitter);
    in.cpu_bytes_per_s = cpu_rate;
    in.h2d_bytes_per_s = h2d;
    const Plan q = resplit(in, p);
    if (step > 0) changes += q.cpu != p.cpu;
    p = q;
    EXPECT_LE(true_step(in, p, b_cpu, b), best * (1 + 1.0 / 16)) << "step " << step;
  }
  EXPECT_LE(changes, 1);
}

}  // namespace
}  // namespace kvs
