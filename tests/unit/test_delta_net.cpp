// Device::gated_delta_net on the CPU against a plain double-precision computation of the same
// layer (the delta rule as full matrix products, token by token): decode and chunked prefill
// over awkward lengths and chunk sizes, and a prefill continued by decode steps (the conv tail
// and the state carried). Shapes with 2 key heads for 4 value heads tell the tiled head order
// (h % k_heads, as the reference and llama.cpp's converter) from the grouped one.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <vector>

#include "kvs/backend/device.h"

namespace kvs {
namespace {

using VecD = std::vector<double>;

struct Shape {
  int32_t k_heads, v_heads, head, conv;
  int32_t conv_dim() const { return (2 * k_heads + v_heads) * head; }
};

// One layer's weights and a sequence's projections, random.
struct Case {
  Shape sh;
  std::vector<float> qkv, z, alpha, beta, conv_w, dt_bias, a, norm;
  Case(Shape s, int32_t n_tok, uint32_t seed) : sh(s) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    auto fill = [&](std::vector<float>& v, size_t n, float lo, float hi) {
      v.resize(n);
      for (float& x : v) x = lo + (hi - lo) * (u(rng) + 1.0f) / 2.0f;
    };
    const size_t T = static_cast<size_t>(n_tok), Hv = static_cast<size_t>(s.v_heads);
    fill(qkv, T * static_cast<size_t>(s.conv_dim()), -2.0f, 2.0f);
    fill(z, T * Hv * static_cast<size_t>(s.head), -2.0f, 2.0f);
    fill(alpha, T * Hv, -2.0f, 2.0f);
    fill(beta, T * Hv, -3.0f, 3.0f);
    fill(conv_w, static_cast<size_t>(s.conv_dim() * s.conv), -0.5f, 0.5f);
    fill(dt_bias, Hv, -3.0f, 0.0f);
    fill(a, Hv, -2.0f, -0.1f);
    fill(norm, static_cast<size_t>(s.head), 0.8f, 1.2f);
  }
};

VecD to_double(const std::vector<float>& v) {
  return VecD(v.begin(), v.end());
}

// The layer in double: conv over the whole history, then M = e M + beta (v - e M k) k^T.
std::vector<double> reference(const Case& c, int32_t n_tok, double eps) {
  const Shape& s = c.sh;
  const int32_t C = s.conv_dim(), S = s.head, Hv = s.v_heads, kd = s.k_heads * S;
  const VecD qkv = to_double(c.qkv), z = to_double(c.z), alpha = to_double(c.alpha),
             beta_x = to_double(c.beta), conv_w = to_double(c.conv_w), dt = to_double(c.dt_bias),
             a = to_double(c.a), norm = to_double(c.norm);
  auto at = [](const VecD& v, int64_t i) { return v[static_cast<size_t>(i)]; };
  VecD conv(static_cast<size_t>(n_tok) * C);
  for (int32_t t = 0; t < n_tok; ++t)
    for (int32_t ch = 0; ch < C; ++ch) {
      double acc = 0;
      for (int32_t j = 0; j < s.conv; ++j) {
        const int32_t src = t - (s.conv - 1) + j;  // rows before 0 are the zero tail
        if (src >= 0) acc += at(qkv, src * C + ch) * at(conv_w, ch * s.conv + j);
      }
      conv[static_cast<size_t>(t * C + ch)] = acc / (1 + std::exp(-acc));
    }
  auto l2 = [&](double* x, double scale) {
    double n = 0;
    for (int32_t i = 0; i < S; ++i) n += x[i] * x[i];
    n = std::sqrt(n + eps);
    for (int32_t i = 0; i < S; ++i) x[i] *= scale / n;
  };
  VecD y(static_cast<size_t>(n_tok) * Hv * S);
  std::vector<VecD> M(static_cast<size_t>(Hv), VecD(static_cast<size_t>(S * S), 0.0));
  for (int32_t t = 0; t < n_tok; ++t) {
    double* row = conv.data() + static_cast<size_t>(t) * C;
    for (int32_t h = 0; h < 2 * s.k_heads; ++h)
      l2(row + h * S, h < s.k_heads ? 1 / std::sqrt(double(S)) : 1.0);
    for (int32_t h = 0; h < Hv; ++h) {
      const double* q = row + (h % s.k_heads) * S;
      const double* k = q + kd;
      const double* v = row + 2 * kd + h * S;
      const int64_t gi = t * Hv + h;
      const double e = std::exp(std::log1p(std::exp(at(alpha, gi) + at(dt, h))) * at(a, h));
      const double beta = 1 / (1 + std::exp(-at(beta_x, gi)));
      VecD& m = M[static_cast<size_t>(h)];
      VecD mk(static_cast<size_t>(S), 0.0), o(static_cast<size_t>(S), 0.0);
      for (int32_t i = 0; i < S; ++i)
        for (int32_t j = 0; j < S; ++j) mk[static_cast<size_t>(i)] += e * at(m, i * S + j) * k[j];
      for (int32_t i = 0; i < S; ++i)
        for (int32_t j = 0; j < S; ++j) {
          double& mij = m[static_cast<size_t>(i * S + j)];
          mij = e * mij + beta * (v[i] - mk[static_cast<size_t>(i)]) * k[j];
          o[static_cast<size_t>(i)] += mij * q[j];
        }
      double ss = 0;
      for (double x2 : o) ss += x2 * x2;
      const double r = 1 / std::sqrt(ss / S + eps);
      for (int32_t i = 0; i < S; ++i) {
        const double zi = at(z, gi * S + i);
        y[static_cast<size_t>(gi * S + i)] = at(o, i) * r * at(norm, i) * zi / (1 + std::exp(-zi));
      }
    }
  }
  return y;
}

// The device's layer over tokens [t0, t1) of the case, continuing conv_state and state.
void run(Device& dev, const Case& c, int32_t t0, int32_t t1, int32_t chunk, float eps,
         std::vector<float>& conv_state, std::vector<float>& state, std::vector<float>& y) {
  const Shape& s = c.sh;
  const size_t C = static_cast<size_t>(s.conv_dim()), Hv = static_cast<size_t>(s.v_heads),
               V = Hv * static_cast<size_t>(s.head), b = static_cast<size_t>(t0);
  DeltaNetArgs a;
  a.qkv = c.qkv.data() + b * C;
  a.z = c.z.data() + b * V;
  a.alpha = c.alpha.data() + b * Hv;
  a.beta = c.beta.data() + b * Hv;
  a.y = y.data() + b * V;
  a.conv_state = conv_state.data();
  a.state = state.data();
  a.conv_w = c.conv_w.data();
  a.dt_bias = c.dt_bias.data();
  a.a = c.a.data();
  a.norm = c.norm.data();
  a.n_tok = t1 - t0;
  a.conv = s.conv;
  a.k_heads = s.k_heads;
  a.v_heads = s.v_heads;
  a.head = s.head;
  a.eps = eps;
  a.chunk = chunk;
  dev.gated_delta_net(a);
}

// Runs the case in pieces of (tokens, chunk size), in order; returns y.
std::vector<float> run_pieces(const Case& c, int32_t n_tok,
                              const std::vector<std::pair<int32_t, int32_t>>& pieces, float eps) {
  auto dev = make_cpu_device(0);
  const Shape& s = c.sh;
  std::vector<float> conv_state(static_cast<size_t>((s.conv - 1) * s.conv_dim()), 0.0f);
  std::vector<float> state(static_cast<size_t>(s.v_heads * s.head * s.head), 0.0f);
  std::vector<float> y(static_cast<size_t>(n_tok * s.v_heads * s.head), 0.0f);
  int32_t t = 0;
  for (const auto& [n, chunk] : pieces) {
    run(*dev, c, t, t + n, chunk, eps, conv_state, state, y);
    t += n;
  }
  EXPECT_EQ(t, n_tok);
  return y;
}

double max_rel_error(const std::vector<float>& got, const std::vector<double>& want) {
  double amax = 0, err = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    amax = std::max(amax, std::fabs(want[i]));
    err = std::max(err, std::fabs(static_cast<double>(got[i]) - want[i]));
  }
  EXPECT_GT(amax, 0.1);  // a layer that computes something
  return err / amax;
}

constexpr float kEps = 1e-6f;

TEST(GatedDeltaNet, DecodeAndChunkedPrefillMatchReference) {
  const Shape shapes[] = {{2, 4, 32, 4}, {1, 3, 16, 3}, {2, 2, 64, 4}};
  for (const Shape& s : shapes) {
    for (int32_t n : {1, 5, 37, 100}) {
      SCOPED_TRACE(testing::Message() << s.k_heads << "/" << s.v_heads << " heads of " << s.head
                                      << ", " << n << " tokens");
      const Case c(s, n, static_cast<uint32_t>(n * 7 + s.head));
      const std::vector<double> want = reference(c, n, static_cast<double>(kEps));
      EXPECT_LT(max_rel_error(run_pieces(c, n, {{n, 1}}, kEps), want), 1e-4) << "token by token";
      // one token at a time, as decode steps
      std::vector<std::pair<int32_t, int32_t>> steps(static_cast<size_t>(n), {1, 1});
      EXPECT_LT(max_rel_error(run_pieces(c, n, steps, kEps), want), 1e-4) << "decode steps";
      for (int32_t chunk : {2, 16, 64})
        EXPECT_LT(max_rel_error(run_pieces(c, n, {{n, chunk}}, kEps), want), 1e-4)
            << "chunks of " << chunk;
    }
  }
}

TEST(GatedDeltaNet, PrefillThenDecodeCarriesTheState) {
  const Shape s{2, 4, 32, 4};
  const Case c(s, 54, 3);
  const std::vector<double> want = reference(c, 54, static_cast<double>(kEps));
  // a prefill of 37 in chunks of 16, 5 decode steps, a prefill of 12 (one chunk)
  std::vector<std::pair<int32_t, int32_t>> pieces{{37, 16}};
  for (int i = 0; i < 5; ++i) pieces.emplace_back(1, 1);
  pieces.emplace_back(12, 64);
  EXPECT_LT(max_rel_error(run_pieces(c, 54, pieces, kEps), want), 1e-4);
  // Without the state carried the later tokens differ: the check above can fail.
  std::vector<float> fresh = run_pieces(c, 54, {{54, 16}}, kEps);
  const std::vector<float> tail_only = [&] {
    Case t = c;
    t.qkv.erase(t.qkv.begin(), t.qkv.begin() + 42 * s.conv_dim());
    t.z.erase(t.z.begin(), t.z.begin() + 42 * s.v_heads * s.head);
    t.alpha.erase(t.alpha.begin(), t.alpha.begin() + 42 * s.v_heads);
    t.beta.erase(t.beta.begin(), t.beta.begin() + 42 * s.v_heads);
    return run_pieces(t, 12, {{12, 64}}, kEps);
  }();
  double diff = 0;
  for (size_t i = 0; i < tail_only.size(); ++i)
    diff = std::max(
        diff, static_cast<double>(std::fabs(tail_only[i] - fresh[42 * s.v_heads * s.head + i])));
  EXPECT_GT(diff, 1e-2);
}

}  // namespace
}  // namespace kvs
