#include "kvs/engine/drafter.h"

#include "kvs/util/error.h"

namespace kvs {

SamplerParams drafting_params(const SamplerParams& sp) {
  SamplerParams p = sp;
  p.grammar.reset();  // the target's sampler masks; a drafter only proposes
  if (p.seed != Sampler::kSeedRandom) {
    p.seed ^= 0x9E3779B97F4A7C15ull;
    if (p.seed == Sampler::kSeedRandom) p.seed ^= 1;
  }
  return p;
}

void Drafter::start(int32_t seq, const int32_t* tokens, int32_t n, const SamplerParams& sp) {
  Track& t = track(seq);
  t.tokens.assign(tokens, tokens + n);
  t.sampler.emplace(drafting_params(sp));
  t.drafted = 0;
  for (int32_t id : t.tokens) t.sampler->accept(id);
}

void Drafter::accept(int32_t seq, int32_t token) {
  Track& t = track(seq);
  KVS_CHECK(t.sampler.has_value(), name_, ": sequence ", seq, " was not started");
  t.sampler->forget(t.drafted);
  t.drafted = 0;
  t.tokens.push_back(token);
  t.sampler->accept(token);
}

bool Drafter::begin(const Ask& a) {
  a.out->tokens.clear();
  a.out->q.clear();
  if (a.max <= 0) return false;
  KVS_CHECK(a.max <= draft_max_, name_, ": ", a.max, " drafts, more than ", draft_max_);
  Track& t = track(a.seq);
  KVS_CHECK(t.sampler.has_value(), name_, ": sequence ", a.seq, " was not started");
  t.sampler->forget(t.drafted);
  t.drafted = 0;
  return true;
}

bool Drafter::next_draft(Track& t, const Ask& a, const float* logits) {
  Drafts& d = *a.out;
  const bool sampled = t.sampler->params().temp > 0;
  const size_t k = d.tokens.size(), V = static_cast<size_t>(n_vocab_);
  if (sampled) d.q.resize((k + 1) * V);
  const int32_t id =
      t.sampler->draft(logits, n_vocab_, p_min_, sampled ? d.q.data() + k * V : nullptr);
  if (id < 0) {  // too unsure to be worth verifying: the drafts end
    if (sampled) d.q.resize(k * V);
    return false;
  }
  d.tokens.push_back(id);
  ++t.drafted;
  return static_cast<int32_t>(d.tokens.size()) < a.max;
}

}  // namespace kvs
