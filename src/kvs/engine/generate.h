// Decoding after the prompt, the loop that run, chat, bench and serve's scheduler share: a step
// of a sequence feeds its last token and, with speculation, the drafts proposed after it; its
// rows choose the next tokens, each draft verified against the row before it, the first one
// rejected replaced by that row's token and rolled back with those after it (Engine::truncate).
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <vector>

#include "kvs/engine/engine.h"
#include "kvs/engine/sampler.h"
#include "kvs/engine/speculation.h"

namespace kvs {

// One sequence's decoding, which the Decoder's calls advance.
struct Decoding {
  Sequence* seq = nullptr;
  Sampler* sampler = nullptr;  // its history holds the sequence's tokens
  // The most drafts its next step may carry, which the caller's limit on tokens leaves (the
  // context's limit applies too).
  int64_t max_drafts = std::numeric_limits<int64_t>::max();
  int32_t next = -1;            // the token the next step feeds; -1: none yet, or it has ended
  std::vector<int32_t> feed{};  // that step's tokens, once added: next, then the drafts
  int64_t steps = 0, drafted = 0, accepted = 0;  // decode steps, drafts fed and accepted
};

class Decoder {
 public:
  // A chosen token: the row of logits it was chosen from, the positions before it, whether it
  // is a draft the step verified. False: the sequence ends with it (the caller closes it once
  // the call that took it returns, which first rolls back the drafts after it).
  using Take = std::function<bool(int32_t id, const float* row, int32_t n_past, bool accepted)>;
  // The logits a row's token is chosen from (the server's penalties); unset: the row's.
  using Adjust = std::function<const float*(const float* row)>;

  // spec: null or off: no drafts. Both outlive the decoder.
  Decoder(Engine& eng, int32_t n_vocab, Speculator* spec);

  // d.seq now holds `tokens` (n of them: the prompt, the conversation so far); its drafter
  // starts from them with its sampler's parameters and seed.
  void start(Decoding& d, const int32_t* tokens, int32_t n);
  // The first token, from the logits of the prompt's last token; false when it ends d.
  bool first(Decoding& d, const float* logits, const Take& take, const Adjust& adjust = {});
  // The next step's entries of the decodings ds (each with a token to feed) appended to batch:
  // its token and the drafts proposed for it, the proposals batched.
  void add_steps(const std::vector<Decoding*>& ds, std::vector<BatchEntry>& batch);
  // After the step whose entry `entry` read d's last prompt tokens or its add_steps() tokens:
  // the tokens its rows choose, the rejected drafts rolled back (and, where d ends, those after
  // its last token). Returns the tokens taken.
  int32_t advance(Decoding& d, int32_t entry, const Take& take, const Adjust& adjust = {});

 private:
  // advance(), the first row being `row0` where it is given (d fed no drafts).
  int32_t choose(Decoding& d, int32_t entry, const float* row0, const Take& take,
                 const Adjust& adjust);

  Engine& eng_;
  const int32_t n_vocab_;
  Speculator* const spec_;
  std::vector<Speculator::Ask> asks_;  // scratch
};

}  // namespace kvs
