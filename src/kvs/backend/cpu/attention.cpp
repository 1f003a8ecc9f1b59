#include "kvs/backend/cpu/host_attention.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kvs/backend/cpu/kernels.h"
#include "kvs/backend/cpu/span_attention.h"
#include "kvs/util/threadpool.h"

namespace kvs::cpu {
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

// The first key position a query at pos sees.
inline int32_t first_key(const AttentionArgs& a, int32_t pos) {
  return a.window > 0 ? pos - a.window + 1 : 0;
}

std::vector<float>& scratch(size_t n) {
  thread_local std::vector<float> buf;
  if (buf.size() < n) buf.resize(n);
  return buf;
}

// The queries of a call prepared for the span kernels (span_attention.h), in the calling
// thread's buffers: token t's heads are query(t).
struct Queries {
  const AttentionArgs& a;
  int16_t* q16;
  float* step;
  int32_t* offset;
  explicit Queries(const AttentionArgs& args) : a(args) {
    thread_local std::vector<int16_t> q16_buf;
    thread_local std::vector<float> step_buf;
    thread_local std::vector<int32_t> offset_buf;
    const auto d = static_cast<size_t>(a.kv.head_dim);
    const size_t heads = static_cast<size_t>(a.n_tok) * static_cast<size_t>(a.n_head);
    q16_buf.resize(std::max(q16_buf.size(), heads * d));
    step_buf.resize(
        std::max(step_buf.size(), heads * static_cast<size_t>(query_blocks(a.kv.head_dim))));
    offset_buf.resize(std::max(offset_buf.size(), heads * d / 4));
    q16 = q16_buf.data();
    step = step_buf.data();
    offset = offset_buf.data();
    prepare_query(a.kv.k_type, a.q, a.n_tok * a.n_head, a.kv.head_dim, q16, step, offset);
  }
  Query query(int32_t t) const {
    const int64_t heads = static_cast<int64_t>(t) * a.n_head, d = a.kv.head_dim;
    return Query{a.q + heads * d, q16 + heads * d, step + heads * query_blocks(a.kv.head_dim),
                 offset + heads * d / 4};
  }
};

// Rows [j0, j0 + n) of kv head hk in span sp.
HeadRows head_rows(const KvLayout& l, const Span& sp, int32_t hk, int32_t j0, int32_t n) {
  return HeadRows{sp.page + static_cast<size_t>(j0) * l.k_row + static_cast<size_t>(hk) * l.k_head,
                  sp.page + l.v_offset() + static_cast<size_t>(j0) * l.v_row +
                      static_cast<size_t>(hk) * l.v_head,
                  l.k_row,
                  l.v_row,
                  l.v_head,
                  n};
}

// A span's partials of every query head, its kv heads taken together a piece of rows at a time
// so that the page is read in order (a head's rows are slices a row apart); the same bits as a
// span_partials call per kv head.
void span_all_heads(const SpanKernels& ks, const KvLayout& l, const Query& q, const Span& sp,
                    int32_t j0, int32_t n, float* buf, float* out) {
  const int32_t nkv = l.n_head_kv, group = ks.group;
  const size_t stride = part_stride(ks.d);
  const auto head_out = [&](int32_t hk) { return out + static_cast<size_t>(hk * group) * stride; };
  if (n <= 0) {
    for (int32_t h = 0; h < nkv * group; ++h) out[h * stride + 2] = 0.0f;
    return;
  }
  constexpr int32_t kPiece = 32;
  const int64_t per_head = score_floats(n, group);
  const int32_t slots = score_slots(group);
  float* w = buf + nkv * per_head;
  const auto scores_of = [&](int32_t hk) { return buf + hk * per_head; };
  for (int32_t j = 0; j < n; j += kPiece)
    for (int32_t hk = 0; hk < nkv; ++hk) {
      HeadRows r = head_rows(l, sp, hk, j0 + j, std::min(kPiece, n - j));
      r.more = n - j - r.n;
      span_scores(ks, q, hk * group, r, scores_of(hk) + j * slots);
    }
  for (int32_t hk = 0; hk < nkv; ++hk) span_softmax(ks, n, scores_of(hk), head_out(hk));
  // The values read the V rows a second time, after the softmax, when the scores' prefetch of
  // them has left L1: the next piece's rows (contiguous, every head's) come back while this
  // piece's are summed.
  const uint8_t* v = sp.page + l.v_offset() + static_cast<size_t>(j0) * l.v_row;
  for (int32_t j = 0; j < n; j += kPiece) {
    if (j + kPiece < n) {
      const uint8_t* next = v + static_cast<size_t>(j + kPiece) * l.v_row;
      const size_t bytes = static_cast<size_t>(std::min(kPiece, n - j - kPiece)) * l.v_row;
      for (size_t at = 0; at < bytes; at += 64)
        _mm_prefetch(reinterpret_cast<const char*>(next + at), _MM_HINT_T0);
    }
    for (int32_t hk = 0; hk < nkv; ++hk)
      span_values(ks, scores_of(hk) + j * slots,
                  head_rows(l, sp, hk, j0 + j, std::min(kPiece, n - j)), nullptr, w, head_out(hk));
  }
}

void decode_partials(const AttentionArgs& a, const Queries& qs, ThreadPool& pool, float* part) {
  const KvLayout& l = a.kv;
  const int32_t d = l.head_dim, group = a.n_head / l.n_head_kv, nkv = l.n_head_kv;
  const SpanKernels ks = span_kernels(l.k_type, l.v_type, group, d, a.scale, best_isa());
  const size_t stride = part_stride(d);
  // A task per span, its kv heads together (the page read in order), for all but the last span
  // a thread; those a task per (span, kv head), so that the threads finish together (the tasks
  // go out in order). Either way the same partials. A task takes every query row in turn, the
  // page's rows still in the core's caches for the rows after the first.
  const int32_t whole = std::max(0, a.n_spans - pool.size());
  const int64_t tasks = whole + static_cast<int64_t>(a.n_spans - whole) * nkv;
  pool.parallel_for(tasks, 1, [&](int64_t b, int64_t e) {
    const size_t floats =
        std::max(static_cast<size_t>(nkv * score_floats(l.page_size, group)) + value_scratch(ks),
                 span_scratch(ks, l.page_size));
    float* buf = scratch(floats).data();
    for (int64_t task = b; task < e; ++task) {
      const bool by_span = task < whole;
      const auto s = static_cast<int32_t>(by_span ? task : whole + (task - whole) / nkv);
      const Span& sp = a.spans[s];
      for (int32_t t = 0; t < a.n_tok; ++t) {
        const Query q = qs.query(t);
        const int32_t pos = a.pos[t];
        const int32_t n = std::min(sp.n, pos - sp.start + 1);
        const int32_t j0 = std::clamp(first_key(a, pos) - sp.start, 0, std::max(n, 0));
        float* out = part + (static_cast<size_t>(t) * a.n_spans + s) * a.n_head * stride;
        if (by_span) {
          span_all_heads(ks, l, q, sp, j0, n - j0, buf, out);
        } else {
          const auto hk = static_cast<int32_t>((task - whole) % nkv);
          span_partials(ks, q, hk * group, head_rows(l, sp, hk, j0, n - j0), nullptr, buf,
                        out + static_cast<size_t>(hk * group) * stride);
        }
      }
    }
  });
}

// Folds query t's partials of the group's heads (rows of po, part_stride apart) into its state.
void merge_group(const AttentionArgs& a, int32_t t, int32_t h0, int32_t group, const float* po) {
  const int32_t d = a.kv.head_dim;
  const int64_t qstride = static_cast<int64_t>(a.n_head) * d;
  for (int32_t g = 0; g < group; ++g) {
    const int32_t h = h0 + g;
    const float* pg = po + static_cast<size_t>(g) * part_stride(d);
    float* st = a.acc + 2 * (int64_t{t} * a.n_head + h);
    Acc acc{st[0], st[1], a.out + t * qstride + h * d};
    merge(acc, pg[0], pg[1], pg + kPartHead, d);
    st[0] = acc.m;
    st[1] = acc.l;
  }
}

// Prefill: a task per (kv head, tile of queries); the spans in order, each span's V levels
// read once for the tile, each query's partial folded as it is made. With f16 keys a tile is
// the lanes of a vector and a span's partials are made for all its queries at once
// (tile_partials) wherever none of them starts inside the span (a window's start); elsewhere
// query by query (span_partials): the same bits.
void prefill(const AttentionArgs& a, const Queries& qs) {
  const KvLayout& l = a.kv;
  const int32_t d = l.head_dim, group = a.n_head / l.n_head_kv, P = l.page_size;
  const SpanKernels ks = span_kernels(l.k_type, l.v_type, group, d, a.scale, best_isa());
  const int64_t qstride = static_cast<int64_t>(a.n_head) * d;
  const size_t stride = part_stride(d);
  const bool tiles = l.k_type == DType::F16;
  const int32_t kQTile = tiles ? tile_lanes(best_isa()) : 8;
  const int32_t n_tiles = (a.n_tok + kQTile - 1) / kQTile;
  const size_t span_floats = span_scratch(ks, P);
  const size_t pd = static_cast<size_t>(P) * static_cast<size_t>(d);
  // Per task: V levels and (tiles) K rows of a span; scratch; the queries transposed; partials.
  const size_t floats =
      pd + span_floats + static_cast<size_t>(kQTile) * group * stride +
      (tiles ? pd + tile_scratch(P, d, kQTile) + static_cast<size_t>(group) * d * kQTile : 0);
  thread_pool().parallel_for(
      static_cast<int64_t>(n_tiles) * l.n_head_kv, 1, [&](int64_t b, int64_t e) {
        float* vf = scratch(floats).data();
        float *sc = vf + pd, *po = sc + span_floats;
        float *kf = po + static_cast<size_t>(kQTile) * group * stride, *ts = kf + pd;
        float* qt = ts + tile_scratch(P, d, kQTile);
        for (int64_t task = b; task < e; ++task) {
          const int32_t tile = static_cast<int32_t>(task / l.n_head_kv),
                        hk = static_cast<int32_t>(task % l.n_head_kv);
          const int32_t t0 = tile * kQTile, t1 = std::min(a.n_tok, t0 + kQTile);
          int32_t max_pos = 0, min_pos = INT32_MAX;
          for (int32_t t = t0; t < t1; ++t)
            max_pos = std::max(max_pos, a.pos[t]), min_pos = std::min(min_pos, a.pos[t]);
          if (tiles)  // qt[g][i][lane], the lanes past the tile's queries 0
            for (int32_t g = 0; g < group; ++g)
              for (int32_t i = 0; i < d; ++i)
                for (int32_t t = 0; t < kQTile; ++t)
                  qt[(static_cast<size_t>(g) * d + i) * kQTile + t] =
                      t0 + t < t1 ? a.q[(t0 + t) * qstride + (hk * group + g) * d + i] : 0.0f;
          for (int32_t s = 0; s < a.n_spans; ++s) {
            const Span& sp = a.spans[s];
            if (sp.start > max_pos) break;
            if (sp.start + sp.n <= first_key(a, min_pos)) continue;  // before every window
            const int32_t nload = std::min(sp.n, max_pos - sp.start + 1);
            const int32_t lo = std::clamp(first_key(a, min_pos) - sp.start, 0, nload);
            const HeadRows rows = head_rows(l, sp, hk, lo, nload - lo);
            ks.v_levels(rows.v, rows.v_row, rows.n, d, vf + static_cast<int64_t>(lo) * d);
            if (tiles && first_key(a, max_pos) <= sp.start) {  // every query from row 0
              int32_t n[16] = {};
              for (int32_t t = t0; t < t1; ++t) n[t - t0] = std::min(sp.n, a.pos[t] - sp.start + 1);
              for (int32_t j = 0; j < nload; ++j)
                for (int32_t i = 0; i < d; i += 8)
                  _mm256_storeu_ps(kf + static_cast<int64_t>(j) * d + i,
                                   _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(
                                       rows.k + static_cast<size_t>(j) * rows.k_row + 2 * i))));
              for (int32_t g = 0; g < group; ++g) {
                TileArgs ta;
                ta.qt = qt + static_cast<size_t>(g) * d * kQTile;
                ta.n = n;
                ta.rows = nload;
                ta.k = kf;
                ta.levels = vf;
                ta.v = rows.v;
                ta.v_row = rows.v_row;
                ta.v_type = l.v_type;
                ta.d = d;
                ta.slots = score_slots(group);
                ta.lanes = kQTile;
                ta.scale = a.scale;
                ta.scratch = ts;
                ta.out = po + static_cast<size_t>(g) * stride;
                ta.out_stride = static_cast<size_t>(group) * stride;
                tile_partials(ta);
              }
              for (int32_t t = t0; t < t1; ++t)
                if (n[t - t0] > 0)
                  merge_group(a, t, hk * group, group,
                              po + static_cast<size_t>(t - t0) * group * stride);
              continue;
            }
            for (int32_t t = t0; t < t1; ++t) {
              const int32_t n = std::min(sp.n, a.pos[t] - sp.start + 1);
              const int32_t j0 = std::max(0, first_key(a, a.pos[t]) - sp.start);
              if (n - j0 <= 0) continue;
              span_partials(ks, qs.query(t), hk * group, head_rows(l, sp, hk, j0, n - j0),
                            vf + static_cast<int64_t>(j0) * d, sc, po);
              merge_group(a, t, hk * group, group, po);
            }
          }
        }
      });
}

// Folds each of a's n_tok rows of a.n_spans spans' partials (decode_partials') into that
// query's state, head by head in span order.
void fold_rows(const AttentionArgs& a, const float* parts) {
  const int32_t d = a.kv.head_dim;
  const size_t stride = part_stride(d);
  thread_pool().parallel_for(int64_t{a.n_tok} * a.n_head, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {  // query t's head h: i = t n_head + h
      const int64_t t = i / a.n_head, h = i % a.n_head;
      Acc acc{a.acc[2 * i], a.acc[2 * i + 1], a.out + i * d};
      for (int32_t s = 0; s < a.n_spans; ++s) {
        const float* p = parts + (static_cast<size_t>(t * a.n_spans + s) * a.n_head + h) * stride;
        if (p[2] != 0.0f) merge(acc, p[0], p[1], p + kPartHead, d);
      }
      a.acc[2 * i] = acc.m;
      a.acc[2 * i + 1] = acc.l;
    }
  });
}

// acc[(t * n_head + h) * 2 + {0, 1}]: running max and sum; a sum of 0 means "nothing yet".
void start(const AttentionArgs& a) {
  if (a.first)
    for (int64_t i = 0; i < int64_t{a.n_tok} * a.n_head; ++i) a.acc[2 * i + 1] = 0.0f;
}
void finish(const AttentionArgs& a) {
  if (!a.last) return;
  const int32_t d = a.kv.head_dim;
  for (int64_t i = 0; i < int64_t{a.n_tok} * a.n_head; ++i) {
    const float inv = 1.0f / a.acc[2 * i + 1];
    float* o = a.out + i * d;
    for (int32_t j = 0; j < d; ++j) o[j] *= inv;
  }
}

}  // namespace

void decode_partials(const AttentionArgs& a, ThreadPool& pool, float* part) {
  decode_partials(a, Queries(a), pool, part);
}

void merge_partials(const AttentionArgs& a, const float* part, ThreadPool& pool, float* out) {
  const int32_t d = a.kv.head_dim;
  const size_t stride = part_stride(d);
  pool.parallel_for(a.n_head, 1, [&](int64_t b, int64_t e) {
    for (auto h = static_cast<int32_t>(b); h < e; ++h) {
      float* row = out + static_cast<size_t>(h) * stride;
      Acc acc{0.0f, 0.0f, row + kPartHead};
      for (int32_t s = 0; s < a.n_spans; ++s) {
        const float* p = part + (static_cast<size_t>(s) * a.n_head + h) * stride;
        if (p[2] != 0.0f) merge(acc, p[0], p[1], p + kPartHead, d);
      }
      row[0] = acc.m, row[1] = acc.l, row[2] = acc.l != 0.0f ? 1.0f : 0.0f, row[3] = 0.0f;
    }
  });
}

void fold_partials(const AttentionArgs& a, const float* part) {
  start(a);
  fold_rows(a, part);
  finish(a);
}

// Steps of at most this many queries take the decode path (a verify step's token and drafts).
constexpr int32_t kDecodeRows = 8;

void attention(const AttentionArgs& a) {
  start(a);
  if (a.n_spans > 0) {
    const Queries qs(a);
    if (a.n_tok <= kDecodeRows) {
      // Decode and verify steps: every span's partials of every row (a task a span, its page
      // read once for the rows), then a fold per row and head in logical order. Same arithmetic
      // per query as the prefill path, whose tasks (a kv head each) and tiles a few rows
      // would leave mostly idle.
      thread_local std::vector<float> part;  // not scratch(): the tasks take that one
      part.resize(std::max(part.size(), static_cast<size_t>(a.n_tok) * a.n_spans * a.n_head *
                                            part_stride(a.kv.head_dim)));
      decode_partials(a, qs, thread_pool(), part.data());
      fold_rows(a, part.data());
    } else {
      prefill(a, qs);
    }
  }
  finish(a);
}

}  // namespace kvs::cpu
