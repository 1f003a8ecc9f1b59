// The CPU's decode attention over a long paged KV cache in host memory (the CPU backend's and
// host mode's kernel, the CPU's side of split attention): GB/s of K and V read, for 1..N
// threads and each cache type and head size. A benchmark program, not a test.
//
//   kvs_cpu_attention_bench [--ctx 256k] [--kv-heads 8] [--group 4] [--heads 64,128,256]
//                           [--types q8_0/q8_0,q8_0/q4_0,q4_0/q4_0,f16/f16] [--threads 1,2,4]
//                           [--page 256] [--reps 10] [--layers N [--rows R]]
//
// --layers N: split attention's shape (engine/split.h): a call is N layers of --ctx tokens each,
// in memory of their own, a job a layer posted to a SplitWorker of the given threads, as the
// engine posts them. --rows R: each job has R query rows (a verify step's token and drafts);
// GB/s then counts the pages' bytes once for each row, as the engine's rate does.
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kvs/backend/cpu/isa.h"
#include "kvs/backend/cpu/kernels.h"
#include "kvs/backend/cpu/span_attention.h"
#include "kvs/backend/device.h"
#include "kvs/engine/split.h"
#include "kvs/quant/kv_page.h"
#include "kvs/util/error.h"
#include "kvs/util/parse.h"
#include "kvs/util/threadpool.h"

namespace {

using namespace kvs;

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> r;
  size_t at = 0;
  while (at <= s.size()) {
    const size_t comma = std::min(s.find(',', at), s.size());
    if (comma > at) r.push_back(s.substr(at, comma - at));
    at = comma + 1;
  }
  return r;
}

std::string loadavg() {
  std::ifstream f("/proc/loadavg");
  std::string a, b, c;
  f >> a >> b >> c;
  return a + " " + b + " " + c;
}

double now() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

// One page of random rows, copied into every page of the cache: the speed does not depend on
// the values.
std::vector<uint8_t> make_cache(const KvLayout& l, int32_t pages) {
  std::mt19937 g(1);
  std::normal_distribution<float> nd;
  std::vector<float> x(static_cast<size_t>(l.head_dim));
  std::vector<uint8_t> page(l.page_bytes());
  for (int32_t j = 0; j < l.page_size; ++j)
    for (int32_t h = 0; h < l.n_head_kv; ++h) {
      for (float& v : x) v = nd(g);
      kv_quantize_head(l.k_type, x.data(), page.data() + j * l.k_row + h * l.k_head, l.head_dim);
      for (float& v : x) v = nd(g);
      kv_quantize_head(l.v_type, x.data(), page.data() + l.v_offset() + j * l.v_row + h * l.v_head,
                       l.head_dim);
    }
  std::vector<uint8_t> cache(page.size() * static_cast<size_t>(pages));
  for (int32_t p = 0; p < pages; ++p)
    std::memcpy(cache.data() + p * page.size(), page.data(), page.size());
  return cache;
}

// GB/s of a plain AVX2 read of the cache by the pool's threads: the ceiling the kernel is
// measured against.
double read_gbps(const std::vector<uint8_t>& cache, int reps) {
  constexpr int64_t kPiece = 1 << 20;
  const auto n = static_cast<int64_t>(cache.size());
  double best = 1e30;
  for (int r = 0; r <= reps; ++r) {
    std::vector<long long> sink(static_cast<size_t>(thread_pool().size()) * 8);
    const double t0 = now();
    thread_pool().parallel_for((n + kPiece - 1) / kPiece, 1, [&](int64_t b, int64_t e) {
      __m256i acc = _mm256_setzero_si256();
      for (int64_t i = b * kPiece; i < std::min(n, e * kPiece); i += 32)
        acc = _mm256_add_epi64(
            acc,
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(&cache[static_cast<size_t>(i)])));
      sink[static_cast<size_t>(b % thread_pool().size()) * 8] += _mm256_extract_epi64(acc, 0);
    });
    if (r > 0) best = std::min(best, now() - t0);  // the first read warms the pages
  }
  return static_cast<double>(n) / best / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    int64_t ctx = 256 * 1024;
    int32_t kv_heads = 8, group = 4, page = 256, reps = 10, layers = 0, rows = 1;
    std::vector<std::string> heads = {"64", "128", "256"},
                             types = {"q8_0/q8_0", "q8_0/q4_0", "q4_0/q4_0", "f16/f16"}, threads;
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      KVS_CHECK(i + 1 < argc, a, ": a value is missing");
      const std::string v = argv[++i];
      if (a == "--ctx")
        ctx = static_cast<int64_t>(parse_size(v.c_str(), "--ctx"));
      else if (a == "--kv-heads")
        kv_heads = std::stoi(v);
      else if (a == "--group")
        group = std::stoi(v);
      else if (a == "--heads")
        heads = split(v);
      else if (a == "--types")
        types = split(v);
      else if (a == "--threads")
        threads = split(v);
      else if (a == "--page")
        page = std::stoi(v);
      else if (a == "--reps")
        reps = std::stoi(v);
      else if (a == "--layers")
        layers = std::stoi(v);
      else if (a == "--rows")
        rows = std::stoi(v);
      else
        fail("unknown option ", a);
    }
    if (threads.empty())
      for (int t = 1; t <= hardware_threads(); t *= 2) threads.push_back(std::to_string(t));
    std::printf(
        "cpu attention, decode: %lld tokens, %d kv heads x %d query heads, pages of %d, "
        "%s%s; load average %s\n",
        static_cast<long long>(ctx), kv_heads, group, page, cpu::isa_name(cpu::best_isa()),
        layers > 0 ? (", " + std::to_string(layers) + " layers of " + std::to_string(rows) +
                      " query rows through a SplitWorker")
                         .c_str()
                   : "",
        loadavg().c_str());
    std::printf(
        "| K/V | head | threads | ms / call | GB/s | read GB/s | of read |\n"
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    for (const std::string& t : types) {
      const size_t slash = t.find('/');
      KVS_CHECK(slash != std::string::npos, "--types: ", t, " is not K/V");
      const DType kt = parse_kv_type(t.substr(0, slash).c_str(), "--types");
      const DType vt = parse_kv_type(t.substr(slash + 1).c_str(), "--types");
      for (const std::string& hs : heads) {
        const int32_t d = std::stoi(hs);
        const KvLayout l = KvLayout::make(kt, vt, page, kv_heads, d);
        const auto pages = static_cast<int32_t>((ctx + page - 1) / page);
        const int32_t n_layers = std::max(1, layers);
        const std::vector<uint8_t> cache = make_cache(l, pages * n_layers);
        std::vector<Span> spans;  // layer by layer
        for (int32_t p = 0; p < pages * n_layers; ++p)
          spans.push_back(
              {cache.data() + static_cast<size_t>(p) * l.page_bytes(), p % pages * page,
               static_cast<int32_t>(std::min<int64_t>(page, ctx - int64_t{p % pages} * page))});
        const int32_t n_head = kv_heads * group;
        std::vector<float> q(static_cast<size_t>(n_head) * d * rows, 0.5f), out(q.size()),
            acc(2 * static_cast<size_t>(n_head));
        const int32_t pos = static_cast<int32_t>(ctx - 1);
        AttentionArgs a;
        a.q = q.data();
        a.out = out.data();
        a.acc = acc.data();
        a.pos = &pos;
        a.n_tok = 1;
        a.spans = spans.data();
        a.n_spans = pages;
        a.kv = l;
        a.n_head = n_head;
        a.scale = 1.0f / std::sqrt(static_cast<float>(d));
        const double bytes = static_cast<double>(ctx) * static_cast<double>(l.k_row + l.v_row) *
                             static_cast<double>(n_layers) * (layers > 0 ? rows : 1);
        std::vector<int32_t> row_pos;
        for (int32_t r = 0; r < rows; ++r) row_pos.push_back(pos + r);
        const std::unique_ptr<Device> dev = make_cpu_device(size_t{1} << 20);
        const FlagId flag = dev->make_flag();
        const FenceId ready = dev->make_fence();  // the pages and queries, there from the start
        dev->record(Stream::Compute, ready);
        uint64_t ticket = 0;
        std::vector<float> part(static_cast<size_t>(n_head) * cpu::part_stride(d) * rows);
        for (const std::string& ts : threads) {
          set_thread_count(std::stoi(ts));
          std::unique_ptr<SplitWorker> worker;
          if (layers > 0)
            worker = std::make_unique<SplitWorker>(*dev, l, n_head, a.scale, thread_pool().size());
          const auto call = [&] {
            if (!worker) return cpu::attention(a);
            for (int32_t i = 0; i < layers; ++i) {
              SplitJob job;
              job.q = q.data();
              job.stored = job.q_ready = ready;
              job.flag = flag;
              job.ticket = ++ticket;
              job.entries.push_back(
                  {row_pos,
                   std::vector<Span>(spans.begin() + i * pages, spans.begin() + (i + 1) * pages),
                   part.data()});
              worker->post(std::move(job));
            }
            dev->wait_flag(Stream::Compute, flag, ticket);
            worker->check();
          };
          call();  // warm: the pool's threads, the scratch
          double best = 1e30, sum = 0;
          for (int r = 0; r < reps; ++r) {
            const double t0 = now();
            call();
            const double dt = now() - t0;
            best = std::min(best, dt);
            sum += dt;
          }
          const double mean = sum / reps, read = read_gbps(cache, 3);
          std::printf("| %s | %d | %d | %.2f (best %.2f) | %.1f (best %.1f) | %.1f | %.0f %% |\n",
                      t.c_str(), d, thread_pool().size(), mean * 1e3, best * 1e3,
                      bytes / mean / 1e9, bytes / best / 1e9, read,
                      100 * bytes / best / 1e9 / read);
          std::fflush(stdout);
        }
      }
    }
    std::printf("load average after: %s\n", loadavg().c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kvs_cpu_attention_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
