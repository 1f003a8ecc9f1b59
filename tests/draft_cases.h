// Greedy decoding with a draft model or the model's MTP block, shared by the CPU
// (tests/unit/test_draft_model.cpp, test_mtp.cpp) and CUDA (tests/cuda/test_cuda_draft.cpp,
// test_cuda_mtp.cpp) tests: the sequences of a stream_cases.h Case decoded together as
// `kvstream run` does, each step carrying the drafts the Speculator proposes.
#pragma once

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "kvs/engine/speculation.h"
#include "speculative_cases.h"

namespace kvs::test {

// Greedy decode of the case's sequences (its prompts, gen_len tokens each) together, as
// `kvstream run` does: with a draft model each step of a sequence carries its token and the
// drafts the Speculator proposes; a rejected draft's replacement is the next step's token.
// On `dev`, or on a fresh CPU device when it is null; no draft: plain decoding, or with `mtp`
// the drafts of m's MTP block.
inline Decoded decode(const Model& m, const Model* draft, const Case& c, KvMode mode, size_t arena,
                      int32_t draft_max, Device* dev = nullptr, bool mtp = false) {
  std::unique_ptr<Device> own;
  if (!dev) {
    own = make_cpu_device(0);
    dev = own.get();
  }
  EngineOptions o = options(c);
  o.kv_mode = mode;
  o.kv_arena = arena;
  std::unique_ptr<ModelDrafter> drafter;
  std::unique_ptr<MtpDrafter> block;
  if (draft || mtp) o.n_verify = draft_max + 1;
  if (draft) drafter = std::make_unique<ModelDrafter>(*draft, m, *dev, o, draft_max, 0.0);
  if (mtp) block = std::make_unique<MtpDrafter>(m, *dev, o, draft_max, 0.0);
  Engine e(m, *dev, o, block ? &block->engine() : nullptr);
  const SpecMode sm = draft ? SpecMode::Draft : mtp ? SpecMode::Mtp : SpecMode::Off;
  Speculator spec({sm, draft_max, 1}, e, drafter.get(), block.get());
  const int32_t V = m.config.n_vocab, N = o.n_seq;
  SamplerParams greedy;
  greedy.temp = 0;
  Decoded r;
  r.tokens.resize(static_cast<size_t>(N));
  r.rows.resize(static_cast<size_t>(N));
  r.first_draft.assign(static_cast<size_t>(N),
                       std::vector<int32_t>(static_cast<size_t>(c.n_ctx), -1));
  std::vector<Sequence> seqs(static_cast<size_t>(N));
  std::vector<std::vector<float>> cur(static_cast<size_t>(N));
  std::vector<int32_t> pending(static_cast<size_t>(N), -1);
  std::vector<std::vector<int32_t>> feed(static_cast<size_t>(N));
  for (int32_t i = 0; i < N; ++i) {
    const auto u = static_cast<size_t>(i);
    const auto p = tokens(c.seed * 100 + static_cast<uint32_t>(i), c.prompt_len[u], V);
    seqs[u] = e.open_sequence();
    const float* l = e.eval(seqs[u], p.data(), static_cast<int32_t>(p.size()));
    cur[u].assign(l, l + V);
    if (spec.on()) spec.start(i, p.data(), static_cast<int32_t>(p.size()), greedy);
  }
  // Records a chosen token; false when its sequence is complete (and closed).
  auto choose = [&](size_t u, const float* row, int32_t t) {
    r.rows[u].emplace_back(row, row + V);
    r.tokens[u].push_back(t);
    if (spec.on()) spec.accept(static_cast<int32_t>(u), t);
    if (static_cast<int32_t>(r.tokens[u].size()) < c.gen_len[u]) return true;
    e.close_sequence(seqs[u]);
    return false;
  };
  for (;;) {
    std::vector<size_t> who;
    std::vector<Speculator::Ask> asks;
    for (size_t u = 0; u < static_cast<size_t>(N); ++u) {
      if (seqs[u].id < 0) continue;
      int32_t id = pending[u];
      pending[u] = -1;
      if (id < 0) {
        id = argmax(cur[u].data(), V);
        if (!choose(u, cur[u].data(), id)) continue;
      }
      feed[u].assign(1, id);
      who.push_back(u);
      asks.push_back({static_cast<int32_t>(u),
                      std::min<int64_t>(c.gen_len[u] - static_cast<int64_t>(r.tokens[u].size()),
                                        c.n_ctx - seqs[u].n_past - 1)});
    }
    if (who.empty()) break;
    if (spec.on()) spec.propose(asks);
    std::vector<BatchEntry> batch;
    for (size_t u : who) {
      if (spec.on()) {
        const std::vector<int32_t>& d = spec.drafts(static_cast<int32_t>(u));
        feed[u].insert(feed[u].end(), d.begin(), d.end());
        if (!d.empty()) r.first_draft[u][static_cast<size_t>(seqs[u].n_past)] = d[0];
      }
      const auto n = static_cast<int32_t>(feed[u].size());
      batch.push_back({&seqs[u], feed[u].data(), n, n > 1});
    }
    e.step(batch);
    for (size_t j = 0; j < who.size(); ++j) {
      const size_t u = who[j];
      const auto ej = static_cast<int32_t>(j);
      const float* last = e.logits(ej);
      cur[u].assign(last, last + V);
      const auto nd = static_cast<int32_t>(feed[u].size()) - 1;
      int32_t accepted = 0;
      for (int32_t k = 0; k < nd; ++k) {
        const float* row = e.logits(ej, k);
        const int32_t t = argmax(row, V);
        const bool ok = t == feed[u][static_cast<size_t>(k) + 1];
        accepted += ok;
        if (!choose(u, row, t)) break;
        if (!ok) {
          const int32_t before = seqs[u].n_past, after = before - (nd - k);
          e.truncate(seqs[u], after);
          r.page_rollbacks += after / c.page < before / c.page;
          pending[u] = t;
          break;
        }
      }
      if (nd > 0) spec.verified(static_cast<int32_t>(u), accepted);
      r.drafted += nd;
      r.accepted += accepted;
    }
  }
  r.totals = e.totals();
  return r;
}

}  // namespace kvs::test
