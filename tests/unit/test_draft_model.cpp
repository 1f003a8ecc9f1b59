// Speculative decoding with a draft model (ModelDrafter through the Speculator, as run, chat and
// serve drive it): greedy output equal to plain decoding token for token and logit for logit
// (every verified row bit-identical), resident and streamed, for llama, qwen3, gemma3's windows
// and qwen35's recurrent state, as target and as draft; the draft model's memory taken from the
// target's arena under a device limit; a vocabulary mismatch refused by name before anything is
// allocated; with a temperature the output's law is the target's; the adaptive draft length.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <vector>

#include "draft_cases.h"
#include "kvs/engine/speculation.h"
#include "kvs/gguf/gguf.h"
#include "kvs/model/synthetic.h"
#include "kvs/tokenizer/tokenizer.h"
#include "kvs/util/error.h"

namespace kvs::test {
namespace {

struct DraftCase {
  const char* target;
  const char* draft;
  KvMode mode;
  int32_t n_seq, draft_max;
};

TEST(DraftModel, GreedyGivesTheTokensAndLogitsOfPlainDecoding) {
  // The same weights quantized otherwise draft well (most drafts accepted, some not); another
  // model of the vocabulary drafts badly (most rejected); the target itself drafts what it
  // decodes (every draft accepted: its sequences follow the target's through every rollback).
  const DraftCase cases[] = {
      {"tiny", "tiny:q4_0", KvMode::Resident, 1, 6},
      {"tiny", "tiny-qwen2", KvMode::Stream, 2, 4},
      {"tiny-qwen3", "tiny-qwen3:q4_0", KvMode::Resident, 3, 8},
      {"tiny-qwen3", "tiny-qwen3:q4_0", KvMode::Stream, 2, 5},
      {"tiny-gemma3", "tiny-gemma3:q4_0", KvMode::Auto, 2, 6},
      {"tiny-qwen35", "tiny-qwen35:q4_k", KvMode::Resident, 2, 6},
      {"tiny-qwen35", "tiny-qwen35:q4_k", KvMode::Stream, 1, 7},
      {"tiny-qwen35:q4_k", "tiny", KvMode::Stream, 2, 3},
      {"tiny", "tiny", KvMode::Stream, 2, 5},
      {"tiny-gemma3", "tiny-gemma3", KvMode::Resident, 2, 8},
      {"tiny-qwen35", "tiny-qwen35", KvMode::Resident, 2, 8},
      {"tiny-qwen35", "tiny-qwen35", KvMode::Stream, 1, 4},
  };
  int64_t accepted = 0, rejected = 0;
  uint32_t seed = 1;
  for (const DraftCase& dc : cases) {
    Case c;
    c.preset = dc.target;
    c.seed = seed++;
    c.page = 8;
    c.batch = 64;
    c.n_ctx = 512;
    c.chunk = 4096;
    c.n_verify = dc.draft_max + 1;
    for (int32_t i = 0; i < dc.n_seq; ++i) {
      c.prompt_len.push_back(dc.mode == KvMode::Stream ? 200 + 37 * i : 30 + 11 * i);
      c.gen_len.push_back(60 + 7 * i);
    }
    auto m = Model::load(std::string("synthetic:") + dc.target);
    auto d = Model::load(std::string("synthetic:") + dc.draft);
    const size_t arena = dc.mode == KvMode::Resident ? 0 : case_arena(*m, c);
    SCOPED_TRACE(cat(dc.target, " drafted by ", dc.draft, ", up to ", dc.draft_max, ", mode ",
                     kv_mode_name(dc.mode), ", ", dc.n_seq, " sequences"));
    const Decoded want = decode(*m, nullptr, c, KvMode::Resident, 0, dc.draft_max);
    const Decoded got = decode(*m, d.get(), c, dc.mode, arena, dc.draft_max);
    expect_same(want, got);
    EXPECT_GT(got.drafted, 0);
    if (dc.mode == KvMode::Stream) {
      EXPECT_GT(got.totals.bytes_in, 0u);
    }
    accepted += got.accepted;
    rejected += got.drafted - got.accepted;
    if (std::string(dc.target) == dc.draft) {  // it drafts what the target decodes
      EXPECT_EQ(got.accepted, got.drafted);
    }
  }
  EXPECT_GT(accepted, 300);
  EXPECT_GT(rejected, 100);
}

// The draft model's engine is built first on the target's device; under a device limit what it
// takes (weights, buffers, its whole KV) is what the target's arena no longer gets.
TEST(DraftModel, ItsMemoryComesOutOfTheTargetsArena) {
  auto m = Model::load("synthetic:tiny-h128");
  auto d = Model::load("synthetic:tiny");
  EngineOptions o;
  o.n_ctx = 4096;
  o.n_seq = 2;
  o.page_size = 16;
  o.n_verify = 5;
  o.phase_arena = false;
  size_t want = 0, rest = 0, draft_bytes = 0;
  {
    auto dev = make_cpu_device(0);
    Engine e(*m, *dev, o);
    want = e.arena_bytes();
    rest = dev->used() - want;
    ModelDrafter dr(*d, *m, *dev, o, 4, 0.0);
    draft_bytes = dr.device_bytes();
  }
  ASSERT_LT(draft_bytes, want);
  const size_t cap = rest + draft_bytes + (want - draft_bytes) / 2;
  size_t alone = 0, beside = 0;
  {
    auto dev = make_cpu_device(cap);
    alone = Engine(*m, *dev, o).arena_bytes();
  }
  {
    auto dev = make_cpu_device(cap);
    ModelDrafter dr(*d, *m, *dev, o, 4, 0.0);
    EXPECT_EQ(dr.device_bytes(), draft_bytes);
    beside = Engine(*m, *dev, o).arena_bytes();
  }
  EXPECT_LT(alone, want);
  const size_t page =
      KvLayout::make(o.k_type, o.v_type, o.page_size, m->config.n_head_kv, m->config.head_dim)
          .page_bytes();
  EXPECT_NEAR(static_cast<double>(alone - beside), static_cast<double>(draft_bytes),
              static_cast<double>(page));
}

// A synthetic tiny model written to a file with one change to its vocabulary.
std::string tiny_with(const char* name, gguf::Value v, const std::string& file) {
  gguf::Writer w = synthetic_writer("tiny");
  w.set(name, std::move(v));
  const std::vector<uint8_t> bytes = w.to_bytes();
  const std::string path = (std::filesystem::temp_directory_path() / file).string();
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()),
             static_cast<std::streamsize>(bytes.size()));
  return path;
}

TEST(DraftModel, AnotherVocabularyIsRefusedByNameBeforeAnythingIsAllocated) {
  auto m = Model::load("synthetic:tiny");
  EngineOptions o;
  o.n_verify = 5;
  const auto refusal = [&](const Model& d) {
    auto dev = make_cpu_device(0);
    try {
      ModelDrafter dr(d, *m, *dev, o, 4, 0.0);
    } catch (const Error& e) {
      EXPECT_EQ(dev->used(), 0u) << "allocated before refusing";
      return std::string(e.what());
    }
    return std::string();
  };
  auto size = Model::load("synthetic:tiny");
  size->config.n_vocab = 500;
  EXPECT_NE(refusal(*size).find("500 tokens against 512"), std::string::npos) << refusal(*size);
  EXPECT_NE(refusal(*size).find("vocab size"), std::string::npos);

  SyntheticVocab v = make_synthetic_vocab(512);
  gguf::Array texts;
  for (size_t i = 0; i < v.tokens.size(); ++i)
    texts.push_back(gguf::Value::str(i == 2 ? "<|eot|>" : v.tokens[i]));
  auto text = Model::load(tiny_with("tokenizer.ggml.tokens",
                                    gguf::Value::array(gguf::ValueType::STRING, std::move(texts)),
                                    "kvs_draft_texts.gguf"));
  const std::string t = refusal(*text);
  EXPECT_NE(t.find("-md/--model-draft"), std::string::npos) << t;
  EXPECT_NE(t.find("token 2 is '<|eot|>' in the draft model, '<|im_end|>' in the target"),
            std::string::npos)
      << t;

  auto eos = Model::load(
      tiny_with("tokenizer.ggml.eos_token_id", gguf::Value::u32(2), "kvs_draft_eos.gguf"));
  const std::string e = refusal(*eos);
  EXPECT_NE(e.find("eos id 2 against 0 (special ids)"), std::string::npos) << e;
  EXPECT_EQ(refusal(*Model::load("synthetic:tiny-qwen3")), "");
}

// Sampling with a temperature: the drafts are drawn from the draft model's own distribution q
// and verified with it, so the tokens that come out follow the target's law p. After a fixed
// prompt and token, the pair of the next two tokens (from one verify step of two drafts, or
// from a rejection's residual and the step after it) is counted over many seeds and compared
// with p's exact joint law by chi-square. The draft model is the target itself drawing at
// another temperature, so q and p differ on the same tokens: the same drafts verified with a q
// other than the one they were drawn from (p's, as a drafter that forgot its temperature would
// give) come out with a law far from p, so the test can fail.
std::vector<std::pair<int32_t, double>> law_of(const float* logits, int32_t V,
                                               const SamplerParams& sp) {
  std::vector<int32_t> ids(static_cast<size_t>(V));
  for (int32_t i = 0; i < V; ++i) ids[static_cast<size_t>(i)] = i;
  std::partial_sort(ids.begin(), ids.begin() + sp.top_k, ids.end(),
                    [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  std::vector<std::pair<int32_t, double>> law;
  double z = 0;
  for (int32_t k = 0; k < sp.top_k; ++k) {
    const int32_t id = ids[static_cast<size_t>(k)];
    const double w =
        std::exp(static_cast<double>(logits[id] - logits[ids[0]]) / static_cast<double>(sp.temp));
    law.emplace_back(id, w);
    z += w;
  }
  for (auto& [id, w] : law) w /= z;
  return law;
}

TEST(DraftModel, SampledDraftsKeepTheTargetsLaw) {
  auto m = Model::load("synthetic:tiny");
  const int32_t V = m->config.n_vocab;
  SamplerParams sp;  // the target's
  sp.temp = 0.5f;
  sp.top_k = 3;
  sp.top_p = 1.0f;
  sp.min_p = 0.0f;
  SamplerParams dp = sp;  // the drafts'
  dp.temp = 5.0f;
  auto dev = make_cpu_device(0);
  EngineOptions o;
  o.n_ctx = 128;
  o.page_size = 8;
  o.n_verify = 3;
  ModelDrafter dr(*m, *m, *dev, o, 2, 0.0);
  Engine e(*m, *dev, o);
  Speculator spec({SpecMode::Draft, 2, 1}, e, &dr);
  std::vector<int32_t> prompt = tokens(77, 20, V);
  const auto P = static_cast<int32_t>(prompt.size());
  Sequence s = e.open_sequence();
  e.eval(s, prompt.data(), P);
  prompt.push_back(5);  // the fixed token the drafts follow
  // p's joint law of the pair, from one-token steps.
  std::map<std::pair<int32_t, int32_t>, double> law, counts[2];  // counts: wrong q, their q
  for (const auto& [a, pa] : law_of(e.eval(s, &prompt.back(), 1), V, sp)) {
    for (const auto& [b, pb] : law_of(e.eval(s, &a, 1), V, sp)) law[{a, b}] = pa * pb;
    e.truncate(s, P + 1);
  }
  e.truncate(s, P);
  constexpr int kTrials = 4000;
  int64_t accepted = 0, drafted = 0;
  for (int with_q = 0; with_q < 2; ++with_q)
    for (int trial = 0; trial < kTrials; ++trial) {
      SamplerParams t = sp, d = dp;
      t.seed = d.seed = static_cast<uint64_t>(trial) * 2 + static_cast<uint64_t>(with_q);
      Sampler sampler(t);
      spec.start(0, prompt.data(), P + 1, d);
      spec.propose({{0, 2}});
      std::vector<int32_t> feed = {prompt.back()};
      const std::vector<int32_t>& drafts = spec.drafts(0);
      feed.insert(feed.end(), drafts.begin(), drafts.end());
      ASSERT_EQ(feed.size(), 3u);
      ASSERT_NE(spec.q(0, 1), nullptr);
      e.step({BatchEntry{&s, feed.data(), 3, true}});
      int32_t pair[2];
      int32_t got = 0;
      for (int32_t j = 0; j < 2; ++j) {
        std::vector<float> wrong(static_cast<size_t>(V), 0.0f);
        for (const auto& [id, p] : law_of(e.logits(0, j), V, sp))
          wrong[static_cast<size_t>(id)] = static_cast<float>(p);
        bool ok = false;
        pair[got++] = sampler.verify(e.logits(0, j), V, feed[static_cast<size_t>(j) + 1],
                                     with_q ? spec.q(0, j) : wrong.data(), &ok);
        accepted += with_q && ok;
        drafted += with_q;
        if (!ok) break;
      }
      if (got == 1) {  // the first draft rejected: the second token from the step after it
        e.truncate(s, P + 1);
        pair[got++] = sampler.sample(e.eval(s, &pair[0], 1), V);
      }
      e.truncate(s, P);
      counts[with_q][{pair[0], pair[1]}] += 1;
    }
  double chi2[2] = {0, 0};
  for (int w = 0; w < 2; ++w) {
    for (const auto& [pair, c] : counts[w])
      EXPECT_TRUE(law.count(pair)) << "a pair p cannot give: " << pair.first << " " << pair.second;
    for (const auto& [pair, p] : law) {
      const double expect = p * kTrials, c = counts[w][pair];
      chi2[w] += (c - expect) * (c - expect) / expect;
    }
  }
  // 9 cells, 8 degrees of freedom: P(chi-square > 55) ~ 1e-8.
  EXPECT_LT(chi2[1], 55.0) << "drafts verified with their q";
  EXPECT_GT(chi2[0], 10 * 55.0) << "drafts verified with p as their q";
  EXPECT_GT(accepted, drafted / 4);
  EXPECT_LT(accepted, drafted);
}

TEST(DraftLength, AdaptsToTheAcceptanceAndToStreaming) {
  DraftLength fresh;
  EXPECT_EQ(fresh.next(1, 8, true), 8);  // 0.75^8 = 0.10
  EXPECT_EQ(fresh.next(1, 8, false), 3);
  DraftLength good, bad;
  for (int i = 0; i < 40; ++i) {
    good.verified(8, 8);
    bad.verified(4, 0);
  }
  EXPECT_EQ(good.next(1, 8, false), 8);
  EXPECT_EQ(good.next(2, 5, true), 5);
  EXPECT_EQ(bad.next(1, 8, true), 1);
  EXPECT_EQ(bad.next(3, 8, false), 3);
  DraftLength half;  // one draft in two accepted: a = 1/2
  for (int i = 0; i < 200; ++i) half.verified(2, 1);
  EXPECT_NEAR(half.acceptance(), 0.5, 1e-6);
  EXPECT_EQ(half.next(1, 8, true), 3);   // 0.5^3 >= 0.1 > 0.5^4
  EXPECT_EQ(half.next(1, 8, false), 1);  // 0.5 >= 0.4 > 0.5^2
  half.verified(0, 0);                   // a step without drafts tells nothing
  EXPECT_NEAR(half.acceptance(), 0.5, 1e-6);
}

}  // namespace
}  // namespace kvs::test
