#include "kvs/engine/oracle_draft.h"

#include <algorithm>

#include "kvs/util/error.h"

namespace kvs {

OracleDrafter::OracleDrafter(int32_t n_sequences, int32_t n_vocab, int32_t draft_max, double accept,
                             uint64_t seed)
    : Drafter("oracle drafts", n_vocab, draft_max, 0.0),
      accept_(accept),
      seqs_(static_cast<size_t>(n_sequences)),
      rng_(seed) {
  KVS_CHECK(accept > 0.0 && accept <= 1.0, "--accept must be above 0 and at most 1, got ", accept);
}

void OracleDrafter::expect(int32_t seq, std::vector<int32_t> expected) {
  seqs_.at(static_cast<size_t>(seq)).expected = std::move(expected);
}

void OracleDrafter::propose(const std::vector<Ask>& asks) {
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (const Ask& a : asks) {
    if (!begin(a)) continue;
    const Seq& s = seqs_.at(static_cast<size_t>(a.seq));
    KVS_CHECK(s.tokens.size() <= s.expected.size() &&
                  std::equal(s.tokens.begin(), s.tokens.end(), s.expected.begin()),
              name_, ": sequence ", a.seq, " left the tokens it was expected to produce");
    for (size_t i = s.tokens.size();
         i < s.expected.size() && a.out->tokens.size() < static_cast<size_t>(a.max); ++i) {
      const int32_t t = s.expected[i];
      // A wrong draft: the next id, which the greedy choice of that row is not.
      a.out->tokens.push_back(u(rng_) < accept_ ? t : (t + 1) % n_vocab_);
    }
  }
}

}  // namespace kvs
