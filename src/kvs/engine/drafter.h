// What the draft model's and the MTP block's drafters share (model_draft.h, mtp_draft.h): each
// sequence's tokens as the target accepted them, a sampler of its own whose history holds them
// and the drafts of the last proposal, and the drafts drawn from the drafter's logits.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "kvs/engine/sampler.h"

namespace kvs {

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

class Drafter {
 public:
  virtual ~Drafter() = default;

  // Sequence seq (< --parallel) now holds `tokens` (a prompt, a conversation so far). sp: the
  // target's sampling; the drafts are drawn with its temperature and filters from a generator
  // of their own.
  void start(int32_t seq, const int32_t* tokens, int32_t n, const SamplerParams& sp);
  // A token the target chose for seq.
  void accept(int32_t seq, int32_t token);

  struct Ask {
    int32_t seq = 0;
    int32_t max = 0;        // drafts at most
    Drafts* out = nullptr;  // replaced
  };
  // The drafts of several sequences, the drafter's steps batched.
  virtual void propose(const std::vector<Ask>& asks) = 0;

 protected:
  // name: the drafter in messages. p_min: drafting stops at a token the drafter gives less
  // probability than that (--draft-p-min).
  Drafter(const char* name, int32_t n_vocab, int32_t draft_max, double p_min)
      : name_(name), n_vocab_(n_vocab), draft_max_(draft_max), p_min_(p_min) {}

  struct Track {
    std::vector<int32_t> tokens;  // the target's, as accepted
    std::optional<Sampler> sampler;
    int32_t drafted = 0;  // tokens the sampler's history holds beyond `tokens`
  };
  virtual Track& track(int32_t seq) = 0;
  // Clears a's drafts and drops the last ones from its sequence's sampler; false where it asks
  // for none. Fails where it asks for more than draft_max or its sequence was not started.
  bool begin(const Ask& a);
  // The next draft of a's sequence t (Sampler::draft with p_min) from the drafter's logits, its
  // distribution kept when sampling; false when its drafts end: too unsure, or a.max of them.
  bool next_draft(Track& t, const Ask& a, const float* logits);

  const char* const name_;
  const int32_t n_vocab_, draft_max_;
  const double p_min_;
};

}  // namespace kvs
