#include "kvs/kv/ring.h"

#include <algorithm>

#include "kvs/util/error.h"

namespace kvs {

Ring::Ring(Device& dev, HostStore& host, DevicePool& pool, size_t page_bytes)
    : dev_(dev), host_(host), pool_(pool), page_bytes_(page_bytes) {}

void Ring::configure(int32_t slot_pages, int32_t n_slots) {
  KVS_CHECK(issued_ == released_, "ring: reconfigured while chunks are in use");
  slot_pages_ = slot_pages;
  n_slots_ = n_slots;
  while (static_cast<int32_t>(ready_.size()) < n_slots) {
    ready_.push_back(dev_.make_fence());
    consumed_.push_back(dev_.make_fence());
  }
  items_.clear();
  next_.clear();
  base_slot_ = issued_ = released_ = next_issued_ = 0;
  waited_ = -1;
}

bool Ring::same_chunk(const std::vector<RingItem>& a, const std::vector<RingItem>& b,
                      int32_t c) const {
  const size_t lo = static_cast<size_t>(c) * slot_pages_;
  const size_t hi_a = std::min(a.size(), lo + slot_pages_),
               hi_b = std::min(b.size(), lo + slot_pages_);
  return hi_a == hi_b && hi_a > lo && std::equal(a.begin() + lo, a.begin() + hi_a, b.begin() + lo);
}

void Ring::begin_step(std::vector<RingItem> items, std::vector<RingItem> next) {
  KVS_CHECK(released_ == n_chunks(items_), "ring: a step ended with ", n_chunks(items_) - released_,
            " chunks unread");
  base_slot_ = n_slots_ == 0 ? 0 : (base_slot_ + n_chunks(items_)) % n_slots_;
  // Prefetched chunks stay valid while they match the real step, chunk for chunk.
  int32_t kept = 0;
  while (kept < next_issued_ && same_chunk(next_, items, kept)) ++kept;
  stats_.prefetch_kept += kept;
  stats_.prefetch_dropped += next_issued_ - kept;
  items_ = std::move(items);
  next_ = std::move(next);
  issued_ = kept;
  released_ = 0;
  waited_ = -1;
  next_issued_ = 0;
  layers_done_ = 0;
  pump();
}

void Ring::layers_done(int32_t n) {
  layers_done_ = n;
  pump();
}

void Ring::after_writeback(FenceId fence) {
  writeback_ = fence;
  writeback_pending_ = true;
}

void Ring::issue(const std::vector<RingItem>& v, int32_t c, int32_t slot) {
  if (writeback_pending_) {  // the pages may have been written back just before
    dev_.wait(Stream::CopyIn, writeback_);
    writeback_pending_ = false;
  }
  dev_.wait(Stream::CopyIn, consumed_[static_cast<size_t>(slot)]);
  uint8_t* dst = pool_.slot(slot);
  const size_t lo = static_cast<size_t>(c) * slot_pages_;
  const size_t hi = std::min(v.size(), lo + slot_pages_);
  // Runs of consecutive pages of one layer and sequence that are adjacent in host memory go
  // in one copy.
  for (size_t i = lo; i < hi;) {
    const RingItem& a = v[i];
    size_t j = i + 1;
    while (j < hi && v[j].layer == a.layer && v[j].seq == a.seq &&
           v[j].page == a.page + static_cast<int32_t>(j - i) &&
           host_.contiguous(a.seq, a.layer, a.page, static_cast<int32_t>(j - i + 1)))
      ++j;
    const size_t n = (j - i) * page_bytes_;
    dev_.copy(Stream::CopyIn, dst + (i - lo) * page_bytes_, host_.page(a.seq, a.layer, a.page), n);
    stats_.bytes_in += n;
    i = j;
  }
  dev_.record(Stream::CopyIn, ready_[static_cast<size_t>(slot)]);
}

void Ring::pump() {
  if (n_slots_ == 0) return;
  const int32_t nc = n_chunks(items_);
  while (in_flight() < n_slots_) {
    if (issued_ < nc) {
      issue(items_, issued_, (base_slot_ + issued_) % n_slots_);
      ++issued_;
      continue;
    }
    // Prefetch for the next step, but only layers whose write-backs this step has issued.
    if (next_issued_ >= n_chunks(next_)) break;
    const size_t last =
        std::min(next_.size(), static_cast<size_t>(next_issued_ + 1) * slot_pages_) - 1;
    if (next_[last].layer >= layers_done_) break;
    issue(next_, next_issued_, (base_slot_ + nc + next_issued_) % n_slots_);
    ++next_issued_;
  }
}

const uint8_t* Ring::acquire(int32_t i) {
  KVS_CHECK(i >= 0 && i < n_items(), "ring: item ", i, " out of range");
  const int32_t c = chunk_of(i);
  KVS_CHECK(c == released_, "ring: chunk ", c, " acquired before chunk ", released_,
            " was released");
  if (c >= issued_) pump();
  KVS_CHECK(c < issued_, "ring: chunk ", c, " could not be issued");
  const int32_t slot = (base_slot_ + c) % n_slots_;
  if (waited_ != c) {
    stats_.occupancy_sum += static_cast<double>(in_flight()) / n_slots_;
    ++stats_.occupancy_n;
    dev_.wait(Stream::Compute, ready_[static_cast<size_t>(slot)]);  // timed by the device
    waited_ = c;
  }
  return pool_.slot(slot) + static_cast<size_t>(i - c * slot_pages_) * page_bytes_;
}

void Ring::release(int32_t upto) {
  const int32_t nc = n_chunks(items_);
  bool any = false;
  while (released_ < nc && released_ < issued_ &&
         std::min(n_items(), (released_ + 1) * slot_pages_) <= upto) {
    dev_.record(Stream::Compute,
                consumed_[static_cast<size_t>((base_slot_ + released_) % n_slots_)]);
    ++released_;
    ++stats_.chunks;
    any = true;
  }
  if (any) pump();
}

}  // namespace kvs
