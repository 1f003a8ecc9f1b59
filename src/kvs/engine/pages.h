// Where the pages of every sequence live: each slot's frames of the device pool (the arena),
// the host store (streaming and host modes), the ring that streams what the plan leaves off the
// device, and the write-backs' fences with the frames they free.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "kvs/backend/device.h"
#include "kvs/engine/cache_link.h"
#include "kvs/kv/device_pool.h"
#include "kvs/kv/host_store.h"
#include "kvs/kv/planner.h"
#include "kvs/kv/ring.h"
#include "kvs/model/model.h"
#include "kvs/quant/kv_page.h"

namespace kvs {

struct BatchEntry;

class PagePlacement {
 public:
  // store_index: [layer] -> its index in the host store and the ring (-1: none); kv_index:
  // [layer] -> its index among the full layers, the plan's (-1: none). Host mode keeps every
  // page on the host; n_verify - 1 positions behind the windows stay for a rollback.
  PagePlacement(Device& dev, const ModelConfig& c, const KvLayout& kv, int32_t n_seq,
                int32_t n_verify, bool host_mode, std::vector<int32_t> store_index,
                std::vector<int32_t> kv_index);
  PagePlacement(const PagePlacement&) = delete;
  PagePlacement& operator=(const PagePlacement&) = delete;
  // The mode's stores (either may be null), and with `ring` the ring between them and the
  // write-backs' fences.
  void own(std::unique_ptr<HostStore> host, std::unique_ptr<DevicePool> pool, bool ring);

  HostStore* host() const { return host_.get(); }
  DevicePool* pool() const { return pool_.get(); }
  Ring* ring() const { return ring_.get(); }
  // Slot s's frames at layer il: [page] -> pool frame; -1: host only (full layers) or behind
  // the window.
  const std::vector<int32_t>& frames(int32_t s, int32_t il) const {
    return frames_[static_cast<size_t>(s)][static_cast<size_t>(il)];
  }
  // Bumped whenever any slot's frames change (SpanCache's test).
  uint64_t epoch() const { return epoch_; }
  void touched() { ++epoch_; }
  // Slot s's pages as the prompt cache link copies them.
  SlotPages slot(int32_t s);

  // A free frame, waiting for the write-backs that free one if need be.
  int32_t take();
  // Frames of written-back pages go back to the pool once their copies are done (`wait`: wait
  // for them).
  void reclaim(bool wait);
  // Moves the pool to plan p with `top` frames kept for the prefill's workspace; lengths:
  // [slot] -> its positions, -1: not live.
  void apply(const Plan& p, int32_t top, const std::vector<int32_t>& lengths);
  // Frames for the pages this pass writes into at layer il.
  void add(int32_t il, const std::vector<BatchEntry>& batch);
  // Pages the pass completed at full layer il to the host store; returns their bytes.
  size_t write_back(int32_t il, const std::vector<BatchEntry>& batch, const Plan& plan);
  // Gives back the window layers' frames no later query of slot s (n_past long) can see.
  void trim_windows(int32_t s, int32_t n_past);
  // Slot s keeps its first n_past positions' pages, the tail page in a frame.
  void truncate(int32_t s, int32_t n_past);
  // Slot s's frames go back to the pool (a closing sequence).
  void release(int32_t s);

 private:
  bool full(int32_t il) const { return cfg_.kinds[static_cast<size_t>(il)] == LayerKind::Full; }
  int32_t store_layer(int32_t il) const { return store_index_[static_cast<size_t>(il)]; }

  Device& dev_;
  const ModelConfig& cfg_;
  KvLayout kv_;
  int32_t n_verify_;
  bool host_mode_;
  std::vector<int32_t> store_index_, kv_index_;
  std::vector<std::vector<std::vector<int32_t>>> frames_;  // [slot][layer][page]
  uint64_t epoch_ = 1;
  std::unique_ptr<HostStore> host_;
  std::unique_ptr<DevicePool> pool_;
  std::unique_ptr<Ring> ring_;
  std::vector<int32_t> pending_;  // frames of written-back pages, free once wb_ is reached
  FenceId wb_ = -1, computed_ = -1;
};

}  // namespace kvs
