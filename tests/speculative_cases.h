// Speculative decoding's verify step on any backend (tests/unit/test_speculative.cpp on the CPU,
// tests/cuda/test_cuda_speculative.cpp on CUDA): greedy decodes whose steps carry drafts, some
// accepted, some rolled back, against decodes of one token a step, logits compared bit for bit.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <random>
#include <utility>
#include <vector>

#include "stream_cases.h"

namespace kvs::test {

struct Decoded {
  std::vector<std::vector<int32_t>> tokens;           // [sequence][i]
  std::vector<std::vector<std::vector<float>>> rows;  // the logits token i was chosen from
  EngineStats totals;
  int64_t drafted = 0, accepted = 0, page_rollbacks = 0;
  // [sequence][n_past]: the first draft proposed when the target had read n_past positions (-1:
  // none).
  std::vector<std::vector<int32_t>> first_draft;
};

inline int32_t argmax(const float* l, int32_t n) {
  return static_cast<int32_t>(std::max_element(l, l + n) - l);
}

// Where a decode's steps get their drafts (none where unset): `propose` hears the sequences
// about to step and how many drafts each has room for, then `drafts` gives each one's (`have`:
// its tokens so far); `chosen` hears every token chosen, `verified` how many of a step's drafts
// held.
struct Drafting {
  std::function<void(const std::vector<std::pair<size_t, int64_t>>& asks)> propose;
  std::function<std::vector<int32_t>(size_t u, int32_t have, int64_t room)> drafts;
  std::function<void(size_t u, int32_t t)> chosen;
  std::function<void(size_t u, int32_t accepted)> verified;
};

// Greedy decode of the case's sequences (its prompts, gen_len tokens each) together on e, as
// `kvstream run` does: each step of a sequence carries its token and the drafts d gives; a
// rejected draft's replacement is the next step's token. `started` follows each prompt's
// prefill.
inline Decoded decode_on(
    Engine& e, const Case& c, int32_t V, const Drafting& d,
    const std::function<void(size_t u, const std::vector<int32_t>& prompt)>& started = {}) {
  const size_t N = c.prompt_len.size();
  Decoded r;
  r.tokens.resize(N);
  r.rows.resize(N);
  r.first_draft.assign(N, std::vector<int32_t>(static_cast<size_t>(c.n_ctx), -1));
  std::vector<Sequence> seqs(N);
  std::vector<std::vector<float>> cur(N);
  std::vector<int32_t> pending(N, -1);
  std::vector<std::vector<int32_t>> feed(N);
  for (size_t u = 0; u < N; ++u) {
    const auto p = tokens(c.seed * 100 + static_cast<uint32_t>(u), c.prompt_len[u], V);
    seqs[u] = e.open_sequence();
    const float* l = e.eval(seqs[u], p.data(), static_cast<int32_t>(p.size()));
    cur[u].assign(l, l + V);
    if (started) started(u, p);
  }
  // Records a chosen token; false when its sequence is complete (and closed).
  auto choose = [&](size_t u, const float* row, int32_t t) {
    r.rows[u].emplace_back(row, row + V);
    r.tokens[u].push_back(t);
    if (d.chosen) d.chosen(u, t);
    if (static_cast<int32_t>(r.tokens[u].size()) < c.gen_len[u]) return true;
    e.close_sequence(seqs[u]);
    return false;
  };
  for (size_t u = 0; u < N; ++u)
    if (c.gen_len[u] == 0) e.close_sequence(seqs[u]);
  for (;;) {
    std::vector<std::pair<size_t, int64_t>> asks;  // who steps, and its room for drafts
    for (size_t u = 0; u < N; ++u) {
      if (seqs[u].id < 0) continue;
      int32_t id = pending[u];
      pending[u] = -1;
      if (id < 0) {
        id = argmax(cur[u].data(), V);
        if (!choose(u, cur[u].data(), id)) continue;
      }
      feed[u].assign(1, id);
      asks.push_back({u, std::min<int64_t>(c.gen_len[u] - static_cast<int64_t>(r.tokens[u].size()),
                                           c.n_ctx - seqs[u].n_past - 1)});
    }
    if (asks.empty()) break;
    if (d.propose) d.propose(asks);
    std::vector<BatchEntry> batch;
    for (const auto& [u, room] : asks) {
      if (d.drafts) {
        const std::vector<int32_t> dr = d.drafts(u, static_cast<int32_t>(r.tokens[u].size()), room);
        feed[u].insert(feed[u].end(), dr.begin(), dr.end());
        if (!dr.empty()) r.first_draft[u][static_cast<size_t>(seqs[u].n_past)] = dr[0];
      }
      const auto n = static_cast<int32_t>(feed[u].size());
      batch.push_back({&seqs[u], feed[u].data(), n, n > 1});
    }
    e.step(batch);
    for (size_t j = 0; j < asks.size(); ++j) {
      const size_t u = asks[j].first;
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
          EXPECT_EQ(seqs[u].n_past, after);
          r.page_rollbacks += after / c.page < before / c.page;
          pending[u] = t;
          break;
        }
      }
      if (nd > 0 && d.verified) d.verified(u, accepted);
      r.drafted += nd;
      r.accepted += accepted;
    }
  }
  r.totals = e.totals();
  return r;
}

// With draft_max > 0 each sequence's step carries up to draft_max drafts: the tokens `oracle`
// chose after it, each replaced by a random one with probability 0.3, so steps accept all,
// some or none.
inline Decoded decode(const Model& m, Device& dev, const Case& c, KvMode mode, size_t arena,
                      int32_t draft_max, const Decoded* oracle) {
  EngineOptions o = options(c);
  o.kv_mode = mode;
  o.kv_arena = arena;
  o.n_verify = draft_max + 1;
  Engine e(m, dev, o);
  const int32_t V = m.config.n_vocab;
  std::mt19937 g(c.seed * 7 + 3);
  Drafting d;
  if (draft_max > 0)
    d.drafts = [&](size_t u, int32_t have, int64_t room) {
      int32_t k = static_cast<int32_t>(g() % static_cast<uint32_t>(draft_max + 1));
      k = static_cast<int32_t>(std::min<int64_t>(k, room));
      std::vector<int32_t> out;
      for (int32_t j = 0; j < k; ++j)
        out.push_back(g() % 10 < 7 ? oracle->tokens[u][static_cast<size_t>(have + j)]
                                   : static_cast<int32_t>(g() % static_cast<uint32_t>(V)));
      return out;
    };
  return decode_on(e, c, V, d);
}

inline void expect_same(const Decoded& want, const Decoded& got) {
  ASSERT_EQ(want.tokens, got.tokens);
  for (size_t u = 0; u < want.rows.size(); ++u)
    for (size_t i = 0; i < want.rows[u].size(); ++i)
      ASSERT_EQ(std::memcmp(want.rows[u][i].data(), got.rows[u][i].data(),
                            want.rows[u][i].size() * sizeof(float)),
                0)
          << "sequence " << u << ": the logits of token " << i << " differ";
}

// What n_cases random cases (hybrid and window models among them, every KV mode) exercised;
// max_step: the most tokens of a step (all sequences' with their drafts), 0 for no bound.
struct VerifyTotals {
  int64_t drafted = 0, accepted = 0, rejected = 0, page_rollbacks = 0, streamed = 0;
};

inline VerifyTotals verify_cases(Device& dev, int n_cases, int32_t max_step = 0) {
  std::mt19937 g(20261206);
  VerifyTotals t;
  for (int k = 0; k < n_cases; ++k) {
    Case c = random_case(g, k);
    if (k % 4 == 1) c.preset = k % 8 == 1 ? "tiny-gemma3" : "tiny-gemma3:q4_0";
    if (k % 4 == 2) c.preset = k % 8 == 2 ? "tiny-qwen35" : "tiny-qwen35:q4_k";
    auto m = Model::load("synthetic:" + c.preset);
    if (m->config.arch == Arch::Gemma3) m->config.n_swa = static_cast<int32_t>(1 + g() % 40);
    for (auto& n : c.gen_len) n += 20;
    const auto n_seq = static_cast<int32_t>(c.prompt_len.size());
    int32_t draft_max = static_cast<int32_t>(1 + g() % 8);
    if (max_step > 0) draft_max = std::max(1, std::min(draft_max, max_step / n_seq - 1));
    c.batch = std::max(c.batch, n_seq * (draft_max + 1));
    c.n_verify = draft_max + 1;  // the windows' frames in the arena's least
    const KvMode modes[] = {KvMode::Stream, KvMode::Auto, KvMode::Resident, KvMode::Host};
    const KvMode mode = modes[k % 4];
    if (mode == KvMode::Stream) {  // long histories through the least arena: most pages stream
      c.n_ctx = 1024;
      for (auto& n : c.prompt_len) n += 400;
      c.arena_frac = 0;
    }
    const size_t arena = mode == KvMode::Stream || mode == KvMode::Auto ? case_arena(*m, c) : 0;
    SCOPED_TRACE(cat(c.str(), " drafts up to ", draft_max, " in mode ", kv_mode_name(mode)));
    // Host mode attends on the CPU: the same kernels for both runs (on the CPU backend they
    // are resident mode's as well).
    const KvMode base = mode == KvMode::Host ? KvMode::Host : KvMode::Resident;
    const Decoded want = decode(*m, dev, c, base, 0, 0, nullptr);
    const Decoded got = decode(*m, dev, c, mode, arena, draft_max, &want);
    expect_same(want, got);
    t.drafted += got.drafted;
    t.accepted += got.accepted;
    t.rejected += got.drafted - got.accepted;
    t.page_rollbacks += got.page_rollbacks;
    t.streamed += got.totals.bytes_in > 0;
  }
  return t;
}

}  // namespace kvs::test
