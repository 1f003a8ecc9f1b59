// Gated DeltaNet on the CPU (qwen35's recurrent layers): the conv with its tail, the gates, the
// delta rule token by token (decode) or a chunk at a time (prefill), the gated norm. Value heads
// run in parallel; within a head every output is a fixed sequence of float operations.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kvs/backend/cpu/kernels.h"
#include "kvs/util/error.h"
#include "kvs/util/threadpool.h"

namespace kvs::cpu {
namespace {

inline float silu(float x) {
  return x / (1.0f + std::exp(-x));
}

inline float softplus(float x) {
  return x > 20.0f ? x : std::log1p(std::exp(x));
}

inline float dot(const float* a, const float* b, int32_t n) {
  float s = 0.0f;
  for (int32_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

// x / sqrt(||x||^2 + eps) as transformers' l2norm and llama.cpp's GDN (f32 squares summed in
// double), then times `scale`.
void l2_normalize(float* x, int32_t n, float eps, float scale) {
  double ss = 0.0;
  for (int32_t i = 0; i < n; ++i) ss += static_cast<double>(x[i] * x[i]);
  const float s = scale / std::sqrt(static_cast<float>(ss) + eps);
  for (int32_t i = 0; i < n; ++i) x[i] *= s;
}

// conv [n_tok][conv_dim]: silu of the causal conv over [conv_state; qkv], q and k normalized;
// conv_state moves on to the last conv - 1 rows.
void conv_silu(const DeltaNetArgs& a, float* conv) {
  const int32_t C = a.conv_dim(), K = a.conv, T = a.n_tok;
  thread_pool().parallel_for(C, 64, [&](int64_t c0, int64_t c1) {
    std::vector<float> col(static_cast<size_t>(K - 1 + T));  // channel c's rows, the tail first
    for (int64_t c = c0; c < c1; ++c) {
      for (int32_t r = 0; r < K - 1; ++r) col[static_cast<size_t>(r)] = a.conv_state[r * C + c];
      for (int32_t t = 0; t < T; ++t)
        col[static_cast<size_t>(K - 1 + t)] = a.qkv[static_cast<int64_t>(t) * C + c];
      const float* w = a.conv_w + c * K;
      for (int32_t t = 0; t < T; ++t) {
        float s = 0.0f;
        for (int32_t j = 0; j < K; ++j) s += col[static_cast<size_t>(t + j)] * w[j];
        conv[static_cast<int64_t>(t) * C + c] = silu(s);
      }
      for (int32_t r = 0; r < K - 1; ++r) a.conv_state[r * C + c] = col[static_cast<size_t>(T + r)];
    }
  });
  const float q_scale = 1.0f / std::sqrt(static_cast<float>(a.head));
  thread_pool().parallel_for(T, 8, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t)
      for (int32_t h = 0; h < 2 * a.k_heads; ++h)
        l2_normalize(conv + t * C + h * a.head, a.head, a.eps, h < a.k_heads ? q_scale : 1.0f);
  });
}

// Where token t's q, k and v of value head h are in conv.
struct Rows {
  const float* conv;
  int32_t C, head, key_dim, k_head;
  const float* q(int32_t t) const { return conv + static_cast<int64_t>(t) * C + k_head * head; }
  const float* k(int32_t t) const { return q(t) + key_dim; }
  const float* v(int32_t t, int32_t h) const {
    return conv + static_cast<int64_t>(t) * C + 2 * key_dim + h * head;
  }
};

// Token by token, one row of M at a time (rows are independent): M_i = e M_i; d = beta (v_i -
// M_i . k); M_i += d k; o_i = M_i . q.
void recur_tokens(const DeltaNetArgs& a, const Rows& r, int32_t h, const float* g, const float* b,
                  float* M) {
  const int32_t S = a.head;
  for (int32_t t = 0; t < a.n_tok; ++t) {
    const float e = std::exp(g[t * a.v_heads + h]), beta = b[t * a.v_heads + h];
    const float *k = r.k(t), *q = r.q(t), *v = r.v(t, h);
    float* o = a.y + static_cast<int64_t>(t) * a.v_heads * S + h * S;
    for (int32_t i = 0; i < S; ++i) {
      float* m = M + static_cast<int64_t>(i) * S;
      for (int32_t j = 0; j < S; ++j) m[j] *= e;
      const float d = beta * (v[i] - dot(m, k, S));
      for (int32_t j = 0; j < S; ++j) m[j] += d * k[j];
      o[i] = dot(m, q, S);
    }
  }
}

// A chunk of n tokens from t0 at once. With G_t the decay's log summed over the chunk up to t
// and u_t = beta_t (v_t - e^G_t M0 k_t - sum_{s<t} e^(G_t - G_s) (k_s . k_t) u_s) (a forward
// substitution): o_t = e^G_t M0 q_t + sum_{s<=t} e^(G_t - G_s) (k_s . q_t) u_s and M =
// e^G_last M0 + sum_s e^(G_last - G_s) u_s k_s^T; every exponent is <= 0.
void recur_chunk(const DeltaNetArgs& a, const Rows& r, int32_t h, const float* g, const float* b,
                 float* M, int32_t t0, int32_t n, std::vector<float>& buf) {
  const int32_t S = a.head;
  buf.resize(static_cast<size_t>(n) * (1 + 2 * n + S));
  float* G = buf.data();   // [n]
  float* kk = G + n;       // [n][n]: e^(G_t - G_s) (k_s . k_t), s < t
  float* qk = kk + n * n;  // [n][n]: e^(G_t - G_s) (k_s . q_t), s <= t
  float* u = qk + n * n;   // [n][S]
  float acc = 0.0f;
  for (int32_t t = 0; t < n; ++t) G[t] = acc += g[(t0 + t) * a.v_heads + h];
  for (int32_t t = 0; t < n; ++t)
    for (int32_t s = 0; s <= t; ++s) {
      const float e = std::exp(G[t] - G[s]);
      kk[t * n + s] = s < t ? e * dot(r.k(t0 + s), r.k(t0 + t), S) : 0.0f;
      qk[t * n + s] = e * dot(r.k(t0 + s), r.q(t0 + t), S);
    }
  for (int32_t t = 0; t < n; ++t) {
    const float eg = std::exp(G[t]), beta = b[(t0 + t) * a.v_heads + h];
    const float *k = r.k(t0 + t), *q = r.q(t0 + t), *v = r.v(t0 + t, h);
    float* ut = u + t * S;
    float* o = a.y + static_cast<int64_t>(t0 + t) * a.v_heads * S + h * S;
    for (int32_t i = 0; i < S; ++i) {
      const float* m = M + static_cast<int64_t>(i) * S;
      float w = v[i] - eg * dot(m, k, S);
      for (int32_t s = 0; s < t; ++s) w -= kk[t * n + s] * u[s * S + i];
      ut[i] = beta * w;
      float oi = eg * dot(m, q, S);
      for (int32_t s = 0; s <= t; ++s) oi += qk[t * n + s] * u[s * S + i];
      o[i] = oi;
    }
  }
  const float e_last = std::exp(G[n - 1]);
  for (int32_t s = 0; s < n; ++s) G[s] = std::exp(G[n - 1] - G[s]);  // now the weights of u_s
  for (int32_t i = 0; i < S; ++i) {
    float* m = M + static_cast<int64_t>(i) * S;
    for (int32_t j = 0; j < S; ++j) m[j] *= e_last;
    for (int32_t s = 0; s < n; ++s) {
      const float c = G[s] * u[s * S + i];
      const float* k = r.k(t0 + s);
      for (int32_t j = 0; j < S; ++j) m[j] += c * k[j];
    }
  }
}

}  // namespace

void gated_delta_net(const DeltaNetArgs& a) {
  KVS_CHECK(a.n_tok > 0 && a.conv >= 2 && a.k_heads > 0 && a.head > 0 && a.v_heads % a.k_heads == 0,
            "gated_delta_net: ", a.n_tok, " tokens, ", a.conv, " taps, ", a.k_heads, " key and ",
            a.v_heads, " value heads of ", a.head);
  const int32_t T = a.n_tok, Hv = a.v_heads, S = a.head, C = a.conv_dim();
  thread_local std::vector<float> conv_buf, gates;
  conv_buf.resize(static_cast<size_t>(T) * C);
  gates.resize(2 * static_cast<size_t>(T) * Hv);
  float* g = gates.data();  // [T][Hv]: softplus(alpha + dt) * a, the decay's log
  float* b = g + static_cast<int64_t>(T) * Hv;  // [T][Hv]: sigmoid(beta)
  for (int64_t i = 0; i < static_cast<int64_t>(T) * Hv; ++i) {
    const int64_t h = i % Hv;
    g[i] = softplus(a.alpha[i] + a.dt_bias[h]) * a.a[h];
    b[i] = 1.0f / (1.0f + std::exp(-a.beta[i]));
  }
  float* conv = conv_buf.data();  // a pointer: the workers have thread_locals of their own
  conv_silu(a, conv);
  thread_pool().parallel_for(Hv, 1, [&](int64_t h0, int64_t h1) {
    std::vector<float> buf;
    for (int64_t h64 = h0; h64 < h1; ++h64) {
      const int32_t h = static_cast<int32_t>(h64);
      const Rows r{conv, C, S, a.k_heads * S, h % a.k_heads};
      float* M = a.state + h64 * S * S;
      if (a.chunk <= 1) {
        recur_tokens(a, r, h, g, b, M);
      } else {
        for (int32_t t0 = 0; t0 < T; t0 += a.chunk)
          recur_chunk(a, r, h, g, b, M, t0, std::min(a.chunk, T - t0), buf);
      }
      // y = rmsnorm(o, norm) * silu(z), per token, over this head's S values
      for (int32_t t = 0; t < T; ++t) {
        float* y = a.y + static_cast<int64_t>(t) * Hv * S + h * S;
        const float* z = a.z + static_cast<int64_t>(t) * Hv * S + h * S;
        const float s = 1.0f / std::sqrt(dot(y, y, S) / static_cast<float>(S) + a.eps);
        for (int32_t i = 0; i < S; ++i) y[i] = y[i] * s * a.norm[i] * silu(z[i]);
      }
    }
  });
}

}  // namespace kvs::cpu
