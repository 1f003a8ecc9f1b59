// CPU attention over paged KV spans. A query head's partial over a span is one fixed sequence of
// float operations whatever the call, so results depend neither on the batch nor on where each
// page lives, nor on the instruction set:
// - score s_j = (fma chain over the head's elements i = 0 .. d - 1 of q_i k_ji, from 0) * scale;
//   prefill computes W queries' chains at once (the tile's queries transposed, a key element
//   broadcast), decode W keys' (the span's keys transposed, a query element broadcast);
// - m = the max of the span's scores; p_j = exp(s_j - m) (exp_ps, within 1 ulp);
// - the sum of the p_j in 8 partial sums (key j, counted from the span's start, in sum j % 8, in
//   key order), then ((0 + 4) + (2 + 6)) + ((1 + 5) + (3 + 7));
// - output_i = fma chain over the keys in order of p_j v_ji, from 0;
// and the partials fold in logical span order. W is 8 (AVX2) or 16 (AVX-512).
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kvs/backend/cpu/kernels.h"
#include "kvs/backend/cpu/quant_dot.h"
#include "kvs/quant/simd.h"
#include "kvs/util/error.h"
#include "kvs/util/threadpool.h"

namespace kvs::cpu {
namespace {

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

constexpr int32_t kMaxGroup = 64;  // query heads a KV head

// Where one tile's query (or the decoding query) looks in a span: keys [j0, n) of it.
struct Range {
  int32_t j0, n;
};

// The first key position a query at pos sees.
inline int32_t first_key(const AttentionArgs& a, int32_t pos) {
  return a.window > 0 ? pos - a.window + 1 : 0;
}

// Dequantizes rows [0, n) of head h of a span's K and V (those not null) into k, v ([n][d]
// f32), and repeats K's row n - 1 16 times (the kernels read whole groups of 8 keys from any
// first row).
void load_span(const KvLayout& l, const Span& sp, int32_t h, int32_t n, float* k, float* v) {
  const int32_t d = l.head_dim;
  const uint8_t* kp = sp.page + h * l.k_head;
  const uint8_t* vp = sp.page + l.v_offset() + h * l.v_head;
  const auto row = [d](DType t, const uint8_t* src, float* y) {
    if (t == DType::F16) {
      for (int32_t c = 0; c < d; c += 8)
        _mm256_storeu_ps(
            y + c, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src) + c / 8)));
    } else {
      kv_dequantize_head(t, src, y, d);
    }
  };
  for (int32_t j = 0; j < n; ++j) {
    if (k) row(l.k_type, kp + j * l.k_row, k + static_cast<int64_t>(j) * d);
    if (v) row(l.v_type, vp + j * l.v_row, v + static_cast<int64_t>(j) * d);
  }
  if (k)
    for (int32_t j = n; j < n + 16; ++j)
      std::copy(k + static_cast<int64_t>(n - 1) * d, k + static_cast<int64_t>(n) * d,
                k + static_cast<int64_t>(j) * d);
}

// Rows of K and V that a task converts (a page and the 16 copies of its last row).
inline size_t span_rows(const AttentionArgs& a) {
  return static_cast<size_t>(a.kv.page_size + 16);
}

// The floats of a prefill task's buffer: K, V and scores of a span, the queries transposed and
// the partials.
inline size_t prefill_floats(const AttentionArgs& a, int w) {
  const int32_t d = a.kv.head_dim, group = a.n_head / a.kv.n_head_kv;
  return span_rows(a) * static_cast<size_t>(2 * d + w) + static_cast<size_t>(group * d * w) +
         static_cast<size_t>(w * group * (d + 3));
}

// ---- one copy of the kernels per instruction set ----
// exp: quant::exp_ps's steps (the AVX-512 one too), for the scores less their max.

namespace avx2 {
#include "kvs/backend/cpu/attention_kernels.inc"
struct Avx2 {
  static constexpr int W = 8;
  static constexpr int kScoreBlocks = 2;  // of a decode pass: 16 registers
  using V = __m256;
  static V zero() { return _mm256_setzero_ps(); }
  static V set1(float f) { return _mm256_set1_ps(f); }
  static V load(const float* p) { return _mm256_loadu_ps(p); }
  static V load(const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static void store(float* p, V v) { _mm256_storeu_ps(p, v); }
  static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static V add(V a, V b) { return _mm256_add_ps(a, b); }
  static V max(V a, V b) { return _mm256_max_ps(a, b); }
  // Lanes l with lo[l] <= j + l * step < hi[l] kept, the others -inf.
  static V keep(V v, __m256i lanes_j, __m256i lo, __m256i hi) {
    const __m256i in =
        _mm256_andnot_si256(_mm256_cmpgt_epi32(lo, lanes_j), _mm256_cmpgt_epi32(hi, lanes_j));
    return _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), v, _mm256_castsi256_ps(in));
  }
  static __m256i iota() { return _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7); }
  static __m256i seti(int32_t v) { return _mm256_set1_epi32(v); }
  static __m256i loadi(const int32_t* p) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  }
  static __m256i addi(__m256i a, __m256i b) { return _mm256_add_epi32(a, b); }
  // sum8 + the lanes in order of 8 (keys j .. j + W with j % 8 == 0).
  static __m256 add8(__m256 sum8, V v) { return _mm256_add_ps(sum8, v); }
  static float hmax(V v) {
    alignas(32) float l[8];
    _mm256_store_ps(l, v);
    float m = l[0];
    for (int i = 1; i < 8; ++i) m = std::max(m, l[i]);
    return m;
  }
  static V exp(V x) { return quant::exp_ps(x); }
  // dst[c][k] = f32 of the f16 src[k stride + 2 c], 8 keys k x 8 columns c (dst's rows ld floats
  // apart).
  static void transpose_f16(const uint8_t* src, size_t stride, float* dst, int64_t ld) {
    __m128i a[8], o[8];
    for (int r = 0; r < 8; ++r)
      a[r] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + r * stride));
    unpack8x8(a, o, _mm_unpacklo_epi16, _mm_unpackhi_epi16, _mm_unpacklo_epi32, _mm_unpackhi_epi32,
              _mm_unpacklo_epi64, _mm_unpackhi_epi64);
    for (int c = 0; c < 8; ++c) _mm256_storeu_ps(dst + c * ld, _mm256_cvtph_ps(o[c]));
  }
};

void decode(const AttentionArgs& a, int64_t task, float* part, float* buf) {
  decode_task<Avx2>(a, task, part, buf);
}
void prefill(const AttentionArgs& a, int64_t task, float* buf) {
  prefill_task<Avx2>(a, task, buf);
}
}  // namespace avx2

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512dq,avx512vl"))), \
                             apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512dq,avx512vl")
#endif
namespace avx512 {
#include "kvs/backend/cpu/attention_kernels.inc"
struct Avx512 {
  static constexpr int W = 16;
  static constexpr int kScoreBlocks = 4;  // of a decode pass: 32 registers
  using V = __m512;
  static V zero() { return _mm512_setzero_ps(); }
  static V set1(float f) { return _mm512_set1_ps(f); }
  static V load(const float* p) { return _mm512_loadu_ps(p); }
  static V load(const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static void store(float* p, V v) { _mm512_storeu_ps(p, v); }
  static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static V add(V a, V b) { return _mm512_add_ps(a, b); }
  static V max(V a, V b) { return _mm512_max_ps(a, b); }
  static V keep(V v, __m512i lanes_j, __m512i lo, __m512i hi) {
    const __mmask16 in = _mm512_cmp_epi32_mask(lo, lanes_j, _MM_CMPINT_LE) &
                         _mm512_cmp_epi32_mask(lanes_j, hi, _MM_CMPINT_LT);
    return _mm512_mask_blend_ps(in, _mm512_set1_ps(-INFINITY), v);
  }
  static __m512i iota() {
    return _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  }
  static __m512i seti(int32_t v) { return _mm512_set1_epi32(v); }
  static __m512i loadi(const int32_t* p) { return _mm512_loadu_si512(p); }
  static __m512i addi(__m512i a, __m512i b) { return _mm512_add_epi32(a, b); }
  static __m256 add8(__m256 sum8, V v) {
    return _mm256_add_ps(_mm256_add_ps(sum8, _mm512_castps512_ps256(v)),
                         _mm512_extractf32x8_ps(v, 1));
  }
  static float hmax(V v) { return _mm512_reduce_max_ps(v); }
  // dst[c][k] = f32 of the f16 src[k stride + 2 c], 16 keys k x 8 columns c: keys k and k + 8
  // in the two lanes of a 256-bit transpose.
  static void transpose_f16(const uint8_t* src, size_t stride, float* dst, int64_t ld) {
    __m256i a[8], o[8];
    for (int r = 0; r < 8; ++r)
      a[r] = _mm256_inserti128_si256(
          _mm256_castsi128_si256(
              _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + r * stride))),
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + (r + 8) * stride)), 1);
    unpack8x8(a, o, _mm256_unpacklo_epi16, _mm256_unpackhi_epi16, _mm256_unpacklo_epi32,
              _mm256_unpackhi_epi32, _mm256_unpacklo_epi64, _mm256_unpackhi_epi64);
    for (int c = 0; c < 8; ++c) _mm512_storeu_ps(dst + c * ld, _mm512_cvtph_ps(o[c]));
  }
  static V exp(V x) {
    const V lo = _mm512_set1_ps(-87.0f);
    const __mmask16 under = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
    x = _mm512_min_ps(_mm512_max_ps(x, lo), _mm512_set1_ps(88.7f));
    const V n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    V r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    V p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    const __m512i e =
        _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_maskz_mov_ps(static_cast<__mmask16>(~under),
                               _mm512_mul_ps(p, _mm512_castsi512_ps(e)));
  }
};

[[gnu::flatten]] void decode(const AttentionArgs& a, int64_t task, float* part, float* buf) {
  decode_task<Avx512>(a, task, part, buf);
}
[[gnu::flatten]] void prefill(const AttentionArgs& a, int64_t task, float* buf) {
  prefill_task<Avx512>(a, task, buf);
}
}  // namespace avx512
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

bool has_avx512() {
  static const bool yes = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
                          __builtin_cpu_supports("avx512vl");
  return yes;
}

}  // namespace

void attention(const AttentionArgs& a, DotIsa isa) {
  const int32_t d = a.kv.head_dim;
  KVS_CHECK(d % 8 == 0, "cpu attention: head size ", d, " is not a multiple of 8");
  KVS_CHECK(a.n_head / a.kv.n_head_kv <= kMaxGroup, "cpu attention: more than ", kMaxGroup,
            " query heads a KV head");
  // acc[(t * n_head + h) * 2 + {0, 1}]: running max and sum; a sum of 0 means "nothing yet".
  if (a.first)
    for (int64_t i = 0; i < int64_t{a.n_tok} * a.n_head; ++i) a.acc[2 * i + 1] = 0.0f;
  const KvLayout& l = a.kv;
  const bool wide = isa == DotIsa::Avx512Vnni && has_avx512();
  if (a.n_tok == 1 && a.n_spans > 0) {
    // Decode: one task per (kv head, span) stores its partials; then a fold per head in
    // logical order.
    const int32_t ns = a.n_spans;
    std::vector<float>& part = scratch(static_cast<size_t>(ns) * a.n_head * (d + 3));
    thread_pool().parallel_for(
        static_cast<int64_t>(ns) * l.n_head_kv, 1, [&](int64_t b, int64_t e) {
          thread_local std::vector<float> buf;
          const size_t need = span_rows(a) * static_cast<size_t>(3 * d + a.n_head / l.n_head_kv);
          if (buf.size() < need) buf.resize(need);
          for (int64_t task = b; task < e; ++task)
            (wide ? avx512::decode : avx2::decode)(a, task, part.data(), buf.data());
        });
    for (int32_t h = 0; h < a.n_head; ++h) {
      Acc acc{a.acc[2 * h], a.acc[2 * h + 1], a.out + h * d};
      for (int32_t s = 0; s < ns; ++s) {
        const float* p = part.data() + (static_cast<size_t>(s) * a.n_head + h) * (d + 3);
        if (p[2] != 0.0f) merge(acc, p[0], p[1], p + 3, d);
      }
      a.acc[2 * h] = acc.m;
      a.acc[2 * h + 1] = acc.l;
    }
  } else if (a.n_spans > 0) {
    // Prefill: one task per (kv head, tile of W queries).
    const int w = wide ? avx512::Avx512::W : avx2::Avx2::W;
    const int32_t n_tiles = (a.n_tok + w - 1) / w;
    thread_pool().parallel_for(static_cast<int64_t>(n_tiles) * l.n_head_kv, 1,
                               [&](int64_t b, int64_t e) {
                                 thread_local std::vector<float> buf;
                                 if (buf.size() < prefill_floats(a, w))
                                   buf.resize(prefill_floats(a, w));
                                 for (int64_t task = b; task < e; ++task)
                                   (wide ? avx512::prefill : avx2::prefill)(a, task, buf.data());
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
