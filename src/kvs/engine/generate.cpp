#include "kvs/engine/generate.h"

#include <algorithm>

namespace kvs {

Decoder::Decoder(Engine& eng, int32_t n_vocab, Speculator* spec)
    : eng_(eng), n_vocab_(n_vocab), spec_(spec && spec->on() ? spec : nullptr) {}

void Decoder::start(Decoding& d, const int32_t* tokens, int32_t n) {
  d.next = -1;
  d.feed.clear();
  if (!spec_) return;
  SamplerParams sp = d.sampler->params();
  sp.seed = d.sampler->seed();  // the drafts' generator follows the sequence's seed
  spec_->start(d.seq->id, tokens, n, sp);
}

bool Decoder::first(Decoding& d, const float* logits, const Take& take, const Adjust& adjust) {
  choose(d, -1, logits, take, adjust);
  return d.next >= 0;
}

void Decoder::add_steps(const std::vector<Decoding*>& ds, std::vector<BatchEntry>& batch) {
  if (spec_ && !ds.empty()) {
    // No draft past the context.
    asks_.clear();
    for (const Decoding* d : ds)
      asks_.push_back({d->seq->id, std::min<int64_t>(d->max_drafts, int64_t{eng_.options().n_ctx} -
                                                                        d->seq->n_past - 1)});
    spec_->propose(asks_);
  }
  for (Decoding* d : ds) {
    d->feed.assign(1, d->next);
    if (spec_) {
      const std::vector<int32_t>& drafts = spec_->drafts(d->seq->id);
      d->feed.insert(d->feed.end(), drafts.begin(), drafts.end());
    }
    const auto n = static_cast<int32_t>(d->feed.size());
    batch.push_back({d->seq, d->feed.data(), n, n > 1});
  }
}

int32_t Decoder::advance(Decoding& d, int32_t entry, const Take& take, const Adjust& adjust) {
  return choose(d, entry, nullptr, take, adjust);
}

int32_t Decoder::choose(Decoding& d, int32_t entry, const float* row0, const Take& take,
                        const Adjust& adjust) {
  const int32_t n_draft = d.feed.empty() ? 0 : static_cast<int32_t>(d.feed.size()) - 1;
  const int32_t n_past = d.seq->n_past, seq = d.seq->id;
  d.steps += d.feed.empty() ? 0 : 1;
  d.drafted += n_draft;
  // Row j follows the token at position n_past - n_draft - 1 + j and chooses the one after it,
  // where draft j + 1 stands.
  for (int32_t j = 0;; ++j) {
    const float* row = row0 ? row0 : eng_.logits(entry, j);
    const float* from = adjust ? adjust(row) : row;
    bool ok = false;
    const int32_t id = j < n_draft
                           ? d.sampler->verify(from, n_vocab_, d.feed[static_cast<size_t>(j) + 1],
                                               spec_ ? spec_->q(seq, j) : nullptr, &ok)
                           : d.sampler->sample(from, n_vocab_);
    const int32_t kept = n_past - (n_draft - j);  // the positions before id
    d.accepted += ok;
    if (spec_) spec_->accept(seq, id);
    const bool more = take(id, row, kept, ok);
    if (ok && more) continue;
    // The drafts after id leave the KV (and so never reach the prompt cache).
    if (kept < d.seq->n_past) eng_.truncate(*d.seq, kept);
    if (spec_ && n_draft > 0) spec_->verified(seq, j + ok);
    d.next = more ? id : -1;
    d.feed.clear();
    return j + 1;
  }
}

}  // namespace kvs
