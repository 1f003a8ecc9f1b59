#include "kvs/engine/speculation.h"

#include <algorithm>
#include <cmath>

#include "kvs/util/error.h"

namespace kvs {

void DraftLength::verified(int32_t drafted, int32_t accepted) {
  if (drafted == 0) return;
  constexpr double kDecay = 0.9;
  accepted_ = kDecay * accepted_ + accepted;
  tried_ = kDecay * tried_ + accepted + (accepted < drafted ? 1 : 0);
}

int32_t DraftLength::next(int32_t lo, int32_t hi, bool streaming) const {
  const double a = acceptance(), worth = streaming ? 0.1 : 0.4;
  if (a >= 1.0) return hi;
  if (a <= 0.0) return lo;
  const double k = std::floor(std::log(worth) / std::log(a));
  return static_cast<int32_t>(std::clamp(k, static_cast<double>(lo), static_cast<double>(hi)));
}

Speculator::Speculator(const SpecOptions& o, Engine& target, Drafter* draft, MtpDrafter* mtp)
    : opt_(o), target_(target), drafter_(draft ? draft : mtp) {
  KVS_CHECK((o.mode == SpecMode::Draft || o.mode == SpecMode::Oracle) == (draft != nullptr),
            "speculation: a drafter is for --spec draft or oracle, and they need one");
  KVS_CHECK((o.mode == SpecMode::Mtp) == (mtp != nullptr),
            "speculation: an MTP drafter is for --spec mtp, and --spec mtp needs one");
  if (mtp) mtp->follow(target);
  seqs_.resize(static_cast<size_t>(target.options().n_seq));
  if (!on()) return;
  KVS_CHECK(o.draft_max >= 1 && o.draft_max < target.options().n_verify,
            "speculation: --draft-max ", o.draft_max, " needs an engine that verifies ",
            o.draft_max + 1, " tokens at once");
  KVS_CHECK(o.draft_min >= 0 && o.draft_min <= o.draft_max,
            "--draft-min must be 0 to --draft-max (", o.draft_max, "), got ", o.draft_min);
}

void Speculator::start(int32_t seq, const int32_t* tokens, int32_t n, const SamplerParams& sp) {
  Seq& s = seqs_.at(static_cast<size_t>(seq));
  s.length = DraftLength{};
  s.drafts = Drafts{};
  if (opt_.mode == SpecMode::Ngram) {
    s.ngram = NgramDrafter{};
    s.ngram.accept(tokens, n);
  } else if (drafter_) {
    drafter_->start(seq, tokens, n, sp);
  }
}

void Speculator::accept(int32_t seq, int32_t token) {
  if (opt_.mode == SpecMode::Ngram) seqs_.at(static_cast<size_t>(seq)).ngram.accept(token);
  if (drafter_) drafter_->accept(seq, token);
}

void Speculator::propose(const std::vector<Ask>& asks) {
  const bool streaming = target_.last_step().bytes_in > 0;
  const int32_t lo = std::max(1, opt_.draft_min);
  asks_.clear();
  for (const Ask& a : asks) {
    Seq& s = seqs_.at(static_cast<size_t>(a.seq));
    const auto max = static_cast<int32_t>(
        std::clamp<int64_t>(a.room, 0, s.length.next(lo, opt_.draft_max, streaming)));
    s.drafts.tokens.clear();
    s.drafts.q.clear();
    if (max < opt_.draft_min) continue;
    if (opt_.mode == SpecMode::Ngram)
      s.drafts.tokens = s.ngram.propose(max);
    else if (drafter_)
      asks_.push_back({a.seq, max, &s.drafts});
  }
  if (!asks_.empty()) drafter_->propose(asks_);
  for (const Ask& a : asks) {
    Drafts& d = seqs_.at(static_cast<size_t>(a.seq)).drafts;
    if (static_cast<int32_t>(d.tokens.size()) >= opt_.draft_min) continue;
    d.tokens.clear();
    d.q.clear();
  }
}

const float* Speculator::q(int32_t seq, int32_t i) const {
  const Drafts& d = at(seq).drafts;
  if (d.q.empty()) return nullptr;
  const size_t n_vocab = d.q.size() / d.tokens.size();
  return d.q.data() + static_cast<size_t>(i) * n_vocab;
}

void Speculator::verified(int32_t seq, int32_t accepted) {
  Seq& s = seqs_.at(static_cast<size_t>(seq));
  s.length.verified(static_cast<int32_t>(s.drafts.tokens.size()), accepted);
}

}  // namespace kvs
