// A draft model: drafts for speculative decoding from a second, smaller model of the target's
// vocabulary, run by an Engine of its own on the target's device with its whole KV resident
// (built before the target's engine, so that the target's arena takes what it leaves). Each of
// its sequences follows one of the target's: it is told the target's tokens (accept), and before
// drafting it keeps what its KV shares with them, rolls back the rest (the rejected drafts) and
// reads the tokens it has not seen, then drafts a token a step from its own distribution.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "kvs/engine/engine.h"
#include "kvs/engine/sampler.h"

namespace kvs {

// Fails, naming what differs (the vocabulary's size, a token's text, the bos or eos id), unless
// the draft model's vocabulary is the target's.
void check_draft_vocab(const Model& target, const Model& draft);

// A drafter's sampling: the target's sp with a generator of its own (the drafts must not be
// drawn from the numbers the target's verify() draws).
SamplerParams drafting_params(const SamplerParams& sp);

// One sequence's drafts of a step.
struct Drafts {
  std::vector<int32_t> tokens;
  // Sampling with a temperature: [tokens][n_vocab], the drafter's distribution each token was
  // drawn from (for Sampler::verify); empty: greedy.
  std::vector<float> q;
};

// The next draft of d from a drafter's logits (Sampler::draft with p_min), its distribution
// kept in d.q when sampling; -1 where the drafter is too unsure and the drafts end.
int32_t next_draft(Sampler& s, const float* logits, int32_t n_vocab, double p_min, Drafts& d);

class ModelDrafter {
 public:
  // The draft engine's options follow the target's (o: -c, -b, --parallel, --page-size, -ctk,
  // -ctv), its KV resident, drafting up to draft_max tokens a step of the target. p_min: drafting
  // stops at a token the draft model gives less probability than that (--draft-p-min). Fails,
  // naming the draft model, when the vocabularies differ (before allocating anything) or its KV
  // does not fit what the device has left.
  ModelDrafter(const Model& draft, const Model& target, Device& dev, const EngineOptions& o,
               int32_t draft_max, double p_min);

  // Sequence seq (< --parallel) now holds `tokens` (a prompt, a conversation so far): its
  // draft sequence keeps the positions that begin alike. sp: the target's sampling; the drafts
  // are drawn with its temperature and filters from a generator of their own.
  void start(int32_t seq, const int32_t* tokens, int32_t n, const SamplerParams& sp);
  // A token the target chose for seq.
  void accept(int32_t seq, int32_t token);

  struct Ask {
    int32_t seq = 0;
    int32_t max = 0;        // drafts at most
    Drafts* out = nullptr;  // replaced
  };
  // The drafts of several sequences, their draft model steps batched. A sequence with more
  // than -b tokens still to read reads -b of them and drafts nothing this time.
  void propose(const std::vector<Ask>& asks);

  // What a draft model of config c (its matrices: `weights` bytes) takes on the device beside a
  // target of options o, without building it: its weights, activations and logits, and its
  // whole KV (kvstream plan's figure; the buffers of the backend's kernels come on top).
  static size_t planned_bytes(const ModelConfig& c, size_t weights, const EngineOptions& o,
                              int32_t draft_max);

  const Engine& engine() const { return eng_; }
  size_t device_bytes() const { return device_bytes_; }  // weights, buffers and KV

 private:
  struct Seq {
    Sequence draft;               // in the draft engine
    std::vector<int32_t> tokens;  // the target's, as accepted
    std::vector<int32_t> kv;      // the draft KV's
    // The draft KV keeps no position below this through a rollback (window and recurrent
    // layers undo only the last drafts); it starts again from nothing instead.
    int32_t floor = 0;
    std::optional<Sampler> sampler;
    int32_t drafted = 0;  // tokens the sampler's history holds beyond `tokens`
  };
  // Rolls s's KV back to what it shares with its tokens (from scratch under the floor) and
  // drops the drafts from its sampler's history.
  void sync(Seq& s);

  const ModelConfig& cfg_;
  const double p_min_;
  const int32_t draft_max_;
  size_t device_bytes_ = 0;
  Engine eng_;
  std::vector<Seq> seqs_;
  std::vector<BatchEntry> batch_;  // scratch
};

}  // namespace kvs
