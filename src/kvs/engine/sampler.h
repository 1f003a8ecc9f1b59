// Token sampling from logits, in llama.cpp's default chain order:
//   repetition penalty -> (temp <= 0: greedy argmax) -> top-k -> top-p -> min-p -> temperature
//   -> draw from the renormalised distribution.
//
// As in llama.cpp, top-p and min-p look at the temperature-1 distribution (softmax over the
// top-k survivors); the temperature is applied to the logits of the tokens that survive the
// filters, just before the final softmax. So the temperature changes how the kept tokens are
// weighted, never which tokens are kept.
//
// The draw uses std::mt19937_64 and a hand-written uniform (53 random bits), so a given seed
// gives the same tokens with any standard library.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <random>
#include <vector>

#include "kvs/grammar/matcher.h"

namespace kvs {

struct SamplerParams {
  float temp = 0.8f;            // <= 0: greedy (argmax after the penalty, lowest id on ties)
  int32_t top_k = 40;           // <= 0: off
  float top_p = 0.95f;          // in (0, 1]; 1: off
  float min_p = 0.05f;          // in [0, 1]; 0: off
  float repeat_penalty = 1.0f;  // > 0; 1: off. Positive logits are divided, others multiplied
  int32_t repeat_last_n = 64;   // tokens of history the penalty looks at (0: off, -1: all)
  uint64_t seed = 0xFFFFFFFF;   // kSeedRandom: pick one from std::random_device and the clock
  // A grammar the generated text must follow (null: none). The tokens it refuses get -inf
  // before the chain above, so greedy decoding picks the best token it allows.
  std::shared_ptr<const grammar::Constraint> grammar;
};

class Sampler {
 public:
  static constexpr uint64_t kSeedRandom = 0xFFFFFFFF;

  // Throws kvs::Error naming the flag (--temp, --top-k, --top-p, --min-p, --repeat-penalty,
  // --repeat-last-n) of a parameter out of range.
  explicit Sampler(SamplerParams p);

  // Picks a token from n_vocab logits, accepts it into the history and returns it. NaN logits
  // count as -inf; throws kvs::Error when no logit is finite.
  int32_t sample(const float* logits, int32_t n_vocab);
  // Speculative sampling of a drafted token: accepts `draft` with probability
  // min(1, p(draft) / q(draft)), p this sampler's distribution of `logits`, else draws from the
  // residual max(0, p - q) renormalised, so the token returned is distributed as sample()'s
  // (Leviathan et al.; Chen et al.). q: the drafter's distribution [n_vocab], or null for a
  // drafter that proposes one token for certain. Greedy: accepts exactly when the draft is the
  // argmax, which it returns. The returned token joins the history.
  int32_t verify(const float* logits, int32_t n_vocab, int32_t draft, const float* q,
                 bool* accepted);
  // A draft model's token (its grammar unused: drafters take drafting_params()), drawn as
  // sample() draws it (it joins the history); or -1, drawing
  // nothing, when the most likely token's probability is below p_min (greedy: its softmax
  // probability at temperature 1), the stop deciding nothing about the token drawn. With a
  // temperature and q, q [n_vocab] receives the distribution it was drawn from (zero outside
  // the candidates), which verify() then takes.
  int32_t draft(const float* logits, int32_t n_vocab, double p_min, float* q);
  // Adds a token to the history the repetition penalty looks at (prompt tokens too); the
  // grammar follows only the tokens sample() and verify() return.
  void accept(int32_t token);
  // Drops the last n tokens of the history (a drafter's rejected drafts); n <= kMaxForget.
  void forget(int32_t n);
  static constexpr int32_t kMaxForget = 64;
  // The seed actually used (print it so a run can be repeated).
  uint64_t seed() const { return seed_; }
  // Clears the history and restarts the random sequence from seed().
  void reset();

  const SamplerParams& params() const { return p_; }
  // How many tokens survived the filters in the last sample() call (1 for greedy).
  int32_t last_candidates() const { return last_candidates_; }
  // The last sample()'s distribution after the chain: its n most likely candidates and their
  // probabilities, most likely first (llama-server's post_sampling_probs); empty for greedy,
  // whose token had probability 1.
  std::vector<std::pair<int32_t, float>> last_distribution(size_t n) const;

 private:
  struct Cand {
    float logit;
    int32_t id;
  };

  // Total order: higher logit first, lower id first on ties.
  static bool ranks_before(const Cand& a, const Cand& b);

  void apply_penalty(int32_t n_vocab);
  // cand_ = the k best of work_, in rank order.
  void keep_top_k(size_t k);
  // How many of cand_'s first `size` reach top-p (z: the softmax's normaliser); sorts what it
  // reads into rank order unless cand_ is already.
  size_t top_p_prefix(size_t size, bool sorted, double z, float max_l);
  // The distribution of `logits` after the chain: cand_[0, n_cand_) with unnormalised weights
  // (in .logit) summing to total_, and -1; greedy: the argmax (n_cand_ = 0).
  int32_t distribution(const float* logits, int32_t n_vocab);
  // distribution(), or for greedy decoding without penalties the argmax straight from `logits`.
  int32_t pick(const float* logits, int32_t n_vocab);
  // `logits`, or where a grammar refuses some tokens a copy with those at -inf. Greedy decoding
  // without penalties first tries the best token alone, the common case, before a full mask.
  const float* constrain(const float* logits, int32_t n_vocab);
  // The grammar follows the token returned.
  int32_t follow(int32_t token);
  int32_t verify_token(const float* logits, int32_t n_vocab, int32_t draft, const float* q,
                       bool* accepted);
  // A token of cand_ drawn by its weight; `total`: their sum.
  int32_t draw(double total);
  double uniform();  // [0, 1)

  SamplerParams p_;
  uint64_t seed_;
  std::mt19937_64 rng_;
  std::vector<int32_t> history_;
  std::vector<int32_t> window_;  // scratch: distinct tokens of the penalty window
  std::vector<float> work_;      // scratch: sanitised, penalised logits by id
  std::vector<Cand> cand_;       // scratch: candidates, reused between calls
  size_t n_cand_ = 0;
  double total_ = 0.0;
  int32_t last_candidates_ = 0;
  std::optional<grammar::Matcher> matcher_;  // with params().grammar: the text's parse state
  std::vector<float> masked_;                // scratch: the logits the grammar masked
};

}  // namespace kvs
