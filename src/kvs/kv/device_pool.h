// The device pool: one arena of page-sized frames. Frames [0, ring_begin) hold pages (resident
// ones and the pages being written); the ring_frames() frames above them are the ring's slots,
// and the last top() frames, while a prefill holds them, its workspace (the phase arena).
#pragma once

#include <cstddef>
#include <cstdint>
#include <set>

#include "kvs/backend/device.h"

namespace kvs {

class DevicePool {
 public:
  // `managed`: the arena in managed memory (the `unified` baseline), paged by the driver.
  DevicePool(Device& dev, size_t arena_bytes, size_t page_bytes, bool managed = false);

  int32_t n_frames() const { return n_frames_; }
  uint8_t* frame(int32_t f) const { return arena_.as() + static_cast<size_t>(f) * page_bytes_; }
  size_t bytes() const { return arena_.size(); }

  // The lowest free page frame (keeping the top of the arena free for the ring), -1 if none.
  int32_t take();
  void give(int32_t f);

  // Moves the ring boundary, the ring right below `top` frames kept out of the pool; the frames
  // they take must be free (the engine relocates first).
  void set_ring(int32_t slot_pages, int32_t n_slots, int32_t top = 0);
  int32_t ring_begin() const { return n_frames_ - top_ - slot_pages_ * n_slots_; }
  int32_t top() const { return top_; }
  uint8_t* top_memory() const { return frame(n_frames_ - top_); }
  int32_t ring_frames() const { return slot_pages_ * n_slots_; }
  uint8_t* slot(int32_t i) const { return frame(ring_begin() + i * slot_pages_); }

 private:
  size_t page_bytes_;
  int32_t n_frames_ = 0, slot_pages_ = 0, n_slots_ = 0, top_ = 0;
  DeviceBuffer arena_;
  std::set<int32_t> free_;  // below the ring
};

}  // namespace kvs
