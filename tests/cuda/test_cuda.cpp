// The CUDA backend against the CPU backend (skipped without a GPU). Logits agree within a
// tolerance relative to the logits' scale: the two backends sum in different orders, and a
// quantized KV row may round one step apart. Streaming on CUDA is bit-identical to resident.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "common.h"
#include "kvs/backend/cuda/backend.h"
#include "kvs/backend/device.h"
#include "kvs/engine/engine.h"
#include "kvs/model/model.h"
#include "kvs/util/error.h"
#include "rel_diff.h"
#include "stream_cases.h"

namespace kvs {
namespace {

std::unique_ptr<Device> cuda_or_skip() {
  try {
    return make_cuda_device(0, CudaOptions{});
  } catch (const Error& e) {
    return nullptr;
  }
}

#define NEED_GPU(dev)        \
  auto dev = cuda_or_skip(); \
  if (!dev) GTEST_SKIP() << "no CUDA device";

// A device whose decode attention takes a warp per span at every context length.
std::unique_ptr<Device> cuda_by_warp() {
  CudaOptions o;
  o.decode_split = CudaOptions::DecodeSplit::WarpPerSpan;
  return make_cuda_device(0, o);
}

std::vector<int32_t> tokens(uint32_t seed, int n, int vocab) {
  std::mt19937 g(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = static_cast<int32_t>(g() % static_cast<uint32_t>(vocab));
  return t;
}

struct Trace {
  std::vector<std::vector<float>> logits;  // after the prompt, then after each decode token
  std::vector<int32_t> greedy;
};

// Prompt in chunks of -b (prefill kernels), then n_gen greedy tokens (decode kernels).
Trace run(const Model& m, Device& dev, EngineOptions o, const std::vector<int32_t>& prompt,
          int n_gen) {
  Engine e(m, dev, o);
  Sequence s = e.open_sequence();
  Trace r;
  const int V = m.config.n_vocab;
  const float* l = e.eval(s, prompt.data(), static_cast<int32_t>(prompt.size()));
  for (int i = 0;; ++i) {
    r.logits.emplace_back(l, l + V);
    if (i == n_gen) break;
    const int32_t id = static_cast<int32_t>(std::max_element(l, l + V) - l);
    r.greedy.push_back(id);
    l = e.eval(s, &id, 1);
  }
  return r;
}

// Decode steps are compared on the CPU's tokens: both runs eval the same inputs only if the
// greedy tokens agree, so the CUDA run replays the CPU's tokens.
Trace replay(const Model& m, Device& dev, EngineOptions o, const std::vector<int32_t>& prompt,
             const std::vector<int32_t>& gen) {
  Engine e(m, dev, o);
  Sequence s = e.open_sequence();
  Trace r;
  const int V = m.config.n_vocab;
  const float* l = e.eval(s, prompt.data(), static_cast<int32_t>(prompt.size()));
  r.logits.emplace_back(l, l + V);
  for (int32_t id : gen) {
    l = e.eval(s, &id, 1);
    r.logits.emplace_back(l, l + V);
  }
  return r;
}

// Every step's logits of got equal want's, bit for bit.
void expect_same_bits(const Trace& want, const Trace& got, const std::string& what) {
  ASSERT_EQ(want.logits.size(), got.logits.size()) << what;
  for (size_t i = 0; i < want.logits.size(); ++i)
    ASSERT_EQ(std::memcmp(want.logits[i].data(), got.logits[i].data(),
                          want.logits[i].size() * sizeof(float)),
              0)
        << what << ": step " << i << " differs by " << test::rel_diff(want.logits, got.logits);
}

// A test's engine options: context, batch, page and K/V types; the KV mode as the default.
EngineOptions options(int32_t n_ctx, int32_t n_batch, int32_t page_size, DType kt, DType vt) {
  EngineOptions o;
  o.n_ctx = n_ctx;
  o.n_batch = n_batch;
  o.page_size = page_size;
  o.k_type = kt;
  o.v_type = vt;
  return o;
}

constexpr double kTol = 2e-2;  // max |cuda - cpu| relative to max |cpu logit|

TEST(CudaVsCpu, EveryArchitectureWeightFormatAndKvType) {
  NEED_GPU(gpu);
  auto cpu = make_cpu_device(0);
  const char* archs[] = {"tiny", "tiny-qwen2", "tiny-qwen3", "tiny-gemma3"};
  const char* wtypes[] = {"f32",  "f16",  "bf16", "q8_0", "q4_0", "q4_1",   "q5_0",  "q5_1",
                          "q4_k", "q5_k", "q6_k", "q3_k", "q2_k", "iq4_nl", "iq4_xs"};
  const DType kv[] = {DType::F16, DType::Q8_0, DType::Q4_0};
  double worst = 0;
  std::string worst_at = "-";
  for (const char* arch : archs)
    for (const char* wt : wtypes) {
      auto m = Model::load(std::string("synthetic:") + arch + ":" + wt);
      const auto prompt = tokens(7, 150, m->config.n_vocab);
      for (DType kt : kv)
        for (DType vt : kv) {
          const EngineOptions o = options(512, 64, 32, kt, vt);
          const Trace want = run(*m, *cpu, o, prompt, 12);
          const Trace got = replay(*m, *gpu, o, prompt, want.greedy);
          const double d = test::rel_diff(want.logits, got.logits);
          const std::string at =
              std::string(arch) + ":" + wt + " kv " + dtype_name(kt) + "/" + dtype_name(vt);
          if (d > worst) worst = d, worst_at = at;
          EXPECT_LT(d, kTol) << at;
        }
    }
  std::printf("worst relative logit difference: %.3g (tolerance %.3g), %s\n", worst, kTol,
              worst_at.c_str());
}

TEST(CudaVsCpu, HeadSize64ShapesOfRealModels) {
  NEED_GPU(gpu);
  auto cpu = make_cpu_device(0);
  for (const char* spec : {"smollm2-135m:q8_0", "qwen2-0.5b:q4_0"}) {
    auto m = Model::load(std::string("synthetic:") + spec);
    const auto prompt = tokens(3, 300, m->config.n_vocab);
    EngineOptions o;
    o.n_ctx = 1024;
    o.k_type = DType::Q8_0;
    o.v_type = DType::Q8_0;
    const Trace want = run(*m, *cpu, o, prompt, 8);
    const Trace got = replay(*m, *gpu, o, prompt, want.greedy);
    EXPECT_LT(test::rel_diff(want.logits, got.logits), kTol) << spec;
  }
}

// The 8B models' heads (128, 4 to a kv head) through the whole engine: the tensor-core decode
// attention with a block per span and with a warp per span, over several pages.
TEST(CudaVsCpu, HeadSize128ShapeOfThe8BModels) {
  NEED_GPU(gpu);
  auto cpu = make_cpu_device(0);
  auto by_warp = cuda_by_warp();
  for (const char* spec : {"tiny-h128:q4_0", "tiny-h128:q8_0"}) {
    auto m = Model::load(std::string("synthetic:") + spec);
    const auto prompt = tokens(13, 300, m->config.n_vocab);
    for (DType vt : {DType::Q8_0, DType::Q4_0}) {
      const EngineOptions o = options(1024, 128, 64, DType::Q8_0, vt);
      const Trace want = run(*m, *cpu, o, prompt, 8);
      for (Device* dev : {gpu.get(), by_warp.get()}) {
        const Trace got = replay(*m, *dev, o, prompt, want.greedy);
        EXPECT_LT(test::rel_diff(want.logits, got.logits), kTol)
            << spec << " kv q8_0/" << dtype_name(vt) << (dev == gpu.get() ? "" : ", by warp");
      }
    }
  }
}

// The CPU exactness cases on the GPU: random models, page sizes, cache types, arenas, rings and
// 1-4 sequences decoded together, prefill and decode; streamed (auto or stream) logits equal
// resident ones bit for bit, and so do unified ones (the same kernels over managed memory).
TEST(CudaStream, StreamedAndUnifiedLogitsAreBitIdenticalToResident) {
  NEED_GPU(gpu);
  std::mt19937 g(20261203);
  int streamed = 0, several = 0;
  for (int k = 0; k < 16; ++k) {
    const test::Case c = test::random_case(g, k);
    auto m = Model::load("synthetic:" + c.preset);
    SCOPED_TRACE(c.str());
    const test::Result want = test::run(*m, c, KvMode::Resident, 0, gpu.get());
    const test::Result got = test::run(*m, c, c.mode, test::case_arena(*m, c), gpu.get());
    test::expect_same(want, got, c.str());
    test::expect_same(want, test::run(*m, c, KvMode::Unified, 0, gpu.get()),
                      c.str() + " (unified)");
    streamed += got.totals.bytes_in > 0;
    several += c.prompt_len.size() > 1;
  }
  EXPECT_GE(streamed, 8);
  EXPECT_GE(several, 6);
}

// Gemma 3's window layers (resident windows, recycled pages) between streamed full layers:
// random windows, arenas and 1-4 sequences, streamed logits bit-identical to resident ones.
TEST(CudaStream, WindowLayersStreamedEqualResident) {
  NEED_GPU(gpu);
  std::mt19937 g(20261206);
  int streamed = 0;
  for (int k = 0; k < 8; ++k) {
    test::Case c = test::random_case(g, k);
    c.preset = k % 2 ? "tiny-gemma3" : "tiny-gemma3:q4_0";
    c.n_ctx = 512;
    c.gen_len[0] += 200;
    auto m = Model::load("synthetic:" + c.preset);
    m->config.n_swa = static_cast<int32_t>(1 + g() % 64);
    SCOPED_TRACE(c.str() + " window " + std::to_string(m->config.n_swa));
    const test::Result want = test::run(*m, c, KvMode::Resident, 0, gpu.get());
    const test::Result got = test::run(*m, c, c.mode, test::case_arena(*m, c), gpu.get());
    test::expect_same(want, got, c.str());
    streamed += got.totals.bytes_in > 0;
  }
  EXPECT_GE(streamed, 3);
}

// Larger rings and chunks of many pages on a model with real head sizes; the decode attention
// as the context chooses (a block per span here) and forced to a warp per span, whose fold runs
// inside the attention's launch unless the ring's chunk is one page.
TEST(CudaStream, StreamedLogitsAreBitIdenticalToResident) {
  NEED_GPU(gpu);
  auto m = Model::load("synthetic:tiny-qwen3:q4_0");
  const auto prompt = tokens(5, 200, m->config.n_vocab);
  auto by_warp = cuda_by_warp();
  for (Device* dev : {gpu.get(), by_warp.get()})
    for (DType kt : {DType::F16, DType::Q8_0})
      for (DType vt : {DType::F16, DType::Q4_0}) {
        EngineOptions o = options(512, 48, 8, kt, vt);
        o.kv_mode = KvMode::Resident;
        const Trace want = run(*m, *dev, o, prompt, 40);
        o.kv_mode = KvMode::Stream;
        o.ring_chunk_bytes = 4096;
        const Trace got = run(*m, *dev, o, prompt, 40);
        expect_same_bits(want, got,
                         std::string("kv ") + dtype_name(kt) + "/" + dtype_name(vt) +
                             (dev == gpu.get() ? "" : ", a warp per span"));
      }
}

// The switches that must not change a bit (each a device of its own): the products asking L2
// for the next product's weights (only in recorded decode steps; the default 4 MiB against none
// and 16); a warp per span in recorded steps, which issues its first copies before its wait,
// against the same launched one by one (graphs off; a warp per span on both sides, whose
// partials differ from a block's). Prompt and decode logits, bit for bit.
TEST(CudaSwitches, TrialsKeepTheBits) {
  NEED_GPU(gpu);
  struct Trial {
    std::string what;
    CudaOptions base, trial;
  };
  std::vector<Trial> trials(3);
  trials[0].what = "l2_next_mib 0", trials[0].trial.l2_next_mib = 0;
  trials[1].what = "l2_next_mib 16", trials[1].trial.l2_next_mib = 16;
  trials[2].what = "a warp per span, graphs off";
  trials[2].base.decode_split = trials[2].trial.decode_split =
      CudaOptions::DecodeSplit::WarpPerSpan;
  trials[2].trial.graphs = false;
  for (const char* spec : {"tiny-qwen3:q4_0", "smollm2-135m:q8_0", "tiny:q4_1", "tiny-h128:q4_0"}) {
    auto m = Model::load(std::string("synthetic:") + spec);
    const auto prompt = tokens(11, 300, m->config.n_vocab);
    // 19 spans and more: a block per span, the fold over many
    const EngineOptions o = options(1024, 512, 16, DType::Q8_0, DType::Q4_0);
    const Trace plain = run(*m, *gpu, o, prompt, 24);
    for (const Trial& t : trials) {
      const Trace want =
          t.base == CudaOptions{} ? plain : run(*m, *make_cuda_device(0, t.base), o, prompt, 24);
      expect_same_bits(want, run(*m, *make_cuda_device(0, t.trial), o, prompt, 24),
                       std::string(spec) + " " + t.what);
    }
  }
}

TEST(CudaVsCpu, SmolLM2LogitsAndGreedyText) {
  if (!std::filesystem::exists(test::smollm2())) GTEST_SKIP() << "no " << test::smollm2();
  NEED_GPU(gpu);
  auto cpu = make_cpu_device(0);
  auto m = Model::load(test::smollm2());
  const char* prompts[] = {"The three primary colors are", "def fibonacci(n):\n    ",
                           "<|im_start|>user\nWrite a short story about a lighthouse keeper."
                           "<|im_end|>\n<|im_start|>assistant\n"};
  for (const char* p : prompts) {
    const auto ids = m->tokenizer->encode(p, false, true);
    EngineOptions o;
    o.n_ctx = 512;
    const Trace want = run(*m, *cpu, o, ids, 64);
    const Trace got = run(*m, *gpu, o, ids, 64);
    EXPECT_EQ(want.greedy, got.greedy) << p;
    const Trace rep = replay(*m, *gpu, o, ids, want.greedy);
    EXPECT_LT(test::rel_diff(want.logits, rep.logits), kTol) << p;
  }
}

// qwen35's hybrid (tiny-qwen35: 6 Gated DeltaNet layers, 2 gated full attention layers with a
// quarter of each head rotated): a prompt of several of the prefill's 64-token delta-rule chunks
// in one pass and in passes of 48, then decode steps, against the CPU.
TEST(CudaVsCpu, Qwen35HybridPrefillAndDecode) {
  NEED_GPU(gpu);
  auto cpu = make_cpu_device(0);
  for (const char* wt : {"f32", "q8_0", "q4_0"}) {
    auto m = Model::load(std::string("synthetic:tiny-qwen35:") + wt);
    const auto prompt = tokens(21, 230, m->config.n_vocab);
    for (int32_t b : {256, 48})
      for (DType kv : {DType::F16, DType::Q8_0}) {
        const EngineOptions o = options(512, b, 32, kv, kv);
        const Trace want = run(*m, *cpu, o, prompt, 16);
        const Trace got = replay(*m, *gpu, o, prompt, want.greedy);
        EXPECT_LT(test::rel_diff(want.logits, got.logits), kTol)
            << wt << " -b " << b << " kv " << dtype_name(kv) << ": "
            << test::rel_diff(want.logits, got.logits);
      }
  }
}

// The prefill's chunked delta rule (tensor cores) against the decode's token by token on the
// GPU: the prompt in one pass, and one token a pass (-b 1); then decode steps.
TEST(CudaVsCpu, Qwen35ChunkedPrefillMatchesTokenByToken) {
  NEED_GPU(gpu);
  auto m = Model::load("synthetic:tiny-qwen35:q8_0");
  const auto prompt = tokens(22, 200, m->config.n_vocab);
  const Trace want = run(*m, *gpu, options(512, 1, 32, DType::F16, DType::F16), prompt, 8);
  const Trace got =
      replay(*m, *gpu, options(512, 256, 32, DType::F16, DType::F16), prompt, want.greedy);
  EXPECT_LT(test::rel_diff(want.logits, got.logits), kTol);
}

// The CPU's recurrent exactness cases on the GPU: each sequence's resident delta-rule state
// beside the arena while the full layers stream (random arenas, page sizes, cache types, 1-4
// sequences that close as they end, staggered starts, prompts over several delta-rule chunks);
// streamed and unified logits equal resident ones bit for bit.
TEST(CudaStream, RecurrentLayersStreamedEqualResident) {
  NEED_GPU(gpu);
  std::mt19937 g(20261206);
  int streamed = 0, several = 0;
  for (int k = 0; k < 16; ++k) {
    test::Case c = test::random_case(g, k);
    c.preset = k % 2 ? "tiny-qwen35" : "tiny-qwen35:q4_0";
    c.prompt_len[0] += 100;  // past a chunk of 64 whatever the draw
    c.n_ctx = 512;
    auto m = Model::load("synthetic:" + c.preset);
    SCOPED_TRACE(c.str());
    const test::Result want = test::run(*m, c, KvMode::Resident, 0, gpu.get());
    const test::Result got = test::run(*m, c, c.mode, test::case_arena(*m, c), gpu.get());
    test::expect_same(want, got, c.str());
    if (k % 4 == 0)
      test::expect_same(want, test::run(*m, c, KvMode::Unified, 0, gpu.get()),
                        c.str() + " (unified)");
    streamed += got.totals.bytes_in > 0;
    several += c.prompt_len.size() > 1;
  }
  EXPECT_GE(streamed, 4);
  EXPECT_GE(several, 4);
}

// A sequence opened in a slot another one closed starts from zero recurrent states on the GPU
// too: its logits are those of the same tokens in a fresh engine.
TEST(CudaStream, AReopenedSequenceStartsFromZeroRecurrentState) {
  NEED_GPU(gpu);
  auto m = Model::load("synthetic:tiny-qwen35");
  const int32_t V = m->config.n_vocab;
  const auto a = tokens(1, 90, V), b = tokens(2, 70, V), other = tokens(3, 40, V);
  for (KvMode mode : {KvMode::Resident, KvMode::Stream}) {
    EngineOptions o = options(256, 32, 16, DType::F16, DType::F16);
    o.n_seq = 2;
    o.kv_mode = mode;
    std::vector<float> want;
    {
      Engine fresh(*m, *gpu, o);
      Sequence s = fresh.open_sequence();
      const float* l = fresh.eval(s, b.data(), static_cast<int32_t>(b.size()));
      want.assign(l, l + V);
    }
    Engine e(*m, *gpu, o);
    Sequence s0 = e.open_sequence(), s1 = e.open_sequence();
    e.eval(s0, a.data(), static_cast<int32_t>(a.size()));
    e.eval(s1, other.data(), static_cast<int32_t>(other.size()));
    e.close_sequence(s0);
    Sequence s2 = e.open_sequence();
    ASSERT_EQ(s2.id, 0);
    const float* l = e.eval(s2, b.data(), static_cast<int32_t>(b.size()));
    EXPECT_EQ(std::memcmp(l, want.data(), want.size() * sizeof(float)), 0)
        << kv_mode_name(mode) << ": the reopened sequence's state was not zero";
  }
}

// A Gated DeltaNet head size without CUDA kernels is refused, naming it, before the weights are
// placed or anything is allocated.
TEST(CudaErrors, UnsupportedDeltaNetHeadIsRefusedBeforeAnyAllocation) {
  NEED_GPU(gpu);
  auto m = Model::load("synthetic:tiny-qwen35");
  m->weights.layers[0].ssm_norm.resize(48);  // what heads of 48 would have
  const size_t used = gpu->used();
  try {
    Engine e(*m, *gpu, EngineOptions{});
    FAIL() << "an engine was built with Gated DeltaNet heads of 48 on the CUDA backend";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("heads of 48"), std::string::npos) << e.what();
  }
  EXPECT_EQ(gpu->used(), used);
}

}  // namespace
}  // namespace kvs
