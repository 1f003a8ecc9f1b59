// The iq4 levels of the integer matrix-vector kernel (matmul.cu): a look-up of 8 codes in the
// 16-entry table by four byte permutes, for __dp4a with x's words put in the codes' order.
#pragma once

#include <cstdint>

namespace kvs::cuda {

// prmt's generic mode: byte k of the result is byte s[4k+2:4k] of {b, a}, or, where bit 4k + 3
// of s is set, that byte's sign bit copied to all 8 bits (only s's low 16 bits are read).
__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t s) {
  uint32_t r;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(s));
  return r;
}

// The first words of iq4_split's two tables, loaded once per chunk: a permute takes only its
// second word as an immediate, and a constant first word the compiler would move into a
// register before every permute instead of keeping it in one. One per translation unit.
static __device__ uint32_t g_iq4_first[2] = {0xBFAD9881u, 0x271A0E02u};

// The iq4 levels (ggml's kvalues_iq4nl) of the 8 codes of q, each as the sum of two bytes from
// one permute each, without masks: n holds the level of a code below 8 (the table's negative
// half) and -1 for the others (the sign of a negative level); p, from the codes with bit 3
// flipped, the level + 1 of a code of 8 or more (the positive half, each level plus one) and 0
// for the others (the sign of a positive byte). The codes of q's low half word give n[0] and
// p[0], of its high one n[1] and p[1]: __dp4a(n, x) + __dp4a(p, x) is the levels' dot product
// with x, one more __dp4a and no select per 4 weights (t0, t1: g_iq4_first).
__device__ __forceinline__ void iq4_split(uint32_t q, uint32_t t0, uint32_t t1, int (&n)[2],
                                          int (&p)[2]) {
  const uint32_t f = q ^ 0x88888888u;
  n[0] = static_cast<int>(prmt(t0, 0xF6EADDCFu, q));
  p[0] = static_cast<int>(prmt(t1, 0x725A4636u, f));
  n[1] = static_cast<int>(prmt(t0, 0xF6EADDCFu, q >> 16));
  p[1] = static_cast<int>(prmt(t1, 0x725A4636u, f >> 16));
}

// x's words in the order of the iq4 codes: quant word w holds element 4w + j in the low nibble
// of byte j and 16 + 4w + j in the high one, so its low half word holds elements 4w, 16 + 4w,
// 4w + 1, 17 + 4w (p[2w]) and its high one the next two (p[2w + 1]).
__device__ __forceinline__ void iq4_order(const int (&x)[8], int (&p)[8]) {
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    p[2 * w] = static_cast<int>(__byte_perm(x[w], x[w + 4], 0x5140));
    p[2 * w + 1] = static_cast<int>(__byte_perm(x[w], x[w + 4], 0x7362));
  }
}

}  // namespace kvs::cuda
