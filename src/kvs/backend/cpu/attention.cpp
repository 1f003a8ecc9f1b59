// CPU attention over paged KV spans. A query head's partial over a span (max, sum of exp,
// unnormalised output) is one fixed sequence of float operations whatever the call (decode or
// prefill, the batch, the tile of queries it shares, the thread), and the partials fold in
// logical span order, so results do not depend on the batch or on where each page lives.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kvs/backend/cpu/kernels.h"
#include "kvs/quant/simd.h"
#include "kvs/util/error.h"
#include "kvs/util/threadpool.h"

namespace kvs::cpu {
namespace {

using quant::hsum;

std::vector<float>& scratch(size_t n) {
  thread_local std::vector<float> buf;
  if (buf.size() < n) buf.resize(n);
  return buf;
}

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

// e^x for x <= 0 (the scores less their max), -inf -> 0: x = n ln 2 + r with |r| <= ln 2 / 2
// (ln 2 in two parts, n ln 2 exact), Cephes' expf polynomial for e^r (within 1 ulp), scaled by
// 2^n; below -87 the result is 0.
inline __m256 exp_neg(__m256 x) {
  const __m256 lo = _mm256_set1_ps(-87.0f);
  const __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
  x = _mm256_max_ps(x, lo);
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i e =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(under, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}

// The 8 sums of 8 vectors, lanes (0 + 1) + (2 + 3) and (4 + 5) + (6 + 7) added last.
inline __m256 sums8(const __m256 a[8]) {
  const __m256 u0 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
  const __m256 u1 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

// s[0 .. 8) = dot(q, k_j) * scale for the 8 keys k + j d: per key 8 lanes of fma over the
// chunks of 8 of the head in order, then sums8.
inline void scores8(const float* q, const float* k, int32_t d, float scale, float* s) {
  __m256 acc[8];
  for (int j = 0; j < 8; ++j) acc[j] = _mm256_setzero_ps();
  for (int32_t c = 0; c < d; c += 8) {
    const __m256 qc = _mm256_loadu_ps(q + c);
    for (int j = 0; j < 8; ++j) acc[j] = _mm256_fmadd_ps(qc, _mm256_loadu_ps(k + j * d + c), acc[j]);
  }
  _mm256_storeu_ps(s, _mm256_mul_ps(sums8(acc), _mm256_set1_ps(scale)));
}

// o[0 .. 8 C) = fma(p[j], v[j d + i], o[i]) for the keys j < n in order, from zero: each
// element's chain of fmas, C vectors of 8 at once, kept in registers over the keys.
template <int C>
inline void accumulate(float* o, const float* p, const float* v, int32_t d, int32_t n) {
  __m256 acc[C];
  for (int c = 0; c < C; ++c) acc[c] = _mm256_setzero_ps();
  for (int32_t j = 0; j < n; ++j) {
    const __m256 pj = _mm256_broadcast_ss(p + j);
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
// span (k, v: [n][d], k readable up to a multiple of 8 rows), into out + g * ostride: [max, sum,
// non-empty, output[d]]. Per head: the scores s_j (scores8, 8 keys at a time), their max m,
// p_j = exp(s_j - m) summed in 8 lanes (key j in lane j % 8, in key order) and then by hsum,
// and output = sum of p_j v_j by one fma per key in key order. The heads share each K and V row
// while it is in cache. s: group * (n + 8) floats of scratch.
void partials(const float* q, int32_t group, const float* k, const float* v, int32_t n, int32_t d,
              float scale, float* s, float* out, int64_t ostride) {
  if (n <= 0) {
    for (int32_t g = 0; g < group; ++g) out[g * ostride + 2] = 0.0f;
    return;
  }
  const int32_t n8 = (n + 7) / 8 * 8;
  for (int32_t g = 0; g < group; ++g) {
    float* p = s + g * n8;  // the scores, then the probabilities
    for (int32_t j = 0; j < n8; j += 8) scores8(q + g * d, k + static_cast<int64_t>(j) * d, d, scale, p + j);
    const float m = max_of(p, n);
    for (int32_t j = n; j < n8; ++j) p[j] = -INFINITY;  // rows past n: exp gives 0
    __m256 sum = _mm256_setzero_ps();
    const __m256 mv = _mm256_set1_ps(m);
    for (int32_t j = 0; j < n8; j += 8) {
      const __m256 e = exp_neg(_mm256_sub_ps(_mm256_loadu_ps(p + j), mv));
      _mm256_storeu_ps(p + j, e);
      sum = _mm256_add_ps(sum, e);
    }
    float* o = out + g * ostride;
    o[0] = m, o[1] = hsum(sum), o[2] = 1.0f;
    o += 3;
    int32_t i = 0;
    for (; i + 64 <= d; i += 64) accumulate<8>(o + i, p, v + i, d, n);
    for (; i + 32 <= d; i += 32) accumulate<4>(o + i, p, v + i, d, n);
    for (; i < d; i += 8) accumulate<1>(o + i, p, v + i, d, n);
  }
}

// The first key position a query at pos sees.
inline int32_t first_key(const AttentionArgs& a, int32_t pos) {
  return a.window > 0 ? pos - a.window + 1 : 0;
}

// Dequantizes rows [0, n) of head h of a span's K and V into k, v ([n][d] f32), and repeats K's
// row n - 1 seven times (scores8 reads whole groups of 8 from any first row).
void load_span(const KvLayout& l, const Span& sp, int32_t h, int32_t n, float* k, float* v) {
  const int32_t d = l.head_dim;
  const uint8_t* kp = sp.page + h * l.k_head;
  const uint8_t* vp = sp.page + l.v_offset() + h * l.v_head;
  for (int32_t j = 0; j < n; ++j) {
    float* kj = k + static_cast<int64_t>(j) * d;
    float* vj = v + static_cast<int64_t>(j) * d;
    if (l.k_type == DType::F16) {
      const auto* src = reinterpret_cast<const __m128i*>(kp + j * l.k_row);
      for (int32_t c = 0; c < d / 8; ++c) _mm256_storeu_ps(kj + 8 * c, _mm256_cvtph_ps(_mm_loadu_si128(src + c)));
    } else {
      kv_dequantize_head(l.k_type, kp + j * l.k_row, kj, d);
    }
    if (l.v_type == DType::F16) {
      const auto* src = reinterpret_cast<const __m128i*>(vp + j * l.v_row);
      for (int32_t c = 0; c < d / 8; ++c) _mm256_storeu_ps(vj + 8 * c, _mm256_cvtph_ps(_mm_loadu_si128(src + c)));
    } else {
      kv_dequantize_head(l.v_type, vp + j * l.v_row, vj, d);
    }
  }
  for (int32_t j = n; j < n + 7; ++j)
    std::copy(k + static_cast<int64_t>(n - 1) * d, k + static_cast<int64_t>(n) * d,
              k + static_cast<int64_t>(j) * d);
}

}  // namespace

void attention(const AttentionArgs& a) {
  const KvLayout& l = a.kv;
  const int32_t d = l.head_dim, group = a.n_head / l.n_head_kv, P = l.page_size;
  KVS_CHECK(d % 8 == 0, "cpu attention: head size ", d, " is not a multiple of 8");
  const int64_t qstride = static_cast<int64_t>(a.n_head) * d;
  const size_t span_floats = static_cast<size_t>(2 * (P + 8) * d + group * (P + 8));
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
          std::vector<float>& buf = scratch(span_floats);
          for (int64_t task = b; task < e; ++task) {
            const int32_t s = static_cast<int32_t>(task / l.n_head_kv),
                          hk = static_cast<int32_t>(task % l.n_head_kv);
            const Span& sp = a.spans[s];
            const int32_t n = std::min(sp.n, pos - sp.start + 1);
            const int32_t j0 = std::clamp(first_key(a, pos) - sp.start, 0, std::max(n, 0));
            float *k = buf.data(), *v = k + (P + 8) * d, *sc = v + (P + 8) * d;
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
    constexpr int32_t kQTile = 16;
    const int32_t n_tiles = (a.n_tok + kQTile - 1) / kQTile;
    thread_pool().parallel_for(
        static_cast<int64_t>(n_tiles) * l.n_head_kv, 1, [&](int64_t b, int64_t e) {
          std::vector<float>& buf = scratch(span_floats + static_cast<size_t>(group * (d + 3)));
          for (int64_t task = b; task < e; ++task) {
            const int32_t tile = static_cast<int32_t>(task / l.n_head_kv),
                          hk = static_cast<int32_t>(task % l.n_head_kv);
            const int32_t t0 = tile * kQTile, t1 = std::min(a.n_tok, t0 + kQTile);
            float *k = buf.data(), *v = k + (P + 8) * d, *sc = v + (P + 8) * d,
                  *po = sc + group * (P + 8);
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
