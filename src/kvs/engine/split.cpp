#include "kvs/engine/split.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <utility>

#include "kvs/backend/cpu/host_attention.h"
#include "kvs/util/error.h"
#include "kvs/util/parse.h"

namespace kvs {

SplitWorker::SplitWorker(Device& dev, const KvLayout& kv, int32_t n_head, float scale,
                         int32_t threads, const std::vector<int>& cpus)
    : dev_(dev), kv_(kv), n_head_(n_head), scale_(scale), pool_(threads, cpus) {
  const int cpu = cpus.empty() ? -1 : cpus[0];
  thread_ = std::thread([this, cpu] {
    if (cpu >= 0) pin_this_thread(cpu);
    loop();
  });
}

SplitWorker::~SplitWorker() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void SplitWorker::post(SplitJob job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    jobs_.push_back(std::move(job));
  }
  cv_.notify_one();
}

double SplitWorker::busy_seconds() const {
  std::lock_guard<std::mutex> lock(mu_);
  return busy_s_;
}

size_t SplitWorker::bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_;
}

double SplitWorker::calibrate(size_t bytes) {
  const int32_t P = kv_.page_size;
  const size_t page = kv_.page_bytes();
  const int32_t n_pages = static_cast<int32_t>(std::max<size_t>(4, bytes / page));
  // One page of uniform rows in the cache's own quantization, copied into the others: the
  // kernels' work does not depend on the values, only on their types.
  const size_t kvd = static_cast<size_t>(kv_.n_head_kv) * static_cast<size_t>(kv_.head_dim);
  std::vector<float> k(static_cast<size_t>(P) * kvd), v(k.size());
  uint32_t x = 0x2545F491u;
  const auto uniform = [&x] {  // xorshift32, top 24 bits in [-1, 1)
    x ^= x << 13, x ^= x >> 17, x ^= x << 5;
    return static_cast<float>(x >> 8) * (2.0f / 16777216.0f) - 1.0f;
  };
  for (size_t i = 0; i < k.size(); ++i) k[i] = uniform(), v[i] = uniform();
  std::vector<uint8_t> mem(static_cast<size_t>(n_pages) * page);
  std::vector<uint8_t*> dst(static_cast<size_t>(P), mem.data());
  std::vector<int32_t> slot(static_cast<size_t>(P));
  for (int32_t j = 0; j < P; ++j) slot[static_cast<size_t>(j)] = j;
  cpu::kv_write(kv_, k.data(), v.data(), P, dst.data(), slot.data());
  std::vector<Span> spans;
  for (int32_t i = 0; i < n_pages; ++i) {
    if (i > 0) std::memcpy(mem.data() + static_cast<size_t>(i) * page, mem.data(), page);
    spans.push_back({mem.data() + static_cast<size_t>(i) * page, i * P, P});
  }
  std::vector<float> q(static_cast<size_t>(n_head_) * static_cast<size_t>(kv_.head_dim));
  for (float& f : q) f = uniform();
  const size_t row = static_cast<size_t>(n_head_) * cpu::part_stride(kv_.head_dim);
  const int32_t pos = n_pages * P;
  AttentionArgs a;
  a.q = q.data();
  a.pos = &pos;
  a.n_tok = 1;
  a.spans = spans.data();
  a.n_spans = n_pages;
  a.kv = kv_;
  a.n_head = n_head_;
  a.scale = scale_;
  rows_.resize(std::max(rows_.size(), spans.size() * row));
  std::vector<float> out(row);
  const auto pass = [&] {
    cpu::decode_partials(a, pool_, rows_.data());
    cpu::merge_partials(a, rows_.data(), pool_, out.data());
  };
  pass();  // untimed: the pages' first touch, the pool's threads waking
  constexpr int kPasses = 3;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < kPasses; ++i) pass();
  const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return t > 0 ? static_cast<double>(kPasses) * static_cast<double>(mem.size()) / t : 0.0;
}

void SplitWorker::check() {
  std::exception_ptr e;
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::swap(e, error_);
  }
  if (e) std::rethrow_exception(e);
}

void SplitWorker::loop() {
  for (;;) {
    SplitJob job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
      if (jobs_.empty()) return;  // stopping, nothing left
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    run(job);
  }
}

void SplitWorker::run(const SplitJob& job) {
  size_t k = 0;
  try {
    dev_.wait_host(job.stored);
    dev_.wait_host(job.q_ready);
    const size_t row = static_cast<size_t>(n_head_) * cpu::part_stride(kv_.head_dim);
    const float* q = job.q;
    for (; k < job.entries.size(); ++k) {
      const auto t0 = std::chrono::steady_clock::now();
      const SplitEntry& e = job.entries[k];
      const auto n = static_cast<int32_t>(e.pos.size());
      AttentionArgs a;
      a.q = q;
      a.pos = e.pos.data();
      a.n_tok = n;
      a.spans = e.spans.data();
      a.n_spans = static_cast<int32_t>(e.spans.size());
      a.kv = kv_;
      a.n_head = n_head_;
      a.scale = scale_;
      q += static_cast<size_t>(n) * static_cast<size_t>(n_head_) * static_cast<size_t>(kv_.head_dim);
      if (job.per_span) {
        cpu::decode_partials(a, pool_, e.out);
      } else {
        const size_t per_row = e.spans.size() * row;
        rows_.resize(std::max(rows_.size(), static_cast<size_t>(n) * per_row));
        cpu::decode_partials(a, pool_, rows_.data());
        for (int32_t t = 0; t < n; ++t)
          cpu::merge_partials(a, rows_.data() + t * per_row, pool_, e.out + t * row);
      }
      // Bytes a row attended to: a verify step's rows count once each, as the planner's rate.
      size_t bytes = 0;
      for (const Span& s : e.spans) bytes += static_cast<size_t>(s.n) * (kv_.k_row + kv_.v_row);
      bytes *= static_cast<size_t>(n);
      {  // counted before the flag: the step that waits for it then sees them
        std::lock_guard<std::mutex> lock(mu_);
        busy_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        bytes_ += bytes;
      }
      dev_.raise(job.flag, job.ticket + k);
    }
  } catch (...) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!error_) error_ = std::current_exception();
    }
    if (!job.entries.empty()) dev_.raise(job.flag, job.ticket + job.entries.size() - 1);
  }
}

int32_t default_split_threads() {
  return std::max(1, default_thread_count() - 1);
}

SplitThreads place_split_threads(const std::vector<int>& cpus, int32_t threads, bool pinned) {
  const std::vector<int> allowed = allowed_cpus();
  if (cpus.empty()) {
    const int32_t n = threads > 0 ? threads : default_split_threads();
    if (!pinned || static_cast<size_t>(n) >= allowed.size()) return {n, {}};
    return {n, {allowed.end() - n, allowed.end()}};
  }
  KVS_CHECK(threads <= 0 || threads == static_cast<int32_t>(cpus.size()), "--split-threads ",
            threads, " with --split-cpus of ", cpus.size(),
            " CPUs: a thread runs on each CPU, give one or the other");
  for (auto c = cpus.begin(); c != cpus.end(); ++c) {
    KVS_CHECK(std::find(allowed.begin(), allowed.end(), *c) != allowed.end(), "--split-cpus: CPU ",
              *c, " is not one this process may run on (", cpu_list_name(allowed), ")");
    KVS_CHECK(std::find(cpus.begin(), c, *c) == c, "--split-cpus: CPU ", *c, " is listed twice");
  }
  return {static_cast<int32_t>(cpus.size()), cpus};
}

// ---- the engine's controller ----

SplitAttention::SplitAttention(Device& dev, const ModelConfig& c, const KvLayout& kv, int32_t n_seq,
                               int32_t rows, int32_t n_full, int32_t max_pages,
                               SplitThreads placed)
    : dev_(dev),
      kv_(kv),
      n_rows_(n_seq * std::max(1, rows)),
      q_dim_(c.q_dim()),
      row_(static_cast<size_t>(c.n_head) * cpu::part_stride(c.head_dim)),
      per_span_(dev.caps().cpu_partials),
      placed_(std::move(placed)) {
  const size_t parts =
      static_cast<size_t>(n_rows_) * static_cast<size_t>(per_span_ ? std::max(1, max_pages) : 1);
  const size_t f = sizeof(float);
  q_ = dev.alloc_host(
      static_cast<size_t>(n_full) * static_cast<size_t>(n_rows_) * static_cast<size_t>(q_dim_) * f,
      "split attention: queries");
  for (DeviceBuffer& b : part_) b = dev.alloc_host(parts * row_ * f, "split attention: partials");
  for (int32_t l = 0; l < n_full; ++l) q_ready_.push_back(dev.make_fence());
  stored_ = dev.make_fence();
  flag_ = dev.make_flag();
  tickets_.assign(static_cast<size_t>(n_seq), 0);
  place_.assign(static_cast<size_t>(n_seq), 0);
  worker_ =
      std::make_unique<SplitWorker>(dev, kv, c.n_head, c.attn_scale, placed_.threads, placed_.cpus);
}

void SplitAttention::assume_rate(double given, bool share_fixed, size_t bytes) {
  if (given > 0)
    assumed_ = given;
  else if (!share_fixed)
    assumed_ = worker_->calibrate(bytes);
}

void SplitAttention::measured(double seconds, size_t bytes) {
  if (seconds > 0 && bytes > 0) rate_ = ema(rate_, static_cast<double>(bytes) / seconds);
}

std::pair<int32_t, int32_t> SplitAttention::pages(const Plan& plan, int32_t s, int32_t layer,
                                                  int32_t done) const {
  const auto i = static_cast<size_t>(s);
  if (plan.cpu.empty() || plan.cpu[i] == 0) return {0, 0};
  return {std::max(std::min(done, resident_cap(plan, i, layer)), done - plan.cpu[i]), done};
}

void SplitAttention::begin_step() {
  dev_.record(Stream::CopyOut, stored_);
  busy0_ = worker_->busy_seconds();
  bytes0_ = worker_->bytes();
}

std::pair<double, size_t> SplitAttention::end_step() {
  worker_->check();
  return {worker_->busy_seconds() - busy0_, worker_->bytes() - bytes0_};
}

void SplitAttention::post(int32_t layer, const std::vector<SplitQuery>& queries, const float* q,
                          HostStore& host) {
  const int32_t P = kv_.page_size;
  float* out = part_[layer % 2].as<float>();
  size_t place = 0;
  SplitJob job;
  job.per_span = per_span_;
  for (size_t i = 0; i < queries.size(); ++i) {
    const SplitQuery& e = queries[i];
    tickets_[i] = 0;
    if (e.from >= e.to) continue;
    SplitEntry se;
    for (int32_t t = 0; t < e.n; ++t) se.pos.push_back(e.pos + t);
    for (int32_t p = e.from; p < e.to; ++p)
      se.spans.push_back({host.page(e.seq, layer, p), p * P, P});
    se.out = out + place;
    place_[i] = place;
    place += row_ * static_cast<size_t>(e.n) * (per_span_ ? se.spans.size() : 1);
    tickets_[i] = ticket_ + 1 + job.entries.size();
    job.entries.push_back(std::move(se));
  }
  if (job.entries.empty()) return;
  // Each entry's query rows, in job order (a pass with prompts has more rows than the buffer).
  const auto qd = static_cast<size_t>(q_dim_);
  float* rows = q_.as<float>() + static_cast<size_t>(layer) * static_cast<size_t>(n_rows_) * qd;
  size_t k = 0;
  for (size_t i = 0; i < queries.size(); ++i)
    if (tickets_[i] != 0) {
      const auto n = static_cast<size_t>(queries[i].n);
      KVS_CHECK(k + n <= static_cast<size_t>(n_rows_), "split attention: ", k + n,
                " query rows in a layer, more than its ", n_rows_, "; this is a bug");
      dev_.copy(Stream::Compute, rows + qd * k, q + static_cast<size_t>(queries[i].row) * qd,
                n * qd * sizeof(float));
      k += n;
    }
  dev_.record(Stream::Compute, q_ready_[static_cast<size_t>(layer)]);
  job.stored = stored_;
  job.q_ready = q_ready_[static_cast<size_t>(layer)];
  job.q = rows;
  job.flag = flag_;
  job.ticket = ticket_ + 1;
  ticket_ += job.entries.size();
  worker_->post(std::move(job));
}

void SplitAttention::fold(int32_t layer, int32_t i, int32_t pages, AttentionArgs& a) {
  dev_.wait_flag(Stream::Compute, flag_, tickets_[static_cast<size_t>(i)]);
  const float* part = part_[layer % 2].as<float>() + place_[static_cast<size_t>(i)];
  const auto qd = static_cast<size_t>(q_dim_);
  for (int32_t t = 0; t < a.n_tok; ++t) {
    AttentionArgs g = a;
    g.q = a.q + t * qd;
    g.out = a.out + t * qd;
    g.acc = a.acc + 2 * static_cast<size_t>(t) * static_cast<size_t>(a.n_head);
    g.pos = a.pos + t;
    g.n_tok = 1;
    g.spans = nullptr;
    g.n_spans = per_span_ ? pages : 1;
    g.last = false;
    dev_.fold(g, part + static_cast<size_t>(t) * static_cast<size_t>(g.n_spans) * row_);
  }
  a.first = false;
}

}  // namespace kvs
