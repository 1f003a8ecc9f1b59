#include "kvs/backend/cpu/quant_dot.h"

#include <cpuid.h>
#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <cstring>

#include "kvs/quant/blocks.h"
#include "kvs/quant/simd.h"
#include "kvs/util/error.h"
#include "kvs/util/threadpool.h"

namespace kvs::cpu {
namespace {

using namespace quant;

// ---- activations ----

inline float hmax(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

inline int hsum_i32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}

// 4 vectors of 8 int32 (each within int8) -> 32 bytes in element order.
inline void pack_bytes(const __m256i q[4], int8_t* out) {
  // packs works within 128-bit lanes: the dwords come out as 0 4 1 5 2 6 3 7.
  const __m256i p =
      _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out),
                      _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
}

// Block b (0 or 1) of a pair from the 32 floats at x: quantize_x_block of the CUDA backend
// (common.cuh), with the same correctly rounded division, reciprocal, products and rint.
void quantize_block(const float* x, XPair& p, int b) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 v[4], amax = _mm256_setzero_ps();
  for (int c = 0; c < 4; ++c) {
    v[c] = _mm256_loadu_ps(x + 8 * c);
    amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[c]));
  }
  const float dx = hmax(amax) / 127.0f;
  const __m256 id = _mm256_set1_ps(dx != 0.0f ? 1.0f / dx : 0.0f);
  constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  __m256i h[4], l[4];
  for (int c = 0; c < 4; ++c) {
    const __m256 s = _mm256_mul_ps(v[c], id), hf = _mm256_round_ps(s, kRound);
    const __m256 lf =
        _mm256_round_ps(_mm256_mul_ps(_mm256_sub_ps(s, hf), _mm256_set1_ps(254.0f)), kRound);
    h[c] = _mm256_cvtps_epi32(hf);
    l[c] = _mm256_cvtps_epi32(lf);
  }
  pack_bytes(h, p.h + 32 * b);
  pack_bytes(l, p.l + 32 * b);
  // Each half of 16 (the mins of q2_k apply per half): a quarter of its sum in each lane.
  for (int half = 0; half < 2; ++half) {
    const int sh = hsum_i32(_mm256_add_epi32(h[2 * half], h[2 * half + 1]));
    const int sl = hsum_i32(_mm256_add_epi32(l[2 * half], l[2 * half + 1]));
    const float sum = static_cast<float>(254 * sh + sl) / 254.0f;  // exact numerator
    _mm_storeu_ps(p.s4 + 8 * b + 4 * half, _mm_set1_ps(dx * sum * 0.25f));
  }
  _mm256_storeu_ps(p.d + 8 * b, _mm256_set1_ps(dx / 254.0f));
}

// ---- one copy of the kernels per instruction set ----

namespace avx2 {
#include "kvs/backend/cpu/quant_dot_kernels.inc"
struct Maddubs {
  static constexpr bool kVnni = false;
  // Pairs of products summed to int16 (at most 2 x 128 x 127 here), then pairs of those.
  static __m256i dot(__m256i acc, __m256i u, __m256i x) {
    return _mm256_add_epi32(acc,
                            _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), _mm256_set1_epi16(1)));
  }
};
void rows(const Matrix& w, const XPair* x, int64_t n_tok, int64_t r0, int64_t nr, float* y,
          int64_t ldy) {
  rows_of<Ymm2<Maddubs>>(w, x, n_tok, r0, nr, y, ldy);
}
}  // namespace avx2

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c,avxvnni"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avxvnni")
#endif
namespace avxvnni {
#include "kvs/backend/cpu/quant_dot_kernels.inc"
struct DpbusdAvx {
  static constexpr bool kVnni = true;
  static __m256i dot(__m256i acc, __m256i u, __m256i x) {
    return _mm256_dpbusd_avx_epi32(acc, u, x);
  }
};
[[gnu::flatten]] void rows(const Matrix& w, const XPair* x, int64_t n_tok, int64_t r0, int64_t nr,
                           float* y, int64_t ldy) {
  rows_of<Ymm2<DpbusdAvx>>(w, x, n_tok, r0, nr, y, ldy);
}
}  // namespace avxvnni
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#if defined(__clang__)
#pragma clang attribute push( \
    __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512vnni"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx512vnni")
#endif
namespace avx512 {
#include "kvs/backend/cpu/quant_dot_kernels.inc"
// One 512-bit register.
struct Avx512 {
  static constexpr bool kVnni = true;
  static constexpr int kRows = 2, kToks = 8, kRows1 = 4;  // 32 registers
  using VI = __m512i;
  using VF = __m512;
  static VI zero() { return _mm512_setzero_si512(); }
  static VF zerof() { return _mm512_setzero_ps(); }
  static VI join(__m256i a, __m256i b) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1);
  }
  static VI load(const int8_t* p) { return _mm512_loadu_si512(p); }
  static VF loadf(const float* p) { return _mm512_loadu_ps(p); }
  static VI nibbles2(const uint8_t* a, const uint8_t* b) {
    const __m512i v =
        _mm512_mask_broadcast_i32x4(_mm512_broadcast_i32x4(load16(a)), 0xFF00, load16(b));
    return _mm512_and_si512(_mm512_srlv_epi64(v, _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4)),
                            _mm512_set1_epi8(0x0F));
  }
  static VI nibbles32(const uint8_t* p) {
    const __m512i v = _mm512_broadcast_i64x4(load32(p));
    return _mm512_and_si512(_mm512_srlv_epi64(v, _mm512_setr_epi64(0, 0, 0, 0, 4, 4, 4, 4)),
                            _mm512_set1_epi8(0x0F));
  }
  static VI bytes2(const uint8_t* a, const uint8_t* b) { return join(load32(a), load32(b)); }
  static VI lookup(VI idx, __m128i table) {
    return _mm512_shuffle_epi8(_mm512_broadcast_i32x4(table), idx);
  }
  static VI bits_or(VI a, VI b) { return _mm512_or_si512(a, b); }
  static VF rep8(__m128 v, int first) {
    const __m512i i = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    return _mm512_permutexvar_ps(_mm512_add_epi32(i, _mm512_set1_epi32(first)),
                                 _mm512_castps128_ps512(v));
  }
  static VF rep4(__m128 v) {
    const __m512i i = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    return _mm512_permutexvar_ps(i, _mm512_castps128_ps512(v));
  }
  static VI dot(VI acc, VI u, VI x) { return _mm512_dpbusd_epi32(acc, u, x); }
  static VI xor80(VI u) { return _mm512_xor_si512(u, _mm512_set1_epi8(static_cast<char>(0x80))); }
  static VI abs8(VI u) { return _mm512_abs_epi8(u); }
  static VI sign8(VI x, VI) { return x; }  // unused: kVnni
  static VI offset(VI x, int s) {
    return _mm512_sub_epi32(
        zero(), _mm512_dpbusd_epi32(zero(), _mm512_set1_epi8(static_cast<char>(1 << s)), x));
  }
  template <bool kNarrow>
  static VI combine(VI h, VI l) {
    if constexpr (kNarrow)
      return _mm512_dpwssd_epi32(l, h, _mm512_set1_epi32(254));
    else
      return _mm512_add_epi32(_mm512_mullo_epi32(h, _mm512_set1_epi32(254)), l);
  }
  static VF mul(VF a, VF b) { return _mm512_mul_ps(a, b); }
  static VF fma(VF a, VF b, VF c) { return _mm512_fmadd_ps(a, b, c); }
  static VF cvt(VI v) { return _mm512_cvtepi32_ps(v); }
  static float sum(VF v) {
    return hsum(_mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1)));
  }
};

[[gnu::flatten]] void rows(const Matrix& w, const XPair* x, int64_t n_tok, int64_t r0, int64_t nr,
                           float* y, int64_t ldy) {
  rows_of<Avx512>(w, x, n_tok, r0, nr, y, ldy);
}
}  // namespace avx512
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

}  // namespace

bool cpu_has(DotIsa isa) {
  switch (isa) {
    case DotIsa::Avx2:
      return true;
    case DotIsa::AvxVnni: {  // CPUID leaf 7, sub-leaf 1: EAX bit 4 (not every compiler names it)
      unsigned a = 0, b = 0, c = 0, d = 0;
      return __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a >> 4 & 1) != 0;
    }
    case DotIsa::Avx512Vnni:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
             __builtin_cpu_supports("avx512vnni");
  }
  return false;
}

DotIsa best_dot_isa() {
  static const DotIsa best = cpu_has(DotIsa::Avx512Vnni) ? DotIsa::Avx512Vnni
                             : cpu_has(DotIsa::AvxVnni)  ? DotIsa::AvxVnni
                                                         : DotIsa::Avx2;
  return best;
}

bool has_int_dot(DType t) {
  switch (t) {
    case DType::Q8_0:
    case DType::Q4_0:
    case DType::Q4_1:
    case DType::Q5_0:
    case DType::Q5_1:
    case DType::IQ4_NL:
    case DType::Q2_K:
    case DType::Q3_K:
    case DType::Q4_K:
    case DType::Q5_K:
    case DType::Q6_K:
    case DType::IQ4_XS:
      return true;
    default:
      return false;
  }
}

void quantize_x(const float* x, int64_t n_tok, int64_t n, XPair* xq) {
  KVS_CHECK(n % QK == 0, "quantize_x: ", n, " activations is not a whole number of blocks of 32");
  const int64_t nb = n / QK, np = x_pairs(n);
  thread_pool().parallel_for(n_tok * np, 128, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const int64_t t = i / np, p = i % np;
      XPair& xp = xq[i];
      quantize_block(x + t * n + 2 * p * QK, xp, 0);
      if (2 * p + 1 < nb) {
        quantize_block(x + t * n + (2 * p + 1) * QK, xp, 1);
      } else {  // the odd last block's partner: zeros
        std::memset(xp.h + 32, 0, 32);
        std::memset(xp.l + 32, 0, 32);
        std::fill(xp.d + 8, xp.d + 16, 0.0f);
        std::fill(xp.s4 + 8, xp.s4 + 16, 0.0f);
      }
    }
  });
}

void int_matmul_rows(const Matrix& w, const XPair* xq, int64_t n_tok, int64_t r0, int64_t nr,
                     float* y, int64_t ldy, DotIsa isa) {
  switch (isa) {
    case DotIsa::Avx2:
      return avx2::rows(w, xq, n_tok, r0, nr, y, ldy);
    case DotIsa::AvxVnni:
      return avxvnni::rows(w, xq, n_tok, r0, nr, y, ldy);
    case DotIsa::Avx512Vnni:
      return avx512::rows(w, xq, n_tok, r0, nr, y, ldy);
  }
}

}  // namespace kvs::cpu
