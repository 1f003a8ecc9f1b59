// The engine: runs the forward pass of a model on a Device over paged KV caches of sequences.
#pragma once

#include <cstdint>
#include <vector>

#include "kvs/backend/device.h"
#include "kvs/kv/page.h"
#include "kvs/model/model.h"

namespace kvs {

struct EngineOptions {
  int32_t n_ctx = 4096;                            // -c: positions per sequence
  int32_t n_batch = 512;                           // -b: prompt tokens per forward pass
  int32_t page_size = 256;                         // --page-size
  DType k_type = DType::F16, v_type = DType::F16;  // -ctk, -ctv
  int32_t n_seq = 1;                               // sequences that can be live at once
};

// One sequence's cache: its length and, per layer, the frames of its pages in logical order.
struct Sequence {
  int32_t id = -1;
  int32_t n_past = 0;
  std::vector<std::vector<int32_t>> pages;  // [layer][logical page] -> frame
};

class Engine {
 public:
  Engine(const Model& model, Device& dev, const EngineOptions& opt);

  Sequence open_sequence();
  void close_sequence(Sequence& s);  // returns its frames to the pool
  // Appends n tokens to the sequence (in chunks of n_batch) and returns the logits of the last
  // one [n_vocab], valid until the next call. Fails when the sequence would pass n_ctx.
  const float* eval(Sequence& s, const int32_t* tokens, int32_t n);

  const KvLayout& kv_layout() const { return kv_; }
  size_t kv_bytes_per_token() const;
  const EngineOptions& options() const { return opt_; }

 private:
  void forward(Sequence& s, const int32_t* tokens, int32_t n, bool logits);
  uint8_t* frame(int32_t f) const {
    return frames_.as() + static_cast<size_t>(f) * kv_.page_bytes();
  }

  const ModelConfig& cfg_;
  Device& dev_;
  EngineOptions opt_;
  Weights w_;
  KvLayout kv_;
  RopeParams rope_;
  int32_t max_pages_ = 0;  // per layer and sequence
  DeviceBuffer frames_;    // every page frame of every layer and sequence (resident cache)
  std::vector<int32_t> free_frames_;
  std::vector<int32_t> free_ids_;
  // Activations for one batch of n_batch tokens.
  DeviceBuffer x_, h_, q_, k_, v_, att_, gate_, up_, logits_;
  std::vector<int32_t> pos_, slots_;
  std::vector<uint8_t*> dst_;
  std::vector<Span> spans_;
};

}  // namespace kvs
