// The generation loop through its own API (Decoder, as run, chat, bench and serve drive it):
// plain, prompt lookup and draft-model decoding of several sequences in one batch give the same
// greedy tokens, resident and streamed; the caller's adjustment of the logits (serve's
// penalties) holds for drafts as for sampled tokens; a sequence that ends among accepted drafts
// keeps in its KV only the tokens before its last.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "kvs/engine/generate.h"
#include "kvs/model/synthetic.h"
#include "stream_cases.h"

namespace kvs::test {
namespace {

struct Generated {
  std::vector<std::vector<int32_t>> tokens;  // [sequence]
  std::vector<int32_t> n_past;               // each sequence's positions when it ended
  int64_t drafted = 0, accepted = 0;
  size_t streamed = 0;
};

// Greedy generation of n_gen tokens after each prompt, all sequences in one batch a step; with
// `draft` its drafts, else with SpecMode::Ngram prompt lookup's. banned: a token whose logit the
// caller sets to -inf (-1: none).
Generated generate(const Model& m, const Model* draft, SpecMode mode, KvMode kv,
                   const std::vector<std::vector<int32_t>>& prompts, int32_t n_gen,
                   int32_t banned = -1) {
  auto dev = make_cpu_device(0);
  const int32_t V = m.config.n_vocab;
  EngineOptions o;
  o.n_ctx = 256;
  o.n_batch = 64;
  o.page_size = 8;
  o.n_seq = static_cast<int32_t>(prompts.size());
  o.kv_mode = kv;
  o.n_verify = mode == SpecMode::Off ? 1 : 5;
  if (kv == KvMode::Stream) {  // the smallest arena: most pages stream
    const KvLayout l = KvLayout::make(o.k_type, o.v_type, o.page_size, m.config.n_head_kv,
                                      m.config.head_dim);
    o.kv_arena = min_arena_bytes(l.page_bytes(), Engine::fixed_frames(m.config, o));
  }
  std::unique_ptr<ModelDrafter> drafter;
  if (draft) drafter = std::make_unique<ModelDrafter>(*draft, m, *dev, o, 4, 0.0);
  Engine eng(m, *dev, o);
  Speculator spec({mode, 4, 1}, eng, drafter.get());
  Decoder decoder(eng, V, &spec);
  SamplerParams greedy;
  greedy.temp = 0;
  const size_t N = prompts.size();
  std::vector<Sampler> samplers(N, Sampler(greedy));
  std::vector<Sequence> seqs(N);
  std::vector<Decoding> ds(N);
  Generated g;
  g.tokens.resize(N);
  g.n_past.assign(N, -1);
  std::vector<float> work;
  const Decoder::Adjust adjust = [&](const float* row) {
    if (banned < 0) return row;
    work.assign(row, row + V);
    work[static_cast<size_t>(banned)] = -INFINITY;
    return static_cast<const float*>(work.data());
  };
  auto take = [&](size_t u) -> Decoder::Take {
    return [&, u](int32_t id, const float*, int32_t n_past, bool) {
      g.tokens[u].push_back(id);
      EXPECT_EQ(n_past, static_cast<int32_t>(prompts[u].size() + g.tokens[u].size()) - 1);
      return static_cast<int32_t>(g.tokens[u].size()) < n_gen;
    };
  };
  for (size_t u = 0; u < N; ++u) {
    seqs[u] = eng.open_sequence();
    const auto n = static_cast<int32_t>(prompts[u].size());
    const float* l = eng.eval(seqs[u], prompts[u].data(), n);
    ds[u] = Decoding{&seqs[u], &samplers[u]};
    decoder.start(ds[u], prompts[u].data(), n);
    decoder.first(ds[u], l, take(u), adjust);
  }
  for (;;) {
    std::vector<Decoding*> who;
    for (Decoding& d : ds)
      if (d.next >= 0) who.push_back(&d);
    if (who.empty()) break;
    std::vector<BatchEntry> batch;
    decoder.add_steps(who, batch);
    eng.step(batch);
    for (size_t j = 0; j < who.size(); ++j) {
      const auto u = static_cast<size_t>(who[j] - ds.data());
      decoder.advance(*who[j], static_cast<int32_t>(j), take(u), adjust);
      if (who[j]->next < 0) g.n_past[u] = seqs[u].n_past;
    }
  }
  for (const Decoding& d : ds) g.drafted += d.drafted, g.accepted += d.accepted;
  g.streamed = eng.totals().bytes_in;
  return g;
}

// Prompts that repeat themselves, so that prompt lookup finds drafts.
std::vector<std::vector<int32_t>> prompts(int32_t V) {
  std::vector<std::vector<int32_t>> p;
  for (uint32_t i = 0; i < 3; ++i) {
    const std::vector<int32_t> part = tokens(7 + i, 12 + 5 * static_cast<int32_t>(i), V);
    std::vector<int32_t> whole;
    for (int r = 0; r < 4; ++r) whole.insert(whole.end(), part.begin(), part.end());
    p.push_back(whole);
  }
  return p;
}

TEST(Generate, PlainNgramAndDraftModelGiveTheSameTokens) {
  auto m = Model::load("synthetic:tiny-qwen3");
  auto d = Model::load("synthetic:tiny-qwen3:q4_0");
  const auto p = prompts(m->config.n_vocab);
  for (KvMode kv : {KvMode::Resident, KvMode::Stream}) {
    SCOPED_TRACE(kv_mode_name(kv));
    const Generated plain = generate(*m, nullptr, SpecMode::Off, kv, p, 40);
    const Generated ngram = generate(*m, nullptr, SpecMode::Ngram, kv, p, 40);
    const Generated model = generate(*m, d.get(), SpecMode::Draft, kv, p, 40);
    EXPECT_EQ(plain.tokens, ngram.tokens);
    EXPECT_EQ(plain.tokens, model.tokens);
    EXPECT_EQ(plain.drafted, 0);
    EXPECT_GT(ngram.drafted, 0);
    EXPECT_GT(model.accepted, 0);
    EXPECT_LT(model.accepted, model.drafted);  // some rolled back
    if (kv == KvMode::Stream) {
      EXPECT_GT(model.streamed, 0u);
    }
    // Every sequence ends with its last token unread: the drafts after it rolled back too.
    for (size_t u = 0; u < p.size(); ++u) {
      EXPECT_EQ(plain.n_past[u], static_cast<int32_t>(p[u].size()) + 39);
      EXPECT_EQ(ngram.n_past, plain.n_past);
      EXPECT_EQ(model.n_past, plain.n_past);
    }
  }
}

TEST(Generate, TheCallersAdjustmentHoldsForDrafts) {
  auto m = Model::load("synthetic:tiny");
  const auto p = prompts(m->config.n_vocab);
  const Generated plain = generate(*m, nullptr, SpecMode::Off, KvMode::Resident, p, 30);
  const int32_t banned = plain.tokens[0][3];
  const Generated a = generate(*m, nullptr, SpecMode::Off, KvMode::Resident, p, 30, banned);
  const Generated b = generate(*m, m.get(), SpecMode::Draft, KvMode::Resident, p, 30, banned);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_GT(b.drafted, 0);
  for (const auto& t : b.tokens) EXPECT_EQ(std::count(t.begin(), t.end(), banned), 0);
}

}  // namespace
}  // namespace kvs::test
