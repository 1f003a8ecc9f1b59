#include "kvs/backend/cpu/kernels.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kvs/quant/blocks.h"
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

// The 32 weights of a q8_0, q4_0 or q4_1 block as 4 vectors of 8, the values dequantize_row
// gives (d q, d q + m: a multiply, then an add, never fused).
template <DType T>
inline void block_weights(const uint8_t* p, __m256 w[4]) {
  using namespace quant;
  __m256i q[4];
  if constexpr (T == DType::Q8_0) {
    const auto* b = reinterpret_cast<const BlockQ8_0*>(p);
    for (int c = 0; c < 4; ++c) q[c] = i8_lanes(b->qs + 8 * c);
  } else if constexpr (T == DType::Q4_0) {
    q4_levels(reinterpret_cast<const BlockQ4_0*>(p)->qs, _mm256_set1_epi32(8), q);
  } else {
    q4_levels(reinterpret_cast<const BlockQ4_1*>(p)->qs, _mm256_setzero_si256(), q);
  }
  const __m256 d = bcast_f16(p);  // every block type starts with its f16 scale
  for (int c = 0; c < 4; ++c) w[c] = _mm256_mul_ps(d, to_ps(q[c]));
  if constexpr (T == DType::Q4_1) {
    const __m256 m = bcast_f16(reinterpret_cast<const BlockQ4_1*>(p)->m);
    for (int c = 0; c < 4; ++c) w[c] = _mm256_add_ps(w[c], m);
  }
}

// R rows x 1 token (decode) straight from q8_0, q4_0 or q4_1 rows (n a multiple of 32): the
// weights dequantize_row gives and each row's chain as dot()'s on them, without the f32 tile.
template <DType T, int R>
inline void dot_blocks(const uint8_t* w, size_t ld, const float* x, int64_t n, float* out) {
  constexpr size_t kBlock = T == DType::Q8_0   ? sizeof(quant::BlockQ8_0)
                            : T == DType::Q4_0 ? sizeof(quant::BlockQ4_0)
                                               : sizeof(quant::BlockQ4_1);
  __m256 a[R];
  for (int r = 0; r < R; ++r) a[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < n / 32; ++b) {
    __m256 u[4];
    for (int c = 0; c < 4; ++c) u[c] = _mm256_loadu_ps(x + 32 * b + 8 * c);
    for (int r = 0; r < R; ++r) {
      __m256 wv[4];
      block_weights<T>(w + r * ld + b * kBlock, wv);
      for (int c = 0; c < 4; ++c) a[r] = _mm256_fmadd_ps(wv[c], u[c], a[r]);
    }
  }
  for (int r = 0; r < R; ++r) out[r] = hsum(a[r]);
}

// One token's product for q8_0, q4_0 and q4_1 rows by dot_blocks; false for other types.
bool matvec_blocks(const Matrix& w, const float* x, float* y, int64_t r0, int64_t nr) {
  const auto run = [&]<DType T>() {
    int64_t r = 0;
    for (; r + 4 <= nr; r += 4) dot_blocks<T, 4>(w.row(r0 + r), w.row_bytes, x, w.n_in, y + r0 + r);
    for (; r < nr; ++r) dot_blocks<T, 1>(w.row(r0 + r), w.row_bytes, x, w.n_in, y + r0 + r);
    return true;
  };
  switch (w.type) {
    case DType::Q8_0:
      return run.template operator()<DType::Q8_0>();
    case DType::Q4_0:
      return run.template operator()<DType::Q4_0>();
    case DType::Q4_1:
      return run.template operator()<DType::Q4_1>();
    default:
      return false;
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

void matmul(const Matrix& w, const float* x, float* y, int64_t n_tok, const float* bias) {
  constexpr int64_t kTile = 16;  // weight rows dequantized at once (f32 tile stays in L1/L2)
  const int64_t n = w.n_in, n_out = w.n_out;
  const int64_t tiles = (n_out + kTile - 1) / kTile;
  thread_pool().parallel_for(tiles, 1, [&](int64_t tb, int64_t te) {
    std::vector<float>& buf = scratch(static_cast<size_t>(kTile * n));
    for (int64_t tile = tb; tile < te; ++tile) {
      const int64_t r0 = tile * kTile, nr = std::min(kTile, n_out - r0);
      if (n_tok == 1 && matvec_blocks(w, x, y, r0, nr)) {
        if (bias)
          for (int64_t r = 0; r < nr; ++r) y[r0 + r] += bias[r0 + r];
        continue;
      }
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

}  // namespace kvs::cpu
