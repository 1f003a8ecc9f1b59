// A draft model: drafts for speculative decoding from a second, smaller model of the target's
// vocabulary, run by an Engine of its own on the target's device with its whole KV resident
// (built before the target's engine, so that the target's arena takes what it leaves). Each of
// its sequences follows one of the target's: it is told the target's tokens (accept), and before
// drafting it keeps what its KV shares with them, rolls back the rest (the rejected drafts) and
// reads the tokens it has not seen, then drafts a token a step from its own distribution.
#pragma once

#include <cstdint>
#include <vector>

#include "kvs/engine/drafter.h"
#include "kvs/engine/engine.h"

namespace kvs {

// Fails, naming what differs (the vocabulary's size, a token's text, the bos or eos id), unless
// the draft model's vocabulary is the target's.
void check_draft_vocab(const Model& target, const Model& draft);

class ModelDrafter final : public Drafter {
 public:
  // The draft engine's options follow the target's (o: -c, -b, --parallel, --page-size, -ctk,
  // -ctv), its KV resident, drafting up to draft_max tokens a step of the target. p_min: drafting
  // stops at a token the draft model gives less probability than that (--draft-p-min). Fails,
  // naming the draft model, when the vocabularies differ (before allocating anything) or its KV
  // does not fit what the device has left.
  ModelDrafter(const Model& draft, const Model& target, Device& dev, const EngineOptions& o,
               int32_t draft_max, double p_min);

  // The drafts of several sequences, their draft model steps batched. A sequence with more
  // than -b tokens still to read reads -b of them and drafts nothing this time.
  void propose(const std::vector<Ask>& asks) override;

  // What a draft model of config c (its matrices: `weights` bytes) takes on the device beside a
  // target of options o, without building it: its weights, activations and logits, and its
  // whole KV (kvstream plan's figure; the buffers of the backend's kernels come on top).
  static size_t planned_bytes(const ModelConfig& c, size_t weights, const EngineOptions& o,
                              int32_t draft_max);

  const Engine& engine() const { return eng_; }
  size_t device_bytes() const { return device_bytes_; }  // weights, buffers and KV

 private:
  struct Seq : Track {
    Sequence draft;           // in the draft engine
    std::vector<int32_t> kv;  // the draft KV's
    // The draft KV keeps no position below this through a rollback (window and recurrent
    // layers undo only the last drafts); it starts again from nothing instead.
    int32_t floor = 0;
  };
  Track& track(int32_t seq) override { return seqs_.at(static_cast<size_t>(seq)); }
  // Rolls s's KV back to what it shares with its tokens (from scratch under the floor).
  void sync(Seq& s);

  const ModelConfig& cfg_;
  size_t device_bytes_ = 0;
  Engine eng_;
  std::vector<Seq> seqs_;
  std::vector<BatchEntry> batch_;  // scratch
};

}  // namespace kvs
