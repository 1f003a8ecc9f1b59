// kvstream bench --spec: greedy decoding with and without speculation at each depth.
#include <algorithm>
#include <cstdio>
#include <functional>
#include <nlohmann/json.hpp>

#include "bench.h"
#include "kvs/engine/generate.h"
#include "kvs/engine/oracle_draft.h"

namespace kvs::cli {
namespace {

// A greedy decode of n tokens by one sequence, which holds `prompt`, from the logits l of its
// last token, with the drafts of spec where given (Decoder): the tokens, and the steps, drafts
// and time it took, the time the device waited on the ring and the copy engine's busy time;
// split: the CPU's pages (for draft rows too) and its bytes and time.
struct Decoded {
  std::vector<int32_t> tokens;
  int64_t steps = 0, drafted = 0, accepted = 0;
  double seconds = 0;
  size_t streamed = 0;
  int64_t cpu_pages = 0, cpu_draft_pages = 0;
  size_t cpu_bytes = 0;
  double cpu_s = 0, ready_wait_s = 0, copy_busy_s = 0;
};
Decoded decode_greedy(Engine& eng, Sequence& s, const std::vector<int32_t>& prompt, const float* l,
                      int32_t n, int32_t V, Speculator* spec) {
  SamplerParams greedy;
  greedy.temp = 0;
  Sampler sampler(greedy);
  Decoder decoder(eng, V, spec);
  Decoding g{&s, &sampler};
  decoder.start(g, prompt.data(), static_cast<int32_t>(prompt.size()));
  Decoded d;
  const EngineStats t0s = eng.totals();
  const size_t in0 = t0s.bytes_in;
  const double t0 = now();
  const Decoder::Take take = [&](int32_t t, const float*, int32_t, bool) {
    d.tokens.push_back(t);
    return static_cast<int32_t>(d.tokens.size()) < n;
  };
  std::vector<BatchEntry> batch;
  for (bool more = decoder.first(g, l, take); more; more = g.next >= 0) {
    g.max_drafts = n - static_cast<int64_t>(d.tokens.size());
    batch.clear();
    decoder.add_steps({&g}, batch);
    eng.step(batch);
    decoder.advance(g, 0, take);
  }
  d.seconds = now() - t0;
  const EngineStats& t1s = eng.totals();
  d.streamed = t1s.bytes_in - in0;
  d.cpu_pages = t1s.cpu_pages - t0s.cpu_pages;
  d.cpu_draft_pages = t1s.cpu_draft_pages - t0s.cpu_draft_pages;
  d.cpu_bytes = t1s.cpu_bytes - t0s.cpu_bytes;
  d.cpu_s = t1s.cpu_s - t0s.cpu_s;
  d.ready_wait_s = t1s.ready_wait_s - t0s.ready_wait_s;
  d.copy_busy_s = t1s.copy_busy_s - t0s.copy_busy_s;
  d.steps = g.steps;
  d.drafted = g.drafted;
  d.accepted = g.accepted;
  return d;
}

}  // namespace

// bench --spec: at each depth, -r times, a sequence filled to the depth, the prompt prefilled,
// then --n-gen tokens decoded greedily without speculation (an engine without a drafter, as a
// run without --spec) and with it: their tokens/s, the drafts and tokens a step, and whether
// both gave the same tokens.
void spec_bench(BenchArgs& a, const Model& model, const std::vector<int64_t>& depths,
                int64_t max_depth, size_t vram, const std::vector<int32_t>& prompt,
                nlohmann::json& runs, std::string& device_name, const std::function<void()>& save) {
  const int32_t n_prompt = static_cast<int32_t>(prompt.size());
  const std::unique_ptr<Model> draft_model = load_draft(a.spec, model);
  for (const std::string& mode_s : split(a.modes)) {
    EngineOptions plain_o = options(a, mode_s), spec_o = plain_o;
    apply_speculation(a.spec, spec_o, a.backend, true);
    plain_o.n_ctx = spec_o.n_ctx =
        context_of(max_depth + n_prompt + a.n_gen + spec_o.n_verify, "--depths, -f and --n-gen");
    check_host_kv(spec_o, model.config, a.backend);
    RandomTokens random_tokens{static_cast<uint32_t>(model.config.n_vocab)};
    const std::unique_ptr<OracleDrafter> oracle =
        a.spec.kind() == "oracle"
            ? std::make_unique<OracleDrafter>(spec_o.n_seq, model.config.n_vocab, a.spec.draft_max,
                                              a.accept, 43)
            : nullptr;
    // Each depth's decodes, -r of each: fill, prompt, decode.
    // expected: the plain decodes at the depth, whose tokens the oracle's drafts follow.
    auto decodes = [&](Engine& eng, Speculator* spec, int64_t depth,
                       const std::vector<Decoded>& expected) {
      std::vector<Decoded> out;
      Progress progress(cat(mode_s, " at ", depth, ": ", spec ? "--spec" : "plain", " decode"),
                        int64_t{a.reps} * a.n_gen, true);
      for (int32_t r = 0; r < a.reps; ++r) {
        progress.update(int64_t{r} * a.n_gen);
        Sequence s = eng.open_sequence();
        // The same history for the plain and the speculative decode of (depth, r), which must
        // then give the same tokens.
        RandomTokens history{static_cast<uint32_t>(model.config.n_vocab)};
        history.rng.seed(static_cast<uint32_t>(depth * 1000 + r));
        fill(a, eng, s, depth, mode_s, history, static_cast<uint32_t>(depth));
        const float* l = nullptr;
        for (int32_t j = 0; j < n_prompt; j += a.n_batch)
          l = eng.eval(s, prompt.data() + j, std::min(a.n_batch, n_prompt - j));
        if (oracle && spec) {
          std::vector<int32_t> e = prompt;
          const std::vector<int32_t>& t = expected.at(static_cast<size_t>(r)).tokens;
          e.insert(e.end(), t.begin(), t.end());
          oracle->expect(s.id, std::move(e));
        }
        out.push_back(decode_greedy(eng, s, prompt, l, a.n_gen, model.config.n_vocab, spec));
        eng.close_sequence(s);
      }
      progress.finish();
      return out;
    };
    std::vector<std::vector<Decoded>> plain, spec;
    {
      auto dev = device_of(a.s, a.backend, vram);
      device_name = dev->name();
      Engine eng(model, *dev, plain_o);
      warm_up(eng, random_tokens(std::min<int64_t>(a.n_batch, plain_o.n_ctx - 1) + 1));
      for (int64_t depth : depths) plain.push_back(decodes(eng, nullptr, depth, {}));
    }
    auto dev = device_of(a.s, a.backend, vram);
    const auto drafter = make_drafter(a.spec, draft_model.get(), model, *dev, spec_o);
    const auto mtp = make_mtp(a.spec, model, *dev, spec_o);
    Engine eng(model, *dev, spec_o, mtp ? &mtp->engine() : nullptr);
    Speculator sp(spec_options(a.spec), eng,
                  drafter ? static_cast<Drafter*>(drafter.get()) : oracle.get(), mtp.get());
    warm_up(eng, random_tokens(std::min<int64_t>(a.n_batch, spec_o.n_ctx - 1) + 1));
    for (size_t i = 0; i < depths.size(); ++i) {
      spec.push_back(decodes(eng, &sp, depths[i], plain[i]));
      const auto rate = [&](const std::vector<Decoded>& v) {
        std::vector<double> x;
        for (const Decoded& d : v)
          x.push_back((static_cast<double>(d.tokens.size()) - 1) / d.seconds);
        return x;
      };
      int64_t drafted = 0, accepted = 0, steps = 0, tokens = 0, cpu_pages = 0, cpu_draft_pages = 0;
      size_t streamed = 0, cpu_bytes = 0;
      double cpu_s = 0, ready_wait_s = 0, copy_busy_s = 0, seconds = 0;
      bool same = true;
      for (size_t r = 0; r < spec[i].size(); ++r) {
        const Decoded& d = spec[i][r];
        drafted += d.drafted, accepted += d.accepted, steps += d.steps;
        tokens += static_cast<int64_t>(d.tokens.size()) - 1;
        streamed += d.streamed;
        cpu_pages += d.cpu_pages, cpu_draft_pages += d.cpu_draft_pages;
        cpu_bytes += d.cpu_bytes, cpu_s += d.cpu_s;
        ready_wait_s += d.ready_wait_s, copy_busy_s += d.copy_busy_s, seconds += d.seconds;
        same &= d.tokens == plain[i][r].tokens;
      }
      const Stat p = stat(rate(plain[i])), q = stat(rate(spec[i]));
      const auto n = static_cast<size_t>(a.reps);
      nlohmann::json j = run_json(a, eng, mode_s);
      j["depth"] = depths[i];
      j["prompt_tokens"] = n_prompt;
      j["spec"] = {
          {"mode", a.spec.kind()},
          {"draft_max", a.spec.draft_max},
          {"draft_min", a.spec.draft_min},
          {"tg_tokens_per_s", q.mean},
          {"tg_tokens_per_s_std", q.std},
          {"tg_tokens_per_s_reps", rate(spec[i])},
          {"plain_tg_tokens_per_s", p.mean},
          {"plain_tg_tokens_per_s_std", p.std},
          {"plain_tg_tokens_per_s_reps", rate(plain[i])},
          {"speedup", q.mean / p.mean},
          {"drafted", drafted},
          {"accepted", accepted},
          {"acceptance", drafted ? static_cast<double>(accepted) / drafted : 0.0},
          {"tokens_per_step", steps ? static_cast<double>(tokens) / steps : 0.0},
          {"streamed_bytes_per_token", tokens ? static_cast<double>(streamed) / tokens : 0.0},
          {"same_tokens", same},
          {"step_s", steps ? seconds / static_cast<double>(steps) : 0.0},
          {"ready_wait_s_per_step", steps ? ready_wait_s / static_cast<double>(steps) : 0.0},
          {"copy_busy_fraction", seconds > 0 ? copy_busy_s / seconds : 0.0},
          {"plan_n_slots", eng.plan().n_slots},
          {"plan_slot_pages", eng.plan().slot_pages}};
      if (cpu_pages > 0) {
        const auto per_step = [&](double x) { return steps ? x / static_cast<double>(steps) : 0.0; };
        j["spec"]["cpu_pages_per_step"] = per_step(static_cast<double>(cpu_pages));
        j["spec"]["cpu_draft_pages_per_step"] = per_step(static_cast<double>(cpu_draft_pages));
        j["spec"]["cpu_s_per_step"] = per_step(cpu_s);
        j["spec"]["cpu_bytes_per_s"] = cpu_s > 0 ? static_cast<double>(cpu_bytes) / cpu_s : 0.0;
      }
      // The oracle's acceptance is chosen, not reached: the rows say so.
      std::string label = a.spec.kind();
      if (oracle) {
        j["spec"]["accept_p"] = a.accept;
        label = cat("oracle (drafts kept with P ", a.accept, ")");
      }
      std::printf(
          "| %s | %s | %s/%s | %lld | tg%d spec %s | %s (%.2fx of %s) | %.1f %% accepted | "
          "%.2f tokens/step | %s%s |\n",
          a.s.model.c_str(), mode_s.c_str(), a.s.ctk.c_str(), a.s.ctv.c_str(),
          static_cast<long long>(depths[i]), a.n_gen, label.c_str(), show(q, n).c_str(),
          q.mean / p.mean, show(p, n).c_str(),
          drafted ? 100.0 * static_cast<double>(accepted) / drafted : 0.0,
          steps ? static_cast<double>(tokens) / steps : 0.0,
          format_bytes(static_cast<size_t>(j["spec"]["streamed_bytes_per_token"].get<double>()))
              .c_str(),
          same ? "" : " (other tokens than without --spec)");
      std::fflush(stdout);
      runs.push_back(j);
      save();
    }
  }
}

}  // namespace kvs::cli
