// kvstream bench: prefill and decode speed at chosen depths and KV modes, as a table like
// llama-bench's and as JSON with every figure.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <random>

#include "commands.h"
#include "kvs/backend/device.h"
#include "kvs/engine/engine.h"
#include "kvs/model/model.h"
#include "kvs/util/error.h"
#include "kvs/util/parse.h"
#include "kvs/util/threadpool.h"

namespace kvs::cli {
namespace {

struct BenchArgs {
  std::string model, depths = "0", modes = "auto", ctk = "f16", ctv = "f16", backend = "cpu";
  std::string kv_arena, vram_limit, json_out, ring_chunk = "4M";
  int32_t n_gen = 32, n_batch = 512, page_size = 256, threads = 0;
  std::string command;
};

double now() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i <= s.size()) {
    const size_t j = s.find(',', i);
    out.push_back(s.substr(i, j == std::string::npos ? std::string::npos : j - i));
    if (j == std::string::npos) break;
    i = j + 1;
  }
  return out;
}

void bench(const BenchArgs& a) {
  if (a.threads > 0) set_thread_count(a.threads);
  const std::vector<int64_t> depths = parse_count_list(a.depths, "--depths");
  KVS_CHECK(a.n_gen >= 1, "--n-gen must be at least 1");
  const size_t vram = a.vram_limit.empty() ? 0 : parse_size(a.vram_limit, "--vram-limit");
  auto model = Model::load(a.model);
  const ModelConfig& c = model->config;
  int64_t max_depth = 0;
  for (int64_t d : depths) {
    KVS_CHECK(d >= 0, "--depths: negative depth");
    max_depth = std::max(max_depth, d);
  }
  nlohmann::json runs = nlohmann::json::array();
  std::string device_name;
  std::printf(
      "| model | mode | KV | depth | test | tokens/s | bytes/token | GB/s | streamed/token |\n");
  std::printf("| --- | --- | --- | ---: | --- | ---: | ---: | ---: | ---: |\n");
  for (const std::string& mode_s : split(a.modes)) {
    EngineOptions o;
    o.kv_mode = parse_kv_mode(mode_s.c_str());
    o.n_batch = a.n_batch;
    o.page_size = a.page_size;
    o.k_type = parse_kv_type(a.ctk.c_str(), "-ctk/--cache-type-k");
    o.v_type = parse_kv_type(a.ctv.c_str(), "-ctv/--cache-type-v");
    o.n_ctx = static_cast<int32_t>(max_depth + a.n_gen + a.n_batch);
    o.ring_chunk_bytes = parse_size(a.ring_chunk, "--ring-chunk");
    if (!a.kv_arena.empty()) o.kv_arena = parse_size(a.kv_arena, "--kv-arena");
    auto dev = make_device(a.backend, vram);
    device_name = dev->name();
    Engine eng(*model, *dev, o);
    const size_t weights = model->weights.matrix_bytes();
    std::mt19937 rng(1);
    auto random_tokens = [&](int64_t n) {
      std::vector<int32_t> t(static_cast<size_t>(n));
      for (auto& x : t) x = static_cast<int32_t>(rng() % static_cast<uint32_t>(c.n_vocab));
      return t;
    };
    // The JSON is rewritten after every run, so a long sweep cut short keeps what it measured.
    const auto save = [&] {
      if (a.json_out.empty()) return;
      nlohmann::json j;
      j["model"] = a.model;
      j["device"] = device_name;
      j["backend"] = a.backend;
      j["build"] = {{"version", KVS_VERSION}, {"compiler", __VERSION__}, {"date", __DATE__}};
      j["command"] = a.command;
      j["threads"] = thread_pool().size();
      j["page_size"] = a.page_size;
      j["batch"] = a.n_batch;
      j["runs"] = runs;
      write_json(a.json_out, j);
    };
    for (int64_t depth : depths) {
      Sequence s = eng.open_sequence();
      // Fill the context to the depth (not timed), with progress on a terminal.
      const auto fill = random_tokens(depth);
      for (int64_t i = 0; i < depth; i += a.n_batch) {
        const int32_t m = static_cast<int32_t>(std::min<int64_t>(a.n_batch, depth - i));
        eng.eval(s, fill.data() + i, m);
        if (isatty(STDERR_FILENO))
          std::fprintf(stderr, "\rkvstream bench: %s depth %lld: filling %lld/%lld", mode_s.c_str(),
                       static_cast<long long>(depth), static_cast<long long>(i + m),
                       static_cast<long long>(depth));
      }
      if (depth > 0 && isatty(STDERR_FILENO)) std::fputc('\n', stderr);
      // Decode at the depth.
      const EngineStats before = eng.totals();
      const auto gen = random_tokens(a.n_gen);
      const double t0 = now();
      for (int32_t i = 0; i < a.n_gen; ++i) eng.eval(s, &gen[static_cast<size_t>(i)], 1);
      const double tg_s = now() - t0;
      const EngineStats after = eng.totals();
      // Prefill of one batch, right after (at depth + n_gen).
      const auto pp = random_tokens(a.n_batch);
      const double t1 = now();
      eng.eval(s, pp.data(), a.n_batch);
      const double pp_s = now() - t1;
      eng.close_sequence(s);

      const double tg = a.n_gen / tg_s, ppt = a.n_batch / pp_s;
      // Bytes a decode step reads: every weight once and the KV at its mean depth.
      const double kv_tok = static_cast<double>(eng.kv_bytes_per_token()) *
                            (static_cast<double>(depth) + (a.n_gen - 1) / 2.0);
      const double bytes = static_cast<double>(weights) + kv_tok;
      const double streamed = static_cast<double>(after.bytes_in - before.bytes_in) / a.n_gen;
      const double busy = after.copy_busy_s - before.copy_busy_s;
      const double h2d =
          busy > 0 ? static_cast<double>(after.bytes_in - before.bytes_in) / busy : 0;
      const std::string kv = a.ctk + "/" + a.ctv;
      std::printf("| %s | %s | %s | %lld | tg%d | %.2f | %.3g | %.1f | %.3g |\n", a.model.c_str(),
                  mode_s.c_str(), kv.c_str(), static_cast<long long>(depth), a.n_gen, tg, bytes,
                  bytes * tg / 1e9, streamed);
      std::printf("| %s | %s | %s | %lld | pp%d | %.2f | | | |\n", a.model.c_str(), mode_s.c_str(),
                  kv.c_str(), static_cast<long long>(depth), a.n_batch, ppt);
      std::fflush(stdout);
      nlohmann::json r;
      r["mode"] = mode_s;
      r["depth"] = depth;
      r["cache_type_k"] = a.ctk;
      r["cache_type_v"] = a.ctv;
      r["tg_tokens"] = a.n_gen;
      r["tg_tokens_per_s"] = tg;
      r["tg_bytes_per_token"] = bytes;
      r["tg_weight_bytes"] = weights;
      r["tg_kv_bytes_per_token"] = kv_tok;
      r["tg_achieved_gb_per_s"] = bytes * tg / 1e9;
      r["pp_tokens"] = a.n_batch;
      r["pp_tokens_per_s"] = ppt;
      r["streamed_bytes_per_token"] = streamed;
      r["ready_wait_s_per_token"] = (after.ready_wait_s - before.ready_wait_s) / a.n_gen;
      r["copy_busy_fraction"] = tg_s > 0 ? busy / tg_s : 0.0;
      r["h2d_bytes_per_s"] = h2d;
      if (h2d > 0) {
        const double bound = streamed / h2d;
        r["stream_bound_s_per_token"] = bound;
      }
      r["arena_bytes"] = eng.arena_bytes();
      r["plan_n_slots"] = eng.plan().n_slots;
      r["plan_slot_pages"] = eng.plan().slot_pages;
      runs.push_back(r);
      save();
    }
  }
}

}  // namespace

void register_bench(CLI::App& app, std::string command) {
  auto a = std::make_shared<BenchArgs>();
  a->command = std::move(command);
  CLI::App* c = app.add_subcommand("bench", "Measure prefill and decode speed at depths");
  c->add_option("-m,--model", a->model, "GGUF file, or synthetic:PRESET[:TYPE]")->required();
  c->add_option("--depths", a->depths, "Context depths, e.g. 0,4k,32k")->capture_default_str();
  c->add_option("--modes", a->modes, "KV modes: auto, resident, stream, host")
      ->capture_default_str();
  c->add_option("--cache-type-k", a->ctk, "K cache type: f16, q8_0, q4_0")->capture_default_str();
  c->add_option("--cache-type-v", a->ctv, "V cache type: f16, q8_0, q4_0")->capture_default_str();
  c->add_option("--n-gen", a->n_gen, "Tokens decoded at each depth")->capture_default_str();
  c->add_option("-b,--batch-size", a->n_batch, "Prefill batch timed at each depth")
      ->capture_default_str();
  c->add_option("--page-size", a->page_size, "Tokens per KV page")->capture_default_str();
  c->add_option("--backend", a->backend, "Backend: cpu or cuda")->capture_default_str();
  c->add_option("--kv-arena", a->kv_arena, "Device memory for the KV cache");
  c->add_option("--vram-limit", a->vram_limit, "Device memory for weights, buffers and the arena");
  c->add_option("--ring-chunk", a->ring_chunk, "Smallest ring slot")->capture_default_str();
  c->add_option("-t,--threads", a->threads, "CPU threads");
  c->add_option("--json", a->json_out, "Write every figure as JSON to this file");
  c->callback([a] { bench(*a); });
}

}  // namespace kvs::cli
