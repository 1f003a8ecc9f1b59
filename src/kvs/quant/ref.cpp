// Scalar reference dequantizers and quantizers (see ref.h). The products are written as separate
// statements where ggml/gguf-py round twice (d * q, then + m), so no compiler fuses them.
#include "kvs/quant/ref.h"

#include <algorithm>
#include <cfloat>
#include <cmath>

#include "kvs/quant/blocks.h"

namespace kvs {
namespace {

using namespace quant;

float fq(int q) {
  return static_cast<float>(q);
}

// ---- dequantize ----

void deq_q4_0(const BlockQ4_0* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += QK) {
    const float d = load_f16(b[i].d);
    for (int j = 0; j < QK / 2; ++j) {
      y[j] = d * fq((b[i].qs[j] & 0xF) - 8);
      y[j + QK / 2] = d * fq((b[i].qs[j] >> 4) - 8);
    }
  }
}

void deq_q4_1(const BlockQ4_1* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += QK) {
    const float d = load_f16(b[i].d), m = load_f16(b[i].m);
    for (int j = 0; j < QK / 2; ++j) {
      const float lo = d * fq(b[i].qs[j] & 0xF), hi = d * fq(b[i].qs[j] >> 4);
      y[j] = lo + m;
      y[j + QK / 2] = hi + m;
    }
  }
}

void deq_q5_0(const BlockQ5_0* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += QK) {
    const float d = load_f16(b[i].d);
    uint32_t qh;
    std::memcpy(&qh, b[i].qh, 4);
    for (int j = 0; j < QK / 2; ++j) {
      const int h0 = ((qh >> j) << 4) & 0x10, h1 = (qh >> (j + 12)) & 0x10;
      y[j] = d * fq(((b[i].qs[j] & 0xF) | h0) - 16);
      y[j + QK / 2] = d * fq(((b[i].qs[j] >> 4) | h1) - 16);
    }
  }
}

void deq_q5_1(const BlockQ5_1* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += QK) {
    const float d = load_f16(b[i].d), m = load_f16(b[i].m);
    uint32_t qh;
    std::memcpy(&qh, b[i].qh, 4);
    for (int j = 0; j < QK / 2; ++j) {
      const int h0 = ((qh >> j) << 4) & 0x10, h1 = (qh >> (j + 12)) & 0x10;
      const float lo = d * fq((b[i].qs[j] & 0xF) | h0), hi = d * fq((b[i].qs[j] >> 4) | h1);
      y[j] = lo + m;
      y[j + QK / 2] = hi + m;
    }
  }
}

void deq_q8_0(const BlockQ8_0* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += QK) {
    const float d = load_f16(b[i].d);
    for (int j = 0; j < QK; ++j) y[j] = d * fq(b[i].qs[j]);
  }
}

void deq_q4_k(const BlockQ4_K* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = load_f16(b[i].d), dmin = load_f16(b[i].dmin);
    const uint8_t* q = b[i].qs;
    for (int s = 0; s < 8; s += 2, q += 32, y += 64) {
      int sc0, m0, sc1, m1;
      scale_min_k4(s, b[i].scales, sc0, m0);
      scale_min_k4(s + 1, b[i].scales, sc1, m1);
      const float d0 = d * fq(sc0), dm0 = dmin * fq(m0);
      const float d1 = d * fq(sc1), dm1 = dmin * fq(m1);
      for (int l = 0; l < 32; ++l) {
        const float lo = d0 * fq(q[l] & 0xF), hi = d1 * fq(q[l] >> 4);
        y[l] = lo - dm0;
        y[l + 32] = hi - dm1;
      }
    }
  }
}

void deq_q5_k(const BlockQ5_K* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = load_f16(b[i].d), dmin = load_f16(b[i].dmin);
    const uint8_t* q = b[i].qs;
    for (int s = 0; s < 8; s += 2, q += 32, y += 64) {
      int sc0, m0, sc1, m1;
      scale_min_k4(s, b[i].scales, sc0, m0);
      scale_min_k4(s + 1, b[i].scales, sc1, m1);
      const float d0 = d * fq(sc0), dm0 = dmin * fq(m0);
      const float d1 = d * fq(sc1), dm1 = dmin * fq(m1);
      for (int l = 0; l < 32; ++l) {
        const int h0 = ((b[i].qh[l] >> s) & 1) << 4, h1 = ((b[i].qh[l] >> (s + 1)) & 1) << 4;
        const float lo = d0 * fq((q[l] & 0xF) | h0), hi = d1 * fq((q[l] >> 4) | h1);
        y[l] = lo - dm0;
        y[l + 32] = hi - dm1;
      }
    }
  }
}

void deq_q6_k(const BlockQ6_K* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = load_f16(b[i].d);
    // Two halves of 128: element l + 32k of a half takes 4 bits from ql and bits 2k, 2k+1 of qh[l].
    for (int h = 0; h < 2; ++h, y += 128) {
      const uint8_t* ql = b[i].ql + 64 * h;
      const uint8_t* qh = b[i].qh + 32 * h;
      const int8_t* sc = b[i].scales + 8 * h;
      for (int l = 0; l < 32; ++l) {
        const int q0 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q1 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q2 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q3 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        const int is = l / 16;
        const float d0 = d * fq(sc[is]), d1 = d * fq(sc[is + 2]);
        const float d2 = d * fq(sc[is + 4]), d3 = d * fq(sc[is + 6]);
        y[l] = d0 * fq(q0);
        y[l + 32] = d1 * fq(q1);
        y[l + 64] = d2 * fq(q2);
        y[l + 96] = d3 * fq(q3);
      }
    }
  }
}

void deq_q2_k(const BlockQ2_K* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = load_f16(b[i].d), dmin = load_f16(b[i].dmin);
    for (int e = 0; e < QK_K; ++e) {
      const int h = e / 128, k = (e % 128) / 32, l = e % 32;
      const uint8_t sc = b[i].scales[e / 16];
      const float dl = d * fq(sc & 0xF), ml = dmin * fq(sc >> 4);
      const float v = dl * fq((b[i].qs[32 * h + l] >> (2 * k)) & 3);
      y[e] = v - ml;
    }
    y += QK_K;
  }
}

void deq_q3_k(const BlockQ3_K* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = load_f16(b[i].d);
    for (int e = 0; e < QK_K; ++e) {
      const int h = e / 128, k = (e % 128) / 32, l = e % 32;
      const int lo = (b[i].qs[32 * h + l] >> (2 * k)) & 3;
      const int hi = (b[i].hmask[l] >> (4 * h + k)) & 1;
      const float dl = d * fq(scale_q3_k(e / 16, b[i].scales));
      y[e] = dl * fq(lo - (hi ? 0 : 4));
    }
    y += QK_K;
  }
}

// 32 iq4_nl elements (nibbles packed as in q4_0) with scale d.
void deq_iq4(const uint8_t* qs, float d, float* y) {
  for (int j = 0; j < QK / 2; ++j) {
    y[j] = d * fq(kIq4nlValues[qs[j] & 0xF]);
    y[j + QK / 2] = d * fq(kIq4nlValues[qs[j] >> 4]);
  }
}

void deq_iq4_nl(const BlockIQ4_NL* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += QK) deq_iq4(b[i].qs, load_f16(b[i].d), y);
}

void deq_iq4_xs(const BlockIQ4_XS* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = load_f16(b[i].d);
    for (int j = 0; j < QK_K / QK; ++j, y += QK) {
      deq_iq4(b[i].qs + 16 * j, d * fq(scale_iq4_xs(j, b[i])), y);
    }
  }
}

// ---- quantize: ggml's quantize_row_*_ref for the 32-blocks ----

// The element of largest magnitude, with its sign; the first one on ties.
float signed_absmax(const float* x, int n) {
  float amax = 0.0f, max = 0.0f;
  for (int j = 0; j < n; ++j) {
    if (amax < std::fabs(x[j])) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  return max;
}

void minmax(const float* x, int n, float& mn, float& mx) {
  mn = FLT_MAX;
  mx = -FLT_MAX;
  for (int j = 0; j < n; ++j) {
    mn = std::min(mn, x[j]);
    mx = std::max(mx, x[j]);
  }
}

void q_q4_0(const float* x, BlockQ4_0* b, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += QK) {
    const float d = signed_absmax(x, QK) / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    store_f16(b[i].d, d);
    for (int j = 0; j < QK / 2; ++j) {
      const float x0 = x[j] * id, x1 = x[j + QK / 2] * id;
      const int q0 = std::min(15, static_cast<int>(static_cast<int8_t>(x0 + 8.5f)));
      const int q1 = std::min(15, static_cast<int>(static_cast<int8_t>(x1 + 8.5f)));
      b[i].qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
  }
}

void q_q4_1(const float* x, BlockQ4_1* b, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += QK) {
    float mn, mx;
    minmax(x, QK, mn, mx);
    const float d = (mx - mn) / 15.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    store_f16(b[i].d, d);
    store_f16(b[i].m, mn);
    for (int j = 0; j < QK / 2; ++j) {
      const float x0 = (x[j] - mn) * id, x1 = (x[j + QK / 2] - mn) * id;
      const int q0 = std::min(15, static_cast<int>(static_cast<int8_t>(x0 + 0.5f)));
      const int q1 = std::min(15, static_cast<int>(static_cast<int8_t>(x1 + 0.5f)));
      b[i].qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
  }
}

// q5_0/q5_1 share the packing of 5-bit values into qs/qh.
void pack_q5(const int* q, uint8_t* qs, uint8_t* qhp) {
  uint32_t qh = 0;
  for (int j = 0; j < QK / 2; ++j) {
    qs[j] = static_cast<uint8_t>((q[j] & 0xF) | ((q[j + QK / 2] & 0xF) << 4));
    qh |= static_cast<uint32_t>((q[j] >> 4) & 1) << j;
    qh |= static_cast<uint32_t>((q[j + QK / 2] >> 4) & 1) << (j + QK / 2);
  }
  std::memcpy(qhp, &qh, 4);
}

void q_q5_0(const float* x, BlockQ5_0* b, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += QK) {
    const float d = signed_absmax(x, QK) / -16.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    store_f16(b[i].d, d);
    int q[QK];
    for (int j = 0; j < QK; ++j) {
      q[j] = std::min(31, static_cast<int>(static_cast<int8_t>(x[j] * id + 16.5f)));
    }
    pack_q5(q, b[i].qs, b[i].qh);
  }
}

void q_q5_1(const float* x, BlockQ5_1* b, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += QK) {
    float mn, mx;
    minmax(x, QK, mn, mx);
    const float d = (mx - mn) / 31.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    store_f16(b[i].d, d);
    store_f16(b[i].m, mn);
    int q[QK];
    for (int j = 0; j < QK; ++j) {
      const float v = (x[j] - mn) * id;
      q[j] = std::min(31, static_cast<int>(static_cast<uint8_t>(v + 0.5f)));
    }
    pack_q5(q, b[i].qs, b[i].qh);
  }
}

void q_q8_0(const float* x, BlockQ8_0* b, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += QK) {
    float amax = 0.0f;
    for (int j = 0; j < QK; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    store_f16(b[i].d, d);
    for (int j = 0; j < QK; ++j) b[i].qs[j] = static_cast<int8_t>(std::round(x[j] * id));
  }
}

// ---- quantize: k-quants ----
// Simpler than ggml's (no search for the best scale per sub-block): each sub-block takes the
// scale that spans its range; sub-block scales are rounded up to the 6/8-bit grid so that no
// element clips. Valid blocks, slightly larger error than llama-quantize.

int nearest(float v) {
  return static_cast<int>(std::lround(v));
}
int round_up(float v, int hi) {
  return std::min(hi, static_cast<int>(std::ceil(v)));
}

// Sub-block scales/mins of q4_k/q5_k (nmax = 15 or 31); writes d, dmin, scales and L (levels).
void k_quant_scales(const float* x, int nmax, uint8_t* dp, uint8_t* dminp, uint8_t* packed,
                    int* L) {
  float scale[8], min[8], max_scale = 0.0f, max_min = 0.0f;
  for (int s = 0; s < 8; ++s) {
    float mn, mx;
    minmax(x + 32 * s, 32, mn, mx);
    mn = std::min(mn, 0.0f);  // as ggml: the offset only ever lowers, so mins are >= 0
    scale[s] = (mx - mn) / static_cast<float>(nmax);
    min[s] = -mn;
    max_scale = std::max(max_scale, scale[s]);
    max_min = std::max(max_min, min[s]);
  }
  store_f16(dp, max_scale / 63.0f);
  store_f16(dminp, max_min / 63.0f);
  const float d = load_f16(dp), dmin = load_f16(dminp);
  int ls[8], lm[8];
  for (int s = 0; s < 8; ++s) {
    ls[s] = d > 0.0f ? round_up(scale[s] / d, 63) : 0;
    lm[s] = dmin > 0.0f ? std::min(63, nearest(min[s] / dmin)) : 0;
  }
  std::memset(packed, 0, 12);
  for (int s = 0; s < 8; ++s) {
    if (s < 4) {
      packed[s] = static_cast<uint8_t>(ls[s]);
      packed[s + 4] = static_cast<uint8_t>(lm[s]);
    } else {
      packed[s + 4] = static_cast<uint8_t>((ls[s] & 0xF) | ((lm[s] & 0xF) << 4));
      packed[s - 4] |= static_cast<uint8_t>((ls[s] >> 4) << 6);
      packed[s] |= static_cast<uint8_t>((lm[s] >> 4) << 6);
    }
  }
  for (int s = 0; s < 8; ++s) {
    int sc, m;
    scale_min_k4(s, packed, sc, m);
    const float ds = d * fq(sc), dm = dmin * fq(m);
    for (int l = 0; l < 32; ++l) {
      const int q = ds > 0.0f ? nearest((x[32 * s + l] + dm) / ds) : 0;
      L[32 * s + l] = std::clamp(q, 0, nmax);
    }
  }
}

void q_q4_k(const float* x, BlockQ4_K* b, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += QK_K) {
    int L[QK_K];
    k_quant_scales(x, 15, b[i].d, b[i].dmin, b[i].scales, L);
    for (int j = 0; j < QK_K / 64; ++j) {
      for (int l = 0; l < 32; ++l) {
        b[i].qs[32 * j + l] = static_cast<uint8_t>(L[64 * j + l] | (L[64 * j + l + 32] << 4));
      }
    }
  }
}

void q_q5_k(const float* x, BlockQ5_K* b, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += QK_K) {
    int L[QK_K];
    k_quant_scales(x, 31, b[i].d, b[i].dmin, b[i].scales, L);
    std::memset(b[i].qh, 0, sizeof b[i].qh);
    for (int j = 0; j < QK_K / 64; ++j) {
      for (int l = 0; l < 32; ++l) {
        const int lo = L[64 * j + l], hi = L[64 * j + l + 32];
        b[i].qs[32 * j + l] = static_cast<uint8_t>((lo & 0xF) | ((hi & 0xF) << 4));
        b[i].qh[l] |= static_cast<uint8_t>(((lo >> 4) << (2 * j)) | ((hi >> 4) << (2 * j + 1)));
      }
    }
  }
}

// Symmetric scales of a super-block's 16 sub-blocks of 16 (q6_k, q3_k): a sub-block's
// largest magnitude maps to `top`; the super-block's scale, stored as f16 at `d16`, puts the
// largest sub-block scale at `lmax`. Returns that scale as stored.
float symmetric_scales(const float* x, float top, float lmax, uint8_t* d16, float scale[16]) {
  float max_scale = 0.0f;
  for (int s = 0; s < 16; ++s) {
    scale[s] = std::fabs(signed_absmax(x + 16 * s, 16)) / top;
    max_scale = std::max(max_scale, scale[s]);
  }
  store_f16(d16, max_scale / lmax);
  return load_f16(d16);
}

void q_q6_k(const float* x, BlockQ6_K* b, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += QK_K) {
    // amax maps to 31.5, so levels -32..31 cover +-amax.
    float scale[16];
    const float d = symmetric_scales(x, 31.5f, 127.0f, b[i].d, scale);
    int L[QK_K];
    for (int s = 0; s < 16; ++s) {
      const int ls = d > 0.0f ? round_up(scale[s] / d, 127) : 0;
      b[i].scales[s] = static_cast<int8_t>(ls);
      const float ds = d * fq(ls);
      for (int l = 0; l < 16; ++l) {
        const int q = ds > 0.0f ? nearest(x[16 * s + l] / ds) : 0;
        L[16 * s + l] = std::clamp(q, -32, 31) + 32;
      }
    }
    for (int h = 0; h < 2; ++h) {
      uint8_t* ql = b[i].ql + 64 * h;
      uint8_t* qh = b[i].qh + 32 * h;
      const int* Lh = L + 128 * h;
      for (int l = 0; l < 32; ++l) {
        ql[l] = static_cast<uint8_t>((Lh[l] & 0xF) | ((Lh[l + 64] & 0xF) << 4));
        ql[l + 32] = static_cast<uint8_t>((Lh[l + 32] & 0xF) | ((Lh[l + 96] & 0xF) << 4));
        qh[l] = static_cast<uint8_t>((Lh[l] >> 4) | ((Lh[l + 32] >> 4) << 2) |
                                     ((Lh[l + 64] >> 4) << 4) | ((Lh[l + 96] >> 4) << 6));
      }
    }
  }
}

// q2_k: like q4_k with 16 sub-blocks of 16, 2-bit levels and 4-bit scales and mins.
void q_q2_k(const float* x, BlockQ2_K* b, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += QK_K) {
    float scale[16], min[16], max_scale = 0.0f, max_min = 0.0f;
    for (int s = 0; s < 16; ++s) {
      float mn, mx;
      minmax(x + 16 * s, 16, mn, mx);
      mn = std::min(mn, 0.0f);
      scale[s] = (mx - mn) / 3.0f;
      min[s] = -mn;
      max_scale = std::max(max_scale, scale[s]);
      max_min = std::max(max_min, min[s]);
    }
    store_f16(b[i].d, max_scale / 15.0f);
    store_f16(b[i].dmin, max_min / 15.0f);
    const float d = load_f16(b[i].d), dmin = load_f16(b[i].dmin);
    int L[QK_K];
    for (int s = 0; s < 16; ++s) {
      const int ls = d > 0.0f ? round_up(scale[s] / d, 15) : 0;
      const int lm = dmin > 0.0f ? std::min(15, nearest(min[s] / dmin)) : 0;
      b[i].scales[s] = static_cast<uint8_t>(ls | (lm << 4));
      const float ds = d * fq(ls), dm = dmin * fq(lm);
      for (int l = 0; l < 16; ++l) {
        const int q = ds > 0.0f ? nearest((x[16 * s + l] + dm) / ds) : 0;
        L[16 * s + l] = std::clamp(q, 0, 3);
      }
    }
    std::memset(b[i].qs, 0, sizeof b[i].qs);
    for (int e = 0; e < QK_K; ++e) {
      const int h = e / 128, k = (e % 128) / 32, l = e % 32;
      b[i].qs[32 * h + l] |= static_cast<uint8_t>(L[e] << (2 * k));
    }
  }
}

// q3_k: like q6_k, symmetric sub-block scales (amax maps to 3.5, levels -4..3), kept >= 0.
void q_q3_k(const float* x, BlockQ3_K* b, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += QK_K) {
    float scale[16];
    const float d = symmetric_scales(x, 3.5f, 31.0f, b[i].d, scale);
    std::memset(b[i].scales, 0, sizeof b[i].scales);
    int L[QK_K];
    for (int s = 0; s < 16; ++s) {
      const int ls = d > 0.0f ? round_up(scale[s] / d, 31) : 0;
      const int v = ls + 32;
      b[i].scales[s % 8] |= static_cast<uint8_t>((v & 0xF) << (4 * (s / 8)));
      b[i].scales[8 + s % 4] |= static_cast<uint8_t>((v >> 4) << (2 * (s / 4)));
      const float ds = d * fq(ls);
      for (int l = 0; l < 16; ++l) {
        const int q = ds > 0.0f ? nearest(x[16 * s + l] / ds) : 0;
        L[16 * s + l] = std::clamp(q, -4, 3) + 4;
      }
    }
    std::memset(b[i].qs, 0, sizeof b[i].qs);
    std::memset(b[i].hmask, 0, sizeof b[i].hmask);
    for (int e = 0; e < QK_K; ++e) {
      const int h = e / 128, k = (e % 128) / 32, l = e % 32;
      b[i].qs[32 * h + l] |= static_cast<uint8_t>((L[e] & 3) << (2 * k));
      b[i].hmask[l] |= static_cast<uint8_t>((L[e] >> 2) << (4 * h + k));
    }
  }
}

// Index of the iq4_nl level nearest v, the lower one on a tie: the number of midpoints between
// adjacent levels below v (the levels increase; 2v and the sums are exact). Counted without
// branches, which a search would mispredict on every element.
int nearest_iq4(float v) {
  const float v2 = 2.0f * v;
  int n = 0;
  for (int j = 0; j < 15; ++j) n += v2 > fq(kIq4nlValues[j] + kIq4nlValues[j + 1]) ? 1 : 0;
  return n;
}

// Levels of 32 elements for scale d (none for d = 0), packed as in q4_0.
void pack_iq4(const float* x, float d, uint8_t* qs) {
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  for (int j = 0; j < QK / 2; ++j) {
    qs[j] = static_cast<uint8_t>(nearest_iq4(x[j] * id) | (nearest_iq4(x[j + QK / 2] * id) << 4));
  }
}

// The scale of a 32-block of iq4 levels: the element of largest magnitude on level -127, then
// the least-squares scale for the levels that gives (simpler than ggml's search over scales).
float iq4_scale(const float* x) {
  const float d0 = signed_absmax(x, QK) / fq(kIq4nlValues[0]);
  if (d0 == 0.0f) return 0.0f;
  uint8_t qs[QK / 2];
  pack_iq4(x, d0, qs);
  float sumqx = 0.0f, sumq2 = 0.0f;
  for (int j = 0; j < QK; ++j) {
    const float q = fq(kIq4nlValues[j < QK / 2 ? qs[j] & 0xF : qs[j - QK / 2] >> 4]);
    sumqx += q * x[j];
    sumq2 += q * q;
  }
  return sumqx / sumq2;
}

void q_iq4_nl(const float* x, BlockIQ4_NL* b, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += QK) {
    store_f16(b[i].d, iq4_scale(x));
    pack_iq4(x, load_f16(b[i].d), b[i].qs);
  }
}

// iq4_xs: iq4_nl scales per sub-block, on a 6-bit grid whose -32 is the largest of them.
void q_iq4_xs(const float* x, BlockIQ4_XS* b, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += QK_K) {
    float scale[8], max_scale = 0.0f;
    for (int j = 0; j < 8; ++j) {
      scale[j] = iq4_scale(x + QK * j);
      if (std::fabs(scale[j]) > std::fabs(max_scale)) max_scale = scale[j];
    }
    store_f16(b[i].d, max_scale / -32.0f);
    const float d = load_f16(b[i].d);
    uint32_t sh = 0;
    std::memset(b[i].scales_l, 0, sizeof b[i].scales_l);
    for (int j = 0; j < 8; ++j) {
      const int ls = d != 0.0f ? std::clamp(nearest(scale[j] / d), -32, 31) : 0;
      const int v = ls + 32;
      b[i].scales_l[j / 2] |= static_cast<uint8_t>((v & 0xF) << (4 * (j % 2)));
      sh |= static_cast<uint32_t>(v >> 4) << (2 * j);
      pack_iq4(x + QK * j, d * fq(ls), b[i].qs + 16 * j);
    }
    b[i].scales_h[0] = static_cast<uint8_t>(sh);
    b[i].scales_h[1] = static_cast<uint8_t>(sh >> 8);
  }
}

}  // namespace

void dequantize_row_ref(DType t, const void* x, float* y, int64_t n) {
  const int64_t nb = check_blocks("dequantize_row", t, n);
  switch (t) {
    case DType::F32:
      std::memcpy(y, x, static_cast<size_t>(n) * 4);
      return;
    case DType::F16:
    case DType::BF16: {
      const uint8_t* p = static_cast<const uint8_t*>(x);
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        y[i] = t == DType::F16 ? f16_to_f32(h) : bf16_to_f32(h);
      }
      return;
    }
    case DType::Q4_0:
      return deq_q4_0(static_cast<const BlockQ4_0*>(x), y, nb);
    case DType::Q4_1:
      return deq_q4_1(static_cast<const BlockQ4_1*>(x), y, nb);
    case DType::Q5_0:
      return deq_q5_0(static_cast<const BlockQ5_0*>(x), y, nb);
    case DType::Q5_1:
      return deq_q5_1(static_cast<const BlockQ5_1*>(x), y, nb);
    case DType::Q8_0:
      return deq_q8_0(static_cast<const BlockQ8_0*>(x), y, nb);
    case DType::Q4_K:
      return deq_q4_k(static_cast<const BlockQ4_K*>(x), y, nb);
    case DType::Q5_K:
      return deq_q5_k(static_cast<const BlockQ5_K*>(x), y, nb);
    case DType::Q6_K:
      return deq_q6_k(static_cast<const BlockQ6_K*>(x), y, nb);
    case DType::Q2_K:
      return deq_q2_k(static_cast<const BlockQ2_K*>(x), y, nb);
    case DType::Q3_K:
      return deq_q3_k(static_cast<const BlockQ3_K*>(x), y, nb);
    case DType::IQ4_NL:
      return deq_iq4_nl(static_cast<const BlockIQ4_NL*>(x), y, nb);
    case DType::IQ4_XS:
      return deq_iq4_xs(static_cast<const BlockIQ4_XS*>(x), y, nb);
    default:
      unsupported("dequantize_row", t);
  }
}

void quantize_row_ref(DType t, const float* x, void* y, int64_t n) {
  const int64_t nb = check_blocks("quantize_row", t, n);
  switch (t) {
    case DType::F32:
      std::memcpy(y, x, static_cast<size_t>(n) * 4);
      return;
    case DType::F16:
    case DType::BF16: {
      uint8_t* p = static_cast<uint8_t*>(y);
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = t == DType::F16 ? f32_to_f16(x[i]) : f32_to_bf16(x[i]);
        std::memcpy(p + 2 * i, &h, 2);
      }
      return;
    }
    case DType::Q4_0:
      return q_q4_0(x, static_cast<BlockQ4_0*>(y), nb);
    case DType::Q4_1:
      return q_q4_1(x, static_cast<BlockQ4_1*>(y), nb);
    case DType::Q5_0:
      return q_q5_0(x, static_cast<BlockQ5_0*>(y), nb);
    case DType::Q5_1:
      return q_q5_1(x, static_cast<BlockQ5_1*>(y), nb);
    case DType::Q8_0:
      return q_q8_0(x, static_cast<BlockQ8_0*>(y), nb);
    case DType::Q4_K:
      return q_q4_k(x, static_cast<BlockQ4_K*>(y), nb);
    case DType::Q5_K:
      return q_q5_k(x, static_cast<BlockQ5_K*>(y), nb);
    case DType::Q6_K:
      return q_q6_k(x, static_cast<BlockQ6_K*>(y), nb);
    case DType::Q2_K:
      return q_q2_k(x, static_cast<BlockQ2_K*>(y), nb);
    case DType::Q3_K:
      return q_q3_k(x, static_cast<BlockQ3_K*>(y), nb);
    case DType::IQ4_NL:
      return q_iq4_nl(x, static_cast<BlockIQ4_NL*>(y), nb);
    case DType::IQ4_XS:
      return q_iq4_xs(x, static_cast<BlockIQ4_XS*>(y), nb);
    default:
      unsupported("quantize_row", t);
  }
}

}  // namespace kvs
