#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "kvs/engine/sampler.h"
#include "kvs/util/error.h"

namespace kvs {
namespace {

SamplerParams plain(float temp, uint64_t seed = 1234) {
  SamplerParams p;
  p.temp = temp;
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 0.0f;
  p.repeat_penalty = 1.0f;
  p.seed = seed;
  return p;
}

std::vector<float> random_logits(int32_t n, float sigma, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, sigma);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = d(rng);
  return v;
}

int32_t argmax(const std::vector<float>& v) {
  return static_cast<int32_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

std::vector<float> logits_of(const std::vector<double>& probs) {
  std::vector<float> v;
  for (double p : probs) v.push_back(static_cast<float>(std::log(p)));
  return v;
}

// Frequencies of n draws (the penalty is off, so the history does not matter).
std::vector<double> frequencies(Sampler& s, const std::vector<float>& logits, int n) {
  std::vector<double> f(logits.size(), 0.0);
  for (int i = 0; i < n; ++i) {
    const int32_t t = s.sample(logits.data(), static_cast<int32_t>(logits.size()));
    EXPECT_GE(t, 0);
    EXPECT_LT(t, static_cast<int32_t>(logits.size()));
    f[static_cast<size_t>(t)] += 1.0 / n;
  }
  return f;
}

// expected: token -> unnormalised weight; tokens not in it must never appear.
void expect_distribution(const std::vector<double>& freq, const std::vector<double>& expected) {
  const double total = std::accumulate(expected.begin(), expected.end(), 0.0);
  for (size_t i = 0; i < freq.size(); ++i) {
    if (expected[i] == 0.0) {
      EXPECT_EQ(freq[i], 0.0) << "token " << i << " is outside the allowed set";
    } else {
      EXPECT_NEAR(freq[i], expected[i] / total, 0.02) << "token " << i;
    }
  }
}

// Reference for the kept-set size: sort everything, then top-k, top-p, min-p as llama.cpp.
size_t reference_kept(const std::vector<float>& logits, const SamplerParams& p) {
  std::vector<float> l(logits);
  std::sort(l.begin(), l.end(), std::greater<>());
  size_t n = l.size();
  if (p.top_k > 0) n = std::min(n, static_cast<size_t>(p.top_k));
  const double mx = static_cast<double>(l[0]);
  double z = 0.0;
  for (size_t i = 0; i < n; ++i) z += static_cast<double>(std::exp(l[i] - l[0]));
  size_t keep_p = n;
  if (p.top_p < 1.0f) {
    double cum = 0.0;
    for (size_t i = 0; i < n; ++i) {
      cum += static_cast<double>(std::exp(l[i] - l[0])) / z;
      if (cum >= static_cast<double>(p.top_p)) {
        keep_p = i + 1;
        break;
      }
    }
  }
  size_t keep_m = n;
  if (p.min_p > 0.0f) {
    const double thresh = mx + std::log(static_cast<double>(p.min_p));
    keep_m = 0;
    while (keep_m < n && static_cast<double>(l[keep_m]) >= thresh) ++keep_m;
  }
  return std::min(keep_p, keep_m);
}

}  // namespace

TEST(Sampler, GreedyIsArgmax) {
  for (uint64_t seed = 0; seed < 5; ++seed) {
    auto logits = random_logits(5000, 2.0f, seed);
    SamplerParams p;  // default filters, temp 0
    p.temp = 0.0f;
    Sampler s(p);
    EXPECT_EQ(s.sample(logits.data(), 5000), argmax(logits));
    p.temp = -1.0f;
    Sampler s2(p);
    EXPECT_EQ(s2.sample(logits.data(), 5000), argmax(logits));
  }
  // Ties: lowest id wins.
  std::vector<float> tied = {1.0f, 3.0f, -2.0f, 3.0f, 2.0f, 3.0f};
  Sampler s(plain(0.0f));
  EXPECT_EQ(s.sample(tied.data(), 6), 1);
  // NaN counts as -inf; -inf tokens are never drawn.
  std::vector<float> nan = {std::nanf(""), -5.0f, -4.0f};
  Sampler s3(plain(0.0f));
  EXPECT_EQ(s3.sample(nan.data(), 3), 2);
  const float inf = std::numeric_limits<float>::infinity();
  // Vocabularies past the vector widths: NaNs among them, the largest in the tail, then ties.
  for (const size_t n : {33u, 100u, 4099u}) {
    std::vector<float> l(n, -1.0f);
    for (size_t i = 3; i < n; i += 7) l[i] = std::nanf("");
    l[n - 1] = 2.0f;
    Sampler g(plain(0.0f));
    EXPECT_EQ(g.sample(l.data(), static_cast<int32_t>(n)), static_cast<int32_t>(n - 1)) << n;
    l[n / 2 + 1] = 2.0f;
    l[n / 2 + 9] = 2.0f;
    EXPECT_EQ(g.sample(l.data(), static_cast<int32_t>(n)), static_cast<int32_t>(n / 2 + 1)) << n;
    l[9] = inf;
    EXPECT_EQ(g.sample(l.data(), static_cast<int32_t>(n)), 9) << n;
    std::fill(l.begin(), l.end(), std::nanf(""));
    EXPECT_THROW(g.sample(l.data(), static_cast<int32_t>(n)), Error) << n;
  }
  std::vector<float> masked = {-inf, 0.0f, -inf, 0.0f, std::nanf("")};
  Sampler s4(plain(1.0f));
  for (int i = 0; i < 100; ++i) {
    const int32_t t = s4.sample(masked.data(), 5);
    EXPECT_TRUE(t == 1 || t == 3) << t;
  }
  EXPECT_EQ(s4.last_candidates(), 2);
}

TEST(Sampler, SeedDeterminism) {
  auto logits = random_logits(1000, 1.0f, 7);
  auto run = [&](Sampler& s) {
    std::vector<int32_t> out;
    for (int i = 0; i < 100; ++i) out.push_back(s.sample(logits.data(), 1000));
    return out;
  };
  SamplerParams p = plain(1.0f, 42);
  Sampler a(p), b(p);
  EXPECT_EQ(a.seed(), 42u);
  const auto seq_a = run(a);
  EXPECT_EQ(seq_a, run(b));
  a.reset();
  EXPECT_EQ(seq_a, run(a)) << "reset() restarts the sequence";
  Sampler c(plain(1.0f, 43));
  EXPECT_NE(seq_a, run(c));

  // Default params too (top-k, top-p, min-p on).
  SamplerParams d;
  d.seed = 5;
  Sampler d1(d), d2(d);
  EXPECT_EQ(run(d1), run(d2));

  // The "random" seed is replaced by a real one, which repeats the run when passed back.
  SamplerParams r = plain(1.0f, Sampler::kSeedRandom);
  Sampler r1(r);
  EXPECT_NE(r1.seed(), Sampler::kSeedRandom);
  const auto seq_r = run(r1);
  Sampler r2(plain(1.0f, r1.seed()));
  EXPECT_EQ(seq_r, run(r2));
}

TEST(Sampler, TopK1IsGreedy) {
  std::vector<float> tied = {1.0f, 3.0f, -2.0f, 3.0f, 2.0f, 3.0f};
  for (float temp : {0.01f, 0.5f, 1.0f, 5.0f, 1000.0f}) {
    SamplerParams p = plain(temp);
    p.top_k = 1;
    Sampler s(p);
    for (uint64_t seed = 0; seed < 5; ++seed) {
      auto logits = random_logits(20000, 1.0f, seed);
      EXPECT_EQ(s.sample(logits.data(), 20000), argmax(logits)) << "temp " << temp;
    }
    for (int i = 0; i < 20; ++i) EXPECT_EQ(s.sample(tied.data(), 6), 1);
    EXPECT_EQ(s.last_candidates(), 1);
  }
}

TEST(Sampler, FullDistribution) {
  const std::vector<double> probs = {0.1, 0.4, 0.2, 0.3};
  auto logits = logits_of(probs);
  Sampler s(plain(1.0f));
  expect_distribution(frequencies(s, logits, 20000), probs);
  // Temperature 2: weights p^(1/2).
  Sampler s2(plain(2.0f));
  std::vector<double> w;
  for (double p : probs) w.push_back(std::sqrt(p));
  expect_distribution(frequencies(s2, logits, 20000), w);
}

// Probabilities by id: 5: .4, 2: .3, 7: .15, 0: .1, the rest .0125 each.
const std::vector<double> kProbs = {0.1, 0.0125, 0.3, 0.0125, 0.0125, 0.4, 0.0125, 0.15};

TEST(Sampler, TopP) {
  auto logits = logits_of(kProbs);
  {
    SamplerParams p = plain(1.0f);
    p.top_p = 0.8f;  // .4 + .3 = .7 < .8 <= .85
    Sampler s(p);
    expect_distribution(frequencies(s, logits, 20000), {0, 0, 0.3, 0, 0, 0.4, 0, 0.15});
    EXPECT_EQ(s.last_candidates(), 3);
  }
  {
    // Temperature does not change the set (applied after the filters), only the weights.
    SamplerParams p = plain(2.0f);
    p.top_p = 0.8f;
    Sampler s(p);
    expect_distribution(frequencies(s, logits, 20000),
                        {0, 0, std::sqrt(0.3), 0, 0, std::sqrt(0.4), 0, std::sqrt(0.15)});
  }
  {
    SamplerParams p = plain(1.0f);
    p.top_p = 0.3f;  // the top token alone
    Sampler s(p);
    expect_distribution(frequencies(s, logits, 2000), {0, 0, 0, 0, 0, 1, 0, 0});
  }
  {
    // After top-k the softmax is over the k survivors: .4/.7 = .57 >= .5.
    SamplerParams p = plain(1.0f);
    p.top_k = 2;
    p.top_p = 0.5f;
    Sampler s(p);
    expect_distribution(frequencies(s, logits, 2000), {0, 0, 0, 0, 0, 1, 0, 0});
    p.top_p = 0.6f;
    Sampler s2(p);
    expect_distribution(frequencies(s2, logits, 20000), {0, 0, 0.3, 0, 0, 0.4, 0, 0});
  }
}

TEST(Sampler, MinP) {
  auto logits = logits_of(kProbs);
  {
    SamplerParams p = plain(1.0f);
    p.min_p = 0.3f;  // keep p >= .12
    Sampler s(p);
    expect_distribution(frequencies(s, logits, 20000), {0, 0, 0.3, 0, 0, 0.4, 0, 0.15});
    EXPECT_EQ(s.last_candidates(), 3);
  }
  {
    SamplerParams p = plain(1.0f);
    p.min_p = 0.2f;  // keep p >= .08
    Sampler s(p);
    expect_distribution(frequencies(s, logits, 20000), {0.1, 0, 0.3, 0, 0, 0.4, 0, 0.15});
  }
  {
    SamplerParams p = plain(0.7f);
    p.min_p = 0.5f;  // keep p >= .2
    Sampler s(p);
    expect_distribution(frequencies(s, logits, 20000),
                        {0, 0, std::pow(0.3, 1 / 0.7), 0, 0, std::pow(0.4, 1 / 0.7), 0, 0});
  }
  {
    // Both: the smaller set wins, whichever it comes from.
    SamplerParams p = plain(1.0f);
    p.top_p = 0.95f;  // {5, 2, 7, 0}
    p.min_p = 0.3f;   // {5, 2, 7}
    Sampler s(p);
    expect_distribution(frequencies(s, logits, 20000), {0, 0, 0.3, 0, 0, 0.4, 0, 0.15});
    p.top_p = 0.6f;  // {5, 2}
    Sampler s2(p);
    expect_distribution(frequencies(s2, logits, 20000), {0, 0, 0.3, 0, 0, 0.4, 0, 0});
  }
  {
    SamplerParams p = plain(1.0f);
    p.min_p = 1.0f;  // the maximum only
    Sampler s(p);
    expect_distribution(frequencies(s, logits, 2000), {0, 0, 0, 0, 0, 1, 0, 0});
  }
}

TEST(Sampler, LargeVocabMatchesReference) {
  constexpr int32_t n = 150000;
  for (float sigma : {0.5f, 2.0f, 4.0f}) {
    auto logits = random_logits(n, sigma, static_cast<uint64_t>(sigma * 10));
    std::vector<float> sorted(logits);
    std::sort(sorted.begin(), sorted.end(), std::greater<>());
    struct Case {
      int32_t top_k;
      float top_p, min_p;
    };
    for (Case c : {Case{40, 0.95f, 0.05f}, Case{0, 0.9f, 0.0f}, Case{0, 0.5f, 0.0f},
                   Case{0, 0.99f, 0.01f}, Case{1000, 0.7f, 0.0f}, Case{0, 1.0f, 0.1f},
                   Case{100, 1.0f, 0.0f}, Case{0, 1.0f, 0.0f}}) {
      SamplerParams p = plain(0.8f, 99);
      p.top_k = c.top_k;
      p.top_p = c.top_p;
      p.min_p = c.min_p;
      const size_t kept = reference_kept(logits, p);
      const float cutoff = sorted[kept - 1];
      Sampler s(p);
      for (int i = 0; i < 20; ++i) {
        const int32_t t = s.sample(logits.data(), n);
        ASSERT_EQ(static_cast<size_t>(s.last_candidates()), kept)
            << "sigma " << sigma << " top_k " << c.top_k << " top_p " << c.top_p << " min_p "
            << c.min_p;
        ASSERT_GE(logits[static_cast<size_t>(t)], cutoff);
      }
    }
  }
}

TEST(Sampler, RepeatPenalty) {
  SamplerParams p = plain(0.0f);
  p.repeat_penalty = 1.5f;
  {
    // Positive logits are divided: 2.0 -> 1.33 < 1.9.
    std::vector<float> l = {2.0f, 1.9f, -1.0f};
    Sampler s(p);
    EXPECT_EQ(s.sample(l.data(), 3), 0);  // empty history: no penalty; 0 is accepted
    EXPECT_EQ(s.sample(l.data(), 3), 1);  // 0 penalised
    // Both penalised now: 1.33 > 1.27.
    EXPECT_EQ(s.sample(l.data(), 3), 0);
  }
  {
    // Negative logits are multiplied: -1.0 -> -1.5 < -1.2.
    std::vector<float> l = {-1.0f, -1.2f, -3.0f};
    Sampler s(p);
    s.accept(0);
    EXPECT_EQ(s.sample(l.data(), 3), 1);
  }
  {
    // Repeats of one token are penalised once.
    std::vector<float> l = {2.0f, 1.0f};
    SamplerParams q = p;
    q.repeat_penalty = 1.5f;
    Sampler s(q);
    for (int i = 0; i < 10; ++i) s.accept(0);
    EXPECT_EQ(s.sample(l.data(), 2), 0);  // 2 / 1.5 = 1.33 > 1
  }
  {
    // Window: only the last repeat_last_n tokens count.
    std::vector<float> l = {2.0f, 1.9f, 0.0f, 0.0f};
    SamplerParams q = p;
    q.repeat_last_n = 2;
    Sampler s(q);
    s.accept(0);
    s.accept(2);
    s.accept(3);
    EXPECT_EQ(s.sample(l.data(), 4), 0);
    q.repeat_last_n = 3;
    Sampler s3(q);
    s3.accept(0);
    s3.accept(2);
    s3.accept(3);
    EXPECT_EQ(s3.sample(l.data(), 4), 1);
    q.repeat_last_n = -1;  // all
    Sampler sa(q);
    sa.accept(0);
    for (int i = 0; i < 1000; ++i) sa.accept(3);
    EXPECT_EQ(sa.sample(l.data(), 4), 1);
    q.repeat_last_n = 0;  // off
    Sampler so(q);
    so.accept(0);
    EXPECT_EQ(so.sample(l.data(), 4), 0);
    // reset() forgets the history.
    s3.reset();
    EXPECT_EQ(s3.sample(l.data(), 4), 0);
  }
  {
    // Tokens outside the vocabulary in the history are ignored.
    std::vector<float> l = {2.0f, 1.9f};
    Sampler s(p);
    s.accept(-1);
    s.accept(1000);
    EXPECT_EQ(s.sample(l.data(), 2), 0);
  }
  {
    // The history is trimmed but still covers the window.
    SamplerParams q = p;
    q.repeat_last_n = 4;
    std::vector<float> l = {2.0f, 1.9f, 0.0f};
    Sampler s(q);
    for (int i = 0; i < 5000; ++i) s.accept(2);
    s.accept(0);
    EXPECT_EQ(s.sample(l.data(), 3), 1);
  }
}

namespace {
void expect_error(const SamplerParams& p, const std::string& flag) {
  try {
    Sampler s(p);
    ADD_FAILURE() << "no error for " << flag;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(flag), std::string::npos) << e.what();
  }
}
}  // namespace

TEST(Sampler, BadParams) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  auto with = [](auto f) {
    SamplerParams p;
    f(p);
    return p;
  };
  expect_error(with([&](SamplerParams& p) { p.temp = nan; }), "--temp");
  expect_error(with([&](SamplerParams& p) { p.temp = inf; }), "--temp");
  expect_error(with([&](SamplerParams& p) { p.top_p = 0.0f; }), "--top-p");
  expect_error(with([&](SamplerParams& p) { p.top_p = -0.5f; }), "--top-p");
  expect_error(with([&](SamplerParams& p) { p.top_p = 1.5f; }), "--top-p");
  expect_error(with([&](SamplerParams& p) { p.top_p = nan; }), "--top-p");
  expect_error(with([&](SamplerParams& p) { p.min_p = -0.1f; }), "--min-p");
  expect_error(with([&](SamplerParams& p) { p.min_p = 1.1f; }), "--min-p");
  expect_error(with([&](SamplerParams& p) { p.min_p = nan; }), "--min-p");
  expect_error(with([&](SamplerParams& p) { p.repeat_penalty = 0.0f; }), "--repeat-penalty");
  expect_error(with([&](SamplerParams& p) { p.repeat_penalty = -1.0f; }), "--repeat-penalty");
  expect_error(with([&](SamplerParams& p) { p.repeat_penalty = nan; }), "--repeat-penalty");
  expect_error(with([&](SamplerParams& p) { p.repeat_penalty = inf; }), "--repeat-penalty");
  expect_error(with([&](SamplerParams& p) { p.repeat_last_n = -2; }), "--repeat-last-n");

  // Edges that are fine.
  EXPECT_NO_THROW(Sampler(with([](SamplerParams& p) { p.top_p = 1.0f; })));
  EXPECT_NO_THROW(Sampler(with([](SamplerParams& p) { p.min_p = 0.0f; })));
  EXPECT_NO_THROW(Sampler(with([](SamplerParams& p) { p.min_p = 1.0f; })));
  EXPECT_NO_THROW(Sampler(with([](SamplerParams& p) { p.top_k = -5; })));
  EXPECT_NO_THROW(Sampler(with([](SamplerParams& p) { p.repeat_last_n = -1; })));

  // Bad inputs to sample().
  Sampler s(SamplerParams{});
  std::vector<float> none = {nan, -inf};
  EXPECT_THROW(s.sample(none.data(), 2), Error);
  EXPECT_THROW(s.sample(none.data(), 0), Error);
}

namespace {

// Speculative sampling (Sampler::verify): over many drafts the emitted token's frequencies are
// the target distribution p itself, whether the drafter gives its distribution q or is certain
// (q one-hot on a draft drawn from some other law). A chi-square statistic against p must stay
// under a bound a correct sampler exceeds by chance with probability ~1e-8; the naive rule (on
// rejection, an ordinary draw from p) exceeds it many times over, so the test can fail.
struct SpecLaw {
  std::vector<double> p, q;  // target (after the chain), drafter
};

double chi_square(const std::vector<double>& counts, const std::vector<double>& p, int n) {
  double c2 = 0.0;
  for (size_t i = 0; i < p.size(); ++i) {
    const double e = p[i] * n;
    c2 += (counts[i] - e) * (counts[i] - e) / e;
  }
  return c2;
}

// Emitted-token counts of n drafts drawn from q (a generator of their own); q handed to
// verify() unless one_hot. naive: accept as verify() would, else an ordinary sample.
std::vector<double> spec_counts(const SpecLaw& law, bool one_hot, bool naive, int n,
                                uint64_t seed) {
  Sampler s(plain(1.0f, seed));
  const std::vector<float> logits = logits_of(law.p);
  const std::vector<float> q(law.q.begin(), law.q.end());
  std::mt19937_64 g(seed ^ 0x5bd1e995);
  std::discrete_distribution<int32_t> draft_law(law.q.begin(), law.q.end());
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::vector<double> counts(law.p.size(), 0.0);
  const auto nv = static_cast<int32_t>(law.p.size());
  for (int i = 0; i < n; ++i) {
    const int32_t draft = draft_law(g);
    const auto d = static_cast<size_t>(draft);
    int32_t t = 0;
    if (naive) {
      t = u(g) * law.q[d] < law.p[d] ? draft : s.sample(logits.data(), nv);
    } else {
      bool accepted = false;
      t = s.verify(logits.data(), nv, draft, one_hot ? nullptr : q.data(), &accepted);
      if (accepted) {
        EXPECT_EQ(t, draft);
      }
    }
    counts[static_cast<size_t>(t)] += 1.0;
  }
  return counts;
}

TEST(Sampler, SpeculativeSamplingKeepsTheTargetDistribution) {
  const SpecLaw law{{0.30, 0.20, 0.15, 0.12, 0.10, 0.07, 0.04, 0.02},
                    {0.05, 0.40, 0.05, 0.20, 0.02, 0.08, 0.10, 0.10}};
  constexpr int kN = 200000;
  constexpr double kBound = 50.0;  // chi-square, 7 degrees of freedom: P(> 50) ~ 1.4e-8
  EXPECT_LT(chi_square(spec_counts(law, false, false, kN, 1), law.p, kN), kBound);
  EXPECT_LT(chi_square(spec_counts(law, true, false, kN, 2), law.p, kN), kBound);
  EXPECT_GT(chi_square(spec_counts(law, false, true, kN, 3), law.p, kN), 10 * kBound);
}

TEST(Sampler, SpeculativeAcceptanceRateIsOneMinusTotalVariation) {
  // A draft is accepted with probability sum_x min(p(x), q(x)) = 1 - TV(p, q) = 0.75 here.
  const SpecLaw law{{0.5, 0.25, 0.125, 0.125}, {0.25, 0.25, 0.25, 0.25}};
  Sampler s(plain(1.0f, 9));
  const std::vector<float> logits = logits_of(law.p);
  const std::vector<float> q(law.q.begin(), law.q.end());
  std::mt19937_64 g(99);
  std::discrete_distribution<int32_t> draft_law(law.q.begin(), law.q.end());
  constexpr int kN = 100000;
  int n_accepted = 0;
  for (int i = 0; i < kN; ++i) {
    bool a = false;
    s.verify(logits.data(), 4, draft_law(g), q.data(), &a);
    n_accepted += a;
  }
  EXPECT_NEAR(n_accepted / static_cast<double>(kN), 0.75, 0.01);
}

// A drafter's tokens (Sampler::draft) come with the distribution they were drawn from, its
// chain (top-k, then the temperature) on the drafter's logits. Verified with it, the tokens that
// come out follow the target's chain on its own logits (the chi-square bound above); verified
// with the drafter's distribution before its temperature, they do not.
TEST(Sampler, DraftedTokensVerifiedWithTheirQKeepTheTargetDistribution) {
  const std::vector<float> target = logits_of({0.30, 0.20, 0.15, 0.12, 0.10, 0.07, 0.04, 0.02});
  const std::vector<float> drafter = logits_of({0.05, 0.40, 0.05, 0.20, 0.02, 0.08, 0.10, 0.10});
  SamplerParams tp = plain(0.8f, 5);
  tp.top_k = 6;
  // p: the target's six best, at temperature 0.8.
  std::vector<double> p(8, 0.0);
  double z = 0.0;
  for (size_t i = 0; i < 6; ++i) z += p[i] = std::exp(static_cast<double>(target[i]) / 0.8);
  for (double& x : p) x /= z;
  std::vector<float> untempered(8);
  SamplerParams up = tp;
  up.temp = 1.0f;
  ASSERT_GE(Sampler(up).draft(drafter.data(), 8, 0.0, untempered.data()), 0);
  constexpr int kN = 200000;
  constexpr double kBound = 50.0;  // 7 degrees of freedom
  double chi2[2] = {0.0, 0.0};
  for (int wrong = 0; wrong < 2; ++wrong) {
    Sampler s(tp);
    SamplerParams dp = tp;
    dp.seed = 6;
    Sampler d(dp);
    std::vector<float> q(8);
    std::vector<double> counts(8, 0.0);
    int n_accepted = 0;
    for (int i = 0; i < kN; ++i) {
      const int32_t x = d.draft(drafter.data(), 8, 0.0, q.data());
      double sum = 0.0;
      for (float v : q) sum += static_cast<double>(v);
      if (i < 100) {
        EXPECT_NEAR(sum, 1.0, 1e-6);
        EXPECT_GT(q[static_cast<size_t>(x)], 0.0f);
        EXPECT_EQ(q[2], 0.0f) << "the drafter's top-k keeps token 0 of the tie, not 2";
      }
      bool a = false;
      const int32_t t = s.verify(target.data(), 8, x, wrong ? untempered.data() : q.data(), &a);
      n_accepted += a;
      counts[static_cast<size_t>(t)] += 1.0;
    }
    EXPECT_EQ(counts[6] + counts[7], 0.0);
    counts.resize(6);
    p.resize(6);
    chi2[wrong] = chi_square(counts, p, kN);
    p.resize(8, 0.0);
    EXPECT_GT(n_accepted, kN / 3);
  }
  EXPECT_LT(chi2[0], kBound);
  EXPECT_GT(chi2[1], 10 * kBound);
}

// A drafter stops where its most likely token is too unsure (below p_min), drawing nothing and
// leaving its history as it was; greedy, by the argmax's probability at temperature 1.
TEST(Sampler, DraftStopsBelowPMin) {
  const std::vector<float> logits = logits_of({0.6, 0.3, 0.1});
  std::vector<float> q(3);
  SamplerParams p = plain(1.0f, 3);
  p.repeat_penalty = 2.0f;  // the history then changes the distribution
  Sampler s(p);
  EXPECT_EQ(s.draft(logits.data(), 3, 0.61, q.data()), -1);
  EXPECT_GE(s.draft(logits.data(), 3, 0.59, q.data()), 0);
  Sampler g(plain(0.0f));
  EXPECT_EQ(g.draft(logits.data(), 3, 0.61, nullptr), -1);
  EXPECT_EQ(g.draft(logits.data(), 3, 0.59, nullptr), 0);
  // forget() undoes what a draft added to the penalty's history: the distributions of a
  // drafter that forgets its drafts stay those of a fresh one with the same history.
  Sampler b(p);
  b.accept(1);
  std::vector<float> qa(3), qb(3);
  int others = 0;  // drafts that would have changed the penalty
  for (int i = 0; i < 20; ++i) {
    Sampler a(p);
    a.accept(1);
    a.draft(logits.data(), 3, 0.0, qa.data());
    others += b.draft(logits.data(), 3, 0.0, qb.data()) != 1;
    b.forget(1);
    EXPECT_EQ(qa, qb) << "draft " << i;
  }
  EXPECT_GT(others, 0);
  EXPECT_THROW(b.forget(2), Error);
}

TEST(Sampler, GreedyVerifyAcceptsExactlyTheArgmax) {
  Sampler s(plain(0.0f));
  const std::vector<float> logits = random_logits(1000, 2.0f, 5);
  const int32_t best = argmax(logits);
  bool a = false;
  EXPECT_EQ(s.verify(logits.data(), 1000, best, nullptr, &a), best);
  EXPECT_TRUE(a);
  EXPECT_EQ(s.verify(logits.data(), 1000, (best + 1) % 1000, nullptr, &a), best);
  EXPECT_FALSE(a);
}

TEST(Sampler, ADraftTheFiltersDropIsRejected) {
  SamplerParams p = plain(1.0f, 3);
  p.top_k = 2;
  Sampler s(p);
  const std::vector<float> logits = logits_of({0.5, 0.3, 0.15, 0.05});
  for (int i = 0; i < 200; ++i) {
    bool a = true;
    const int32_t t = s.verify(logits.data(), 4, 3, nullptr, &a);
    EXPECT_FALSE(a);
    EXPECT_LT(t, 2);
  }
}

}  // namespace

}  // namespace kvs
