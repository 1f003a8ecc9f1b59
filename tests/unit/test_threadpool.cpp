#include <gtest/gtest.h>
#include <sched.h>

#include <atomic>
#include <vector>

#include "kvs/util/threadpool.h"

namespace kvs {
namespace {

TEST(ThreadPool, ParallelForCoversEveryIndexOnce) {
  ThreadPool pool(4);
  for (int64_t n : {1, 7, 64, 1000, 100000}) {
    std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
    pool.parallel_for(n, 3, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)].fetch_add(1);
    });
    for (auto& h : hits) ASSERT_EQ(h.load(), 1);
  }
}

TEST(ThreadPool, RunGivesEveryThreadItsId) {
  ThreadPool pool(3);
  std::vector<std::atomic<int>> seen(3);
  pool.run([&](int tid, int n) {
    ASSERT_EQ(n, 3);
    seen[static_cast<size_t>(tid)].fetch_add(1);
  });
  for (auto& s : seen) EXPECT_EQ(s.load(), 1);
}

// Thousands of tiny regions, as in a decode step: late workers must not break anything.
TEST(ThreadPool, ManyShortRegionsAndNesting) {
  ThreadPool pool(2);
  std::atomic<int64_t> total{0};
  for (int r = 0; r < 5000; ++r) {
    pool.parallel_for(4, 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        // A nested region runs inline on the calling thread.
        pool.parallel_for(2, 1, [&](int64_t b2, int64_t e2) { total.fetch_add(e2 - b2); });
      }
    });
  }
  EXPECT_EQ(total.load(), 5000 * 4 * 2);
}

// Workers given CPUs run there alone; the caller's thread stays where it was.
TEST(ThreadPool, PinnedWorkersRunOnTheirCpus) {
  const std::vector<int> all = allowed_cpus();
  ASSERT_FALSE(all.empty());
  const int last = all.back();
  ThreadPool pool(3, {-1, last, all.front()});
  std::vector<std::vector<int>> masks(3);
  std::vector<int> where(3, -1);
  pool.run([&](int tid, int) {
    cpu_set_t set;
    CPU_ZERO(&set);
    ASSERT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set)) masks[static_cast<size_t>(tid)].push_back(c);
    where[static_cast<size_t>(tid)] = sched_getcpu();
  });
  EXPECT_EQ(masks[0], all);
  EXPECT_EQ(masks[1], std::vector<int>{last});
  EXPECT_EQ(where[1], last);
  EXPECT_EQ(masks[2], std::vector<int>{all.front()});
  EXPECT_EQ(where[2], all.front());
}

TEST(ThreadPool, ThreadCountIsCappedAtTheHardware) {
  const int hw = hardware_threads();
  EXPECT_GE(hw, 1);
  set_thread_count(hw * 1000);
  EXPECT_EQ(thread_pool().size(), hw);
  set_thread_count(1);
  EXPECT_EQ(thread_pool().size(), 1);
  set_thread_count(0);  // the default
  EXPECT_LE(thread_pool().size(), hw);
}

}  // namespace
}  // namespace kvs
