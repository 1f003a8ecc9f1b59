// CPU quant kernels: the AVX2 kernels against the scalar reference (bit exact), both against
// gguf-py (tests/unit/dequant_ref.py, bit exact), and the round-trip error of quantize_row.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <unistd.h>

#include "kvs/quant/kv_page.h"
#include "kvs/quant/ref.h"
#include "kvs/quant/types.h"
#include "kvs/util/error.h"
#include "kvs/util/fp16.h"
#include "kvs/util/npy.h"

namespace kvs {
namespace {

// Layouts written down independently of src/ (ggml-common.h): where each block keeps its f16
// scale fields, so random blocks can be given finite scales.
struct Format {
  DType t;
  const char* gguf;  // GGMLQuantizationType name
  int block, bytes;
  std::vector<int> f16_fields;
};

const std::vector<Format>& formats() {
  static const std::vector<Format> f = {
      {DType::F32, "F32", 1, 4, {}},           {DType::F16, "F16", 1, 2, {}},
      {DType::BF16, "BF16", 1, 2, {}},         {DType::Q8_0, "Q8_0", 32, 34, {0}},
      {DType::Q4_0, "Q4_0", 32, 18, {0}},      {DType::Q4_1, "Q4_1", 32, 20, {0, 2}},
      {DType::Q5_0, "Q5_0", 32, 22, {0}},      {DType::Q5_1, "Q5_1", 32, 24, {0, 2}},
      {DType::Q4_K, "Q4_K", 256, 144, {0, 2}}, {DType::Q5_K, "Q5_K", 256, 176, {0, 2}},
      {DType::Q6_K, "Q6_K", 256, 210, {208}},  {DType::Q2_K, "Q2_K", 256, 84, {80, 82}},
      {DType::Q3_K, "Q3_K", 256, 110, {108}},  {DType::IQ4_NL, "IQ4_NL", 32, 18, {0}},
      {DType::IQ4_XS, "IQ4_XS", 256, 136, {0}},
  };
  return f;
}

std::string format_name(const testing::TestParamInfo<Format>& info) {
  return info.param.gguf;
}
// Shown by gtest (and in ctest's test names) instead of the struct's bytes.
void PrintTo(const Format& f, std::ostream* os) {
  *os << f.gguf;
}

void put_u16(uint8_t* p, uint16_t v) {
  std::memcpy(p, &v, 2);
}

// n_blocks random blocks (or elements, for the float formats) with finite values.
std::vector<uint8_t> random_blocks(const Format& f, int64_t n_blocks, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> raw(static_cast<size_t>(n_blocks * f.bytes));
  for (auto& b : raw) b = static_cast<uint8_t>(rng());
  std::uniform_real_distribution<float> scale(-0.05f, 0.05f);
  for (int64_t i = 0; i < n_blocks; ++i) {
    uint8_t* b = raw.data() + i * f.bytes;
    if (f.t == DType::F32) {
      const float v = std::ldexp(scale(rng), static_cast<int>(rng() % 40) - 20);
      std::memcpy(b, &v, 4);
    } else if (f.t == DType::F16) {
      uint16_t h;
      std::memcpy(&h, b, 2);
      if ((h & 0x7c00) == 0x7c00) put_u16(b, h & 0xbfff);  // no inf/nan; subnormals stay
    } else if (f.t == DType::BF16) {
      uint16_t h;
      std::memcpy(&h, b, 2);
      if ((h & 0x7f80) == 0x7f80) put_u16(b, h & 0xbfff);
    }
    for (int off : f.f16_fields) put_u16(b + off, f32_to_f16(scale(rng)));
  }
  return raw;
}

// Bit equality, with any NaN equal to any NaN.
::testing::AssertionResult same_floats(const std::vector<float>& a, const float* b, size_t n) {
  if (a.size() != n) return ::testing::AssertionFailure() << "size " << a.size() << " vs " << n;
  for (size_t i = 0; i < n; ++i) {
    uint32_t ua, ub;
    std::memcpy(&ua, &a[i], 4);
    std::memcpy(&ub, &b[i], 4);
    if (ua != ub && !(std::isnan(a[i]) && std::isnan(b[i]))) {
      return ::testing::AssertionFailure() << "element " << i << ": " << a[i] << " vs " << b[i];
    }
  }
  return ::testing::AssertionSuccess();
}

std::vector<float> dequant(DType t, const std::vector<uint8_t>& raw, int64_t n, bool ref) {
  std::vector<float> y(static_cast<size_t>(n));
  (ref ? dequantize_row_ref : dequantize_row)(t, raw.data(), y.data(), n);
  return y;
}

// Inputs for the quantizers: normal values with a scale that varies per 32, a few outliers, an
// all-zero block and a constant block.
std::vector<float> random_input(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n));
  float s = 1.0f;
  for (int64_t i = 0; i < n; ++i) {
    if (i % 32 == 0) s = std::exp2(static_cast<float>(static_cast<int>(rng() % 12) - 6));
    x[i] = g(rng) * s;
    if (rng() % 97 == 0) x[i] *= 8.0f;
  }
  if (n >= 512) {
    std::fill(x.begin() + 64, x.begin() + 96, 0.0f);
    std::fill(x.begin() + 96, x.begin() + 128, 0.75f);
  }
  return x;
}

// ---- Python reference ----

const char* python() {
  const char* p = std::getenv("KVS_PYTHON");
  return p != nullptr ? p : KVS_TEST_PYTHON;
}

std::string source_dir() {
  const char* s = std::getenv("KVS_SOURCE_DIR");
  return s != nullptr ? s : KVS_TEST_SOURCE_DIR;
}

std::filesystem::path temp_dir() {
  static const std::filesystem::path dir = [] {
    auto d = std::filesystem::temp_directory_path() /
             ("kvs_test_quant_" + std::to_string(static_cast<long>(getpid())));
    std::filesystem::create_directories(d);
    return d;
  }();
  return dir;
}

void run_reference(const std::string& args) {
  const std::string cmd =
      std::string(python()) + " " + source_dir() + "/tests/unit/dequant_ref.py " + args;
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
}

void write_file(const std::filesystem::path& p, const void* data, size_t n) {
  std::ofstream out(p, std::ios::binary);
  out.write(static_cast<const char*>(data), static_cast<std::streamsize>(n));
  ASSERT_TRUE(out.good()) << p;
}

std::vector<uint8_t> read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

class QuantFormat : public testing::TestWithParam<Format> {};

constexpr int64_t kRows = 3, kCols = 1024;  // kCols: a multiple of every block size

// ---- dequantize ----

TEST_P(QuantFormat, LayoutMatchesTraits) {
  const Format& f = GetParam();
  EXPECT_EQ(traits(f.t).block, static_cast<uint32_t>(f.block));
  EXPECT_EQ(traits(f.t).block_bytes, static_cast<uint32_t>(f.bytes));
  EXPECT_TRUE(is_supported(f.t));
}

TEST_P(QuantFormat, DequantizeFastMatchesReference) {
  const Format& f = GetParam();
  // Several lengths: one block, and for the float formats lengths that leave a scalar tail.
  std::vector<int64_t> lengths = {f.block, 8 * 256, 16 * 256};
  if (f.block == 1) lengths.insert(lengths.end(), {7, 13, 1003});
  for (int64_t n : lengths) {
    SCOPED_TRACE(n);
    const auto raw = random_blocks(f, n / f.block, static_cast<uint32_t>(n));
    EXPECT_TRUE(same_floats(dequant(f.t, raw, n, true), dequant(f.t, raw, n, false).data(),
                            static_cast<size_t>(n)));
  }
}

TEST_P(QuantFormat, DequantizeMatchesGguf) {
  if (python() == nullptr) GTEST_SKIP() << "KVS_PYTHON is not set";
  const Format& f = GetParam();
  const int64_t blocks_per_row = kCols / f.block;
  const auto raw = random_blocks(f, kRows * blocks_per_row, 1234);
  const auto in = temp_dir() / (std::string("deq_") + f.gguf + ".bin");
  const auto out = temp_dir() / (std::string("deq_") + f.gguf + ".npy");
  write_file(in, raw.data(), raw.size());
  run_reference(std::string("dequant ") + f.gguf + " " + in.string() + " " + std::to_string(kRows) +
                " " + out.string());
  const NpyArray want = read_npy(out.string());
  ASSERT_EQ(want.shape, (std::vector<int64_t>{kRows, kCols}));
  for (int64_t r = 0; r < kRows; ++r) {
    SCOPED_TRACE(r);
    const std::vector<uint8_t> row(raw.begin() + r * blocks_per_row * f.bytes,
                                   raw.begin() + (r + 1) * blocks_per_row * f.bytes);
    const float* w = want.data.data() + r * kCols;
    EXPECT_TRUE(same_floats(dequant(f.t, row, kCols, false), w, kCols)) << "fast";
    EXPECT_TRUE(same_floats(dequant(f.t, row, kCols, true), w, kCols)) << "reference";
  }
}

// ---- quantize ----

TEST_P(QuantFormat, QuantizeFastMatchesReference) {
  const Format& f = GetParam();
  const int64_t n = 4096;
  const auto x = random_input(n, 99);
  std::vector<uint8_t> fast(static_cast<size_t>(n / f.block * f.bytes));
  std::vector<uint8_t> ref(fast.size());
  quantize_row(f.t, x.data(), fast.data(), n);
  quantize_row_ref(f.t, x.data(), ref.data(), n);
  EXPECT_EQ(fast, ref);
}

// Worst-case error of one element of a 32-block: b is the block's largest magnitude, lo/hi
// its range. The 1.01 factors cover the f16 rounding of the scales.
double element_bound(DType t, float lo, float hi, float amax) {
  const double a = static_cast<double>(amax);
  const double range = static_cast<double>(hi) - static_cast<double>(lo);
  const double m = std::max(std::fabs(static_cast<double>(lo)), std::fabs(static_cast<double>(hi)));
  switch (t) {
    case DType::Q8_0:
      return 0.51 * a / 127 + a * 0x1p-10;
    // Symmetric formats map the largest magnitude to -8 (-16); its mirror image clips to 7 (15).
    case DType::Q4_0:
      return 1.01 * a / 8;
    case DType::Q5_0:
      return 1.01 * a / 16;
    case DType::Q4_1:
      return 0.51 * range / 15 + m * 0x1p-10;
    case DType::Q5_1:
      return 0.51 * range / 31 + m * 0x1p-10;
    // Levels at most 24 apart, the largest magnitude near -127 (the least-squares scale moves it
    // a little); the mirror image clips 14 past 113.
    case DType::IQ4_NL:
      return 0.125 * a;
    default:
      return 0.0;
  }
}

// Bound on the row's RMS error relative to its RMS value for random_input (measured values
// with ~25% margin; the K-quants and IQ4 use our simple quantizers).
double max_rms_error(DType t) {
  switch (t) {
    case DType::F32:
      return 0.0;
    case DType::F16:
      return 3e-4;
    case DType::BF16:
      return 2.5e-3;
    case DType::Q8_0:
      return 0.01;
    case DType::Q4_0:
      return 0.16;
    case DType::Q4_1:
    case DType::Q4_K:
      return 0.12;
    case DType::Q5_0:
      return 0.08;
    case DType::Q5_1:
    case DType::Q5_K:
      return 0.06;
    case DType::Q6_K:
      return 0.035;
    case DType::IQ4_NL:
      return 0.12;
    case DType::IQ4_XS:
      return 0.125;
    case DType::Q3_K:
      return 0.29;
    case DType::Q2_K:
      return 0.47;
    default:
      return 0.0;
  }
}

TEST_P(QuantFormat, QuantizeRoundTrip) {
  const Format& f = GetParam();
  const int64_t n = 4096;
  const auto x = random_input(n, 5);
  std::vector<uint8_t> q(static_cast<size_t>(n / f.block * f.bytes));
  quantize_row(f.t, x.data(), q.data(), n);
  const auto y = dequant(f.t, q, n, false);
  double err2 = 0.0, x2 = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const double e = static_cast<double>(y[i]) - static_cast<double>(x[i]);
    err2 += e * e;
    x2 += static_cast<double>(x[i]) * static_cast<double>(x[i]);
    const double ax = std::fabs(static_cast<double>(x[i]));
    // Float formats: exact, or round to nearest.
    const double rel_step = f.t == DType::F32 ? 0.0 : f.t == DType::F16 ? 0x1p-11 : 0x1p-8;
    if (f.block == 1) {
      ASSERT_LE(std::fabs(e), ax * rel_step) << "element " << i;
    }
  }
  if (f.block == 32) {
    for (int64_t b = 0; b < n; b += 32) {
      const auto first = x.begin() + b, last = first + 32;
      const auto [lo, hi] = std::minmax_element(first, last);
      float amax = 0.0f;
      for (auto it = first; it != last; ++it) amax = std::max(amax, std::fabs(*it));
      const double bound = element_bound(f.t, *lo, *hi, amax);
      for (int64_t i = b; i < b + 32; ++i) {
        ASSERT_LE(std::fabs(static_cast<double>(y[i]) - static_cast<double>(x[i])), bound)
            << "element " << i << " x " << x[i] << " y " << y[i];
      }
    }
  }
  // Signal to quantization-noise bound over the row (mostly for the k-quants, whose scales
  // are shared by 256 elements of varying magnitude).
  const double rel = std::sqrt(err2 / x2);
  EXPECT_LE(rel, max_rms_error(f.t));
}

TEST_P(QuantFormat, QuantizeMatchesGguf) {
  const Format& f = GetParam();
  if (f.block == 256 || f.t == DType::IQ4_NL) {
    GTEST_SKIP() << "gguf-py has no " << f.gguf << " quantizer (ours is simpler than ggml's)";
  }
  if (python() == nullptr) GTEST_SKIP() << "KVS_PYTHON is not set";
  auto x = random_input(kRows * kCols, 77);
  // Values on the rounding ties: with amax 127, q8_0's scale is exactly 1.
  for (int i = 0; i < 32; ++i) x[static_cast<size_t>(i)] = static_cast<float>(i) - 15.5f;
  x[31] = 127.0f;
  const auto in = temp_dir() / (std::string("q_") + f.gguf + ".npy");
  const auto out = temp_dir() / (std::string("q_") + f.gguf + ".bin");
  write_npy(in.string(), x.data(), {kRows, kCols});
  run_reference(std::string("quant ") + f.gguf + " " + in.string() + " " + out.string());
  const auto want = read_file(out);
  std::vector<uint8_t> got(static_cast<size_t>(kRows * kCols / f.block * f.bytes));
  quantize_row(f.t, x.data(), got.data(), kRows * kCols);
  ASSERT_EQ(want.size(), got.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i], want[i]) << "byte " << i << " (block " << i / static_cast<size_t>(f.bytes)
                               << ")";
  }
}

INSTANTIATE_TEST_SUITE_P(Quant, QuantFormat, testing::ValuesIn(formats()), format_name);

// ---- misc ----

TEST(Quant, Q8_0RoundsHalfAwayFromZero) {
  float x[32];
  for (int i = 0; i < 32; ++i) x[i] = 0.0f;
  x[0] = 127.0f;  // scale exactly 1
  x[1] = 0.5f;
  x[2] = -2.5f;
  x[3] = 1.5f;
  x[4] = 0.49999997f;
  x[5] = -0.49999997f;
  uint8_t q[34];
  quantize_row(DType::Q8_0, x, q, 32);
  const int8_t* qs = reinterpret_cast<const int8_t*>(q + 2);
  EXPECT_EQ(qs[0], 127);
  EXPECT_EQ(qs[1], 1);
  EXPECT_EQ(qs[2], -3);
  EXPECT_EQ(qs[3], 2);
  EXPECT_EQ(qs[4], 0);
  EXPECT_EQ(qs[5], 0);
}

// A KV head's slice (kv_page.h): the blocks' scales first, then their quants, each byte the one
// quantize_row writes for the same values; back to the values dequantize_row gives.
TEST(Quant, KvHeadLayout) {
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  for (const DType t : {DType::F16, DType::Q8_0, DType::Q4_0})
    for (const int d : {32, 64, 128, 256}) {
      std::vector<float> x(d), want(d), got(d);
      for (float& v : x) v = nd(rng);
      const size_t n = row_bytes(t, d);
      std::vector<uint8_t> blocks(n), head(n, 0xEE);
      quantize_row(t, x.data(), blocks.data(), d);
      kv_quantize_head(t, x.data(), head.data(), d);
      const int nb = d / 32;
      const size_t quants = t == DType::F16 ? 0 : row_bytes(t, 32) - 2;
      for (int b = 0; b < nb && t != DType::F16; ++b) {
        const uint8_t* blk = blocks.data() + b * (quants + 2);
        EXPECT_EQ(0, std::memcmp(head.data() + 2 * b, blk, 2)) << dtype_name(t) << " scale " << b;
        EXPECT_EQ(0, std::memcmp(head.data() + 2 * nb + quants * b, blk + 2, quants))
            << dtype_name(t) << " quants " << b;
      }
      if (t == DType::F16) {
        EXPECT_EQ(blocks, head);
      }
      dequantize_row(t, blocks.data(), want.data(), d);
      kv_dequantize_head(t, head.data(), got.data(), d);
      EXPECT_EQ(want, got) << dtype_name(t) << " d " << d;
    }
}

TEST(Quant, UnsupportedTypeFails) {
  uint8_t w[256] = {};
  float y[256], x[256] = {};
  try {
    dequantize_row(DType::IQ2_XXS, w, y, 256);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("iq2_xxs"), std::string::npos) << e.what();
  }
  EXPECT_THROW(quantize_row(DType::IQ3_XXS, x, w, 256), Error);
  EXPECT_THROW(dequantize_row_ref(DType::TQ1_0, w, y, 256), Error);
  EXPECT_FALSE(is_supported(DType::IQ2_XS));
  // Not a whole number of blocks.
  EXPECT_THROW(dequantize_row(DType::Q4_0, w, y, 48), Error);
}

// A row that the format's blocks do not divide is refused, naming the format.
TEST(Quant, PartialBlockNamesFormat) {
  uint8_t w[1024] = {};
  float y[512], x[512] = {};
  for (const DType t : {DType::Q2_K, DType::Q3_K, DType::IQ4_XS, DType::IQ4_NL}) {
    const int64_t n = traits(t).block + 16;
    for (int op = 0; op < 3; ++op) {
      try {
        if (op == 0) dequantize_row(t, w, y, n);
        if (op == 1) quantize_row(t, x, w, n);
        if (op == 2) (void)row_bytes(t, n);
        FAIL() << dtype_name(t) << " op " << op << ": no error";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find(dtype_name(t)), std::string::npos) << e.what();
      }
    }
  }
}

}  // namespace
}  // namespace kvs
