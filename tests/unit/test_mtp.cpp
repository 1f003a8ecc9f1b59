// The MTP drafter (qwen35's nextn block through the Speculator, as run, chat and serve drive
// it): its logits against tools/reference.py's MTP head; greedy output equal to plain decoding
// token for token and logit for logit, resident and streamed, for 1 to 4 sequences; its KV
// rolled back across pages after every rejected draft, so that each proposal's first draft is
// the one a drafter that never drafted ahead would make; sampled drafts with the distribution
// they were drawn from; models without an MTP block refused by name.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "common.h"
#include "draft_cases.h"
#include "kvs/engine/mtp_draft.h"
#include "kvs/gguf/gguf.h"
#include "kvs/model/synthetic.h"
#include "kvs/quant/types.h"
#include "kvs/util/error.h"
#include "kvs/util/npy.h"

namespace kvs::test {
namespace {

// tests/e2e/test_reference.cpp's tolerance for the CPU backend against the reference.
constexpr float kLogitTolerance = 2e-2f;

std::string write_synthetic(const char* preset, const std::string& file) {
  const std::vector<uint8_t> bytes = synthetic_writer(preset).to_bytes();
  const std::string path = (temp_dir("mtp") / file).string();
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()),
             static_cast<std::streamsize>(bytes.size()));
  return path;
}

// The MTP logits of entries 0 .. n-2 of `prompt` by tools/reference.py.
std::vector<float> reference_mtp(const std::string& model, const std::vector<int32_t>& prompt) {
  const auto dir = temp_dir("mtp");
  const std::string tokens = (dir / "prompt.tokens").string(), npy = (dir / "mtp.npy").string();
  {
    std::ofstream f(tokens);
    for (size_t i = 0; i < prompt.size(); ++i) f << (i ? "," : "") << prompt[i];
  }
  const std::string cmd = python() + " " + source_dir() + "/tools/reference.py " + model +
                          " --tokens-file " + tokens + " --kv-type f16 --mtp-logits-out " + npy +
                          " >/dev/null";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  return read_npy(npy).data;
}

float max_diff(const float* a, const float* b, int32_t n) {
  float m = 0;
  for (int32_t i = 0; i < n; ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

// Entry q's logits come from the block's step after the target's step that holds token q + 1:
// token by token, one entry a step; the prompt at once, all entries in one step (its last
// entry's logits compared).
TEST(Mtp, LogitsMatchTheReference) {
  const std::string path = write_synthetic("tiny-qwen35", "tiny-qwen35.gguf");
  auto m = Model::load(path);
  const int32_t V = m->config.n_vocab, T = 40;
  const std::vector<int32_t> prompt = tokens(7, T, V);
  const std::vector<float> ref = reference_mtp(path, prompt);
  ASSERT_EQ(ref.size(), static_cast<size_t>(T - 1) * static_cast<size_t>(V));
  EngineOptions o;
  o.n_ctx = 128;
  o.page_size = 16;
  o.kv_mode = KvMode::Resident;
  {
    auto dev = make_cpu_device(0);
    MtpDrafter mtp(*m, *dev, o, 4, 0.0);
    Engine e(*m, *dev, o, &mtp.engine());
    mtp.follow(e);
    Sequence s = e.open_sequence();
    float worst = 0, spread = 0;
    for (int32_t t = 0; t < T; ++t) {
      e.eval(s, &prompt[static_cast<size_t>(t)], 1);
      if (t == 0) continue;
      const float* got = mtp.engine().logits(0);
      const float* want = ref.data() + static_cast<size_t>(t - 1) * static_cast<size_t>(V);
      worst = std::max(worst, max_diff(got, want, V));
      spread =
          std::max(spread, *std::max_element(want, want + V) - *std::min_element(want, want + V));
    }
    std::printf("MTP logits token by token: max |diff| %.3g (logits spread %.3g)\n",
                static_cast<double>(worst), static_cast<double>(spread));
    EXPECT_LT(worst, kLogitTolerance);
    EXPECT_GT(spread, 100 * kLogitTolerance);  // a difference of the tolerance would show
  }
  auto dev = make_cpu_device(0);
  MtpDrafter mtp(*m, *dev, o, 4, 0.0);
  Engine e(*m, *dev, o);
  mtp.follow(e);
  Sequence s = e.open_sequence();
  e.eval(s, prompt.data(), T);
  const float d = max_diff(mtp.engine().logits(0), ref.data() + static_cast<size_t>(T - 2) * V, V);
  std::printf("MTP logits of the prompt's last entry: max |diff| %.3g\n", static_cast<double>(d));
  EXPECT_LT(d, kLogitTolerance);
}

// The first draft the MTP block proposes when the target has read each position of plain
// greedy decoding of sequence i of case c, by a drafter that follows the decode without ever
// drafting further (its entries all made from the target's states, none rolled back but the
// one each proposal makes).
std::vector<int32_t> first_drafts_alone(const Model& m, const Case& c, size_t i) {
  EngineOptions o = options(c);
  o.n_seq = 1;
  o.n_verify = 1;
  o.kv_mode = KvMode::Resident;
  auto dev = make_cpu_device(0);
  MtpDrafter mtp(m, *dev, o, 1, 0.0);
  Engine e(m, *dev, o);
  mtp.follow(e);
  const int32_t V = m.config.n_vocab;
  const auto p = tokens(c.seed * 100 + static_cast<uint32_t>(i), c.prompt_len[i], V);
  Sequence s = e.open_sequence();
  const float* l = e.eval(s, p.data(), static_cast<int32_t>(p.size()));
  SamplerParams greedy;
  greedy.temp = 0;
  mtp.start(s.id, p.data(), static_cast<int32_t>(p.size()), greedy);
  std::vector<int32_t> first(static_cast<size_t>(c.n_ctx), -1);
  for (int32_t k = 0; k < c.gen_len[i]; ++k) {
    const int32_t t = argmax(l, V);
    mtp.accept(s.id, t);
    Drafts d;
    mtp.propose({{s.id, 1, &d}});
    if (!d.tokens.empty()) first[static_cast<size_t>(s.n_past)] = d.tokens[0];
    l = e.eval(s, &t, 1);
  }
  return first;
}

// A synthetic model whose token 0 the trunk and the MTP block both choose often: its row of the
// (shared) output matrix scaled up, so that drafts are accepted now and then, some steps keeping
// several and rejecting the rest. With `always`, the block's final norm is zero: its logits are
// too, and it drafts token 0 every time, which the trunk takes about half the time: long runs
// of drafts accepted. `rows` holds the matrix, in f32.
std::unique_ptr<Model> favouring_token_0(const char* preset, bool always,
                                         std::vector<float>& rows) {
  auto m = Model::load(std::string("synthetic:") + preset);
  Matrix& out = m->weights.output;
  rows.resize(static_cast<size_t>(out.n_in * out.n_out));
  for (int64_t r = 0; r < out.n_out; ++r)
    dequantize_row(out.type, out.row(r), rows.data() + r * out.n_in, out.n_in);
  for (int64_t i = 0; i < out.n_in; ++i) rows[static_cast<size_t>(i)] *= 40.0f;
  out.type = DType::F32;
  out.row_bytes = row_bytes(DType::F32, out.n_in);
  out.data = reinterpret_cast<const uint8_t*>(rows.data());
  if (always) {
    Vec& norm = m->weights.nextn.at(0).shared_head_norm;
    std::fill(norm.begin(), norm.end(), 0.0f);
  }
  return m;
}

struct MtpCase {
  const char* preset;
  KvMode mode;
  int32_t n_seq, draft_max;
  int favour_0;  // 1: favouring token 0; 2: and the block always drafts it
};

TEST(Mtp, GreedyGivesTheTokensAndLogitsOfPlainDecoding) {
  const MtpCase cases[] = {
      {"tiny-qwen35", KvMode::Resident, 1, 4, 0},
      {"tiny-qwen35", KvMode::Stream, 2, 6, 0},
      {"tiny-qwen35:q4_k", KvMode::Resident, 3, 3, 0},
      {"tiny-qwen35:q4_k", KvMode::Stream, 4, 5, 0},
      {"tiny-qwen35", KvMode::Resident, 2, 6, 1},
      {"tiny-qwen35", KvMode::Stream, 3, 4, 1},
      {"tiny-qwen35", KvMode::Auto, 1, 8, 1},
      {"tiny-qwen35", KvMode::Resident, 2, 5, 2},
      {"tiny-qwen35", KvMode::Stream, 4, 7, 2},
  };
  int64_t accepted = 0, rejected = 0, compared = 0, page_rollbacks = 0;
  uint32_t seed = 3;
  for (const MtpCase& mc : cases) {
    Case c;
    c.preset = mc.preset;
    c.seed = seed++;
    c.page = 8;  // the block's KV pages too: rollbacks cross them
    c.batch = 64;
    c.n_ctx = 512;
    c.chunk = 4096;
    c.n_verify = mc.draft_max + 1;
    for (int32_t i = 0; i < mc.n_seq; ++i) {
      c.prompt_len.push_back(mc.mode == KvMode::Resident ? 30 + 11 * i : 150 + 37 * i);
      c.gen_len.push_back(48 + 7 * i);
    }
    std::vector<float> rows;
    auto m = mc.favour_0 ? favouring_token_0(mc.preset, mc.favour_0 == 2, rows)
                         : Model::load(std::string("synthetic:") + mc.preset);
    const size_t arena = mc.mode == KvMode::Resident ? 0 : case_arena(*m, c);
    SCOPED_TRACE(cat(mc.preset, mc.favour_0 ? " favouring token 0" : "",
                     mc.favour_0 == 2 ? " always" : "", ", up to ", mc.draft_max,
                     " MTP drafts, mode ", kv_mode_name(mc.mode), ", ", mc.n_seq, " sequences"));
    const Decoded want = decode(*m, nullptr, c, KvMode::Resident, 0, mc.draft_max);
    const Decoded got = decode(*m, nullptr, c, mc.mode, arena, mc.draft_max, nullptr, true);
    expect_same(want, got);
    EXPECT_GT(got.drafted, 0);
    if (mc.mode == KvMode::Stream) {
      EXPECT_GT(got.totals.bytes_in, 0u);
    }
    accepted += got.accepted;
    rejected += got.drafted - got.accepted;
    page_rollbacks += got.page_rollbacks;
    for (size_t i = 0; i < static_cast<size_t>(mc.n_seq); ++i) {
      const std::vector<int32_t> alone = first_drafts_alone(*m, c, i);
      for (size_t q = 0; q < alone.size(); ++q) {
        if (got.first_draft[i][q] < 0 || alone[q] < 0) continue;
        EXPECT_EQ(got.first_draft[i][q], alone[q]) << "sequence " << i << ", position " << q;
        ++compared;
      }
    }
  }
  std::printf(
      "MTP drafts: %lld accepted, %lld rejected, %lld rollbacks across a page; %lld first drafts "
      "compared\n",
      static_cast<long long>(accepted), static_cast<long long>(rejected),
      static_cast<long long>(page_rollbacks), static_cast<long long>(compared));
  EXPECT_GT(accepted, 0);
  EXPECT_GT(rejected, 100);
  EXPECT_GT(compared, 200);
  EXPECT_GT(page_rollbacks, 20);
}

// Sampling with a temperature: each draft comes with the distribution it was drawn from (a
// law with the draft among its tokens), the verify step accepts some and rejects others, and the
// same seeds give the same output.
std::vector<int32_t> sampled_decode(const Model& m, uint64_t seed, int64_t* drafted,
                                    int64_t* accepted) {
  const int32_t V = m.config.n_vocab, draft_max = 4, n_gen = 60;
  EngineOptions o;
  o.n_ctx = 256;
  o.page_size = 8;
  o.n_verify = draft_max + 1;
  auto dev = make_cpu_device(0);
  MtpDrafter mtp(m, *dev, o, draft_max, 0.0);
  Engine e(m, *dev, o, &mtp.engine());
  Speculator spec({SpecMode::Mtp, draft_max, 1}, e, nullptr, &mtp);
  SamplerParams sp;
  sp.temp = 1.5f;
  sp.top_k = 8;
  sp.seed = seed;
  Sampler sampler(sp);
  const std::vector<int32_t> prompt = tokens(static_cast<uint32_t>(seed) + 5, 24, V);
  Sequence s = e.open_sequence();
  const float* l = e.eval(s, prompt.data(), static_cast<int32_t>(prompt.size()));
  spec.start(s.id, prompt.data(), static_cast<int32_t>(prompt.size()), sp);
  std::vector<int32_t> out;
  int32_t next = sampler.sample(l, V);
  while (static_cast<int32_t>(out.size()) < n_gen) {
    out.push_back(next);
    spec.accept(s.id, next);
    spec.propose({{s.id, n_gen}});
    std::vector<int32_t> feed{next};
    const std::vector<int32_t>& d = spec.drafts(s.id);
    feed.insert(feed.end(), d.begin(), d.end());
    for (size_t k = 0; k < d.size(); ++k) {
      const float* q = spec.q(s.id, static_cast<int32_t>(k));
      EXPECT_NE(q, nullptr);
      if (!q) continue;
      double sum = 0;
      for (int32_t t = 0; t < V; ++t) sum += static_cast<double>(q[t]);
      EXPECT_NEAR(sum, 1.0, 1e-4);
      EXPECT_GT(q[d[k]], 0.0f);
    }
    const auto n = static_cast<int32_t>(feed.size());
    e.step({BatchEntry{&s, feed.data(), n, n > 1}});
    int32_t ok_n = 0;
    next = -1;
    for (int32_t j = 0; j < n - 1; ++j) {
      bool ok = false;
      const int32_t t =
          sampler.verify(e.logits(0, j), V, feed[static_cast<size_t>(j) + 1], spec.q(s.id, j), &ok);
      if (!ok) {
        e.truncate(s, s.n_past - (n - 1 - j));
        next = t;
        break;
      }
      ++ok_n;
      out.push_back(t);
      spec.accept(s.id, t);
    }
    if (n > 1) spec.verified(s.id, ok_n);
    *drafted += n - 1;
    *accepted += ok_n;
    if (next < 0) next = sampler.sample(e.logits(0, n - 1), V);
  }
  return out;
}

TEST(Mtp, SampledDraftsComeWithTheirLaw) {
  auto m = Model::load("synthetic:tiny-qwen35");
  int64_t drafted = 0, accepted = 0, d2 = 0, a2 = 0;
  const std::vector<int32_t> a = sampled_decode(*m, 42, &drafted, &accepted);
  const std::vector<int32_t> b = sampled_decode(*m, 42, &d2, &a2);
  EXPECT_EQ(a, b);
  EXPECT_GT(drafted, 20);
  EXPECT_GT(accepted, 0);
  EXPECT_LT(accepted, drafted);
}

// The target's engine reads the block's copies of the embedding and the LM head (the block, built
// first, places them): with the block beside it the device holds those matrices once.
TEST(Mtp, TheTargetSharesTheBlocksEmbeddingAndHead) {
  auto m = Model::load("synthetic:tiny-qwen35");
  EngineOptions o;
  o.n_ctx = 256;
  o.page_size = 16;
  o.n_verify = 4;
  o.kv_mode = KvMode::Resident;
  size_t alone = 0;
  {
    auto dev = make_cpu_device(0);
    Engine e(*m, *dev, o);
    alone = dev->used();
  }
  const size_t both = m->weights.tok_embd.bytes() + m->weights.output.bytes();
  ASSERT_NE(m->weights.tok_embd.data, m->weights.output.data);
  auto dev = make_cpu_device(0);
  MtpDrafter mtp(*m, *dev, o, 3, 0.0);
  ASSERT_GT(mtp.device_bytes(), both);
  const size_t before = dev->used();
  Engine e(*m, *dev, o, &mtp.engine());
  EXPECT_EQ(dev->used() - before, alone - both);
  EXPECT_EQ(e.weights().tok_embd.data, mtp.engine().weights().tok_embd.data);
  EXPECT_EQ(e.weights().output.data, mtp.engine().weights().output.data);
  EXPECT_EQ(e.weights().output.n_out, m->config.n_vocab);
}

TEST(Mtp, ModelsWithoutAnMtpBlockAreRefusedByName) {
  EngineOptions o;
  o.n_verify = 5;
  const auto refusal = [&](const Model& target) {
    auto dev = make_cpu_device(0);
    try {
      MtpDrafter mtp(target, *dev, o, 4, 0.0);
    } catch (const Error& e) {
      EXPECT_EQ(dev->used(), 0u) << "allocated before refusing";
      return std::string(e.what());
    }
    return std::string();
  };
  const std::string llama = refusal(*Model::load("synthetic:tiny"));
  EXPECT_NE(llama.find("--spec mtp"), std::string::npos) << llama;
  EXPECT_NE(llama.find("is a llama model"), std::string::npos) << llama;

  gguf::Writer w = synthetic_writer("tiny-qwen35");
  w.set("qwen35.block_count", gguf::Value::u32(8));
  w.set("qwen35.nextn_predict_layers", gguf::Value::u32(0));
  const std::vector<uint8_t> bytes = w.to_bytes();
  const std::string path = (temp_dir("mtp") / "trunk-only.gguf").string();
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()),
             static_cast<std::streamsize>(bytes.size()));
  const std::string trunk = refusal(*Model::load(path));
  EXPECT_NE(trunk.find("trunk-only.gguf has no MTP (nextn) layer"), std::string::npos) << trunk;
  EXPECT_EQ(refusal(*Model::load("synthetic:tiny-qwen35")), "");
}

}  // namespace
}  // namespace kvs::test
