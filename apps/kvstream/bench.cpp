// kvstream bench: prefill and decode speed at chosen depths and KV modes, as a table like
// llama-bench's and as JSON with every figure.
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>

#include "bench.h"
#include "commands.h"
#include "kvs/backend/cpu/isa.h"
#include "kvs/backend/device.h"
#include "kvs/engine/engine.h"
#include "kvs/model/model.h"
#include "kvs/tokenizer/tokenizer.h"
#include "kvs/util/error.h"
#include "kvs/util/parse.h"
#include "kvs/util/threadpool.h"

namespace kvs::cli {
namespace {

// --pair D1,D2: two sequences filled to different depths decode n_gen greedy tokens together
// (timed: their combined tokens/s), then each is filled again and decoded alone in the same
// engine; the tokens must be the same (streaming is exact whatever the partition).
nlohmann::json pair_run(const BenchArgs& a, const Model& model, const std::string& mode,
                        size_t vram) {
  const std::vector<int64_t> d = parse_count_list(a.pair, "--pair");
  KVS_CHECK(d.size() == 2, "--pair: two depths, e.g. 32k,128k");
  EngineOptions o = options(a, mode);
  o.n_seq = 2;
  KVS_CHECK(d[0] >= 0 && d[1] >= 0, "--pair: negative depth");
  o.n_ctx = context_of(std::max(d[0], d[1]) + a.n_gen + 1, "--pair and --n-gen");
  check_host_kv(o, model.config, a.backend, cat("--pair ", a.pair, " x 2 sequences"));
  auto dev = device_of(a.s, a.backend, vram);
  Engine eng(model, *dev, o);
  const int32_t V = model.config.n_vocab;
  // Each sequence's fill tokens depend only on its index, so the alone runs repeat them.
  auto prompt_of = [&](int i) {
    RandomTokens r{static_cast<uint32_t>(V), std::mt19937(static_cast<uint32_t>(100 + i))};
    return r(d[static_cast<size_t>(i)] + 1);
  };
  const auto prefill = [&](Sequence& s, int i) {
    const auto t = prompt_of(i);
    size_t at = 0;
    // With --fill random the last prompt token is evaluated for the first logits.
    const int64_t n = static_cast<int64_t>(t.size()) - (a.fill == "prefill" ? 0 : 1);
    fill(
        a, eng, s, n, mode + " pair",
        [&](int64_t k) {
          std::vector<int32_t> part(t.begin() + static_cast<long>(at),
                                    t.begin() + static_cast<long>(at + static_cast<size_t>(k)));
          at += static_cast<size_t>(k);
          return part;
        },
        static_cast<uint32_t>(1000 * (i + 1)));
    if (a.fill != "prefill") eng.eval(s, &t.back(), 1);
    return argmax(eng.logits(0), V);
  };
  std::vector<int32_t> together[2], alone[2];
  Sequence s[2] = {eng.open_sequence(), eng.open_sequence()};
  int32_t next[2] = {prefill(s[0], 0), prefill(s[1], 1)};
  const double t_together = seconds([&] {
    for (int32_t k = 0; k < a.n_gen; ++k) {
      eng.step({BatchEntry{&s[0], &next[0], 1}, BatchEntry{&s[1], &next[1], 1}});
      for (int i = 0; i < 2; ++i) {
        together[i].push_back(next[i]);
        next[i] = argmax(eng.logits(i), V);
      }
    }
  });
  double t_alone[2] = {0, 0};
  for (int i = 0; i < 2; ++i) eng.close_sequence(s[i]);
  for (int i = 0; i < 2; ++i) {
    Sequence q = eng.open_sequence();
    int32_t id = prefill(q, i);
    t_alone[i] = seconds([&] {
      for (int32_t k = 0; k < a.n_gen; ++k) {
        alone[i].push_back(id);
        id = argmax(eng.eval(q, &id, 1), V);
      }
    });
    eng.close_sequence(q);
  }
  const bool same = together[0] == alone[0] && together[1] == alone[1];
  const double tps = 2.0 * a.n_gen / t_together;
  std::printf("| %s | %s | %s/%s | %lld+%lld | pair tg%d | %.2f (alone %.2f, %.2f) | | | %s |\n",
              a.s.model.c_str(), mode.c_str(), a.s.ctk.c_str(), a.s.ctv.c_str(),
              static_cast<long long>(d[0]), static_cast<long long>(d[1]), a.n_gen, tps,
              a.n_gen / t_alone[0], a.n_gen / t_alone[1],
              same ? "same tokens as alone" : "TOKENS DIFFER FROM ALONE");
  std::fflush(stdout);
  nlohmann::json r = run_json(a, eng, mode);
  r["depths"] = d;
  r["combined_tokens_per_s"] = tps;
  r["alone_tokens_per_s"] = {a.n_gen / t_alone[0], a.n_gen / t_alone[1]};
  r["same_tokens_as_alone"] = same;
  r["tokens_together"] = {together[0], together[1]};
  r["tokens_alone"] = {alone[0], alone[1]};
  return r;
}

// --verify-tokens: at s's depth, -r times --n-gen steps of k tokens of s with the logits of
// each (a speculative verify step: a token and k - 1 random drafts), each followed by the
// rollback of the drafts, so the depth grows by one a step as in the decode; per k the mean
// step time (rollback included) and its ratio to the decode's one-token step (`tg_step_s`).
template <class Tokens>
nlohmann::json verify_steps(const BenchArgs& a, Engine& eng, Sequence& s, double tg_step_s,
                            Tokens&& random_tokens) {
  nlohmann::json out = nlohmann::json::array();
  for (int64_t k64 : a.verify) {
    const auto k = static_cast<int32_t>(k64);
    const EngineStats before = eng.totals();
    std::vector<double> step_r;
    double rollback_s = 0;
    Progress progress(cat("verify", k, " at ", s.n_past, ":"), int64_t{a.reps} * a.n_gen * k, true);
    for (int32_t r = 0; r < a.reps; ++r) {
      const auto t = random_tokens(int64_t{a.n_gen} * k);
      const double t0 = now();
      for (int32_t i = 0; i < a.n_gen; ++i) {
        eng.step(
            {BatchEntry{&s, t.data() + static_cast<size_t>(i) * static_cast<size_t>(k), k, k > 1}});
        const double t1 = now();
        eng.truncate(s, s.n_past - (k - 1));
        rollback_s += now() - t1;
        progress.update((int64_t{r} * a.n_gen + i + 1) * k);
      }
      step_r.push_back((now() - t0) / a.n_gen);
    }
    progress.finish();
    const Stat st = stat(step_r);
    const double steps = static_cast<double>(int64_t{a.reps} * a.n_gen);
    out.push_back({{"tokens", k},
                   {"step_s", st.mean},
                   {"step_s_std", st.std},
                   {"step_s_reps", step_r},
                   {"ratio_to_tg_step", st.mean / tg_step_s},
                   {"rollback_s", rollback_s / steps},
                   {"streamed_bytes_per_step",
                    static_cast<double>(eng.totals().bytes_in - before.bytes_in) / steps}});
  }
  return out;
}

// Times the decode (-r times --n-gen tokens) and the prefill (-r times -p tokens) of sequence s
// at its depth, prints the table's rows and returns the run's JSON.
template <class Tokens>
nlohmann::json measure_depth(const BenchArgs& a, Engine& eng, Sequence& s, int64_t depth,
                             const std::string& mode_s, int32_t n_prompt, size_t weights,
                             Tokens&& random_tokens) {
  // One untimed decode token first (the first step after a prefill repartitions the arena
  // and captures the step's graph), as llama-bench warms up.
  const int32_t warm = random_tokens(1)[0];
  eng.eval(s, &warm, 1);
  // Decode at the depth (+1), -r times; each repetition continues the sequence.
  const EngineStats before = eng.totals();
  std::vector<double> tg_r, pp_r;
  double tg_s = 0;
  const std::string at = cat(mode_s, " at ", depth, ":");
  Progress tg_progress(cat(at, " decode"), int64_t{a.reps} * a.n_gen, true);
  for (int32_t r = 0; r < a.reps; ++r) {
    const auto gen = random_tokens(a.n_gen);
    const double dt = seconds([&] {
      for (int32_t i = 0; i < a.n_gen; ++i) {
        eng.eval(s, &gen[static_cast<size_t>(i)], 1);
        tg_progress.update(int64_t{r} * a.n_gen + i + 1);
      }
    });
    tg_s += dt;
    tg_r.push_back(a.n_gen / dt);
  }
  tg_progress.finish();
  const EngineStats after = eng.totals();
  const Stat tg = stat(tg_r);
  const nlohmann::json verify = verify_steps(a, eng, s, 1 / tg.mean, random_tokens);
  // Prefills of -p tokens (default one batch), right after, -r times.
  Progress pp_progress(cat(at, " prefill"), int64_t{a.reps} * n_prompt, true);
  for (int32_t r = 0; r < a.reps && n_prompt > 0; ++r) {
    const auto pp = random_tokens(n_prompt);
    pp_r.push_back(n_prompt / seconds([&] { eng.eval(s, pp.data(), n_prompt); }));
    pp_progress.update(int64_t{r + 1} * n_prompt);
  }
  pp_progress.finish();

  const Stat ppt = stat(pp_r);
  const int64_t n_tg = int64_t{a.reps} * a.n_gen;  // timed decode tokens
  // Bytes a decode step reads: every weight once and the KV at its mean depth.
  const double kv_tok = static_cast<double>(eng.kv_bytes_per_token()) *
                        (static_cast<double>(depth) + 1 + (n_tg - 1) / 2.0);
  const double bytes = static_cast<double>(weights) + kv_tok;
  const double streamed =
      static_cast<double>(after.bytes_in - before.bytes_in) / static_cast<double>(n_tg);
  const double busy = after.copy_busy_s - before.copy_busy_s;
  const double h2d = busy > 0 ? static_cast<double>(after.bytes_in - before.bytes_in) / busy : 0;
  const std::string kv = a.s.ctk + "/" + a.s.ctv;
  std::printf("| %s | %s | %s | %lld | tg%d | %s | %.3g | %.1f | %.3g |\n", a.s.model.c_str(),
              mode_s.c_str(), kv.c_str(), static_cast<long long>(depth), a.n_gen,
              show(tg, tg_r.size()).c_str(), bytes, bytes * tg.mean / 1e9, streamed);
  for (const auto& v : verify)
    std::printf("| %s | %s | %s | %lld | verify%d | %.2fx tg (%.3f ms/step) | | | %.3g |\n",
                a.s.model.c_str(), mode_s.c_str(), kv.c_str(), static_cast<long long>(depth),
                v["tokens"].get<int32_t>(), v["ratio_to_tg_step"].get<double>(),
                v["step_s"].get<double>() * 1e3, v["streamed_bytes_per_step"].get<double>());
  if (n_prompt > 0)
    std::printf("| %s | %s | %s | %lld | pp%d | %s | | | |\n", a.s.model.c_str(), mode_s.c_str(),
                kv.c_str(), static_cast<long long>(depth), n_prompt,
                show(ppt, pp_r.size()).c_str());
  std::fflush(stdout);
  nlohmann::json r = run_json(a, eng, mode_s);
  r["depth"] = depth;
  r["repetitions"] = a.reps;
  r["tg_tokens_per_s"] = tg.mean;
  r["tg_tokens_per_s_std"] = tg.std;
  r["tg_tokens_per_s_reps"] = tg_r;
  r["tg_bytes_per_token"] = bytes;
  r["tg_weight_bytes"] = weights;
  r["tg_kv_bytes_per_token"] = kv_tok;
  r["tg_achieved_gb_per_s"] = bytes * tg.mean / 1e9;
  r["pp_tokens"] = n_prompt;
  if (n_prompt > 0) {
    r["pp_tokens_per_s"] = ppt.mean;
    r["pp_tokens_per_s_std"] = ppt.std;
    r["pp_tokens_per_s_reps"] = pp_r;
  }
  if (!a.verify.empty()) r["verify"] = verify;
  r["streamed_bytes_per_token"] = streamed;
  r["ready_wait_s_per_token"] =
      (after.ready_wait_s - before.ready_wait_s) / static_cast<double>(n_tg);
  r["host_issue_s_per_token"] = (after.issue_s - before.issue_s) / static_cast<double>(n_tg);
  r["copy_busy_fraction"] = tg_s > 0 ? busy / tg_s : 0.0;
  r["h2d_bytes_per_s"] = h2d;
  r["h2d_limit"] = eng.options().h2d_limit;
  if (h2d > 0) {
    const double bound = streamed / h2d;
    r["stream_bound_s_per_token"] = bound;
  }
  r["plan_n_slots"] = eng.plan().n_slots;
  r["plan_slot_pages"] = eng.plan().slot_pages;
  r["plan_resident_pages"] = eng.plan().resident;
  r["plan_streamed_bytes_per_step"] = eng.plan().streamed_bytes;
  // The copy's time and the device's pages per token, which bound held (the larger of the
  // copy's time and the CPU's where near the step, else the device); split: the CPU's pages,
  // time and rate per token, and the plan's figures at the end.
  const auto per_token = [&](double x) { return x / static_cast<double>(n_tg); };
  const double cpu_s = per_token(after.cpu_s - before.cpu_s),
               cpu_b = per_token(static_cast<double>(after.cpu_bytes - before.cpu_bytes)),
               copy_s = per_token(busy);
  r["copy_s_per_token"] = copy_s;
  r["gpu_pages_per_token"] = per_token(static_cast<double>(after.gpu_pages - before.gpu_pages));
  r["bound"] = step_bound(1 / tg.mean, copy_s, cpu_s);
  r["plan_bound"] = eng.plan().bound();
  r["plan_predicted_step_s"] = eng.plan().predicted_step_s;
  if (cpu_b > 0) {
    r["cpu_pages_per_token"] = per_token(static_cast<double>(after.cpu_pages - before.cpu_pages));
    r["cpu_bytes_per_token"] = cpu_b;
    r["cpu_s_per_token"] = cpu_s;
    r["cpu_wait_s_per_token"] = per_token(after.cpu_wait_s - before.cpu_wait_s);
    r["cpu_bytes_per_s"] = cpu_s > 0 ? cpu_b / cpu_s : 0.0;
    r["split_threads"] = eng.split_threads();
    r["split_cpus"] = eng.split_cpus();  // empty: not pinned
    r["plan_cpu_pages"] = eng.plan().cpu;
    r["plan_cpu_s"] = eng.plan().cpu_s;
    r["plan_copy_s"] = eng.plan().copy_s;
  }
  return r;
}

// --ingest: per length n (ascending), a prompt of n random tokens read from an empty cache in
// -b batches, as a client's whole prompt is, on one engine with room for the longest: its wall
// time, tokens/s and the bytes it streamed.
void ingest_runs(const BenchArgs& a, const Model& model, const std::string& mode, size_t vram,
                 nlohmann::json& runs, std::string& device_name,
                 const std::function<void()>& save) {
  const int64_t longest = *std::max_element(a.ingest.begin(), a.ingest.end());
  EngineOptions o = options(a, mode);
  o.n_ctx = context_of(longest + 1, "--ingest");
  check_host_kv(o, model.config, a.backend, cat("a context of ", o.n_ctx, " tokens (--ingest)"));
  auto dev = device_of(a.s, a.backend, vram);
  device_name = dev->name();
  Engine eng(model, *dev, o);
  RandomTokens random_tokens{static_cast<uint32_t>(model.config.n_vocab)};
  warm_up(eng, random_tokens(std::min<int64_t>(a.n_batch, o.n_ctx - 1) + 1));
  for (const int64_t n : a.ingest) {
    const std::vector<int32_t> t = random_tokens(n);
    Sequence s = eng.open_sequence();
    Progress progress(cat(mode, ": ingest ", n, " tokens"), n, true);
    const size_t in0 = eng.totals().bytes_in;
    const double t0 = now();
    for (int64_t i = 0; i < n; i += a.n_batch) {
      const auto m = static_cast<int32_t>(std::min<int64_t>(a.n_batch, n - i));
      eng.eval(s, t.data() + i, m);  // returns once the batch's logits are on the host
      progress.update(i + m);
    }
    const double seconds = now() - t0;
    progress.finish();
    const size_t streamed = eng.totals().bytes_in - in0;
    eng.close_sequence(s);
    nlohmann::json j = run_json(a, eng, mode);
    j["depth"] = 0;
    j["ingest"] = {{"tokens", n},
                   {"seconds", seconds},
                   {"tokens_per_s", static_cast<double>(n) / seconds},
                   {"batch", a.n_batch},
                   {"streamed_bytes", streamed}};
    std::printf("| %s | %s | %s/%s | 0 | ingest %lld (-b %d): %.2f s | %.2f | | | %s |\n",
                a.s.model.c_str(), mode.c_str(), a.s.ctk.c_str(), a.s.ctv.c_str(),
                static_cast<long long>(n), a.n_batch, seconds, static_cast<double>(n) / seconds,
                format_bytes(streamed / static_cast<size_t>(n)).c_str());
    std::fflush(stdout);
    runs.push_back(j);
    save();
  }
}

// The JSON of a bench: what ran where, and its runs and pairs.
nlohmann::json bench_json(const BenchArgs& a, const std::string& device, size_t vram,
                          const nlohmann::json& runs, const nlohmann::json& pairs) {
  nlohmann::json j;
  j["model"] = a.s.model;
  j["device"] = device;
  j["backend"] = a.backend;
  j["build"] = {{"version", KVS_VERSION}, {"compiler", __VERSION__}, {"date", __DATE__}};
  j["command"] = a.command;
  j["threads"] = thread_pool().size();
  // The CPU's kernels run on whatever the backend: the CPU and the instruction set they chose.
  j["cpu"] = {{"model", cpu::cpu_brand()},
              {"features", cpu::cpu_features()},
              {"isa", cpu::isa_name(cpu::best_isa())},
              {"isa_origin", cpu::isa_origin()}};
  j["page_size"] = a.base.page_size;
  j["batch"] = a.n_batch;
  j["fill"] = a.fill;
  j["vram_limit"] = vram;
  j["phase_arena"] = a.base.phase_arena;
  j["runs"] = runs;
  if (!pairs.empty()) j["pairs"] = pairs;
  return j;
}

void bench(BenchArgs& a) {
  const std::vector<int64_t> depths =
      a.depths.empty() ? std::vector<int64_t>{} : parse_count_list(a.depths, "--depths");
  a.n_gen = static_cast<int32_t>(count_arg(a.n_gen_text, "--n-gen", 1, 1 << 24));
  for (const std::string& m : split(a.modes))
    KVS_CHECK(m == "auto" || m == "resident" || m == "stream" || m == "host" || m == "unified" ||
                  m == "split",
              "--modes: '", m, "' is not a mode (auto, resident, stream, host, unified, split)");
  a.backend = backend_of(a.s);
  check_flash_attn(a.s);
  apply_threads(a.s);
  cpu::best_isa();  // a bad KVS_CPU_ISA is an error before the model loads
  const size_t vram = vram_limit_of(a.s);
  auto model = Model::load(a.s.model);
  const ModelConfig& c = model->config;
  a.base = engine_options(a.s, c);
  a.n_batch = a.base.n_batch;
  if (!a.verify_text.empty()) a.verify = parse_count_list(a.verify_text, "--verify-tokens");
  if (!a.ingest_text.empty()) {
    a.ingest = parse_count_list(a.ingest_text, "--ingest");
    for (int64_t n : a.ingest) KVS_CHECK(n >= 1, "--ingest: ", n, " is not a prompt length");
    std::sort(a.ingest.begin(), a.ingest.end());
  }
  for (int64_t k : a.verify) {
    KVS_CHECK(k >= 1 && k <= 64, "--verify-tokens: ", k, " is not 1 to 64");
    a.base.n_verify = std::max(a.base.n_verify, static_cast<int32_t>(k));
  }
  int64_t max_depth = 0;
  for (int64_t d : depths) {
    KVS_CHECK(d >= 0, "--depths: negative depth");
    max_depth = std::max(max_depth, d);
  }
  KVS_CHECK((a.spec.kind() == "oracle") == (a.accept > 0),
            "bench: --spec oracle needs --accept P (the chance a draft is kept), and --accept is "
            "for --spec oracle");
  if (a.spec.on()) {
    KVS_CHECK(!a.file.empty(), "bench --spec: give the prompt the drafts continue with -f/--file");
    KVS_CHECK(a.spec.kind() != "mtp" || a.fill == "prefill" || depths == std::vector<int64_t>{0},
              "bench --spec mtp: --fill random writes no keys for the MTP block; use --fill "
              "prefill or --depths 0");
    KVS_CHECK(a.pair.empty() && a.verify.empty() && a.ingest.empty(),
              "bench --spec: not with --pair, --verify-tokens or --ingest");
    const Tokenizer& tok = *model->tokenizer;
    std::string text = read_file(a.file);
    if (a.chat) text = tok.apply_chat({{"user", text}});
    const std::vector<int32_t> prompt = tok.encode(text, true, a.chat);
    KVS_CHECK(!prompt.empty(), "-f ", a.file, ": an empty prompt");
    nlohmann::json runs = nlohmann::json::array();
    std::string device_name;
    const auto save = [&] {
      if (!a.json_out.empty())
        write_json(a.json_out, bench_json(a, device_name, vram, runs, nlohmann::json::array()));
    };
    std::printf(
        "| model | mode | KV | depth | test | tokens/s | acceptance | tokens/step | "
        "streamed/token |\n");
    std::printf("| --- | --- | --- | ---: | --- | ---: | ---: | ---: | ---: |\n");
    spec_bench(a, *model, depths, max_depth, vram, prompt, runs, device_name, save);
    return;
  }
  const int32_t n_prompt =
      a.n_prompt_text.empty()
          ? a.n_batch
          : static_cast<int32_t>(count_arg(a.n_prompt_text, "-p/--n-prompt", 0, 1 << 24));
  nlohmann::json runs = nlohmann::json::array(), pairs = nlohmann::json::array();
  std::string device_name;
  // The JSON is rewritten after every run, so a long sweep cut short keeps what it measured.
  const auto save = [&] {
    if (!a.json_out.empty()) write_json(a.json_out, bench_json(a, device_name, vram, runs, pairs));
  };
  bool pairs_ok = true;
  std::printf(
      "| model | mode | KV | depth | test | tokens/s | bytes/token | GB/s | streamed/token |\n");
  std::printf("| --- | --- | --- | ---: | --- | ---: | ---: | ---: | ---: |\n");
  for (const std::string& mode_s : split(a.modes)) {
    if (!a.pair.empty()) {
      nlohmann::json r = pair_run(a, *model, mode_s, vram);
      pairs_ok &= r["same_tokens_as_alone"].get<bool>();
      pairs.push_back(r);
      save();
    }
    if (!a.ingest.empty()) ingest_runs(a, *model, mode_s, vram, runs, device_name, save);
    if (a.depths.empty()) continue;
    EngineOptions o = options(a, mode_s);
    const auto n_verify = static_cast<int64_t>(a.verify.size());
    o.n_ctx = context_of(max_depth + 1 + int64_t{a.reps} * a.n_gen * (1 + n_verify) + o.n_verify -
                             1 + std::max(int64_t{a.reps} * n_prompt, int64_t{a.n_batch}),
                         "--depths, --n-gen, --verify-tokens, -p and -r");
    check_host_kv(o, c, a.backend,
                  cat("a context of ", o.n_ctx, " tokens (--depths, --n-gen, -p, -r)"));
    auto dev = device_of(a.s, a.backend, vram);
    device_name = dev->name();
    if (device_name == "cpu") a.backend = "cpu";  // -ngl fell back where no GPU answered
    Engine eng(*model, *dev, o);
    const size_t weights = model->weights.matrix_bytes();
    RandomTokens random_tokens{static_cast<uint32_t>(c.n_vocab)};
    // Ascending depths share one sequence: each fills on from where the last one's timed
    // tokens left it, so a sweep prefills its deepest depth once.
    // Warm-up, untimed: the first prefill and decode initialise cuBLAS and the kernels.
    warm_up(eng, random_tokens(std::min<int64_t>(a.n_batch, o.n_ctx - 1) + 1));
    Sequence s = eng.open_sequence();
    for (int64_t depth : depths) {
      if (s.n_past > depth) {
        eng.close_sequence(s);
        s = eng.open_sequence();
      }
      // Unified: the context is filled with the whole GPU (thrashing through a fill of 128K
      // tokens would take hours); the timed tokens run under the limit, the balloon evicting
      // what does not fit.
      const bool unified = o.kv_mode == KvMode::Unified;
      if (unified) dev->set_balloon(false);
      fill(a, eng, s, depth, mode_s, random_tokens, static_cast<uint32_t>(depth));
      if (unified) dev->set_balloon(true);
      runs.push_back(measure_depth(a, eng, s, depth, mode_s, n_prompt, weights, random_tokens));
      save();
    }
  }
  if (!pairs_ok)
    fail(
        "--pair: the sequences decoded together gave other tokens than decoded alone (see the "
        "table); streaming must be exact, this is a bug");
}

}  // namespace

void register_bench(CLI::App& app, std::string command) {
  auto a = std::make_shared<BenchArgs>();
  a->command = std::move(command);
  CLI::App* c = app.add_subcommand("bench", "Measure prefill and decode speed at depths");
  add_shared(c, a->s, kModel);
  CLI::Option* depths = c->add_option("--depths", a->depths,
                                      "Context depths, e.g. 0,4k,32k (default 0 unless --pair)")
                            ->capture_default_str();
  c->add_option("--modes", a->modes, "KV modes: auto, resident, stream, host, unified, split")
      ->capture_default_str();
  c->add_option("--n-gen", a->n_gen_text, "Tokens decoded at each depth")
      ->type_name("N")
      ->capture_default_str();
  c->add_option("-r,--repetitions", a->reps,
                "Timed decodes and prefills at each depth, reported as mean ± standard "
                "deviation (each continues the sequence)")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  c->add_option("-p,--n-prompt", a->n_prompt_text,
                "Prompt tokens prefilled (timed) at each depth (default: one -b batch; 0: none)");
  add_shared(c, a->s, kCache | kDevice | kMemory);
  c->add_option("--pair", a->pair,
                "Two depths, e.g. 32k,128k: two sequences decode together, then each alone; "
                "checks the tokens agree and reports the combined tokens/s");
  c->add_option("--fill", a->fill,
                "How the context is filled to a depth (untimed): prefill (random tokens through "
                "the model) or random (random K/V rows written straight into the cache)")
      ->check(CLI::IsMember({"prefill", "random"}))
      ->capture_default_str();
  c->add_option("--verify-tokens", a->verify_text,
                "Also time, at each depth, steps of K tokens of one sequence with the logits of "
                "each (speculative verify steps, the drafts rolled back), e.g. 1,2,4,8: their "
                "time against the one-token step's");
  c->add_option("--ingest", a->ingest_text,
                "Also time whole prompts of these lengths, e.g. 32k,128k, each read from an "
                "empty cache in -b batches: the time to ingest a prompt (the depths then run "
                "only where --depths is given)");
  add_speculation(c, a->spec);
  c->add_option("--accept", a->accept,
                "--spec oracle: drafts are the tokens a plain greedy run of the same prompt "
                "produced, each kept with this probability and otherwise replaced by a wrong one "
                "(a verify pipeline measured at a chosen acceptance, on any weights)")
      ->check(CLI::Range(0.0, 1.0));
  c->add_option("-f,--file", a->file,
                "--spec: the prompt the drafts continue (text), prefilled after each depth; "
                "--n-gen tokens are then decoded greedily with and without speculation");
  c->add_flag("--chat", a->chat, "--spec: wrap the prompt in the model's chat template");
  c->add_option("--json", a->json_out, "Write every figure as JSON to this file");
  c->callback([a, depths] {
    if ((!a->pair.empty() || !a->ingest_text.empty()) && depths->count() == 0) a->depths.clear();
    bench(*a);
  });
}

}  // namespace kvs::cli
