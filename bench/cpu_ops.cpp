// Times of the CPU backend's hot operations at a model's shapes: the integer products (one token:
// weight bytes per second; a batch: multiply-adds per second) and attention over an f16 or q8_0
// cache at a depth (one query: cache bytes per second; a batch of queries). Best of -r runs.
//   kvs_cpu_ops [-t threads] [-r runs] [--rows N] [--cols N] [--type q4_1] [--tokens 1,512]
//               [--depth 4096] [--kv f16] [--heads 9] [--kv-heads 3] [--head-dim 64] [--hot 1]
//               [--only matmul|attention] [--isa avx2|avxvnni|avx512]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kvs/backend/cpu/kernels.h"
#include "kvs/backend/cpu/quant_dot.h"
#include "kvs/quant/kv_page.h"
#include "kvs/quant/types.h"
#include "kvs/util/threadpool.h"

namespace {

using namespace kvs;
using Clock = std::chrono::steady_clock;

struct Options {
  int threads = 2, runs = 5;
  int64_t rows = 1536, cols = 576, depth = 4096;
  std::string type = "q4_1", kv = "f16";
  std::vector<int64_t> tokens = {1, 512};
  bool hot = false;  // the same matrix every run (in cache when it fits)
  std::string isa;   // avx2, avxvnni, avx512: that kernel on one thread (default: the product)
  int heads = 9, kv_heads = 3, head_dim = 64;
};

template <class F>
double best_seconds(int runs, F&& f) {
  double best = 1e30;
  for (int i = 0; i < runs; ++i) {
    const auto t0 = Clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return best;
}

void bench_matmul(const Options& o) {
  const DType t = parse_dtype(o.type, "--type");
  std::mt19937 rng(1);
  std::normal_distribution<float> g(0.0f, 1.0f);
  // Enough copies of the matrix that one pass over them leaves the caches (as a model does).
  Matrix w;
  w.type = t;
  w.n_in = o.cols;
  w.n_out = o.rows;
  w.row_bytes = cpu::cpu_row_bytes(t, o.cols);  // placed as the CPU backend places it
  const int copies =
      o.hot ? 1
            : static_cast<int>(std::max<int64_t>(1, (256 << 20) / static_cast<int64_t>(w.bytes())));
  std::vector<uint8_t> raw(w.bytes() * static_cast<size_t>(copies));
  std::vector<float> row(static_cast<size_t>(o.cols));
  std::vector<uint8_t> file(row_bytes(t, o.cols));
  for (int64_t r = 0; r < o.rows; ++r) {
    for (auto& v : row) v = g(rng) * 0.02f;
    uint8_t* dst = raw.data() + r * w.row_bytes;
    quantize_row(t, row.data(), cpu::cpu_repacked(t) ? file.data() : dst, o.cols);
    if (cpu::cpu_repacked(t)) cpu::pack_row(t, file.data(), dst, o.cols);
  }
  for (int c = 1; c < copies; ++c) std::memcpy(raw.data() + c * w.bytes(), raw.data(), w.bytes());
  for (const int64_t n : o.tokens) {
    std::vector<float> x(static_cast<size_t>(n * o.cols)), y(static_cast<size_t>(n * o.rows));
    for (auto& v : x) v = g(rng);
    std::vector<cpu::XGroup> xq(static_cast<size_t>(n * cpu::x_groups(o.cols)));
    const bool int_dot = cpu::has_int_dot(t);
    const cpu::DotIsa isa = o.isa == "avx2"      ? cpu::DotIsa::Avx2
                            : o.isa == "avxvnni" ? cpu::DotIsa::AvxVnni
                                                 : cpu::DotIsa::Avx512Vnni;
    int c = 0;
    const double s = best_seconds(o.runs * (n == 1 ? 20 : 1), [&] {
      w.data = raw.data() + (c++ % copies) * w.bytes();
      if (int_dot) cpu::quantize_x(x.data(), n, o.cols, xq.data());
      const MatJob job{&w, y.data()};
      if (!o.isa.empty())
        cpu::int_matmul_rows(w, xq.data(), n, 0, o.rows, y.data(), o.rows, isa);
      else
        cpu::matmuls(x.data(), int_dot ? xq.data() : nullptr, n, &job, 1);
    });
    const double macs = static_cast<double>(n) * o.rows * o.cols;
    std::printf("matmul %s %lldx%lld, %lld tokens: %.1f us, %.2f GB/s of weights, %.1f GMAC/s\n",
                o.type.c_str(), static_cast<long long>(o.rows), static_cast<long long>(o.cols),
                static_cast<long long>(n), s * 1e6, static_cast<double>(w.bytes()) / s * 1e-9,
                macs / s * 1e-9);
  }
}

void bench_attention(const Options& o) {
  const DType kt = parse_kv_type(o.kv.c_str(), "--kv");
  const int32_t page = 256, d = o.head_dim;
  const KvLayout l = KvLayout::make(kt, kt, page, o.kv_heads, d);
  const int32_t n_pages = static_cast<int32_t>((o.depth + 512 + page - 1) / page);
  std::vector<uint8_t> pages(l.page_bytes() * static_cast<size_t>(n_pages));
  std::mt19937 rng(2);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> kv(static_cast<size_t>(o.kv_heads) * d);
  for (int32_t p = 0; p < n_pages; ++p)
    for (int32_t j = 0; j < page; ++j) {
      uint8_t* base = pages.data() + p * l.page_bytes();
      for (int32_t h = 0; h < o.kv_heads; ++h) {
        for (auto& v : kv) v = g(rng);
        kv_quantize_head(kt, kv.data(), base + j * l.k_row + h * l.k_head, d);
        kv_quantize_head(kt, kv.data(), base + l.v_offset() + j * l.v_row + h * l.v_head, d);
      }
    }
  for (const int64_t n : o.tokens) {
    const int32_t n_tok = static_cast<int32_t>(n);
    const int64_t ctx = o.depth + n;
    std::vector<Span> spans;
    for (int32_t s = 0; s * page < ctx; ++s)
      spans.push_back({pages.data() + s * l.page_bytes(), s * page,
                       static_cast<int32_t>(std::min<int64_t>(page, ctx - s * page))});
    std::vector<float> q(static_cast<size_t>(n * o.heads * d)), out(q.size()),
        acc(static_cast<size_t>(n * o.heads * 2));
    for (auto& v : q) v = g(rng);
    std::vector<int32_t> pos(static_cast<size_t>(n));
    for (int32_t t = 0; t < n_tok; ++t) pos[t] = static_cast<int32_t>(o.depth) + t;
    AttentionArgs a;
    a.q = q.data();
    a.out = out.data();
    a.acc = acc.data();
    a.pos = pos.data();
    a.n_tok = n_tok;
    a.spans = spans.data();
    a.n_spans = static_cast<int32_t>(spans.size());
    a.kv = l;
    a.n_head = o.heads;
    a.scale = 0.125f;
    const double s = best_seconds(o.runs, [&] { cpu::attention(a); });
    const double bytes =
        static_cast<double>(ctx) * static_cast<double>(l.k_head + l.v_head) * o.kv_heads;
    std::printf("attention %s depth %lld, %lld queries: %.1f us, %.2f GB/s of cache\n",
                o.kv.c_str(), static_cast<long long>(o.depth), static_cast<long long>(n), s * 1e6,
                bytes / s * 1e-9);
  }
}

std::vector<int64_t> list(const char* s) {
  std::vector<int64_t> v;
  for (const char* p = s; *p;) {
    v.push_back(std::atoll(p));
    while (*p && *p != ',') ++p;
    if (*p) ++p;
  }
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  std::string what = "both";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const char* v = argv[i + 1];
    if (k == "-t")
      o.threads = std::atoi(v);
    else if (k == "-r")
      o.runs = std::atoi(v);
    else if (k == "--rows")
      o.rows = std::atoll(v);
    else if (k == "--cols")
      o.cols = std::atoll(v);
    else if (k == "--type")
      o.type = v;
    else if (k == "--tokens")
      o.tokens = list(v);
    else if (k == "--depth")
      o.depth = std::atoll(v);
    else if (k == "--kv")
      o.kv = v;
    else if (k == "--heads")
      o.heads = std::atoi(v);
    else if (k == "--kv-heads")
      o.kv_heads = std::atoi(v);
    else if (k == "--head-dim")
      o.head_dim = std::atoi(v);
    else if (k == "--only")
      what = v;
    else if (k == "--hot")
      o.hot = std::atoi(v) != 0;
    else if (k == "--isa")
      o.isa = v;
    else {
      std::fprintf(stderr, "unknown option %s\n", k.c_str());
      return 2;
    }
  }
  set_thread_count(o.threads);
  if (what != "attention") bench_matmul(o);
  if (what != "matmul") bench_attention(o);
  return 0;
}
