#include "kvs/backend/cpu/kernels.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kvs/quant/simd.h"
#include "kvs/util/error.h"
#include "kvs/util/threadpool.h"

namespace kvs::cpu {
namespace {

using quant::hsum;

// One dot product: lanes accumulate k in steps of 8, then a fixed horizontal sum, then the
// scalar tail. Every blocked kernel below performs exactly this sequence per output.
inline float dot(const float* a, const float* b, int64_t n) {
  __m256 acc = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 8 <= n; k += 8)
    acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + k), _mm256_loadu_ps(b + k), acc);
  float s = hsum(acc);
  for (; k < n; ++k) s = std::fma(a[k], b[k], s);
  return s;
}

// 4 rows x 2 tokens, same per-output arithmetic as dot().
inline void dot4x2(const float* w, int64_t ld, const float* x0, const float* x1, int64_t n,
                   float out[4][2]) {
  __m256 a00 = _mm256_setzero_ps(), a01 = a00, a10 = a00, a11 = a00, a20 = a00, a21 = a00,
         a30 = a00, a31 = a00;
  const float *w0 = w, *w1 = w + ld, *w2 = w + 2 * ld, *w3 = w + 3 * ld;
  int64_t k = 0;
  for (; k + 8 <= n; k += 8) {
    __m256 u = _mm256_loadu_ps(x0 + k), v = _mm256_loadu_ps(x1 + k);
    __m256 r = _mm256_loadu_ps(w0 + k);
    a00 = _mm256_fmadd_ps(r, u, a00);
    a01 = _mm256_fmadd_ps(r, v, a01);
    r = _mm256_loadu_ps(w1 + k);
    a10 = _mm256_fmadd_ps(r, u, a10);
    a11 = _mm256_fmadd_ps(r, v, a11);
    r = _mm256_loadu_ps(w2 + k);
    a20 = _mm256_fmadd_ps(r, u, a20);
    a21 = _mm256_fmadd_ps(r, v, a21);
    r = _mm256_loadu_ps(w3 + k);
    a30 = _mm256_fmadd_ps(r, u, a30);
    a31 = _mm256_fmadd_ps(r, v, a31);
  }
  float s[4][2] = {{hsum(a00), hsum(a01)},
                   {hsum(a10), hsum(a11)},
                   {hsum(a20), hsum(a21)},
                   {hsum(a30), hsum(a31)}};
  const float* ws[4] = {w0, w1, w2, w3};
  for (int r = 0; r < 4; ++r)
    for (int64_t kk = k; kk < n; ++kk) {
      s[r][0] = std::fma(ws[r][kk], x0[kk], s[r][0]);
      s[r][1] = std::fma(ws[r][kk], x1[kk], s[r][1]);
    }
  for (int r = 0; r < 4; ++r) out[r][0] = s[r][0], out[r][1] = s[r][1];
}

// 4 rows x 1 token (decode), same per-output arithmetic as dot(): the rows' chains interleaved.
inline void dot4x1(const float* w, int64_t ld, const float* x, int64_t n, float out[4]) {
  __m256 a[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                 _mm256_setzero_ps()};
  int64_t k = 0;
  for (; k + 8 <= n; k += 8) {
    const __m256 u = _mm256_loadu_ps(x + k);
    for (int r = 0; r < 4; ++r) a[r] = _mm256_fmadd_ps(_mm256_loadu_ps(w + r * ld + k), u, a[r]);
  }
  for (int r = 0; r < 4; ++r) {
    float s = hsum(a[r]);
    for (int64_t kk = k; kk < n; ++kk) s = std::fma(w[r * ld + kk], x[kk], s);
    out[r] = s;
  }
}

std::vector<float>& scratch(size_t n) {
  thread_local std::vector<float> buf;
  if (buf.size() < n) buf.resize(n);
  return buf;
}

}  // namespace

void embed(const Matrix& emb, const int32_t* ids, int32_t n, float* x) {
  for (int32_t t = 0; t < n; ++t) {
    KVS_CHECK(ids[t] >= 0 && ids[t] < emb.n_out, "token id ", ids[t], " is out of range (vocab ",
              emb.n_out, ")");
    dequantize_row(emb.type, emb.row(ids[t]), x + t * emb.n_in, emb.n_in);
  }
}

void rmsnorm(const float* x, const float* w, float* y, int64_t rows, int64_t n, float eps) {
  thread_pool().parallel_for(rows, 8, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const float* xr = x + r * n;
      float* yr = y + r * n;
      float ss = dot(xr, xr, n);
      float s = 1.0f / std::sqrt(ss / static_cast<float>(n) + eps);
      for (int64_t i = 0; i < n; ++i) yr[i] = xr[i] * s * w[i];
    }
  });
}

void matmul(const Matrix& w, const float* x, const XPair* xq, float* y, int64_t n_tok,
            const float* bias) {
  const int64_t n = w.n_in, n_out = w.n_out;
  if (xq) {
    // Tasks of kRows rows x kToks tokens: a task's weights stay in L1 and its activations in
    // L2 while it runs; consecutive tasks share the activations.
    constexpr int64_t kRows = 16, kToks = 64;
    const int64_t rc = (n_out + kRows - 1) / kRows, tc = (n_tok + kToks - 1) / kToks;
    const DotIsa isa = best_dot_isa();
    thread_pool().parallel_for(rc * tc, 1, [&](int64_t b, int64_t e) {
      for (int64_t task = b; task < e; ++task) {
        const int64_t r0 = task % rc * kRows, nr = std::min(kRows, n_out - r0);
        const int64_t t0 = task / rc * kToks, t1 = std::min(n_tok, t0 + kToks);
        int_matmul_rows(w, xq, y, t0, t1, r0, nr, isa);
        if (bias)
          for (int64_t tt = t0; tt < t1; ++tt)
            for (int64_t r = 0; r < nr; ++r) y[tt * n_out + r0 + r] += bias[r0 + r];
      }
    });
    return;
  }
  constexpr int64_t kTile = 16;  // weight rows dequantized at once (f32 tile stays in L1/L2)
  const int64_t tiles = (n_out + kTile - 1) / kTile;
  thread_pool().parallel_for(tiles, 1, [&](int64_t tb, int64_t te) {
    std::vector<float>& buf = scratch(static_cast<size_t>(kTile * n));
    for (int64_t tile = tb; tile < te; ++tile) {
      const int64_t r0 = tile * kTile, nr = std::min(kTile, n_out - r0);
      for (int64_t r = 0; r < nr; ++r) dequantize_row(w.type, w.row(r0 + r), buf.data() + r * n, n);
      int64_t t = 0;
      for (; t + 2 <= n_tok; t += 2) {
        const float *x0 = x + t * n, *x1 = x0 + n;
        int64_t r = 0;
        for (; r + 4 <= nr; r += 4) {
          float o[4][2];
          dot4x2(buf.data() + r * n, n, x0, x1, n, o);
          for (int i = 0; i < 4; ++i) {
            y[t * n_out + r0 + r + i] = o[i][0];
            y[(t + 1) * n_out + r0 + r + i] = o[i][1];
          }
        }
        for (; r < nr; ++r) {
          y[t * n_out + r0 + r] = dot(buf.data() + r * n, x0, n);
          y[(t + 1) * n_out + r0 + r] = dot(buf.data() + r * n, x1, n);
        }
      }
      for (; t < n_tok; ++t) {
        int64_t r = 0;
        for (; r + 4 <= nr; r += 4)
          dot4x1(buf.data() + r * n, n, x + t * n, n, y + t * n_out + r0 + r);
        for (; r < nr; ++r) y[t * n_out + r0 + r] = dot(buf.data() + r * n, x + t * n, n);
      }
      if (bias)
        for (int64_t tt = 0; tt < n_tok; ++tt)
          for (int64_t r = 0; r < nr; ++r) y[tt * n_out + r0 + r] += bias[r0 + r];
    }
  });
}

void rope(float* x, const int32_t* pos, int32_t n_tok, int32_t n_head, const RopeParams& p) {
  const int32_t half = p.rope_dim / 2;
  thread_pool().parallel_for(n_tok, 4, [&](int64_t b, int64_t e) {
    std::vector<float>& cs = scratch(static_cast<size_t>(2 * half));
    for (int64_t t = b; t < e; ++t) {
      // Angles in double: theta_i = pos / scale * base^(-2i/d) / factor_i.
      const double ppos = static_cast<double>(pos[t]) / static_cast<double>(p.linear_scale);
      for (int32_t i = 0; i < half; ++i) {
        double th = ppos * std::pow(static_cast<double>(p.base), -2.0 * i / p.rope_dim);
        if (p.freq_factors) th /= static_cast<double>(p.freq_factors[i]);
        cs[2 * i] = static_cast<float>(std::cos(th));
        cs[2 * i + 1] = static_cast<float>(std::sin(th));
      }
      for (int32_t h = 0; h < n_head; ++h) {
        float* v = x + (t * n_head + h) * p.head_dim;
        for (int32_t i = 0; i < half; ++i) {
          const int32_t a = p.mode == RopeMode::Norm ? 2 * i : i;
          const int32_t c = p.mode == RopeMode::Norm ? 2 * i + 1 : i + half;
          const float x0 = v[a], x1 = v[c], co = cs[2 * i], si = cs[2 * i + 1];
          v[a] = x0 * co - x1 * si;
          v[c] = x0 * si + x1 * co;
        }
      }
    }
  });
}

void sigmoid_mul(float* x, const float* gate, int64_t n) {
  thread_pool().parallel_for(n, 4096, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) x[i] = x[i] / (1.0f + std::exp(-gate[i]));
  });
}

void swiglu(float* gate, const float* up, int64_t n) {
  thread_pool().parallel_for(n, 4096, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const float g = gate[i];
      gate[i] = g / (1.0f + std::exp(-g)) * up[i];
    }
  });
}

void geglu(float* gate, const float* up, int64_t n) {
  constexpr float kC = 0.7978845608028654f;  // sqrt(2 / pi)
  thread_pool().parallel_for(n, 4096, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const float g = gate[i];
      gate[i] = 0.5f * g * (1.0f + std::tanh(kC * (g + 0.044715f * g * g * g))) * up[i];
    }
  });
}

void scale(float* x, float s, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] *= s;
}

void add(float* x, const float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

void kv_write(const KvLayout& l, const float* k, const float* v, int32_t n_tok,
              uint8_t* const* pages, const int32_t* slots) {
  const int32_t d = l.head_dim;
  const int64_t dim = int64_t{l.n_head_kv} * d;
  thread_pool().parallel_for(n_tok, 16, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      uint8_t* kr = pages[t] + static_cast<size_t>(slots[t]) * l.k_row;
      uint8_t* vr = pages[t] + l.v_offset() + static_cast<size_t>(slots[t]) * l.v_row;
      for (int32_t h = 0; h < l.n_head_kv; ++h) {
        kv_quantize_head(l.k_type, k + t * dim + h * d, kr + h * l.k_head, d);
        kv_quantize_head(l.v_type, v + t * dim + h * d, vr + h * l.v_head, d);
      }
    }
  });
}

namespace {

// Running softmax state of one query head: max, sum of exp, unnormalised output.
struct Acc {
  float m;
  float l;
  float* o;
};

// Folds a span's partial (m, l, o) into the accumulator; the fold always runs in logical span
// order, which makes the result independent of where each span's page lives.
inline void merge(Acc& acc, float m, float l, const float* o, int32_t d) {
  if (acc.l == 0.0f) {
    acc.m = m;
    acc.l = l;
    std::copy(o, o + d, acc.o);
    return;
  }
  const float mm = std::max(acc.m, m);
  const float a = std::exp(acc.m - mm), b = std::exp(m - mm);
  acc.l = acc.l * a + l * b;
  for (int32_t i = 0; i < d; ++i) acc.o[i] = acc.o[i] * a + o[i] * b;
  acc.m = mm;
}

// s[g * ld] = dot(q + g d, k, d) * scale for the H query heads g < H: each dot()'s arithmetic,
// the heads' chains interleaved so that they overlap.
template <int H>
inline void scores(const float* q, const float* k, int32_t d, float scale, float* s, int64_t ld) {
  __m256 acc[H];
  for (int g = 0; g < H; ++g) acc[g] = _mm256_setzero_ps();
  int32_t i = 0;
  for (; i + 8 <= d; i += 8) {
    const __m256 kv = _mm256_loadu_ps(k + i);
    for (int g = 0; g < H; ++g)
      acc[g] = _mm256_fmadd_ps(_mm256_loadu_ps(q + g * d + i), kv, acc[g]);
  }
  for (int g = 0; g < H; ++g) {
    float v = hsum(acc[g]);
    for (int32_t t = i; t < d; ++t) v = std::fma(q[g * d + t], k[t], v);
    s[g * ld] = v * scale;
  }
}

// o[0 .. 8 C) = fma(p[j], v[j d + i], o[i]) for the keys j < n in order: each element's chain
// of fmas, C vectors of 8 at once, kept in registers over the keys.
template <int C>
inline void accumulate(float* o, const float* p, const float* v, int32_t d, int32_t n) {
  __m256 acc[C];
  for (int c = 0; c < C; ++c) acc[c] = _mm256_loadu_ps(o + 8 * c);
  for (int32_t j = 0; j < n; ++j) {
    const __m256 pj = _mm256_set1_ps(p[j]);
    for (int c = 0; c < C; ++c)
      acc[c] = _mm256_fmadd_ps(pj, _mm256_loadu_ps(v + j * d + 8 * c), acc[c]);
  }
  for (int c = 0; c < C; ++c) _mm256_storeu_ps(o + 8 * c, acc[c]);
}

// std::max over p[0 .. n) in order, 8 lanes at a time. Only zeros compare equal with other bits
// (where the order picks the first one's sign): a maximum of zero is taken again in order.
inline float max_of(const float* p, int32_t n) {
  float m = -INFINITY;
  int32_t j = 0;
  if (n >= 16) {
    __m256 v = _mm256_set1_ps(-INFINITY);
    for (; j + 8 <= n; j += 8) v = _mm256_max_ps(_mm256_loadu_ps(p + j), v);  // v if p is NaN
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, v);
    for (const float x : lanes) m = std::max(m, x);
  }
  for (; j < n; ++j) m = std::max(m, p[j]);
  if (m == 0.0f) {
    m = -INFINITY;
    for (j = 0; j < n; ++j) m = std::max(m, p[j]);
  }
  return m;
}

// The partials of `group` query heads (q, q + d, ...) over the first n rows of a dequantized
// span (k, v: [n][d]), into out + g * ostride: [max, sum, non-empty, output[d]]. Per head: the
// scores s_j = dot(q, k_j) * scale, their max m, p_j = exp(s_j - m) summed in key order, and
// output = sum of p_j v_j by one fma per key in key order (the arithmetic of every decode and
// prefill call, whatever the span). The heads share each K and V row while it is in cache.
// s: group * n floats of scratch.
void partials(const float* q, int32_t group, const float* k, const float* v, int32_t n, int32_t d,
              float scale, float* s, float* out, int64_t ostride) {
  if (n <= 0) {
    for (int32_t g = 0; g < group; ++g) out[g * ostride + 2] = 0.0f;
    return;
  }
  for (int32_t j = 0; j < n; ++j) {
    const float* kj = k + static_cast<int64_t>(j) * d;
    int32_t g = 0;
    for (; g + 4 <= group; g += 4) scores<4>(q + g * d, kj, d, scale, s + g * n + j, n);
    switch (group - g) {
      case 3:
        scores<3>(q + g * d, kj, d, scale, s + g * n + j, n);
        break;
      case 2:
        scores<2>(q + g * d, kj, d, scale, s + g * n + j, n);
        break;
      case 1:
        scores<1>(q + g * d, kj, d, scale, s + g * n + j, n);
        break;
    }
  }
  for (int32_t g = 0; g < group; ++g) {
    float* p = s + g * n;  // the scores become the probabilities
    const float m = max_of(p, n);
    float sum = 0.0f;
    for (int32_t j = 0; j < n; ++j) sum += (p[j] = std::exp(p[j] - m));
    float* o = out + g * ostride;
    o[0] = m, o[1] = sum, o[2] = 1.0f;
    o += 3;
    std::fill(o, o + d, 0.0f);
    int32_t i = 0;
    for (; i + 64 <= d; i += 64) accumulate<8>(o + i, p, v + i, d, n);
    for (; i + 32 <= d; i += 32) accumulate<4>(o + i, p, v + i, d, n);
    for (; i < d; ++i)
      for (int32_t j = 0; j < n; ++j)
        o[i] = std::fma(p[j], v[static_cast<int64_t>(j) * d + i], o[i]);
  }
}

// The first key position a query at pos sees.
inline int32_t first_key(const AttentionArgs& a, int32_t pos) {
  return a.window > 0 ? pos - a.window + 1 : 0;
}

// Dequantizes rows [0, n) of head h of a span's K and V into k, v ([n][d] f32).
void load_span(const KvLayout& l, const Span& sp, int32_t h, int32_t n, float* k, float* v) {
  const int32_t d = l.head_dim;
  for (int32_t j = 0; j < n; ++j) {
    kv_dequantize_head(l.k_type, sp.page + j * l.k_row + h * l.k_head, k + j * d, d);
    kv_dequantize_head(l.v_type, sp.page + l.v_offset() + j * l.v_row + h * l.v_head, v + j * d, d);
  }
}

}  // namespace

void attention(const AttentionArgs& a) {
  const KvLayout& l = a.kv;
  const int32_t d = l.head_dim, group = a.n_head / l.n_head_kv, P = l.page_size;
  const int64_t qstride = static_cast<int64_t>(a.n_head) * d;
  // acc[(t * n_head + h) * 2 + {0, 1}]: running max and sum; a sum of 0 means "nothing yet".
  if (a.first)
    for (int64_t i = 0; i < int64_t{a.n_tok} * a.n_head; ++i) a.acc[2 * i + 1] = 0.0f;
  if (a.n_tok == 1 && a.n_spans > 0) {
    // Decode: one task per (kv head, span) stores its partials; then a fold per head in
    // logical order. Same arithmetic as the prefill path below.
    const int32_t pos = a.pos[0];
    const int32_t ns = a.n_spans;
    std::vector<float> part(static_cast<size_t>(ns) * a.n_head * (d + 3));
    auto at = [&](int32_t s, int32_t h) {
      return part.data() + (static_cast<size_t>(s) * a.n_head + h) * (d + 3);
    };
    thread_pool().parallel_for(
        static_cast<int64_t>(ns) * l.n_head_kv, 1, [&](int64_t b, int64_t e) {
          std::vector<float>& buf = scratch(static_cast<size_t>(2 * P * d + group * P));
          for (int64_t task = b; task < e; ++task) {
            const int32_t s = static_cast<int32_t>(task / l.n_head_kv),
                          hk = static_cast<int32_t>(task % l.n_head_kv);
            const Span& sp = a.spans[s];
            const int32_t n = std::min(sp.n, pos - sp.start + 1);
            const int32_t j0 = std::clamp(first_key(a, pos) - sp.start, 0, std::max(n, 0));
            float *k = buf.data(), *v = k + P * d, *sc = v + P * d;
            if (n > 0) load_span(l, sp, hk, n, k, v);
            partials(a.q + hk * group * d, group, k + j0 * d, v + j0 * d, n - j0, d, a.scale, sc,
                     at(s, hk * group), d + 3);
          }
        });
    for (int32_t h = 0; h < a.n_head; ++h) {
      Acc acc{a.acc[2 * h], a.acc[2 * h + 1], a.out + h * d};
      for (int32_t s = 0; s < ns; ++s) {
        const float* p = at(s, h);
        if (p[2] != 0.0f) merge(acc, p[0], p[1], p + 3, d);
      }
      a.acc[2 * h] = acc.m;
      a.acc[2 * h + 1] = acc.l;
    }
  } else if (a.n_spans > 0) {
    // Prefill: one task per (kv head, tile of queries), spans folded in order as they are read.
    constexpr int32_t kQTile = 8;
    const int32_t n_tiles = (a.n_tok + kQTile - 1) / kQTile;
    thread_pool().parallel_for(
        static_cast<int64_t>(n_tiles) * l.n_head_kv, 1, [&](int64_t b, int64_t e) {
          std::vector<float>& buf =
              scratch(static_cast<size_t>(2 * P * d + group * P + group * (d + 3)));
          for (int64_t task = b; task < e; ++task) {
            const int32_t tile = static_cast<int32_t>(task / l.n_head_kv),
                          hk = static_cast<int32_t>(task % l.n_head_kv);
            const int32_t t0 = tile * kQTile, t1 = std::min(a.n_tok, t0 + kQTile);
            float *k = buf.data(), *v = k + P * d, *sc = v + P * d, *po = sc + group * P;
            int32_t max_pos = 0, min_pos = INT32_MAX;
            for (int32_t t = t0; t < t1; ++t)
              max_pos = std::max(max_pos, a.pos[t]), min_pos = std::min(min_pos, a.pos[t]);
            for (int32_t s = 0; s < a.n_spans; ++s) {
              const Span& sp = a.spans[s];
              if (sp.start > max_pos) break;
              if (sp.start + sp.n <= first_key(a, min_pos)) continue;  // before every window
              const int32_t nload = std::min(sp.n, max_pos - sp.start + 1);
              load_span(l, sp, hk, nload, k, v);
              for (int32_t t = t0; t < t1; ++t) {
                const int32_t n = std::min(sp.n, a.pos[t] - sp.start + 1);
                const int32_t j0 = std::max(0, first_key(a, a.pos[t]) - sp.start);
                if (n - j0 <= 0) continue;
                partials(a.q + t * qstride + hk * group * d, group, k + j0 * d, v + j0 * d, n - j0,
                         d, a.scale, sc, po, d + 3);
                for (int32_t g = 0; g < group; ++g) {
                  const int32_t h = hk * group + g;
                  const float* pg = po + g * (d + 3);
                  float* st = a.acc + 2 * (int64_t{t} * a.n_head + h);
                  Acc acc{st[0], st[1], a.out + t * qstride + h * d};
                  merge(acc, pg[0], pg[1], pg + 3, d);
                  st[0] = acc.m;
                  st[1] = acc.l;
                }
              }
            }
          }
        });
  }
  if (!a.last) return;
  for (int64_t i = 0; i < int64_t{a.n_tok} * a.n_head; ++i) {
    const float inv = 1.0f / a.acc[2 * i + 1];
    float* o = a.out + i * d;
    for (int32_t j = 0; j < d; ++j) o[j] *= inv;
  }
}

}  // namespace kvs::cpu
