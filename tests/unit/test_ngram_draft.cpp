#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "kvs/engine/ngram_draft.h"
#include "kvs/util/error.h"

namespace kvs {
namespace {

using V = std::vector<int32_t>;

NgramDrafter with(const V& h, int32_t n_min = 2, int32_t n_max = 4) {
  NgramDrafter d(n_min, n_max);
  d.accept(h.data(), static_cast<int32_t>(h.size()));
  return d;
}

// The proposal by brute force: the longest suffix (n_max down to n_min) with an earlier
// occurrence, its most recent one, what followed it.
V brute(const V& h, int32_t n_min, int32_t n_max, int32_t max) {
  const auto len = static_cast<int32_t>(h.size());
  for (int32_t n = std::min(n_max, len); n >= n_min; --n)
    for (int32_t end = len - 1; end >= n; --end) {
      if (!std::equal(h.begin() + end - n, h.begin() + end, h.end() - n)) continue;
      return {h.begin() + end, h.begin() + std::min(len, end + max)};
    }
  return {};
}

TEST(NgramDraft, ProposesWhatFollowedTheLongestEarlierMatch) {
  // "1 2 3 4 5 ... 1 2 3" -> "4 5 9"; the 2-gram "2 3" also occurs later, but the 3-gram wins.
  EXPECT_EQ(with({1, 2, 3, 4, 5, 9, 7, 2, 3, 8, 1, 2, 3}).propose(3), (V{4, 5, 9}));
  EXPECT_EQ(with({1, 2, 3, 4, 5, 9, 7, 2, 3, 8, 1, 2, 3}, 2, 2).propose(3), (V{8, 1, 2}));
  EXPECT_EQ(with({1, 2, 3, 4}).propose(4), V{});  // no repeat
  EXPECT_EQ(with({5, 6, 5, 6}).propose(8), (V{5, 6}));  // the follower may run to the end
  EXPECT_EQ(with({5, 6, 5, 6}).propose(0), V{});
}

TEST(NgramDraft, AgreesWithBruteForceOnRandomSequencesAndTruncation) {
  std::mt19937 rng(7);
  for (int round = 0; round < 200; ++round) {
    const int32_t n_min = 1 + static_cast<int32_t>(rng() % 3);
    const int32_t n_max = n_min + static_cast<int32_t>(rng() % 3);
    const int32_t vocab = 2 + static_cast<int32_t>(rng() % 6);
    NgramDrafter d(n_min, n_max);
    V h;
    for (int step = 0; step < 120; ++step) {
      if (rng() % 5 == 0) {
        const auto drop = static_cast<int32_t>(rng() % std::min<size_t>(h.size() + 1, 6));
        d.truncate(drop);
        h.resize(h.size() - static_cast<size_t>(drop));
      } else {
        const auto t = static_cast<int32_t>(rng() % static_cast<uint32_t>(vocab));
        d.accept(t);
        h.push_back(t);
      }
      ASSERT_EQ(d.history(), h);
      ASSERT_EQ(d.propose(5), brute(h, n_min, n_max, 5)) << "round " << round << " step " << step;
    }
  }
  EXPECT_THROW(with({1, 2}).truncate(3), Error);
}

TEST(NgramDraft, WithoutTruncationEveryProposalIsTheBruteForceOne) {
  std::mt19937 rng(11);
  for (int round = 0; round < 100; ++round) {
    const int32_t vocab = 2 + static_cast<int32_t>(rng() % 8);
    NgramDrafter d(1, 4);
    V h;
    for (int step = 0; step < 150; ++step) {
      const auto t = static_cast<int32_t>(rng() % static_cast<uint32_t>(vocab));
      d.accept(t);
      h.push_back(t);
      ASSERT_EQ(d.propose(6), brute(h, 1, 4, 6)) << "round " << round << " step " << step;
    }
  }
}

TEST(NgramDraft, RefusesBadSizesByName) {
  EXPECT_THROW(NgramDrafter(0, 2), Error);
  EXPECT_THROW(NgramDrafter(3, 2), Error);
  EXPECT_THROW(NgramDrafter(1, NgramDrafter::kMaxN + 1), Error);
  try {
    NgramDrafter(3, 2);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("n-gram sizes"), std::string::npos);
  }
}

}  // namespace
}  // namespace kvs
