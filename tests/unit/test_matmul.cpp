// The CPU backend's integer products (backend/cpu/quant_dot.cpp): the activations quantized as
// the CUDA backend quantizes them; every weight format against a double-precision product of
// the same quantized activations and against the float product of the activations themselves;
// bit-identical per token whatever the batch, the row split, the thread count and the
// instruction set.
#include <gtest/gtest.h>

#include <algorithm>
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

using cpu::XGroup;

constexpr int64_t kOut = 37;  // rows: tiles of 4 (or 2) and one left over

// Rows of 25 blocks of 32 where the format allows it (a last group of one block, a half group).
int64_t n_in(DType t) {
  return traits(t).block == 32 ? 800 : 768;
}
// The widths the products are checked at: for the formats of 32, also a last group of 2 blocks
// (576, SmolLM2's) and one of 5 (672, a short group that is not a half).
std::vector<int64_t> widths(DType t) {
  if (traits(t).block == 32) return {800, 576, 672};
  return {768};
}

struct Problem {
  std::vector<uint8_t> raw, packed;
  Matrix file, w;        // the rows as quantize_row writes them, and as the CPU backend places them
  std::vector<float> x;  // [tokens][n_in]
};

// Weights quantized from normal values with a scale that varies per 32 columns, and activations
// with an outlier now and then, as in a model.
Problem make(DType t, int64_t n_tok, uint32_t seed, int64_t n = 0) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.0f, 1.0f);
  Problem p;
  if (n == 0) n = n_in(t);
  std::vector<float> row(static_cast<size_t>(n));
  p.w.type = t;
  p.w.n_in = n;
  p.w.n_out = kOut;
  p.w.row_bytes = row_bytes(t, n);
  p.raw.resize(p.w.row_bytes * kOut);
  for (int64_t r = 0; r < kOut; ++r) {
    float s = 1.0f;
    for (int64_t i = 0; i < n; ++i) {
      if (i % 32 == 0) s = std::exp2(static_cast<float>(static_cast<int>(rng() % 6) - 3)) * 0.02f;
      row[i] = g(rng) * s + (r % 3 == 0 ? 0.01f : 0.0f);  // some rows with an offset (mins)
    }
    quantize_row(t, row.data(), p.raw.data() + r * p.w.row_bytes, n);
  }
  p.w.data = p.raw.data();
  p.file = p.w;
  if (cpu::cpu_repacked(t)) {
    p.w.row_bytes = cpu::cpu_row_bytes(t, n);
    p.packed.resize(p.w.row_bytes * kOut);
    std::vector<uint8_t> back(p.file.row_bytes);
    for (int64_t r = 0; r < kOut; ++r) {
      uint8_t* packed = p.packed.data() + r * p.w.row_bytes;
      cpu::pack_row(t, p.file.row(r), packed, n);
      cpu::unpack_row(t, packed, back.data(), n);
      EXPECT_EQ(std::memcmp(back.data(), p.file.row(r), back.size()), 0) << "row " << r;
    }
    p.w.data = p.packed.data();
  }
  p.x.resize(static_cast<size_t>(n_tok * n));
  for (auto& v : p.x) v = g(rng) * (rng() % 50 == 0 ? 20.0f : 1.0f);
  return p;
}

std::vector<XGroup> quantize(const float* x, int64_t n_tok, int64_t n) {
  std::vector<XGroup> q(static_cast<size_t>(n_tok * cpu::x_groups(n)));
  cpu::quantize_x(x, n_tok, n, q.data());
  return q;
}

// y = W x through the backend's product of one job.
void product(const Matrix& w, const float* x, const XGroup* xq, float* y, int64_t n_tok) {
  const MatJob job{&w, y};
  cpu::matmuls(x, xq, n_tok, &job, 1);
}

// Activation i of a token's n, as the kernels see it: dx / 254 (254 h + l).
double x_at(const XGroup* q, int64_t i, int64_t n) {
  const XGroup& g = q[i / 256];
  const int j = static_cast<int>(i % 256 / 32), e = static_cast<int>(i % 32);
  const bool half = cpu::half_group(i / 256, n / 32);
  return static_cast<double>(g.d[j]) * g.v[half ? cpu::v_half_index(j, e) : cpu::v_index(j, e)];
}
// Its scale dx / 254.
double d_at(const XGroup* q, int64_t i) {
  return static_cast<double>(q[i / 256].d[i % 256 / 32]);
}

// The CUDA backend's quantize_x_block, written out per element.
TEST(IntMatmul, ActivationsAsCuda) {
  std::mt19937 rng(3);
  std::normal_distribution<float> g(0.0f, 3.0f);
  constexpr int64_t n = 7 * 32;  // a group short of its last block
  std::vector<float> x(n);
  for (auto& v : x) v = g(rng) * (rng() % 20 == 0 ? 30.0f : 1.0f);
  std::fill(x.begin(), x.begin() + 32, 0.0f);  // an all-zero block
  const auto q = quantize(x.data(), 1, n);
  ASSERT_EQ(q.size(), 1u);
  const XGroup& xg = q[0];
  for (int j = 0; j < n / 32; ++j) {
    float amax = 0.0f;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[j * 32 + i]));
    const float dx = amax / 127.0f, id = dx != 0.0f ? 1.0f / dx : 0.0f;
    int sum[3] = {0, 0, 0};
    for (int i = 0; i < 32; ++i) {
      const float s = x[j * 32 + i] * id, h = std::rint(s), l = std::rint((s - h) * 254.0f);
      const int v = 254 * static_cast<int>(h) + static_cast<int>(l);
      ASSERT_LE(std::fabs(l), 127.0f);
      ASSERT_EQ(xg.v[cpu::v_index(j, i)], v) << j << " " << i;
      EXPECT_LE(std::fabs(dx * (h + l / 254.0f) - x[j * 32 + i]), dx / 508.0f * 1.001f + 1e-30f);
      sum[0] += v;
      sum[1 + i / 16] += v;
    }
    EXPECT_EQ(xg.d[j], dx / 254.0f);
    for (int k = 0; k < 3; ++k) {
      EXPECT_EQ(xg.nsum[k][j], -sum[k]);
      EXPECT_EQ(xg.s[k][j], dx * (static_cast<float>(sum[k]) / 254.0f));
    }
  }
  EXPECT_EQ(xg.d[0], 0.0f);
  // The block past the end is zeros.
  for (int i = 0; i < 32; ++i) EXPECT_EQ(xg.v[cpu::v_index(7, i)], 0);
  for (int k = 0; k < 3; ++k) EXPECT_EQ(xg.s[k][7] + static_cast<float>(xg.nsum[k][7]), 0.0f);
  EXPECT_EQ(xg.d[7], 0.0f);
}

class IntMatmul : public testing::TestWithParam<DType> {};

// Every output, for 1 .. 9 and 16 tokens, against sum_i dequant(w)_i x_i in double, with x_i
// the quantized activations (up to float rounding, relative to sum |w x|) and with x_i the
// activations themselves (up to the quantization, at most dx / 508 per element).
TEST_P(IntMatmul, MatchesDequantizedProduct) {
  const DType t = GetParam();
  for (const int64_t n : widths(t))
    for (const int64_t n_tok : {1, 2, 3, 4, 5, 6, 7, 8, 9, 16}) {
      const int64_t np = cpu::x_groups(n);
      Problem p = make(t, n_tok, 11 + static_cast<uint32_t>(n_tok), n);
      const auto q = quantize(p.x.data(), n_tok, n);
      std::vector<float> y(static_cast<size_t>(n_tok * kOut));
      product(p.w, p.x.data(), q.data(), y.data(), n_tok);
      std::vector<float> w(static_cast<size_t>(n));
      for (int64_t r = 0; r < kOut; ++r) {
        dequantize_row(t, p.file.row(r), w.data(), n);
        for (int64_t tt = 0; tt < n_tok; ++tt) {
          const XGroup* xq = q.data() + tt * np;
          const float* xf = p.x.data() + tt * n;
          double want = 0.0, mag = 0.0, exact = 0.0, bound = 0.0;
          for (int64_t i = 0; i < n; ++i) {
            const double xi = x_at(xq, i, n), wi = static_cast<double>(w[i]);
            want += wi * xi;
            mag += std::fabs(wi * xi);
            exact += wi * static_cast<double>(xf[i]);
            bound += std::fabs(wi) * d_at(xq, i) * 254.0 / 508.0;
          }
          const double got = static_cast<double>(y[static_cast<size_t>(tt * kOut + r)]);
          ASSERT_LE(std::fabs(got - want), 2e-6 * mag)
              << n << " wide, " << n_tok << " tokens, row " << r << " token " << tt;
          ASSERT_LE(std::fabs(got - exact), 1.001 * bound + 2e-6 * mag)
              << n << " wide, " << n_tok << " tokens, row " << r << " token " << tt;
        }
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

// A token's outputs are the same bits alone, in batches of 2 .. 9, 16 and 64 (every position in
// them), on one thread or two, rows in one call or one by one, on every instruction set here.
TEST_P(IntMatmul, BatchInvariant) {
  const DType t = GetParam();
  constexpr int64_t kTok = 64;
  for (const int64_t n : widths(t)) {
    const int64_t np = cpu::x_groups(n);
    Problem p = make(t, kTok, 5, n);
    const auto q = quantize(p.x.data(), kTok, n);
    const int threads = thread_pool().size();
    std::vector<float> alone(static_cast<size_t>(kTok * kOut));
    for (int64_t tt = 0; tt < kTok; ++tt)
      product(p.w, p.x.data() + tt * n, q.data() + tt * np, alone.data() + tt * kOut, 1);
    for (const int th : {1, 2}) {
      set_thread_count(th);
      for (int64_t b : {1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 64}) {
        std::vector<float> y(static_cast<size_t>(kTok * kOut));
        for (int64_t t0 = 0; t0 < kTok; t0 += b) {
          const int64_t m = std::min(b, kTok - t0);
          product(p.w, p.x.data() + t0 * n, q.data() + t0 * np, y.data() + t0 * kOut, m);
        }
        EXPECT_TRUE(same_bits(alone.data(), y.data(), y.size()))
            << n << " wide, batch " << b << ", " << th << " threads";
      }
    }
    set_thread_count(threads);
    for (const cpu::DotIsa isa :
         {cpu::DotIsa::Avx2, cpu::DotIsa::AvxVnni, cpu::DotIsa::Avx512Vnni}) {
      if (!cpu::cpu_has(isa)) continue;
      std::vector<float> all(alone.size()), single(alone.size());
      cpu::int_matmul_rows(p.w, q.data(), kTok, 0, kOut, all.data(), kOut, isa);
      for (int64_t r = 0; r < kOut; ++r)
        cpu::int_matmul_rows(p.w, q.data(), kTok, r, 1, single.data() + r, kOut, isa);
      EXPECT_TRUE(same_bits(alone.data(), all.data(), all.size())) << static_cast<int>(isa);
      EXPECT_TRUE(same_bits(alone.data(), single.data(), single.size())) << static_cast<int>(isa);
    }
  }
}

// Jobs that share x run as one: each job's outputs are its product alone, plus its bias, then
// written or added to y (the roundings of the separate steps), whatever the other jobs.
TEST(IntMatmul, JobsOfAGroup) {
  constexpr int64_t kTok = 70;  // two chunks of tokens
  Problem a = make(DType::Q4_1, kTok, 7, 768), b = make(DType::Q6_K, kTok, 8, 768);
  const auto q = quantize(a.x.data(), kTok, 768);
  std::vector<float> bias(kOut), ya(static_cast<size_t>(kTok * kOut)), yb(ya.size());
  for (int64_t r = 0; r < kOut; ++r) bias[r] = 0.1f * static_cast<float>(r);
  for (size_t i = 0; i < yb.size(); ++i) yb[i] = static_cast<float>(i % 7) - 3.0f;
  std::vector<float> want_a(ya.size()), want_b = yb, pb(yb.size());
  product(a.w, a.x.data(), q.data(), want_a.data(), kTok);
  product(b.w, a.x.data(), q.data(), pb.data(), kTok);
  for (int64_t t = 0; t < kTok; ++t)
    for (int64_t r = 0; r < kOut; ++r) {
      want_a[t * kOut + r] += bias[r];
      want_b[t * kOut + r] += pb[t * kOut + r];
    }
  MatJob jobs[2] = {{&a.w, ya.data(), bias.data()}, {&b.w, yb.data()}};
  jobs[1].add = true;
  cpu::matmuls(a.x.data(), q.data(), kTok, jobs, 2);
  EXPECT_TRUE(same_bits(want_a.data(), ya.data(), ya.size()));
  EXPECT_TRUE(same_bits(want_b.data(), yb.data(), yb.size()));
}

INSTANTIATE_TEST_SUITE_P(Formats, IntMatmul,
                         testing::Values(DType::Q8_0, DType::Q4_0, DType::Q4_1, DType::Q5_0,
                                         DType::Q5_1, DType::IQ4_NL, DType::Q2_K, DType::Q3_K,
                                         DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::IQ4_XS),
                         [](const testing::TestParamInfo<DType>& i) {
                           return std::string(dtype_name(i.param));
                         });

}  // namespace
}  // namespace kvs
