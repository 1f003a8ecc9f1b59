#include "kvs/backend/cpu/quant_dot.h"

#include <immintrin.h>

#include <cmath>
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

void quantize_block(const float* x, XBlock& b) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 v[4], amax = _mm256_setzero_ps();
  for (int c = 0; c < 4; ++c) {
    v[c] = _mm256_loadu_ps(x + 8 * c);
    amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[c]));
  }
  const float m = hmax(amax);
  const float d = m / 127.0f, id = m > 0.0f ? 127.0f / m : 0.0f;
  __m256i q[4];
  for (int c = 0; c < 4; ++c) q[c] = _mm256_cvtps_epi32(_mm256_mul_ps(v[c], _mm256_set1_ps(id)));
  // packs works within 128-bit lanes: the dwords come out as 0 4 1 5 2 6 3 7.
  const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(b.q),
                      _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
  const __m256i s4 = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(s4), _mm256_extracti128_si256(s4, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  b.d = d;
  b.s8 = d * static_cast<float>(_mm_cvtsi128_si32(s)) * 0.125f;
}

// ---- weight formats ----
// Each gives, for sub-block j (32 elements) of a block: its levels as 32 bytes, unsigned (the
// weight is d (level - 2^kShift), or d level + min) or signed (kSigned: d level); a float scale
// per int32 lane of the dot (lane i covers elements 4i .. 4i + 3); and with kMin, the min added
// per element. Scales are read once per block into Scales.

inline float f16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}
inline __m256i load32(const void* p) {
  return _mm256_loadu_si256(static_cast<const __m256i*>(p));
}
inline __m256i bytes(int v) {
  return _mm256_set1_epi8(static_cast<char>(v));
}
// 16 bytes of nibbles -> 32 levels: element j in the low nibble of byte j, j + 16 in the high
// (the bytes in both halves, the upper half shifted).
inline __m256i nibbles(const uint8_t* qs) {
  const __m256i v = _mm256_broadcastsi128_si256(load16(qs));
  return _mm256_and_si256(_mm256_srlv_epi64(v, _mm256_setr_epi64x(0, 0, 4, 4)), bytes(0x0F));
}
// The f16 pair (d, m) at p, each in every lane.
struct PairScales {
  __m256 d, m;
};
inline void pair_scales(const uint8_t* p, PairScales& s) {
  const __m128 dm = _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(load_u32(p))));
  s.d = _mm256_broadcastss_ps(dm);
  s.m = _mm256_broadcastss_ps(_mm_movehdup_ps(dm));
}
// 0x10 in byte i where bit i of the 32 bits at p is set (q5_0, q5_1).
inline __m256i fifth_bits(const uint8_t* p) {
  const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2,
                                          2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
  const __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(load_u32(p))), spread);
  const __m256i bit = _mm256_set1_epi64x(0x8040201008040201);
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit), bytes(0x10));
}
// Bits b, b + 1 of each byte (as 16-bit shifts, masked per byte) moved to bits 4 and 5.
inline __m256i bits_to_4(__m256i v, int b, int mask) {
  const __m256i s = b <= 4 ? _mm256_slli_epi16(v, 4 - b) : _mm256_srli_epi16(v, b - 4);
  return _mm256_and_si256(s, bytes(mask));
}

struct Q8_0 {
  using Block = BlockQ8_0;
  static constexpr int kSubs = 1, kShift = 0;
  static constexpr bool kSigned = true, kMin = false;
  struct Scales {
    float d;
  };
  static void scales(const uint8_t* b, Scales& s) { s.d = f16(b); }
  static __m256i levels(const uint8_t* b, int) { return load32(b + 2); }
  static __m256 scale(const Scales& s, int) { return _mm256_set1_ps(s.d); }
  static __m256 min(const Scales&, int) { return _mm256_setzero_ps(); }
};

struct Q4_0 {
  using Block = BlockQ4_0;
  static constexpr int kSubs = 1, kShift = 3;
  static constexpr bool kSigned = false, kMin = false;
  using Scales = Q8_0::Scales;
  static void scales(const uint8_t* b, Scales& s) { s.d = f16(b); }
  static __m256i levels(const uint8_t* b, int) { return nibbles(b + 2); }
  static __m256 scale(const Scales& s, int) { return _mm256_set1_ps(s.d); }
  static __m256 min(const Scales&, int) { return _mm256_setzero_ps(); }
};

struct Q4_1 {
  using Block = BlockQ4_1;
  static constexpr int kSubs = 1, kShift = 0;
  static constexpr bool kSigned = false, kMin = true;
  using Scales = PairScales;
  static void scales(const uint8_t* b, Scales& s) { pair_scales(b, s); }
  static __m256i levels(const uint8_t* b, int) { return nibbles(b + 4); }
  static __m256 scale(const Scales& s, int) { return s.d; }
  static __m256 min(const Scales& s, int) { return s.m; }
};

struct Q5_0 {
  using Block = BlockQ5_0;
  static constexpr int kSubs = 1, kShift = 4;
  static constexpr bool kSigned = false, kMin = false;
  using Scales = Q8_0::Scales;
  static void scales(const uint8_t* b, Scales& s) { s.d = f16(b); }
  static __m256i levels(const uint8_t* b, int) {
    return _mm256_or_si256(nibbles(b + 6), fifth_bits(b + 2));
  }
  static __m256 scale(const Scales& s, int) { return _mm256_set1_ps(s.d); }
  static __m256 min(const Scales&, int) { return _mm256_setzero_ps(); }
};

struct Q5_1 {
  using Block = BlockQ5_1;
  static constexpr int kSubs = 1, kShift = 0;
  static constexpr bool kSigned = false, kMin = true;
  using Scales = PairScales;
  static void scales(const uint8_t* b, Scales& s) { pair_scales(b, s); }
  static __m256i levels(const uint8_t* b, int) {
    return _mm256_or_si256(nibbles(b + 8), fifth_bits(b + 4));
  }
  static __m256 scale(const Scales& s, int) { return s.d; }
  static __m256 min(const Scales& s, int) { return s.m; }
};

// q4_k, q5_k: sub-block j's weights are d sc_j level - dmin m_j; d sc_j and dmin m_j are exact.
struct KScales {
  float d[8], m[8];
};
inline void k_scales(const uint8_t* b, KScales& s) {
  const float d = f16(b), dmin = f16(b + 2);
  for (int j = 0; j < 8; ++j) {
    int sc, m;
    scale_min_k4(j, b + 4, sc, m);
    s.d[j] = d * static_cast<float>(sc);
    s.m[j] = -(dmin * static_cast<float>(m));
  }
}

// Sub-blocks 2i and 2i + 1 of a q4_k/q5_k block: the low and high nibbles of qs[32 i ..].
inline __m256i k_nibbles(const uint8_t* qs, int j) {
  const __m256i v = load32(qs + 32 * (j / 2));
  return _mm256_and_si256(j % 2 ? _mm256_srli_epi16(v, 4) : v, bytes(0x0F));
}

struct Q4_K {
  using Block = BlockQ4_K;
  static constexpr int kSubs = 8, kShift = 0;
  static constexpr bool kSigned = false, kMin = true;
  using Scales = KScales;
  static void scales(const uint8_t* b, Scales& s) { k_scales(b, s); }
  static __m256i levels(const uint8_t* b, int j) { return k_nibbles(b + offsetof(Block, qs), j); }
  static __m256 scale(const Scales& s, int j) { return _mm256_set1_ps(s.d[j]); }
  static __m256 min(const Scales& s, int j) { return _mm256_set1_ps(s.m[j]); }
};

struct Q5_K {
  using Block = BlockQ5_K;
  static constexpr int kSubs = 8, kShift = 0;
  static constexpr bool kSigned = false, kMin = true;
  using Scales = KScales;
  static void scales(const uint8_t* b, Scales& s) { k_scales(b, s); }
  // q4_k's nibbles, with the fifth bit of element l in bit j of qh[l].
  static __m256i levels(const uint8_t* b, int j) {
    const __m256i h = bits_to_4(load32(b + offsetof(Block, qh)), j, 0x10);
    return _mm256_or_si256(k_nibbles(b + offsetof(Block, qs), j), h);
  }
  static __m256 scale(const Scales& s, int j) { return _mm256_set1_ps(s.d[j]); }
  static __m256 min(const Scales& s, int j) { return _mm256_set1_ps(s.m[j]); }
};

// q6_k: sub-block j of 32 is group k = j % 4 of half h = j / 4 (simd.h's q6_lanes), with the
// int8 scales of its two halves of 16 elements; weights are d sc (level - 32).
struct Q6_K {
  using Block = BlockQ6_K;
  static constexpr int kSubs = 8, kShift = 5;
  static constexpr bool kSigned = false, kMin = false;
  struct Scales {
    float d[16];
  };
  static void scales(const uint8_t* b, Scales& s) {
    const auto* q = reinterpret_cast<const Block*>(b);
    const float d = f16(q->d);
    for (int i = 0; i < 16; ++i) s.d[i] = d * static_cast<float>(q->scales[i]);
  }
  static __m256i levels(const uint8_t* b, int j) {
    const auto* q = reinterpret_cast<const Block*>(b);
    const int h = j / 4, k = j % 4;
    const __m256i l = load32(q->ql + 64 * h + 32 * (k % 2));
    const __m256i lo = _mm256_and_si256(k < 2 ? l : _mm256_srli_epi16(l, 4), bytes(0x0F));
    return _mm256_or_si256(lo, bits_to_4(load32(q->qh + 32 * h), 2 * k, 0x30));
  }
  static __m256 scale(const Scales& s, int j) {
    return _mm256_set_m128(_mm_set1_ps(s.d[2 * j + 1]), _mm_set1_ps(s.d[2 * j]));
  }
  static __m256 min(const Scales&, int) { return _mm256_setzero_ps(); }
};

// ---- instruction sets: lanes acc + sum of 4 products u x (u unsigned, x signed bytes) ----
// kRows x kToks: the tile of a batch, as many accumulators as the registers hold.

struct Avx2 {
  static constexpr int kRows = 4, kToks = 2;
  static __m256i dot(__m256i acc, __m256i u, __m256i x) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), _mm256_set1_epi16(1)));
  }
};
struct AvxVnni {
  static constexpr int kRows = 4, kToks = 2;
  [[gnu::target("avxvnni")]] static __m256i dot(__m256i acc, __m256i u, __m256i x) {
    return _mm256_dpbusd_avx_epi32(acc, u, x);
  }
};
struct Avx512Vnni {
  static constexpr int kRows = 4, kToks = 4;  // 32 vector registers
  [[gnu::target("avx512vnni,avx512vl")]] static __m256i dot(__m256i acc, __m256i u, __m256i x) {
    return _mm256_dpbusd_epi32(acc, u, x);
  }
};

// ---- kernels ----

// y[t ldy + r] for R rows (w, ld bytes apart) and T tokens (x, nbx blocks apart), nb format
// blocks a row. Per output: acc (8 lanes) = fma(lanes as float, scale lanes * d_x, acc), then
// with kMin acc = fma(min, s_x / 8, acc) (each lane takes an eighth of the min's share), per
// sub-block in order; the result hsum(acc). Every tile shape performs exactly this sequence, so
// the shapes agree to the bit.
template <class F, class I, int R, int T>
[[gnu::always_inline]] inline void tile(const uint8_t* w, size_t ld, const XBlock* x, int64_t nbx,
                                        int64_t nb, float* y, int64_t ldy) {
  const __m256i zero = _mm256_setzero_si256();
  __m256 acc[R][T];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) acc[r][t] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk[R];
    typename F::Scales sc[R];
    for (int r = 0; r < R; ++r) {
      blk[r] = w + r * ld + b * sizeof(typename F::Block);
      F::scales(blk[r], sc[r]);
    }
    for (int j = 0; j < F::kSubs; ++j) {
      __m256i xq[T], base[T];
      __m256 dx[T], sx[T];
      for (int t = 0; t < T; ++t) {
        const XBlock& xb = x[t * nbx + b * F::kSubs + j];
        xq[t] = load32(xb.q);
        dx[t] = _mm256_set1_ps(xb.d);
        sx[t] = _mm256_set1_ps(xb.s8);
        // The offset's share, - 2^kShift * (sum of each lane's x), starts the lanes.
        base[t] = F::kShift ? _mm256_sub_epi32(zero, _mm256_slli_epi32(I::dot(zero, bytes(1), xq[t]),
                                                                        F::kShift))
                            : zero;
      }
      for (int r = 0; r < R; ++r) {
        const __m256i u = F::levels(blk[r], j);
        const __m256 dw = F::scale(sc[r], j), mw = F::min(sc[r], j);
        for (int t = 0; t < T; ++t) {
          __m256i lanes;
          if constexpr (F::kSigned)  // |level| x sign(level) x
            lanes = I::dot(zero, _mm256_sign_epi8(u, u), _mm256_sign_epi8(xq[t], u));
          else
            lanes = I::dot(base[t], u, xq[t]);
          acc[r][t] =
              _mm256_fmadd_ps(_mm256_cvtepi32_ps(lanes), _mm256_mul_ps(dw, dx[t]), acc[r][t]);
          if constexpr (F::kMin) acc[r][t] = _mm256_fmadd_ps(mw, sx[t], acc[r][t]);
        }
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) y[t * ldy + r] = hsum(acc[r][t]);
}

// Tiles of kRows x kToks (each weight block unpacked once for kToks tokens), then the leftover
// rows and tokens.
template <class F, class I>
[[gnu::always_inline]] inline void rows(const Matrix& w, const XBlock* x, float* y, int64_t n_tok,
                                        int64_t r0, int64_t nr) {
  constexpr int R = I::kRows, T = I::kToks;
  const int64_t nbx = w.n_in / QK, nb = w.n_in / (QK * F::kSubs), ldy = w.n_out;
  const size_t ld = w.row_bytes;
  int64_t t = 0;
  for (; t + T <= n_tok; t += T) {
    int64_t r = 0;
    for (; r + R <= nr; r += R)
      tile<F, I, R, T>(w.row(r0 + r), ld, x + t * nbx, nbx, nb, y + t * ldy + r0 + r, ldy);
    for (; r < nr; ++r)
      tile<F, I, 1, T>(w.row(r0 + r), ld, x + t * nbx, nbx, nb, y + t * ldy + r0 + r, ldy);
  }
  for (; t < n_tok; ++t) {
    int64_t r = 0;
    for (; r + R <= nr; r += R)
      tile<F, I, R, 1>(w.row(r0 + r), ld, x + t * nbx, nbx, nb, y + t * ldy + r0 + r, ldy);
    for (; r < nr; ++r)
      tile<F, I, 1, 1>(w.row(r0 + r), ld, x + t * nbx, nbx, nb, y + t * ldy + r0 + r, ldy);
  }
}

template <class I>
[[gnu::always_inline]] inline void rows_of(const Matrix& w, const XBlock* x, float* y,
                                           int64_t n_tok, int64_t r0, int64_t nr) {
  switch (w.type) {
    case DType::Q8_0:
      return rows<Q8_0, I>(w, x, y, n_tok, r0, nr);
    case DType::Q4_0:
      return rows<Q4_0, I>(w, x, y, n_tok, r0, nr);
    case DType::Q4_1:
      return rows<Q4_1, I>(w, x, y, n_tok, r0, nr);
    case DType::Q5_0:
      return rows<Q5_0, I>(w, x, y, n_tok, r0, nr);
    case DType::Q5_1:
      return rows<Q5_1, I>(w, x, y, n_tok, r0, nr);
    case DType::Q4_K:
      return rows<Q4_K, I>(w, x, y, n_tok, r0, nr);
    case DType::Q5_K:
      return rows<Q5_K, I>(w, x, y, n_tok, r0, nr);
    case DType::Q6_K:
      return rows<Q6_K, I>(w, x, y, n_tok, r0, nr);
    default:
      return;
  }
}

// One entry per instruction set, compiled for it (the kernels are inlined into it).
void rows_avx2(const Matrix& w, const XBlock* x, float* y, int64_t n_tok, int64_t r0, int64_t nr) {
  rows_of<Avx2>(w, x, y, n_tok, r0, nr);
}
[[gnu::target("avxvnni"), gnu::flatten]] void rows_avxvnni(const Matrix& w, const XBlock* x,
                                                            float* y, int64_t n_tok, int64_t r0,
                                                            int64_t nr) {
  rows_of<AvxVnni>(w, x, y, n_tok, r0, nr);
}
[[gnu::target("avx512vnni,avx512vl"), gnu::flatten]] void rows_avx512vnni(
    const Matrix& w, const XBlock* x, float* y, int64_t n_tok, int64_t r0, int64_t nr) {
  rows_of<Avx512Vnni>(w, x, y, n_tok, r0, nr);
}

}  // namespace

bool cpu_has(DotIsa isa) {
  switch (isa) {
    case DotIsa::Avx2:
      return true;
    case DotIsa::AvxVnni:
      return __builtin_cpu_supports("avxvnni");
    case DotIsa::Avx512Vnni:
      return __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl");
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
    case DType::Q4_K:
    case DType::Q5_K:
    case DType::Q6_K:
      return true;
    default:
      return false;
  }
}

void quantize_x(const float* x, int64_t n_tok, int64_t n, XBlock* xq) {
  KVS_CHECK(n % QK == 0, "quantize_x: ", n, " activations is not a whole number of blocks of 32");
  const int64_t nb = n / QK;
  thread_pool().parallel_for(n_tok * nb, 256, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) quantize_block(x + i * QK, xq[i]);
  });
}

void int_matmul_rows(const Matrix& w, const XBlock* xq, float* y, int64_t n_tok, int64_t r0,
                     int64_t nr, DotIsa isa) {
  switch (isa) {
    case DotIsa::Avx2:
      return rows_avx2(w, xq, y, n_tok, r0, nr);
    case DotIsa::AvxVnni:
      return rows_avxvnni(w, xq, y, n_tok, r0, nr);
    case DotIsa::Avx512Vnni:
      return rows_avx512vnni(w, xq, y, n_tok, r0, nr);
  }
}

}  // namespace kvs::cpu
