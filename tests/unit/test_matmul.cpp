// The CPU backend's integer products (backend/cpu/quant_dot.cpp): against a double-precision
// reference on the same quantized activations, and bit-identical per token whatever the batch,
// the row split, the thread count and the instruction set.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kvs/backend/cpu/kernels.h"
#include "kvs/backend/cpu/quant_dot.h"
#include "kvs/quant/types.h"
#include "kvs/util/threadpool.h"

namespace kvs {
namespace {

using cpu::XBlock;

class IntMatmul : public testing::TestWithParam<DType> {};

constexpr int64_t kOut = 37, kIn = 768;  // rows: 9 tiles of 4 and one left over

struct Problem {
  std::vector<uint8_t> raw;
  Matrix w;
  std::vector<float> x;  // [tokens][kIn]
};

// Weights quantized from normal values with a scale that varies per 32 columns, and activations
// with an outlier now and then, as in a model.
Problem make(DType t, int64_t n_tok, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.0f, 1.0f);
  Problem p;
  std::vector<float> row(kIn);
  p.w.type = t;
  p.w.n_in = kIn;
  p.w.n_out = kOut;
  p.w.row_bytes = row_bytes(t, kIn);
  p.raw.resize(p.w.row_bytes * kOut);
  for (int64_t r = 0; r < kOut; ++r) {
    float s = 1.0f;
    for (int64_t i = 0; i < kIn; ++i) {
      if (i % 32 == 0) s = std::exp2(static_cast<float>(static_cast<int>(rng() % 6) - 3)) * 0.02f;
      row[i] = g(rng) * s + (r % 3 == 0 ? 0.01f : 0.0f);  // some rows with an offset (mins)
    }
    quantize_row(t, row.data(), p.raw.data() + r * p.w.row_bytes, kIn);
  }
  p.w.data = p.raw.data();
  p.x.resize(static_cast<size_t>(n_tok * kIn));
  for (auto& v : p.x) v = g(rng) * (rng() % 50 == 0 ? 20.0f : 1.0f);
  return p;
}

std::vector<XBlock> quantize(const float* x, int64_t n_tok) {
  std::vector<XBlock> q(static_cast<size_t>(n_tok * kIn / 32));
  cpu::quantize_x(x, n_tok, kIn, q.data());
  return q;
}

TEST(IntMatmul, ActivationsWithinHalfAStep) {
  std::mt19937 rng(3);
  std::normal_distribution<float> g(0.0f, 3.0f);
  std::vector<float> x(kIn);
  for (auto& v : x) v = g(rng);
  std::fill(x.begin(), x.begin() + 32, 0.0f);  // an all-zero block
  const auto q = quantize(x.data(), 1);
  for (int64_t b = 0; b < kIn / 32; ++b) {
    int sum = 0;
    for (int i = 0; i < 32; ++i) {
      const float v = x[b * 32 + i];
      EXPECT_LE(std::fabs(q[b].d * q[b].q[i] - v), 0.5f * q[b].d * 1.0001f) << b << " " << i;
      EXPECT_GE(q[b].q[i], -127);
      sum += q[b].q[i];
    }
    EXPECT_EQ(q[b].s8, q[b].d * static_cast<float>(sum) * 0.125f);
  }
  EXPECT_EQ(q[0].d, 0.0f);
}

// Every output against sum_i dequant(w)_i d q_i in double, relative to sum |w x|: the integer
// kernel computes that product up to float rounding.
TEST_P(IntMatmul, MatchesDequantizedProduct) {
  const DType t = GetParam();
  const int64_t n_tok = 5;
  Problem p = make(t, n_tok, 11);
  const auto q = quantize(p.x.data(), n_tok);
  std::vector<float> y(static_cast<size_t>(n_tok * kOut));
  cpu::matmul(p.w, p.x.data(), q.data(), y.data(), n_tok, nullptr);
  std::vector<float> w(kIn);
  for (int64_t r = 0; r < kOut; ++r) {
    dequantize_row(t, p.w.row(r), w.data(), kIn);
    for (int64_t tt = 0; tt < n_tok; ++tt) {
      double want = 0.0, mag = 0.0;
      for (int64_t i = 0; i < kIn; ++i) {
        const XBlock& b = q[static_cast<size_t>(tt * kIn / 32 + i / 32)];
        const double xi = static_cast<double>(b.d) * b.q[i % 32];
        want += static_cast<double>(w[i]) * xi;
        mag += std::fabs(static_cast<double>(w[i]) * xi);
      }
      const double got = y[static_cast<size_t>(tt * kOut + r)];
      EXPECT_LE(std::fabs(got - want), 2e-6 * mag) << "row " << r << " token " << tt;
    }
  }
}

::testing::AssertionResult same_bits(const float* a, const float* b, size_t n) {
  if (std::memcmp(a, b, n * sizeof(float)) == 0) return ::testing::AssertionSuccess();
  for (size_t i = 0; i < n; ++i)
    if (std::memcmp(a + i, b + i, sizeof(float)) != 0)
      return ::testing::AssertionFailure() << "element " << i << ": " << a[i] << " vs " << b[i];
  return ::testing::AssertionFailure();
}

// A token's outputs are the same bits alone, in batches of 2 .. 9 and 64 (every position in
// them), on one thread or two, rows in one call or one by one, on every instruction set here.
TEST_P(IntMatmul, BatchInvariant) {
  const DType t = GetParam();
  constexpr int64_t kTok = 64;
  Problem p = make(t, kTok, 5);
  const auto q = quantize(p.x.data(), kTok);
  const int threads = thread_pool().size();
  std::vector<float> alone(static_cast<size_t>(kTok * kOut));
  for (int64_t tt = 0; tt < kTok; ++tt)
    cpu::matmul(p.w, p.x.data() + tt * kIn, q.data() + tt * kIn / 32, alone.data() + tt * kOut, 1,
                nullptr);
  for (const int th : {1, 2}) {
    set_thread_count(th);
    for (int64_t n : {1, 2, 3, 4, 5, 6, 7, 8, 9, 64}) {
      std::vector<float> y(static_cast<size_t>(kTok * kOut));
      for (int64_t t0 = 0; t0 < kTok; t0 += n) {
        const int64_t m = std::min(n, kTok - t0);
        cpu::matmul(p.w, p.x.data() + t0 * kIn, q.data() + t0 * kIn / 32, y.data() + t0 * kOut, m,
                    nullptr);
      }
      EXPECT_TRUE(same_bits(alone.data(), y.data(), y.size())) << "batch " << n << ", " << th
                                                                << " threads";
    }
  }
  set_thread_count(threads);
  for (const cpu::DotIsa isa :
       {cpu::DotIsa::Avx2, cpu::DotIsa::AvxVnni, cpu::DotIsa::Avx512Vnni}) {
    if (!cpu::cpu_has(isa)) continue;
    std::vector<float> all(alone.size()), single(alone.size());
    cpu::int_matmul_rows(p.w, q.data(), all.data(), kTok, 0, kOut, isa);
    for (int64_t r = 0; r < kOut; ++r)
      cpu::int_matmul_rows(p.w, q.data(), single.data(), kTok, r, 1, isa);
    EXPECT_TRUE(same_bits(alone.data(), all.data(), all.size())) << static_cast<int>(isa);
    EXPECT_TRUE(same_bits(alone.data(), single.data(), single.size())) << static_cast<int>(isa);
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, IntMatmul,
                         testing::Values(DType::Q8_0, DType::Q4_0, DType::Q4_1, DType::Q5_0,
                                         DType::Q5_1, DType::Q4_K, DType::Q5_K, DType::Q6_K),
                         [](const testing::TestParamInfo<DType>& i) {
                           return std::string(dtype_name(i.param));
                         });

}  // namespace
}  // namespace kvs
