// The CPU backend's attention (backend/cpu/attention.cpp) over paged f16, q8_0 and q4_0 caches,
// head sizes 64, 128 and 256, groups of 1, 3 and 4 query heads a KV head, with and without a
// window: against a double-precision softmax over the dequantized cache, and the same bits for a
// query whatever the call: decode alone, prefill in any batch, the spans in one call or two, on
// AVX2 or AVX-512, on one thread or two.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <tuple>
#include <vector>

#include "kvs/backend/cpu/kernels.h"
#include "kvs/quant/kv_page.h"
#include "kvs/util/threadpool.h"

namespace kvs {
namespace {

constexpr int32_t kPage = 64, kLen = 200, kKvHeads = 2;  // 4 spans, the last one partial

struct Cache {
  KvLayout l;
  std::vector<uint8_t> pages;
  std::vector<Span> spans;
  std::vector<float> k, v;  // dequantized: [pos][kv head][d]
};

Cache make_cache(DType t, int32_t d, uint32_t seed) {
  Cache c;
  c.l = KvLayout::make(t, t, kPage, kKvHeads, d);
  const int32_t n_pages = (kLen + kPage - 1) / kPage;
  c.pages.assign(c.l.page_bytes() * n_pages, 0);
  c.k.assign(static_cast<size_t>(kLen) * kKvHeads * d, 0.0f);
  c.v.assign(c.k.size(), 0.0f);
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(d));
  for (int32_t p = 0; p < kLen; ++p) {
    uint8_t* page = c.pages.data() + (p / kPage) * c.l.page_bytes();
    const int32_t slot = p % kPage;
    for (int32_t h = 0; h < kKvHeads; ++h) {
      const size_t at = (static_cast<size_t>(p) * kKvHeads + h) * d;
      for (auto& e : x) e = g(rng);
      kv_quantize_head(t, x.data(), page + slot * c.l.k_row + h * c.l.k_head, d);
      kv_dequantize_head(t, page + slot * c.l.k_row + h * c.l.k_head, c.k.data() + at, d);
      for (auto& e : x) e = g(rng);
      uint8_t* vr = page + c.l.v_offset() + slot * c.l.v_row + h * c.l.v_head;
      kv_quantize_head(t, x.data(), vr, d);
      kv_dequantize_head(t, vr, c.v.data() + at, d);
    }
  }
  c.spans.resize(static_cast<size_t>(n_pages));
  for (int32_t s = 0; s < n_pages; ++s)
    c.spans[s] = {c.pages.data() + s * c.l.page_bytes(), s * kPage,
                  std::min(kPage, kLen - s * kPage)};
  return c;
}

// out[n_tok][n_head][d] for queries q at positions pos, spans [s0, s1) in one call per range.
std::vector<float> attend(const Cache& c, const float* q, const int32_t* pos, int32_t n_tok,
                          int32_t n_head, int32_t window, cpu::DotIsa isa,
                          std::vector<std::pair<int32_t, int32_t>> ranges = {}) {
  const int32_t d = c.l.head_dim;
  if (ranges.empty()) ranges = {{0, static_cast<int32_t>(c.spans.size())}};
  std::vector<float> out(static_cast<size_t>(n_tok) * n_head * d),
      acc(static_cast<size_t>(n_tok) * n_head * 2);
  for (size_t i = 0; i < ranges.size(); ++i) {
    AttentionArgs a;
    a.q = q;
    a.out = out.data();
    a.acc = acc.data();
    a.pos = pos;
    a.n_tok = n_tok;
    a.spans = c.spans.data() + ranges[i].first;
    a.n_spans = ranges[i].second - ranges[i].first;
    a.kv = c.l;
    a.n_head = n_head;
    a.scale = 1.0f / std::sqrt(static_cast<float>(d));
    a.window = window;
    a.first = i == 0;
    a.last = i + 1 == ranges.size();
    cpu::attention(a, isa);
  }
  return out;
}

::testing::AssertionResult same_bits(const std::vector<float>& a, const float* b, size_t n) {
  for (size_t i = 0; i < n; ++i)
    if (std::memcmp(&a[i], b + i, sizeof(float)) != 0)
      return ::testing::AssertionFailure() << "element " << i << ": " << a[i] << " vs " << b[i];
  return ::testing::AssertionSuccess();
}

using Param = std::tuple<DType, int32_t, int32_t, int32_t>;  // cache type, head size, group, window
class CpuAttention : public testing::TestWithParam<Param> {};

TEST_P(CpuAttention, MatchesReferenceAndIsTheSameInEveryCall) {
  const auto [t, d, group, window] = GetParam();
  const Cache c = make_cache(t, d, 7);
  const int32_t n_head = kKvHeads * group, n_tok = 37;
  std::mt19937 rng(9);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> q(static_cast<size_t>(n_tok) * n_head * d);
  for (auto& e : q) e = g(rng);
  std::vector<int32_t> pos(n_tok);
  for (int32_t i = 0; i < n_tok; ++i) pos[i] = kLen - n_tok + i;
  const cpu::DotIsa best = cpu::best_dot_isa();
  const std::vector<float> all = attend(c, q.data(), pos.data(), n_tok, n_head, window, best);
  const size_t row = static_cast<size_t>(n_head) * d;

  // Against softmax(q k / sqrt(d)) v in double over the dequantized cache.
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  double worst = 0.0;
  for (int32_t i = 0; i < n_tok; ++i)
    for (int32_t h = 0; h < n_head; ++h) {
      const int32_t hk = h / group, j0 = window > 0 ? std::max(0, pos[i] - window + 1) : 0;
      std::vector<double> w(static_cast<size_t>(pos[i] - j0 + 1));
      double m = -INFINITY, sum = 0.0;
      for (int32_t j = j0; j <= pos[i]; ++j) {
        double s = 0.0;
        for (int32_t e = 0; e < d; ++e)
          s += static_cast<double>(q[i * row + h * d + e]) *
               static_cast<double>(c.k[(static_cast<size_t>(j) * kKvHeads + hk) * d + e]);
        w[static_cast<size_t>(j - j0)] = s * scale;
        m = std::max(m, s * scale);
      }
      for (double& e : w) sum += (e = std::exp(e - m));
      for (int32_t e = 0; e < d; ++e) {
        double o = 0.0;
        for (size_t j = 0; j < w.size(); ++j)
          o += w[j] * static_cast<double>(c.v[((j0 + j) * kKvHeads + hk) * d + e]);
        worst = std::max(worst, std::fabs(o / sum - static_cast<double>(all[i * row + h * d + e])));
      }
    }
  EXPECT_LT(worst, 1e-5) << "worst difference from the double-precision reference";

  // Each query alone (decode), in batches of 2 .. 9 and 16, with the spans in two calls, and on
  // the other instruction set: the same bits.
  std::vector<cpu::DotIsa> isas = {cpu::DotIsa::Avx2};
  if (best == cpu::DotIsa::Avx512Vnni) isas.push_back(best);
  for (const cpu::DotIsa isa : isas) {
    for (int32_t b : {1, 2, 3, 5, 8, 9, 16}) {
      for (int32_t t0 = 0; t0 < n_tok; t0 += b) {
        const int32_t m = std::min(b, n_tok - t0);
        const auto part = attend(c, q.data() + t0 * row, pos.data() + t0, m, n_head, window, isa);
        ASSERT_TRUE(same_bits(part, all.data() + t0 * row, part.size()))
            << "batch " << b << " at " << t0 << ", isa " << static_cast<int>(isa);
      }
    }
    const auto split =
        attend(c, q.data(), pos.data(), n_tok, n_head, window, isa, {{0, 2}, {2, 4}});
    EXPECT_TRUE(same_bits(split, all.data(), all.size())) << "spans in two calls";
  }
  // On one thread.
  const int threads = thread_pool().size();
  set_thread_count(1);
  const auto one = attend(c, q.data(), pos.data(), n_tok, n_head, window, best);
  set_thread_count(threads);
  EXPECT_TRUE(same_bits(one, all.data(), all.size())) << "one thread";
}

INSTANTIATE_TEST_SUITE_P(Shapes, CpuAttention,
                         testing::Combine(testing::Values(DType::F16, DType::Q8_0, DType::Q4_0),
                                          testing::Values(64, 128, 256), testing::Values(1, 3, 4),
                                          testing::Values(0, 50)),
                         [](const testing::TestParamInfo<Param>& i) {
                           return std::string(dtype_name(std::get<0>(i.param))) + "_d" +
                                  std::to_string(std::get<1>(i.param)) + "_g" +
                                  std::to_string(std::get<2>(i.param)) + "_w" +
                                  std::to_string(std::get<3>(i.param));
                         });

}  // namespace
}  // namespace kvs
