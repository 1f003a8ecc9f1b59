#include "kvs/kv/host_store.h"

#include <algorithm>
#include <fstream>
#include <string>

#include "kvs/util/error.h"
#include "kvs/util/parse.h"

namespace kvs {

size_t host_memory_available() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  size_t kb = 0;
  std::string unit;
  while (in >> key >> kb >> unit)
    if (key == "MemAvailable:") return kb * 1024;
  return 0;
}

HostStore::HostStore(Device& dev, size_t page_bytes, int32_t n_layer, int32_t n_seq,
                     int32_t max_pages)
    : dev_(dev), page_bytes_(page_bytes), n_layer_(n_layer), max_pages_(max_pages) {
  // Slabs of about 32 MiB: few allocations (pinning is slow), little waste for short sequences.
  slab_pages_ = static_cast<int32_t>(
      std::clamp<size_t>((size_t{32} << 20) / page_bytes, 1, static_cast<size_t>(max_pages)));
  const size_t total = page_bytes * static_cast<size_t>(max_pages) * n_layer * n_seq;
  const size_t avail = host_memory_available();
  if (avail != 0 && total > avail / 10 * 9)
    fail("the KV history of ", n_seq, " sequence(s) of ", max_pages, " pages needs ",
         format_bytes(total), " of host memory, but only ", format_bytes(avail),
         " is available; lower -c/--ctx-size or --parallel, or use smaller -ctk/-ctv types");
  slabs_.resize(static_cast<size_t>(n_seq) * n_layer);
}

uint8_t* HostStore::page(int32_t seq, int32_t layer, int32_t p) {
  KVS_CHECK(p >= 0 && p < max_pages_, "host store: page ", p, " out of range");
  auto& slabs = slabs_[static_cast<size_t>(seq) * n_layer_ + layer];
  const size_t slab = static_cast<size_t>(p / slab_pages_);
  while (slabs.size() <= slab) {
    const int32_t n =
        std::min(slab_pages_, max_pages_ - static_cast<int32_t>(slabs.size()) * slab_pages_);
    slabs.push_back(dev_.alloc_host(static_cast<size_t>(n) * page_bytes_, "the KV host store"));
    bytes_ += static_cast<size_t>(n) * page_bytes_;
  }
  return slabs[slab].as() + static_cast<size_t>(p % slab_pages_) * page_bytes_;
}

bool HostStore::contiguous(int32_t, int32_t, int32_t p, int32_t n) const {
  return n <= 1 || p / slab_pages_ == (p + n - 1) / slab_pages_;
}

}  // namespace kvs
