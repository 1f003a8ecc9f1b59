#include "kvs/kv/planner.h"

#include <algorithm>
#include <cmath>

#include "kvs/util/error.h"
#include "kvs/util/parse.h"

namespace kvs {
namespace {

// Resident frames of all layers when sequence s keeps cap[s] pages per layer, plus one in
// its first extra[s] layers.
int64_t resident_frames(const std::vector<int32_t>& pages, const std::vector<int32_t>& cap,
                        const std::vector<int32_t>& extra, int32_t n_layer) {
  int64_t n = 0;
  for (size_t s = 0; s < pages.size(); ++s) {
    n += int64_t{std::min(pages[s], cap[s])} * n_layer;
    if (cap[s] != kUnlimited && pages[s] > cap[s]) n += extra[s];
  }
  return n;
}

// Water-filling: one cap for every sequence, the largest whose resident pages fit in `frames`;
// the frames left over give one more page to the first layers of the first sequences.
void fill(const std::vector<int32_t>& pages, int64_t frames, int32_t n_layer,
          std::vector<int32_t>& cap, std::vector<int32_t>& extra) {
  cap.assign(pages.size(), kUnlimited);
  extra.assign(pages.size(), 0);
  if (resident_frames(pages, cap, extra, n_layer) <= frames) return;
  int32_t lo = 0, hi = *std::max_element(pages.begin(), pages.end());
  while (lo < hi) {  // the largest r with resident(r) <= frames
    const int32_t r = lo + (hi - lo + 1) / 2;
    std::fill(cap.begin(), cap.end(), r);
    if (resident_frames(pages, cap, extra, n_layer) <= frames)
      lo = r;
    else
      hi = r - 1;
  }
  std::fill(cap.begin(), cap.end(), lo);
  int64_t left = frames - resident_frames(pages, cap, extra, n_layer);
  for (size_t s = 0; s < pages.size() && left > 0; ++s)
    if (pages[s] > lo) {
      extra[s] = static_cast<int32_t>(std::min<int64_t>(n_layer, left));
      left -= extra[s];
    }
}

// Split: the pages the CPU takes when sequence s gives it `c[s]` pages per layer (the last
// ones past its cap before the tail page; layers [0, extra) hold one page more on the device).
int64_t cpu_taken(const PlanInput& in, const Plan& p, const std::vector<int32_t>& c) {
  int64_t taken = 0;
  for (size_t s = 0; s < c.size(); ++s) {
    const int32_t past = std::max(0, in.seq_pages[s] - 1 - p.resident[s]);
    for (int32_t l = 0; l < in.n_layer; ++l)
      taken += std::min(c[s], std::max(0, past - (l < p.extra[s] ? 1 : 0)));
  }
  return taken;
}

// The CPU's rate for a step's rows: bytes of its pages a second.
double cpu_rate(const PlanInput& in) {
  return in.cpu_bytes_per_s / std::max(1, in.cpu_rows);
}

// The step's bound when the CPU takes `taken` of the `streamed` pages (both rates known): the
// device's time, the ring's, or the CPU's side, which is its pages' time plus the device's.
// Each layer's CPU partial waits for the layer's queries, which wait for the device's work on
// the layer before (its fold, the feed-forward, the projections); the ring copies ahead across
// layers meanwhile.
double step_s(const PlanInput& in, int64_t streamed, int64_t taken) {
  const auto bytes = [&](int64_t n) {
    return static_cast<double>(n) * static_cast<double>(in.page_bytes);
  };
  const double gpu_s = in.layer_s * in.n_layer;
  return std::max({gpu_s, bytes(streamed - taken) / in.h2d_bytes_per_s,
                   taken > 0 ? bytes(taken) / cpu_rate(in) + gpu_s : 0.0});
}

// The CPU's share of the streamed bytes S that balances its side with the ring's:
// x / B_cpu + T_gpu = (S - x) / B, B_cpu / (B_cpu + B) when T_gpu is nothing beside them.
double balanced_share(const PlanInput& in, int64_t streamed) {
  const double s = static_cast<double>(streamed) * static_cast<double>(in.page_bytes);
  if (s <= 0) return 0;
  const double x = (s / in.h2d_bytes_per_s - in.layer_s * in.n_layer) /
                   (1 / cpu_rate(in) + 1 / in.h2d_bytes_per_s);
  return std::clamp(x / s, 0.0, 1.0);
}

// Split: each sequence's CPU pages, a share of those past its cap before the tail page (the
// balanced one, half while a rate is unknown), taken from the streamed pages. The previous
// plan's pages stay while the step they predict is within
// a thirty-second of the new one's: measured rates jitter, and a new share costs the ring its
// prefetched chunks.
void split_pages(const PlanInput& in, const Plan* prev, Plan& p) {
  const bool rates = in.cpu_bytes_per_s > 0 && in.h2d_bytes_per_s > 0;
  const double share = in.split_share > 0 ? in.split_share
                       : rates            ? balanced_share(in, p.streamed_pages)
                                          : 0.5;
  const std::vector<int32_t>& pages = in.seq_pages;
  p.cpu.assign(pages.size(), 0);
  std::vector<int32_t> kept(pages.size(), 0);
  for (size_t s = 0; s < pages.size(); ++s) {
    if (p.resident[s] == kUnlimited) continue;
    const int32_t past = std::max(0, pages[s] - 1 - p.resident[s]);
    p.cpu[s] = std::clamp(static_cast<int32_t>(std::lround(share * past)), 0, past);
    if (prev && s < prev->cpu.size()) kept[s] = std::clamp(prev->cpu[s], 0, past);
  }
  int64_t taken = cpu_taken(in, p, p.cpu);
  if (prev && in.split_share == 0 && kept != p.cpu) {
    const int64_t kept_taken = cpu_taken(in, p, kept);
    if (rates && step_s(in, p.streamed_pages, kept_taken) <=
                     step_s(in, p.streamed_pages, taken) * (1 + 1.0 / 32)) {
      p.cpu = kept;
      taken = kept_taken;
    }
  }
  p.streamed_pages -= taken;
  p.cpu_bytes = static_cast<size_t>(taken) * in.page_bytes;
}

// The streamed pages of p's caps (those past a layer's cap but the last, which is being
// written in its fixed frame), then (split) the CPU's, then the times.
void finish(const PlanInput& in, const Plan* prev, Plan& p) {
  p.streamed_pages = 0;
  for (size_t s = 0; s < in.seq_pages.size(); ++s)
    for (int32_t l = 0; p.resident[s] != kUnlimited && l < in.n_layer; ++l)
      p.streamed_pages += std::max(0, in.seq_pages[s] - 1 - resident_cap(p, s, l));
  p.cpu.clear();
  p.cpu_bytes = 0;
  if (in.split) split_pages(in, prev, p);
  p.streamed_bytes = static_cast<size_t>(p.streamed_pages) * in.page_bytes;
  p.gpu_s = in.layer_s * in.n_layer;
  p.copy_s =
      in.h2d_bytes_per_s > 0 ? static_cast<double>(p.streamed_bytes) / in.h2d_bytes_per_s : 0.0;
  p.cpu_s = in.cpu_bytes_per_s > 0 ? static_cast<double>(p.cpu_bytes) / cpu_rate(in) : 0.0;
  p.predicted_step_s = std::max({p.gpu_s, p.copy_s, p.cpu_side_s()});
}

}  // namespace

size_t min_arena_bytes(size_t page_bytes, int32_t fixed_frames) {
  return (static_cast<size_t>(fixed_frames) + 1) * page_bytes;
}

Plan plan(const PlanInput& in, const Plan* previous) {
  KVS_CHECK(in.page_bytes > 0 && in.n_layer > 0, "planner: empty page geometry");
  const size_t need = min_arena_bytes(in.page_bytes, in.fixed_frames);
  KVS_CHECK(in.arena_bytes >= need, "the KV arena of ", format_bytes(in.arena_bytes),
            " is below the minimum of ", format_bytes(need), " (", in.fixed_frames,
            " frames for the pages being written plus one ring slot, of ",
            format_bytes(in.page_bytes),
            " each); raise --kv-arena or --vram-limit, or lower "
            "--page-size");
  const int64_t frames = static_cast<int64_t>(in.arena_bytes / in.page_bytes) - in.fixed_frames;
  const int32_t L = in.n_layer;
  const std::vector<int32_t>& pages = in.seq_pages;
  const Plan* prev = previous && previous->resident.size() == pages.size() ? previous : nullptr;

  Plan p;
  p.resident.assign(pages.size(), kUnlimited);
  p.extra.assign(pages.size(), 0);
  int64_t demand = 0;
  for (int32_t n : pages) demand += int64_t{n} * L;
  // Back to all-resident only with a ring's worth of frames to spare, so a plan does not flip
  // between the two at one page.
  const int64_t spare = prev && prev->streams() ? prev->ring_frames() : 0;
  if (!in.force_ring && demand + spare <= frames) {
    p.gpu_s = in.layer_s * L;
    p.predicted_step_s = p.gpu_s;
    return p;
  }

  // The ring covers the copy engine's bandwidth-delay product: what lands while the compute
  // works through one layer (with a margin for jitter, and more when steps stalled), in slots
  // large enough for full-bandwidth copies, at least two so one fills while one is read.
  int32_t slot_pages = static_cast<int32_t>(
      std::max<size_t>(1, (in.min_chunk_bytes + in.page_bytes - 1) / in.page_bytes));
  const double slot_bytes = static_cast<double>(slot_pages) * static_cast<double>(in.page_bytes);
  const double bdp =
      in.h2d_bytes_per_s * (1.5 * in.layer_s + (in.stall_s > 0 ? in.stall_s / L : 0.0));
  int32_t n_slots = std::max({2, in.min_slots, static_cast<int32_t>(std::ceil(bdp / slot_bytes))});
  if (prev && prev->streams() && prev->slot_pages == slot_pages &&
      std::abs(prev->n_slots - n_slots) <= std::max(1, prev->n_slots / 4))
    n_slots = prev->n_slots;
  // No more ring than one step streams.
  {
    std::vector<int32_t> cap, extra;
    fill(pages, std::max<int64_t>(0, frames - slot_pages), L, cap, extra);
    const int64_t streamed = demand - resident_frames(pages, cap, extra, L);
    n_slots = std::min<int64_t>(
        n_slots, std::max<int64_t>(2, (streamed + slot_pages - 1) / std::max(1, slot_pages)));
  }
  // The ring takes at most an eighth of the frames (every other frame holds a resident page and
  // saves its bytes each step), but two slots while there are two frames.
  const int64_t ring_max = std::max<int64_t>(std::min<int64_t>(frames, 2), frames / 8);
  if (int64_t{slot_pages} * n_slots > ring_max) {
    n_slots = static_cast<int32_t>(std::clamp<int64_t>(ring_max / slot_pages, 2, n_slots));
    if (n_slots > ring_max) n_slots = static_cast<int32_t>(ring_max);
    slot_pages = static_cast<int32_t>(std::max<int64_t>(1, ring_max / n_slots));
  }
  p.slot_pages = slot_pages;
  p.n_slots = n_slots;

  const int64_t res_frames = frames - p.ring_frames();
  fill(pages, res_frames, L, p.resident, p.extra);
  // Keep the previous caps while they fit and the new ones would grow by no more than a page.
  if (prev && prev->ring_frames() == p.ring_frames() &&
      resident_frames(pages, prev->resident, prev->extra, L) <= res_frames) {
    bool close = true;
    for (size_t s = 0; s < pages.size(); ++s)
      if (p.resident[s] != kUnlimited && prev->resident[s] != kUnlimited &&
          p.resident[s] > prev->resident[s] + 1)
        close = false;
    if (close) {
      p.resident = prev->resident;
      p.extra = prev->extra;
    }
  }
  finish(in, prev, p);
  return p;
}

Plan resplit(const PlanInput& in, const Plan& current) {
  Plan p = current;
  if (!in.split || !p.streams() || p.resident.size() != in.seq_pages.size()) return p;
  finish(in, &current, p);
  return p;
}

const char* Plan::bound() const {
  if (copy_s >= cpu_side_s() && copy_s >= gpu_s) return "pcie";
  return cpu_side_s() > gpu_s ? "cpu" : "gpu";
}

}  // namespace kvs
