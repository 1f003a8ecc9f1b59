// Drafts with a chosen acceptance, for measuring speculative decoding's verify steps on models
// with random weights (kvstream bench --spec oracle --accept P): each sequence is given the
// tokens a plain greedy run of the same prompt produced, and proposes what follows its tokens
// there, each draft kept with probability P and otherwise replaced by a token greedy decoding
// will not choose. The target still verifies every draft, so the output is plain decoding's.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "kvs/engine/drafter.h"

namespace kvs {

class OracleDrafter : public Drafter {
 public:
  // accept: P, in (0, 1]. seed: the draws of which drafts are kept.
  OracleDrafter(int32_t n_sequences, int32_t n_vocab, int32_t draft_max, double accept,
                uint64_t seed);

  // Sequence seq will hold `expected` (its prompt, then the plain run's tokens) if every draft
  // is accepted.
  void expect(int32_t seq, std::vector<int32_t> expected);
  void propose(const std::vector<Ask>& asks) override;

  double accept_p() const { return accept_; }

 private:
  struct Seq : Track {
    std::vector<int32_t> expected;
  };
  Track& track(int32_t seq) override { return seqs_.at(static_cast<size_t>(seq)); }

  double accept_;
  std::vector<Seq> seqs_;
  std::mt19937_64 rng_;
};

}  // namespace kvs
