// Attention of the query heads of one kv head over the rows of one span, on the CPU at the
// speed of memory: the partial (max, sum, unnormalised output; host_attention.h's rows) of each
// head, which the drivers merge in logical span order (attention.cpp, behind host_attention.h,
// for the CPU backend, host mode and split attention, which hands them to the GPU's fold).
// Each K row is read once for all heads of the group: quantized keys (q8_0, q4_0) by integer
// dot products with the query as 16-bit levels (vpdpwssd where the CPU has AVX-VNNI or AVX-512
// VNNI, vpmaddwd otherwise), f16 keys by f32 products; a V row is dequantized once and
// accumulated into every head's output.
//
// The arithmetic of a partial depends only on the query, the keys and the rows' values: not on
// the instruction set (integer sums are exact, the float operations the same on every path),
// not on where the span starts in a page or which thread computes it.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kvs/backend/cpu/host_attention.h"
#include "kvs/backend/cpu/isa.h"
#include "kvs/quant/types.h"

namespace kvs::cpu {

// One token's query heads prepared for the kernels. For quantized keys every block of 32 of a
// head is held as int16 levels with a step of its own (q ~ step q16, |q16| <= 32767): the CUDA
// matmul's two int8 planes h + l / 254 are such levels (254 h + l, on a grid of the block's
// max / 32258), a little coarser. A key's score is then per block an exact integer sum of
// level products times the two steps: the scores are within about 3e-5 of |q| |k| scale,
// closer than an f16 rounding of q would leave them.
struct Query {
  const float* q = nullptr;         // [n_head][d]
  const int16_t* q16 = nullptr;     // [n_head][d]
  const float* step = nullptr;      // [n_head][query_blocks(d)]: the steps of q16's blocks
  const int32_t* offset = nullptr;  // q4_0 keys: [n_head][d / 32][8], where the block sums start
};
// Blocks of a head's steps in Query::step, rounded up to 8 for the kernels' vector loads.
constexpr int32_t query_blocks(int32_t d) {
  return (d / 32 + 7) / 8 * 8;
}
// Fills q16, step and (q4_0 keys) offset for n_head heads of q; nothing for f16 keys, which
// take q itself. A q4_0 key's nibbles are its levels + 8: a block's sum starts from -8 x the
// sum of q16 over each lane's elements.
void prepare_query(DType k_type, const float* q, int32_t n_head, int32_t d, int16_t* q16,
                   float* step, int32_t* offset);

// Rows [0, n) of one kv head in a span: its K and V slices in the cache's formats (kv_page.h).
struct HeadRows {
  const uint8_t* k = nullptr;  // the first row's K slice; rows k_row bytes apart
  const uint8_t* v = nullptr;  // the first row's V slice (v_head bytes); rows v_row bytes apart
  size_t k_row = 0, v_row = 0, v_head = 0;
  int32_t n = 0;
  int32_t more = 0;  // rows after these that the same head reads next (prefetched ahead)
};

// The kernels of one layout and group size on one instruction set, chosen once per call.
struct SpanKernels {
  // p[j * score_slots(group) + g] = score of query head h0 + g against key j < r.n; p has
  // score_floats(r.n, group) floats.
  using Scores = void (*)(const Query& q, int32_t h0, float scale, int32_t d, const HeadRows& r,
                          float* p);
  // out[g][i] += sum over rows j < n of p[j * score_slots(group) + g] x row j's value i, for
  // the group's heads (out: rows of part_stride(d)). The rows' levels (a quantized value's
  // level, or an f16 value) come from tile ([n][d] f32, v_levels') or, where it is null, from
  // the rows; the block scales from the rows.
  using Values = void (*)(const float* p, int32_t n, const uint8_t* v, size_t v_row,
                          const float* tile, int32_t d, int32_t group, float* scratch, float* out);
  // The levels of V rows [0, n) as f32 [n][d].
  using VLevels = void (*)(const uint8_t* v, size_t v_row, int32_t n, int32_t d, float* out);
  Scores scores = nullptr;
  Values values = nullptr;
  VLevels v_levels = nullptr;
  int32_t group = 0, d = 0;
  float scale = 1.0f;  // of the scores (AttentionArgs::scale)
};
SpanKernels span_kernels(DType k_type, DType v_type, int32_t group, int32_t d, float scale,
                         Isa isa);

// Floats of scratch span_partials needs for up to n rows; span_values for any.
size_t span_scratch(const SpanKernels& ks, int32_t n);
size_t value_scratch(const SpanKernels& ks);
// The partials of the group's heads, those of query heads h0 .. h0 + group of q, over r:
// out + g * part_stride(d). levels: the V rows' levels (v_levels, made once for several
// queries), or null to read them from the rows; either gives the same bits.
void span_partials(const SpanKernels& ks, const Query& q, int32_t h0, const HeadRows& r,
                   const float* levels, float* scratch, float* out);

// span_partials in its three steps, for a caller that reads the kv heads of a span together
// (a piece of rows of each in turn, so that the page is read in order): the scores of r's rows
// (at p + j * score_slots(group) for row j); over all n (>= 1) of them the softmax and the
// partials' heads, the outputs zeroed; the values of r's rows (p at r's first row) added to
// the outputs. Pieces of any size give the bits of one call.
void span_scores(const SpanKernels& ks, const Query& q, int32_t h0, const HeadRows& r, float* p);
void span_softmax(const SpanKernels& ks, int32_t n, float* p, float* out);
void span_values(const SpanKernels& ks, const float* p, const HeadRows& r, const float* levels,
                 float* scratch, float* out);

// A tile of prefill's queries (span_tile.cpp), f16 keys: the partials of `lanes` queries (the
// lanes of a vector: tile_lanes) for one head over rows [0, n[l]) of a span, each lane the bits
// span_partials gives its query alone over those rows.
struct TileArgs {
  const float* qt = nullptr;      // the lanes' queries of the head, transposed: [d][lanes]
  const int32_t* n = nullptr;     // [lanes]: each lane's keys, from row 0 (0: no query)
  int32_t rows = 0;               // the largest n
  const float* k = nullptr;       // K rows [rows][d] in f32
  const float* levels = nullptr;  // V rows' levels [rows][d] (SpanKernels::v_levels)
  const uint8_t* v = nullptr;     // V rows (their block scales, where quantized), v_row apart
  size_t v_row = 0;
  DType v_type = DType::F16;
  int32_t d = 0, slots = 1, lanes = 8;  // slots: score_slots(group)
  float scale = 1.0f;
  float* scratch = nullptr;  // tile_scratch floats
  float* out = nullptr;      // lane l's partial row at out + l * out_stride
  size_t out_stride = 0;
};
int tile_lanes(Isa isa);  // 8, or 16 where the build and the CPU have AVX-512
size_t tile_scratch(int32_t rows, int32_t d, int lanes);
void tile_partials(const TileArgs& t);

// The scores of a key, one slot per head of the group (1, 2, 4 or 8 slots: a vector of 8
// holds whole keys), and the floats the scores of n keys take (a multiple of 8, and 8 more
// that a key's vector may write past its slots).
constexpr int32_t score_slots(int32_t group) {
  return group <= 1 ? 1 : group <= 2 ? 2 : group <= 4 ? 4 : 8;
}
constexpr int64_t score_floats(int32_t n, int32_t group) {
  return (int64_t{n} * score_slots(group) + 7) / 8 * 8 + 8;
}

}  // namespace kvs::cpu
