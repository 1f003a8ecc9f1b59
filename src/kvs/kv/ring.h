// The ring schedule: the fixed visiting order of a step's non-resident pages (layer, sequence,
// page), cut into chunks of one slot each, copied host-to-device on the CopyIn stream ahead of
// the compute by as many slots as the ring holds. Each slot has a *ready* fence (its copy has
// landed; the compute waits on it) and a *consumed* fence (its last reader is done; the next copy
// into it waits on it). The schedule is cyclic: once a step's chunks are all issued, the first
// chunks of the next step (as projected by the engine) are prefetched into the freed slots.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kvs/backend/device.h"
#include "kvs/kv/device_pool.h"
#include "kvs/kv/host_store.h"

namespace kvs {

struct RingItem {
  int32_t layer = 0, seq = 0, page = 0;
  bool operator==(const RingItem&) const = default;
};

struct RingStats {
  size_t bytes_in = 0;           // copied host-to-device
  int64_t chunks = 0;            // chunks consumed
  int64_t prefetch_kept = 0;     // chunks prefetched for a step and used by it
  int64_t prefetch_dropped = 0;  // chunks prefetched for a projection that did not happen
  double occupancy_sum = 0;      // slots in flight / slots, summed at every acquire
  int64_t occupancy_n = 0;
};

class Ring {
 public:
  Ring(Device& dev, HostStore& host, DevicePool& pool, size_t page_bytes);

  // New slot geometry; nothing may be in flight (the engine synchronises first).
  void configure(int32_t slot_pages, int32_t n_slots);
  int32_t n_slots() const { return n_slots_; }
  int32_t slot_pages() const { return slot_pages_; }

  // Starts a step over `items` (visiting order), keeping the chunks prefetched for it if the
  // projection was right; `next` is the projected following step, prefetched as slots free up.
  void begin_step(std::vector<RingItem> items, std::vector<RingItem> next);
  // Layers below `n` of this step have issued their write-backs: the next step's chunks of
  // those layers may be copied (they can hold pages this step completed).
  void layers_done(int32_t n);
  // A write-back was issued on CopyOut and recorded on `fence`: later copies in wait for it.
  void after_writeback(FenceId fence);

  int32_t n_items() const { return static_cast<int32_t>(items_.size()); }
  const RingItem& item(int32_t i) const { return items_[static_cast<size_t>(i)]; }
  int32_t chunk_of(int32_t i) const { return i / slot_pages_; }
  // Device memory of item i; waits for its chunk's ready fence. Every chunk before i's must
  // have been released.
  const uint8_t* acquire(int32_t i);
  // The compute has issued everything that reads items [0, upto): records the consumed fence
  // of every chunk they complete and issues the copies that were waiting for those slots.
  void release(int32_t upto);

  const RingStats& stats() const { return stats_; }

 private:
  int32_t n_chunks(const std::vector<RingItem>& v) const {
    return slot_pages_ == 0 ? 0 : (static_cast<int32_t>(v.size()) + slot_pages_ - 1) / slot_pages_;
  }
  bool same_chunk(const std::vector<RingItem>& a, const std::vector<RingItem>& b, int32_t c) const;
  void pump();
  void issue(const std::vector<RingItem>& v, int32_t c, int32_t slot);
  int32_t in_flight() const { return issued_ - released_ + next_issued_; }

  Device& dev_;
  HostStore& host_;
  DevicePool& pool_;
  size_t page_bytes_;
  int32_t slot_pages_ = 0, n_slots_ = 0;
  std::vector<FenceId> ready_, consumed_;
  std::vector<RingItem> items_, next_;
  int32_t base_slot_ = 0;              // slot of this step's chunk 0
  int32_t issued_ = 0, released_ = 0;  // chunks of this step
  int32_t waited_ = -1;                // last chunk whose ready fence the compute waited on
  int32_t next_issued_ = 0;            // chunks of the next step already copied
  int32_t layers_done_ = 0;
  FenceId writeback_ = -1;
  bool writeback_pending_ = false;
  RingStats stats_;
};

}  // namespace kvs
