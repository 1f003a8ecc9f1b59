// Speculative decoding's drafting side, shared by run, chat and serve: for every sequence of the
// target engine a prompt lookup (NgramDrafter), a sequence of a draft model (ModelDrafter) or of
// the model's own MTP block (MtpDrafter), and
// the draft length each step asks for, adapted to how many drafts the target accepts and to
// whether its steps stream. The Decoder (generate.h) verifies the drafts (Sampler::verify with
// q()) in the step of the token before them and tells the outcome (verified()).
#pragma once

#include <cstdint>
#include <vector>

#include "kvs/engine/engine.h"
#include "kvs/engine/model_draft.h"
#include "kvs/engine/mtp_draft.h"
#include "kvs/engine/ngram_draft.h"
#include "kvs/engine/oracle_draft.h"

namespace kvs {

// Oracle: kvstream bench's drafts of a chosen acceptance (oracle_draft.h).
enum class SpecMode { Off, Ngram, Draft, Mtp, Oracle };

struct SpecOptions {
  SpecMode mode = SpecMode::Off;
  int32_t draft_max = 8, draft_min = 1;  // --draft-max, --draft-min
};

// A sequence's draft length: from a moving estimate a of the chance that a draft is accepted
// (accepted drafts over drafts tried, the first rejected one included, decaying by 0.9 a verify
// step, starting as 1.5 of 2), the k-th draft is worth verifying while a^k, the chance it is
// reached and accepted, is at least 0.1 when the target's last step streamed pages (a token more
// costs that step little: it waits for PCIe) and 0.4 when it did not (a token more costs
// compute). The length is the largest such k within [lo, hi].
class DraftLength {
 public:
  void verified(int32_t drafted, int32_t accepted);
  int32_t next(int32_t lo, int32_t hi, bool streaming) const;
  double acceptance() const { return accepted_ / tried_; }

 private:
  double accepted_ = 1.5, tried_ = 2.0;
};

class Speculator {
 public:
  // draft: the draft model for SpecMode::Draft or the oracle for SpecMode::Oracle, mtp: the MTP
  // block for SpecMode::Mtp (else null), which follows the target's steps from now on. target:
  // the engine whose last step says whether the history streams; a sequence is an index below
  // its --parallel (with mtp, its Sequence id).
  Speculator(const SpecOptions& o, Engine& target, Drafter* draft, MtpDrafter* mtp = nullptr);

  const SpecOptions& options() const { return opt_; }
  bool on() const { return opt_.mode != SpecMode::Off; }

  // Sequence seq now holds `tokens` (a prompt, a conversation so far); sp: its sampling.
  void start(int32_t seq, const int32_t* tokens, int32_t n, const SamplerParams& sp);
  // A token the target chose for seq.
  void accept(int32_t seq, int32_t token);

  struct Ask {
    int32_t seq = 0;
    int64_t room = 0;  // drafts at most: what the context and the tokens still wanted leave
  };
  // The drafts of each sequence asked for (drafts(seq)), none where fewer than --draft-min come;
  // a draft model's steps are batched.
  void propose(const std::vector<Ask>& asks);
  const std::vector<int32_t>& drafts(int32_t seq) const { return at(seq).drafts.tokens; }
  // The distribution draft i of seq was drawn from, for Sampler::verify; null where it was
  // proposed for certain (prompt lookup, greedy drafting).
  const float* q(int32_t seq, int32_t i) const;
  // After the verify step: how many of drafts(seq) the target accepted.
  void verified(int32_t seq, int32_t accepted);

 private:
  struct Seq {
    NgramDrafter ngram;
    DraftLength length;
    Drafts drafts;
  };
  const Seq& at(int32_t seq) const { return seqs_.at(static_cast<size_t>(seq)); }

  SpecOptions opt_;
  const Engine& target_;
  Drafter* drafter_;  // the draft model, the MTP block or the oracle; null for the others
  std::vector<Seq> seqs_;
  std::vector<Drafter::Ask> asks_;  // scratch
};

}  // namespace kvs
