#include "kvs/kv/device_pool.h"

#include "kvs/util/error.h"

namespace kvs {

DevicePool::DevicePool(Device& dev, size_t arena_bytes, size_t page_bytes, bool managed)
    : page_bytes_(page_bytes) {
  const size_t n = arena_bytes / page_bytes;
  KVS_CHECK(n >= 1 && n < (size_t{1} << 31), "the KV arena must hold 1 to 2^31 pages");
  n_frames_ = static_cast<int32_t>(n);
  arena_ = managed ? dev.alloc_managed(n * page_bytes, "the KV cache (--kv-mode unified)")
                   : dev.alloc(n * page_bytes, "the KV arena (--kv-arena)");
  for (int32_t f = 0; f < n_frames_; ++f) free_.insert(free_.end(), f);
}

int32_t DevicePool::take() {
  if (free_.empty()) return -1;
  const int32_t f = *free_.begin();
  free_.erase(free_.begin());
  return f;
}

void DevicePool::give(int32_t f) {
  KVS_CHECK(f >= 0 && f < ring_begin() && free_.insert(f).second, "device pool: bad frame ", f);
}

void DevicePool::set_ring(int32_t slot_pages, int32_t n_slots, int32_t top) {
  const int32_t old_begin = ring_begin();
  const int32_t begin = n_frames_ - top - slot_pages * n_slots;
  KVS_CHECK(top >= 0 && begin >= 0, "device pool: the ring does not fit the arena");
  for (int32_t f = begin; f < old_begin; ++f)
    KVS_CHECK(free_.erase(f) == 1, "device pool: frame ", f, " is in use, cannot join the ring");
  for (int32_t f = old_begin; f < begin; ++f) free_.insert(f);
  slot_pages_ = slot_pages;
  n_slots_ = n_slots;
  top_ = top;
}

}  // namespace kvs
