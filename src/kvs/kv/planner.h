// The planner: a pure, deterministic function from the arena, the page geometry, the live
// sequences and measured speeds to a partition of the arena into resident frames and ring slots.
//
// The arena is counted in frames of one page. `fixed_frames` are always reserved for pages being
// written (each sequence's tail page in every layer, plus the pages a prompt chunk fills); the
// rest hold resident pages or form the ring. Resident pages are a prefix of each sequence's
// history in every layer: an equal share across layers, and frames left over from the equal
// share give one more page to the first layers. Pages past a layer's cap stream.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace kvs {

struct PlanInput {
  size_t arena_bytes = 0;
  size_t page_bytes = 0;
  int32_t n_layer = 0;
  int32_t fixed_frames = 0;
  // Per live sequence: pages per layer, the one being written (the tail, in a fixed frame)
  // included.
  std::vector<int32_t> seq_pages;
  double h2d_bytes_per_s = 0;      // measured host-to-device bandwidth
  double layer_s = 0;              // compute time of one layer of a step with all data present
  double stall_s = 0;              // time a step waited on ready fences (feedback)
  size_t min_chunk_bytes = size_t{16} << 20;  // the smallest copy that reaches full bandwidth
  bool force_ring = false;                    // --kv-mode stream: a ring even when all fits
  int32_t min_slots = 0;                      // --ring-slots: at least this many slots (0: 2)
  // --kv-mode split: the CPU attends to some of the pages that would stream, from the host
  // store, at its measured rate (bytes of K and V a second; 0: not measured yet).
  // A step's query rows a sequence's CPU pages serve (a verify step's token and drafts): the
  // CPU attends to each page once for each, the rate being of one row.
  bool split = false;
  double cpu_bytes_per_s = 0;
  int32_t cpu_rows = 1;
  double split_share = 0;  // > 0: the CPU's share, whatever the rates
};

constexpr int32_t kUnlimited = INT32_MAX;

struct Plan {
  std::vector<int32_t> resident;  // per sequence: resident pages per layer (kUnlimited: all)
  std::vector<int32_t> extra;     // per sequence: layers [0, extra) keep one page more
  int32_t slot_pages = 0;         // pages per ring slot
  int32_t n_slots = 0;            // 0: no ring, everything resident
  int64_t streamed_pages = 0;     // pages copied per decode step, all layers and sequences
  size_t streamed_bytes = 0;      // the same in bytes: S
  // Split: per sequence, pages per layer the CPU attends instead of streaming them (the last
  // complete ones before the tail page; empty or zeros: none), and their bytes in all layers.
  std::vector<int32_t> cpu;
  size_t cpu_bytes = 0;
  double gpu_s = 0;             // T_gpu: a step's compute with all data present
  double copy_s = 0;            // S / B
  double cpu_s = 0;             // the CPU's bytes at its rate, for each of its rows
  double predicted_step_s = 0;  // max(T_gpu, S / B, the CPU's side)
  // Split: the CPU's side of a step, its pages' time and the device's, with which each layer's
  // CPU partial is serial (it waits for the queries that the layer before's work makes).
  double cpu_side_s() const { return cpu_bytes > 0 ? cpu_s + gpu_s : 0.0; }
  const char* bound() const;  // the largest of the three: "gpu", "pcie" or "cpu"
  int32_t ring_frames() const { return slot_pages * n_slots; }
  bool streams() const { return n_slots > 0; }
  bool operator==(const Plan&) const = default;
};

// Resident pages of layer l of sequence s under plan p.
inline int32_t resident_cap(const Plan& p, size_t s, int32_t l) {
  const int32_t r = p.resident[s];
  return r == kUnlimited ? r : r + (l < p.extra[s] ? 1 : 0);
}

// The planner's measured figures (rates, times) from one step's: an exponential average that
// takes the first measurement as it is (old == 0: none yet).
inline double ema(double old, double x) {
  return old == 0 ? x : 0.7 * old + 0.3 * x;
}

// The smallest arena that can run: the fixed frames plus one ring slot of one page.
size_t min_arena_bytes(size_t page_bytes, int32_t fixed_frames);

// The partition for `in`. With `previous`, keeps its ring while the new ideal is close to it and
// its resident caps while they still fit, and (split) its CPU pages while the step they predict
// at the new rates is within a thirty-second of the new share's (hysteresis), so the layout
// changes rarely. The CPU takes the share of the pages that would stream whose time, with the
// device's (T_gpu), matches the ring's copy of the rest: B_cpu / (B_cpu + B) where T_gpu is
// small, half while a rate is unknown.
Plan plan(const PlanInput& in, const Plan* previous = nullptr);

// Split between repartitions: `current`'s layout (caps, ring) with the CPU's pages and the
// times for the rates in `in`, the same hysteresis against `current`. A new share moves no
// page between frames, so the engine calls it every step as the rates are measured.
Plan resplit(const PlanInput& in, const Plan& current);

}  // namespace kvs
