// The CPU attention kernels (backend/cpu/span_attention.h, host_attention.h; span_tile.cpp's
// prefill tiles against span_partials) against a scalar
// reference that dequantizes the cache (kv_dequantize_head) and computes in double: every K and
// V type, head sizes 32 to 256, 1 to 8 query heads a kv head, every instruction set the CPU
// has, spans cut at odd rows and lengths. The partials are bit-identical across instruction
// sets, decode and prefill agree bit for bit, and a call cut into several gives the same bits.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kvs/backend/cpu/host_attention.h"
#include "kvs/backend/cpu/kernels.h"
#include "kvs/backend/cpu/span_attention.h"
#include "kvs/quant/kv_page.h"
#include "kvs/util/threadpool.h"

namespace kvs {
namespace {

using cpu::Isa;

std::vector<Isa> isas() {
  std::vector<Isa> r;
  for (Isa i : {Isa::Avx2, Isa::AvxVnni, Isa::Avx512Vnni})
    if (cpu::cpu_has(i)) r.push_back(i);
  return r;
}

std::vector<float> normal(size_t n, std::mt19937& g, float sd = 1.0f) {
  std::normal_distribution<float> d(0.0f, sd);
  std::vector<float> v(n);
  for (float& x : v) x = d(g);
  return v;
}

// Pages of random K and V rows, and their dequantized values [page][row][head][d].
struct Cache {
  KvLayout l;
  int32_t n_pages;
  std::vector<uint8_t> bytes;
  std::vector<float> k, v;
  Cache(DType kt, DType vt, int32_t P, int32_t nkv, int32_t d, int32_t pages, std::mt19937& g)
      : l(KvLayout::make(kt, vt, P, nkv, d)), n_pages(pages), bytes(l.page_bytes() * pages) {
    const size_t vals = static_cast<size_t>(pages) * P * nkv * d;
    k.resize(vals);
    v.resize(vals);
    for (int32_t p = 0; p < pages; ++p)
      for (int32_t j = 0; j < P; ++j)
        for (int32_t h = 0; h < nkv; ++h) {
          const std::vector<float> kx = normal(d, g), vx = normal(d, g);
          uint8_t* kr = bytes.data() + (row_k(p, j, h) - bytes.data());
          uint8_t* vr = bytes.data() + (row_v(p, j, h) - bytes.data());
          kv_quantize_head(kt, kx.data(), kr, d);
          kv_quantize_head(vt, vx.data(), vr, d);
          kv_dequantize_head(kt, kr, &k[at(p, j, h)], d);
          kv_dequantize_head(vt, vr, &v[at(p, j, h)], d);
        }
  }
  const uint8_t* page(int32_t p) const {
    return bytes.data() + static_cast<size_t>(p) * l.page_bytes();
  }
  const uint8_t* row_k(int32_t p, int32_t j, int32_t h) const {
    return page(p) + j * l.k_row + h * l.k_head;
  }
  const uint8_t* row_v(int32_t p, int32_t j, int32_t h) const {
    return page(p) + l.v_offset() + j * l.v_row + h * l.v_head;
  }
  size_t at(int32_t p, int32_t j, int32_t h) const {
    return ((static_cast<size_t>(p) * l.page_size + j) * l.n_head_kv + h) * l.head_dim;
  }
  // Token t of the history (page t / P, row t % P).
  const float* key(int32_t t, int32_t h) const {
    return &k[at(t / l.page_size, t % l.page_size, h)];
  }
  const float* val(int32_t t, int32_t h) const {
    return &v[at(t / l.page_size, t % l.page_size, h)];
  }
};

// The scalar reference: softmax(q . k * scale) v over the keys in [lo, hi), in double.
struct Ref {
  double m = -HUGE_VAL, l = 0;
  std::vector<double> o;  // normalised
};
Ref reference(const Cache& c, const float* q, int32_t hk, int32_t lo, int32_t hi, float scale) {
  const int32_t d = c.l.head_dim;
  Ref r;
  std::vector<double> s;
  for (int32_t t = lo; t < hi; ++t) {
    const float* k = c.key(t, hk);
    double x = 0;
    for (int32_t i = 0; i < d; ++i) x += static_cast<double>(q[i]) * static_cast<double>(k[i]);
    s.push_back(x * static_cast<double>(scale));
    r.m = std::max(r.m, s.back());
  }
  r.o.assign(static_cast<size_t>(d), 0.0);
  for (int32_t t = lo; t < hi; ++t) {
    const double p = std::exp(s[static_cast<size_t>(t - lo)] - r.m);
    r.l += p;
    const float* v = c.val(t, hk);
    for (int32_t i = 0; i < d; ++i) r.o[static_cast<size_t>(i)] += p * static_cast<double>(v[i]);
  }
  for (double& x : r.o) x /= r.l;
  return r;
}

// The most a key's score can be off: for quantized keys the rounding of q to its blocks'
// int16 steps, at most step / 2 an element (the integer sums are exact), plus the f32
// arithmetic's; for f16 keys the f32 arithmetic's alone.
double score_bound(const Cache& c, const float* q, const float* step, int32_t hk, int32_t lo,
                   int32_t hi, float scale) {
  const int32_t d = c.l.head_dim;
  double worst = 0;
  for (int32_t t = lo; t < hi; ++t) {
    const float* k = c.key(t, hk);
    double rounding = 0, magnitude = 0;
    for (int32_t i = 0; i < d; ++i) {
      const double ak = std::fabs(static_cast<double>(k[i]));
      if (c.l.k_type != DType::F16) rounding += ak * static_cast<double>(step[i / 32]) / 2;
      magnitude += ak * std::fabs(static_cast<double>(q[i]));
    }
    worst = std::max(worst, (rounding + 1e-6 * magnitude) * static_cast<double>(scale));
  }
  return worst + 1e-6;
}

// A partial against the reference, with b the bound on its scores' errors: the max within b,
// the sum (taken to the reference's max) and the normalised output within what scores off by
// b make of them (e^(2b) - 1 of the sum; of the output, as much times the largest value), and
// f32 rounding.
struct Check {
  double worst = 0;  // the largest error as a fraction of its bound
  void operator()(const float* part, const Ref& r, double b, double vmax) {
    const double pm = static_cast<double>(part[0]), pl = static_cast<double>(part[1]);
    const double rel = std::expm1(2 * b) + 1e-5;
    const double em = std::fabs(pm - r.m) / b,
                 el = std::fabs(pl * std::exp(pm - r.m) / r.l - 1.0) / rel;
    double eo = 0;
    for (size_t i = 0; i < r.o.size(); ++i)
      eo = std::max(eo, std::fabs(static_cast<double>(part[cpu::kPartHead + i]) / pl - r.o[i]) /
                            (rel * vmax));
    EXPECT_LE(em, 1.0) << "max " << pm << " vs " << r.m << ", bound " << b;
    EXPECT_LE(el, 1.0) << "sum";
    EXPECT_LE(eo, 1.0) << "output";
    worst = std::max({worst, em, el, eo});
  }
};

// The outputs of attention over several pages (normal q, K and V) within this of the double
// reference.
constexpr double kOutTol = 2e-4;

const DType kTypes[] = {DType::F16, DType::Q8_0, DType::Q4_0};

TEST(CpuAttention, SpanPartialsMatchTheScalarReference) {
  std::mt19937 g(33);
  constexpr int32_t P = 100, nkv = 2;  // a page that is not a multiple of 8 or of a V piece
  // (rows from, count): whole page, one row, odd starts and lengths, the last rows.
  const std::pair<int32_t, int32_t> cuts[] = {{0, P}, {0, 1}, {5, 7}, {3, 66}, {P - 9, 9}, {1, 8}};
  Check check;
  int runs = 0;
  for (DType kt : kTypes)
    for (DType vt : kTypes)
      for (int32_t d : {32, 64, 128, 256}) {
        const Cache c(kt, vt, P, nkv, d, 1, g);
        for (int32_t group = 1; group <= 8; ++group) {
          const int32_t n_head = group * nkv;
          std::vector<float> q = normal(static_cast<size_t>(n_head) * d, g);
          q[3] *= 20.0f;  // an outlier dimension in head 0, which sets its int16 step
          std::vector<int16_t> q16(q.size());
          std::vector<float> step(static_cast<size_t>(n_head * cpu::query_blocks(d)));
          std::vector<int32_t> offset(q.size() / 4);
          const float scale = 1.0f / std::sqrt(static_cast<float>(d));
          cpu::prepare_query(kt, q.data(), n_head, d, q16.data(), step.data(), offset.data());
          const cpu::Query qy{q.data(), q16.data(), step.data(), offset.data()};
          const size_t os = cpu::part_stride(d);
          for (const auto& [from, count] : cuts) {
            std::vector<float> first;
            for (Isa isa : isas()) {
              SCOPED_TRACE(std::string(dtype_name(kt)) + "/" + dtype_name(vt) + " d " +
                           std::to_string(d) + " group " + std::to_string(group) + " rows " +
                           std::to_string(from) + "+" + std::to_string(count) + " " +
                           cpu::isa_name(isa));
              const cpu::SpanKernels ks = cpu::span_kernels(kt, vt, group, d, scale, isa);
              std::vector<float> scratch(cpu::span_scratch(ks, P));
              std::vector<float> out(static_cast<size_t>(n_head) * os);
              for (int32_t hk = 0; hk < nkv; ++hk) {
                const cpu::HeadRows r{c.row_k(0, from, hk),
                                      c.row_v(0, from, hk),
                                      c.l.k_row,
                                      c.l.v_row,
                                      c.l.v_head,
                                      count};
                float* o = out.data() + static_cast<size_t>(hk * group) * os;
                cpu::span_partials(ks, qy, hk * group, r, nullptr, scratch.data(), o);
                // The same partial from the V levels as an f32 tile (the prefill's way): the same
                // bits.
                std::vector<float> vf(static_cast<size_t>(count) * d), o2(group * os);
                ks.v_levels(r.v, r.v_row, count, d, vf.data());
                cpu::span_partials(ks, qy, hk * group, r, vf.data(), scratch.data(), o2.data());
                ASSERT_EQ(std::memcmp(o, o2.data(), o2.size() * sizeof(float)), 0);
                for (int32_t gi = 0; gi < group; ++gi) {
                  const int32_t h = hk * group + gi;
                  const float* qh = q.data() + static_cast<size_t>(h) * d;
                  const Ref ref = reference(c, qh, hk, from, from + count, scale);
                  const double bound = score_bound(c, qh, step.data() + h * cpu::query_blocks(d),
                                                   hk, from, from + count, scale);
                  const float* part = o + gi * os;
                  ASSERT_EQ(part[2], 1.0f);
                  double vmax = 0;
                  for (int32_t t = from; t < from + count; ++t)
                    for (int32_t i = 0; i < d; ++i)
                      vmax = std::max(vmax, std::fabs(static_cast<double>(c.val(t, hk)[i])));
                  check(part, ref, bound, vmax);
                  ++runs;
                }
              }
              // Every instruction set gives the same bits.
              if (first.empty())
                first = out;
              else
                ASSERT_EQ(std::memcmp(first.data(), out.data(), out.size() * sizeof(float)), 0);
            }
          }
        }
      }
  std::printf("%d partials; worst error %.3g of its bound (isas:", runs, check.worst);
  for (Isa i : isas()) std::printf(" %s", cpu::isa_name(i));
  std::printf(")\n");
}

TEST(CpuAttention, EmptySpansAreMarkedEmpty) {
  std::mt19937 g(4);
  const Cache c(DType::Q8_0, DType::Q4_0, 16, 1, 64, 1, g);
  const std::vector<float> q = normal(4 * 64, g);
  std::vector<int16_t> q16(q.size());
  std::vector<float> step(4 * cpu::query_blocks(64));
  cpu::prepare_query(DType::Q8_0, q.data(), 4, 64, q16.data(), step.data(), nullptr);
  const cpu::SpanKernels ks =
      cpu::span_kernels(DType::Q8_0, DType::Q4_0, 4, 64, 0.125f, cpu::best_isa());
  std::vector<float> scratch(cpu::span_scratch(ks, 16)), out(4 * cpu::part_stride(64), 7.0f);
  cpu::span_partials(
      ks, {q.data(), q16.data(), step.data()}, 0,
      {c.bytes.data(), c.bytes.data() + c.l.v_offset(), c.l.k_row, c.l.v_row, c.l.v_head, 0},
      nullptr, scratch.data(), out.data());
  for (int32_t h = 0; h < 4; ++h) EXPECT_EQ(out[h * cpu::part_stride(64) + 2], 0.0f);
}

// A whole history in pages (the last one cut short) as attention() sees it: spans in order.
std::vector<Span> spans_of(const Cache& c, int32_t ctx) {
  std::vector<Span> s;
  const int32_t P = c.l.page_size;
  for (int32_t p = 0; p * P < ctx; ++p) s.push_back({c.page(p), p * P, std::min(P, ctx - p * P)});
  return s;
}

struct Call {
  std::vector<float> out, acc;
};
// attention() for n_tok queries at positions pos over spans [s0, s1) of ss (first, last as
// given), continuing `into`.
void attend(const Cache& c, const std::vector<float>& q, const std::vector<int32_t>& pos,
            const std::vector<Span>& ss, size_t s0, size_t s1, int32_t n_head, int32_t window,
            bool first, bool last, Call& into) {
  const int32_t n_tok = static_cast<int32_t>(pos.size()), d = c.l.head_dim;
  into.out.resize(static_cast<size_t>(n_tok) * n_head * d);
  into.acc.resize(static_cast<size_t>(n_tok) * n_head * 2);
  AttentionArgs a;
  a.q = q.data();
  a.out = into.out.data();
  a.acc = into.acc.data();
  a.pos = pos.data();
  a.n_tok = n_tok;
  a.spans = ss.data() + s0;
  a.n_spans = static_cast<int32_t>(s1 - s0);
  a.kv = c.l;
  a.n_head = n_head;
  a.scale = 1.0f / std::sqrt(static_cast<float>(d));
  a.window = window;
  a.first = first;
  a.last = last;
  cpu::attention(a);
}

// Decode takes a task per page (its kv heads together, a piece of rows each in turn) but for
// the last page a thread, a task per (page, kv head) (over 3 pages with 2 threads: 1 and 2;
// over 40: 38 and 2); prefill always a task per kv head: all give the same bits.
TEST(CpuAttention, AttentionMatchesTheScalarReferenceAndItselfBitForBit) {
  set_thread_count(2);  // 40 pages are enough spans to be taken whole
  std::mt19937 g(2026);
  double worst = 0;
  for (DType kt : kTypes)
    for (DType vt : kTypes)
      for (int32_t d : {64, 128, 256})
        for (int32_t group : {1, 2, 3, 4, 8})
          for (int32_t pages : {3, 40}) {
            constexpr int32_t P = 16, nkv = 2;
            if (pages > 3 && group != 4 && d != 128) continue;  // the long case on fewer shapes
            const int32_t ctx = pages * P - 5;
            const Cache c(kt, vt, P, nkv, d, pages, g);
            const std::vector<Span> ss = spans_of(c, ctx);
            const int32_t n_head = group * nkv;
            for (int32_t window : {0, 21, 24}) {  // 24: a page starts inside the 5 windows
              SCOPED_TRACE(std::string(dtype_name(kt)) + "/" + dtype_name(vt) + " d " +
                           std::to_string(d) + " group " + std::to_string(group) + " pages " +
                           std::to_string(pages) + " window " + std::to_string(window));
              // The last 5 positions as one prefill call, and each as a decode step.
              std::vector<int32_t> pos;
              for (int32_t t = ctx - 5; t < ctx; ++t) pos.push_back(t);
              const std::vector<float> q = normal(pos.size() * n_head * d, g);
              Call all;
              attend(c, q, pos, ss, 0, ss.size(), n_head, window, true, true, all);
              for (size_t t = 0; t < pos.size(); ++t) {
                const std::vector<float> qt(q.begin() + static_cast<int64_t>(t * n_head * d),
                                            q.begin() + static_cast<int64_t>((t + 1) * n_head * d));
                Call one, cut;
                attend(c, qt, {pos[t]}, ss, 0, ss.size(), n_head, window, true, true, one);
                // The spans in two calls, as the ring hands them over.
                attend(c, qt, {pos[t]}, ss, 0, 2, n_head, window, true, false, cut);
                attend(c, qt, {pos[t]}, ss, 2, ss.size(), n_head, window, false, true, cut);
                const size_t row = static_cast<size_t>(n_head) * d;
                ASSERT_EQ(std::memcmp(one.out.data(), all.out.data() + t * row, row * 4), 0)
                    << "decode != prefill at token " << t;
                ASSERT_EQ(std::memcmp(one.out.data(), cut.out.data(), row * 4), 0)
                    << "two calls != one at token " << t;
                for (int32_t h = 0; h < n_head; ++h) {
                  const int32_t lo = window > 0 ? std::max(0, pos[t] - window + 1) : 0;
                  const Ref r = reference(c, qt.data() + static_cast<size_t>(h) * d, h / group, lo,
                                          pos[t] + 1, 1.0f / std::sqrt(static_cast<float>(d)));
                  for (int32_t i = 0; i < d; ++i)
                    worst = std::max(
                        worst,
                        std::fabs(static_cast<double>(one.out[static_cast<size_t>(h) * d + i]) -
                                  r.o[static_cast<size_t>(i)]));
                }
              }
            }
          }
  set_thread_count(0);
  std::printf("attention over 3 and 40 pages: worst |output - ref| %.3g\n", worst);
  EXPECT_LT(worst, kOutTol);
}

// Prefill's tiles (tile_partials, f16 keys): each lane's partial is span_partials' for its
// query alone, bit for bit, for every V type, head size and group, with 8 lanes and (where the
// build and the CPU have it) 16, lanes with no query and lanes of different lengths.
TEST(CpuAttention, PrefillTilesAreSpanPartials) {
  std::mt19937 g(7);
  constexpr int32_t P = 40;
  std::vector<int> lanes = {8};
  if (cpu::tile_lanes(cpu::best_isa()) == 16) lanes.push_back(16);
  for (DType vt : kTypes)
    for (int32_t d : {32, 64, 128, 256})
      for (int32_t group : {1, 2, 3, 4, 8})
        for (int L : lanes) {
          SCOPED_TRACE(std::string(dtype_name(vt)) + " d " + std::to_string(d) + " group " +
                       std::to_string(group) + " lanes " + std::to_string(L));
          const Cache c(DType::F16, vt, P, 1, d, 1, g);
          const float scale = 1.0f / std::sqrt(static_cast<float>(d));
          const cpu::SpanKernels ks =
              cpu::span_kernels(DType::F16, vt, group, d, scale, cpu::best_isa());
          std::vector<int32_t> n(static_cast<size_t>(L));
          for (int l = 0; l < L; ++l) n[l] = l % 5 == 3 ? 0 : 1 + static_cast<int32_t>(g() % P);
          const int32_t rows = *std::max_element(n.begin(), n.end());
          const std::vector<float> q = normal(static_cast<size_t>(L) * group * d, g);
          // The keys and the values' levels as the prefill makes them.
          std::vector<float> kf(static_cast<size_t>(rows) * d), lv(kf.size());
          for (int32_t j = 0; j < rows; ++j)
            std::copy(c.key(j, 0), c.key(j, 0) + d, kf.begin() + static_cast<int64_t>(j) * d);
          ks.v_levels(c.row_v(0, 0, 0), c.l.v_row, rows, d, lv.data());
          const size_t stride = cpu::part_stride(d);
          std::vector<float> scratch(cpu::tile_scratch(rows, d, L) + cpu::span_scratch(ks, P));
          for (int32_t h = 0; h < group; ++h) {
            std::vector<float> qt(static_cast<size_t>(d) * L), out(static_cast<size_t>(L) * stride);
            for (int32_t i = 0; i < d; ++i)
              for (int l = 0; l < L; ++l)
                qt[static_cast<size_t>(i) * L + l] =
                    q[(static_cast<size_t>(l) * group + h) * d + i];
            cpu::TileArgs t;
            t.qt = qt.data();
            t.n = n.data();
            t.rows = rows;
            t.k = kf.data();
            t.levels = lv.data();
            t.v = c.row_v(0, 0, 0);
            t.v_row = c.l.v_row;
            t.v_type = vt;
            t.d = d;
            t.slots = cpu::score_slots(group);
            t.lanes = L;
            t.scale = scale;
            t.scratch = scratch.data();
            t.out = out.data();
            t.out_stride = stride;
            cpu::tile_partials(t);
            for (int l = 0; l < L; ++l) {
              if (n[l] == 0) continue;
              std::vector<float> want(static_cast<size_t>(group) * stride);
              const cpu::HeadRows r{c.row_k(0, 0, 0), c.row_v(0, 0, 0), c.l.k_row,
                                    c.l.v_row,        c.l.v_head,       n[l]};
              cpu::span_partials(ks, cpu::Query{q.data() + static_cast<size_t>(l) * group * d}, 0,
                                 r, nullptr, scratch.data(), want.data());
              ASSERT_EQ(std::memcmp(want.data() + h * stride, out.data() + l * stride,
                                    stride * sizeof(float)),
                        0)
                  << "head " << h << " lane " << l << " (" << n[l] << " keys)";
            }
          }
        }
}

// The int16 query against the f32 one (the kernel before it): both against the double
// reference, on K rows of each quantized type; prints the errors of each.
TEST(CpuAttention, IntegerScoresAgainstTheFloatPath) {
  std::mt19937 g(7);
  for (DType kt : {DType::Q8_0, DType::Q4_0}) {
    constexpr int32_t P = 256, d = 128, group = 4;
    const Cache c(kt, DType::F16, P, 1, d, 1, g);
    std::vector<float> q = normal(group * d, g);
    q[5] *= 20.0f;
    std::vector<int16_t> q16(q.size());
    std::vector<float> step(group * cpu::query_blocks(d));
    std::vector<int32_t> offset(q.size() / 4);
    const float scale = 1.0f / std::sqrt(static_cast<float>(d));
    cpu::prepare_query(kt, q.data(), group, d, q16.data(), step.data(), offset.data());
    const cpu::SpanKernels ks = cpu::span_kernels(kt, DType::F16, group, d, scale, cpu::best_isa());
    std::vector<float> s(static_cast<size_t>(cpu::score_floats(P, group)));
    ks.scores(
        {q.data(), q16.data(), step.data(), offset.data()}, 0, scale, d,
        {c.bytes.data(), c.bytes.data() + c.l.v_offset(), c.l.k_row, c.l.v_row, c.l.v_head, P},
        s.data());
    double err_int = 0, err_f32 = 0, top = 0;
    for (int32_t h = 0; h < group; ++h)
      for (int32_t j = 0; j < P; ++j) {
        double ref = 0;
        float f32 = 0;
        for (int32_t i = 0; i < d; ++i) {
          ref += static_cast<double>(q[h * d + i]) * static_cast<double>(c.key(j, 0)[i]);
          f32 = std::fma(q[h * d + i], c.key(j, 0)[i], f32);
        }
        ref *= static_cast<double>(scale);
        top = std::max(top, std::fabs(ref));
        const double got =
            static_cast<double>(s[static_cast<size_t>(j * cpu::score_slots(group) + h)]);
        err_int = std::max(err_int, std::fabs(got - ref));
        err_f32 = std::max(err_f32, std::fabs(static_cast<double>(f32 * scale) - ref));
      }
    std::printf("%s keys: scores up to %.3g; worst error int16 q %.3g, f32 q %.3g\n",
                dtype_name(kt), top, err_int, err_f32);
    EXPECT_LT(err_int, 1e-4 * top);
  }
}

}  // namespace
}  // namespace kvs
