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
  SamplerParams greedy;
  greedy.temp = 0;
  Drafting d;
  if (spec.on()) {
    d.propose = [&](const std::vector<std::pair<size_t, int64_t>>& who) {
      std::vector<Speculator::Ask> asks;
      for (const auto& [u, room] : who) asks.push_back({static_cast<int32_t>(u), room});
      spec.propose(asks);
    };
    d.drafts = [&](size_t u, int32_t, int64_t) { return spec.drafts(static_cast<int32_t>(u)); };
    d.chosen = [&](size_t u, int32_t t) { spec.accept(static_cast<int32_t>(u), t); };
    d.verified = [&](size_t u, int32_t accepted) {
      spec.verified(static_cast<int32_t>(u), accepted);
    };
  }
  return decode_on(e, c, m.config.n_vocab, d, [&](size_t u, const std::vector<int32_t>& p) {
    if (spec.on())
      spec.start(static_cast<int32_t>(u), p.data(), static_cast<int32_t>(p.size()), greedy);
  });
}

}  // namespace kvs::test
