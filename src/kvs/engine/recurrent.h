// The recurrent layers' state of every sequence (resident on the device, beside the arena) and,
// with n_verify > 1, what a verify step keeps to roll it back: each sequence's states before
// the step and the step's Gated DeltaNet inputs, from which a rollback recomputes the states
// of the tokens it keeps.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kvs/backend/device.h"
#include "kvs/model/model.h"

namespace kvs {

class RecurrentState {
 public:
  // n_recurrent layers of layer_bytes each (KvShape's) for n_seq sequences; nothing is
  // allocated without recurrent layers.
  RecurrentState(Device& dev, const ModelConfig& c, int32_t n_recurrent, size_t layer_bytes,
                 int32_t n_seq, int32_t n_verify);
  RecurrentState(const RecurrentState&) = delete;
  RecurrentState& operator=(const RecurrentState&) = delete;

  // Bytes of one sequence's states (a checkpoint); 0 without recurrent layers.
  size_t seq_bytes() const { return seq_bytes_; }
  // A new sequence in slot s: its states start from zero.
  void reset(int32_t s);
  // Before a step that feeds n tokens to slot s: a verify step (all_logits) snapshots its
  // states, one that extends it counts its tokens on; any other ends the rollback's reach.
  void begin_step(int32_t s, int32_t n, bool all_logits, bool extend_verify);
  // Tokens of slot s's last verify step and the steps that extended it (0: none).
  int32_t verified(int32_t s) const { return verified_[static_cast<size_t>(s)]; }
  // Slot s's Gated DeltaNet at recurrent layer il over n_tok rows, its state and L's weights;
  // the caller points it at the inputs and the output.
  DeltaNetArgs args(int32_t s, int32_t il, int32_t n_tok, const LayerWeights& L) const;
  // Where slot s's verify step keeps layer il's inputs: mix, z, alpha, beta.
  std::array<float*, 4> saved_inputs(int32_t s, int32_t il) const;
  // Rolls slot s back by `back` of its verified tokens (checked: never the first), recomputing
  // the kept ones' states from the saved inputs; their outputs go to y, unread.
  void roll_back(int32_t s, int32_t back, const Weights& w, float* y);
  // A checkpoint's copy of slot s's states, and a cached one's into them.
  void download(int32_t s, uint8_t* to) const;
  void upload(int32_t s, const uint8_t* from);

 private:
  // Slot s's place among every slot's recurrent layers, at layer il.
  size_t slot_layer(int32_t s, int32_t il) const;
  float* state(int32_t s, int32_t il) const;
  // One sequence's states in pinned host memory, made at the first use: checkpoints and resets
  // cross the link through it at the link's rate, where pageable memory crosses at a few GB/s.
  uint8_t* staging() const;

  Device& dev_;
  const ModelConfig& cfg_;
  int32_t n_recurrent_, n_verify_;
  size_t layer_bytes_, seq_bytes_;
  std::vector<int32_t> index_;  // [layer]: index among the recurrent layers, -1 for the others
  DeviceBuffer state_, snap_, inputs_;
  mutable DeviceBuffer staging_;  // staging()'s
  int64_t row_ = 0;                // floats of one token's inputs to one Gated DeltaNet layer
  std::vector<int32_t> verified_;  // [slot]
};

}  // namespace kvs
