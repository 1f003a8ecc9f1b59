// The host store: the authoritative KV history in pinned host memory. Every completed page is
// written back here; the device holds copies. Memory comes in slabs per sequence slot and layer,
// so consecutive pages of a layer are adjacent and stream in one copy.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kvs/backend/device.h"

namespace kvs {

class HostStore {
 public:
  // Room for n_seq sequences of up to max_pages pages per layer. Refuses (naming the flags)
  // when that history cannot fit in the host's available memory.
  HostStore(Device& dev, size_t page_bytes, int32_t n_layer, int32_t n_seq, int32_t max_pages);

  // The page's memory, allocating its slab on first use.
  uint8_t* page(int32_t seq, int32_t layer, int32_t p);
  // Pages [p, p + n) are one contiguous run of host memory.
  bool contiguous(int32_t seq, int32_t layer, int32_t p, int32_t n) const;
  size_t bytes() const { return bytes_; }  // allocated so far

 private:
  Device& dev_;
  size_t page_bytes_;
  int32_t n_layer_, max_pages_, slab_pages_;
  std::vector<std::vector<DeviceBuffer>> slabs_;  // [seq * n_layer + layer][slab]
  size_t bytes_ = 0;
};

// Memory the host can still give (MemAvailable), 0 when unknown.
size_t host_memory_available();

}  // namespace kvs
