// Split attention's CPU side (--kv-mode split): while the ring streams some of a layer's
// non-resident pages to the device, a thread with a pool of its own computes the partials of
// the others straight from the host store, as soon as the layer's queries reach host memory,
// and folds them in logical order into one partial per sequence and head, in pinned memory (a
// few KiB a layer cross the bus, not a row per page); a flag tells the device it is there, and
// the device folds it with its own partials in its logical place (Engine::attend). A device
// whose partials are the CPU's (Device::Caps::cpu_partials) gets the row of each span instead.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "kvs/backend/device.h"
#include "kvs/kv/host_store.h"
#include "kvs/kv/planner.h"
#include "kvs/model/model.h"
#include "kvs/quant/kv_page.h"
#include "kvs/util/threadpool.h"

namespace kvs {

// One sequence's part of a layer's job: its query rows (one, or a verify step's token and
// drafts), the host pages the CPU attends and where their partials go: per row, n_head rows of
// part_stride(head size) floats (host_attention.h's), or with SplitJob::per_span those of each
// span in turn.
struct SplitEntry {
  std::vector<int32_t> pos;  // the query rows' positions
  std::vector<Span> spans;   // pages of the host store, in logical order
  float* out = nullptr;
};

// A layer's work for the CPU. The worker waits for `stored` (the write-backs of the pages it
// reads have landed) and `q_ready` (the queries are in q, the entries' rows in turn), then
// writes entry k's partials and raises `flag` to ticket + k.
struct SplitJob {
  FenceId stored = -1, q_ready = -1;
  const float* q = nullptr;  // [rows][n_head * head_dim]
  FlagId flag = -1;
  uint64_t ticket = 0;
  bool per_span = false;
  std::vector<SplitEntry> entries;
};

class SplitWorker {
 public:
  // `threads` for its pool: apart from the global one, so that the thread issuing the device's
  // work is not slowed by the CPU's attention; where `cpus` (threads of them) is given, thread
  // t runs on cpus[t] alone, the worker's own thread on cpus[0].
  SplitWorker(Device& dev, const KvLayout& kv, int32_t n_head, float scale, int32_t threads,
              const std::vector<int>& cpus = {});
  ~SplitWorker();
  SplitWorker(const SplitWorker&) = delete;
  SplitWorker& operator=(const SplitWorker&) = delete;

  void post(SplitJob job);
  // The rate (bytes of K and V a second) at which the pool attends to `bytes` of pages of the
  // cache's types, one query against all of them as a decode step's does (a few passes, the
  // first untimed): the planner's first share, before a step has measured it. Call it before
  // the first post.
  double calibrate(size_t bytes);
  // Seconds spent computing partials, and bytes of K and V read, since it started.
  double busy_seconds() const;
  size_t bytes() const;
  // Rethrows the first error a job met. A failed job raises its flags all the same, so the
  // device never waits forever; the engine calls this after each step.
  void check();

 private:
  void loop();
  void run(const SplitJob& job);

  Device& dev_;
  KvLayout kv_;
  int32_t n_head_;
  float scale_;
  ThreadPool pool_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<SplitJob> jobs_;
  std::vector<float> rows_;  // an entry's partials, a row per span and head
  bool stop_ = false;
  double busy_s_ = 0;  // guarded by mu_
  size_t bytes_ = 0;
  std::exception_ptr error_;
  std::thread thread_;
};

// Threads for the worker's pool by default: all but one, which issues the device's work.
int32_t default_split_threads();
// The worker's threads and the CPUs they run on (empty: not pinned), from --split-cpus (`cpus`,
// checked: CPUs this process may use, each once, as many as `threads` where that is given),
// else `threads` (0: default_split_threads) on the last of the CPUs this process may use, the
// first left to the thread that issues the device's work, unless `pinned` is off or they would
// leave none.
struct SplitThreads {
  int32_t threads = 0;
  std::vector<int> cpus;
};
SplitThreads place_split_threads(const std::vector<int>& cpus, int32_t threads, bool pinned);

// One entry of a pass as the CPU's side sees it: its sequence, its first query's position and
// row in the pass, its rows (n, at consecutive positions), and the host store's pages
// [from, to) that the CPU attends for each row (from == to: none).
struct SplitQuery {
  int32_t seq = 0, pos = 0, row = 0, n = 1, from = 0, to = 0;
};

// The engine's split controller: the worker; each full layer's queries in pinned memory and the
// fence of their copy; the CPU's partials in pinned memory (a layer's and the one before's: the
// worker writes one while the device may still read the other), a row per head and query row,
// or per head, page and query row where the device folds the CPU's rows of each span (per_span);
// the write-backs' fence, the flag, the current layer's entries' tickets and places among its
// partials; and the CPU's rate for the planner, measured or assumed.
class SplitAttention {
 public:
  // For n_seq sequences of at most `rows` query rows a step (EngineOptions::n_verify) and
  // max_pages pages in each of n_full full layers, the worker on `placed`'s threads.
  SplitAttention(Device& dev, const ModelConfig& c, const KvLayout& kv, int32_t n_seq,
                 int32_t rows, int32_t n_full, int32_t max_pages, SplitThreads placed);
  SplitAttention(const SplitAttention&) = delete;
  SplitAttention& operator=(const SplitAttention&) = delete;
  // The worker finishes its posted jobs and goes, before the device's last sync: they read the
  // buffers and the pages, which must outlive them.
  void stop() { worker_.reset(); }

  const SplitThreads& placed() const { return placed_; }
  // The rate (bytes a second) the planner assumes until a step measures it: `given`
  // (--cpu-gbps), none where the share is fixed (--split-share), else the worker's calibration
  // on `bytes` of pages.
  void assume_rate(double given, bool share_fixed, size_t bytes);
  double rate() const { return rate_ > 0 ? rate_ : assumed_; }
  void measured(double seconds, size_t bytes);

  // Of sequence s's `done` complete pages at full layer `layer` (among the full layers), the
  // last plan.cpu[s] that the device does not hold: the tail page, always on the device,
  // follows them.
  std::pair<int32_t, int32_t> pages(const Plan& plan, int32_t s, int32_t layer, int32_t done) const;
  // A step begins: the CPU reads pages whose write-backs were issued before it.
  void begin_step();
  // A step ended: rethrows the worker's error; the CPU's seconds and bytes in it.
  std::pair<double, size_t> end_step();
  // The layer's queries (rows of q, on the device) go to the host after the rope, and the
  // worker gets the layer's pages of the host store.
  void post(int32_t layer, const std::vector<SplitQuery>& queries, const float* q, HostStore& host);
  // Entry i's partials of its CPU pages into the state of a's rows, one fold a row (a device
  // folds one token's): once the worker has raised the flag, on the device (after the device's
  // own pages before them).
  void fold(int32_t layer, int32_t i, int32_t pages, AttentionArgs& a);

 private:
  Device& dev_;
  KvLayout kv_;
  int32_t n_rows_, q_dim_;  // query rows of a layer: sequences x rows
  size_t row_;  // floats of one partial: a row per head
  DeviceBuffer q_, part_[2];
  std::vector<FenceId> q_ready_;
  FenceId stored_ = -1;
  FlagId flag_ = -1;
  uint64_t ticket_ = 0;
  std::vector<uint64_t> tickets_;  // 0: none
  std::vector<size_t> place_;      // floats from the start
  bool per_span_ = false;
  double busy0_ = 0;  // the worker's figures when the step began
  size_t bytes0_ = 0;
  double rate_ = 0, assumed_ = 0;
  SplitThreads placed_;
  std::unique_ptr<SplitWorker> worker_;
};

}  // namespace kvs
