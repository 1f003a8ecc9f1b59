// kvstream run: generate text from a prompt, streaming it to stdout.
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "commands.h"
#include "kvs/backend/device.h"
#include "kvs/engine/engine.h"
#include "kvs/engine/sampler.h"
#include "kvs/model/model.h"
#include "kvs/util/error.h"
#include "kvs/util/npy.h"
#include "kvs/util/parse.h"
#include "kvs/util/threadpool.h"

namespace kvs::cli {
namespace {

struct RunArgs {
  std::string model, prompt, file, tokens, logits_out, json_out, system;
  bool has_prompt = false;
  int32_t n_predict = 128;
  bool chat = false, ignore_eos = false;
  int32_t n_ctx = 4096, n_batch = 512, page_size = 256, threads = 0;
  std::string ctk = "f16", ctv = "f16", backend = "cpu";
  SamplerParams sp;
  int64_t seed = -1;
};

double now() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  KVS_CHECK(in.good(), "-f: cannot read '", path, "'");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

size_t peak_rss() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<size_t>(u.ru_maxrss) * 1024;
}

void run(const RunArgs& a) {
  if (a.threads > 0) set_thread_count(a.threads);
  KVS_CHECK(a.backend == "cpu", "--backend ", a.backend, ": this build has only the cpu backend");
  int given =
      int(!a.prompt.empty() || a.has_prompt) + int(!a.file.empty()) + int(!a.tokens.empty());
  KVS_CHECK(given == 1, "give exactly one of -p/--prompt, -f/--file and --tokens");
  KVS_CHECK(a.n_predict >= 0, "-n/--n-predict must be 0 or more");
  const double t_load = now();
  auto model = Model::load(a.model);
  const Tokenizer& tok = *model->tokenizer;

  std::vector<int32_t> prompt;
  if (!a.tokens.empty()) {
    prompt = parse_int_list(a.tokens, "--tokens");
    for (int32_t id : prompt)
      KVS_CHECK(id >= 0 && id < model->config.n_vocab, "--tokens: id ", id,
                " is out of range (vocab ", model->config.n_vocab, ")");
  } else {
    std::string text = a.file.empty() ? a.prompt : read_file(a.file);
    if (a.chat) {
      std::vector<ChatMessage> msgs;
      if (!a.system.empty()) msgs.push_back({"system", a.system});
      msgs.push_back({"user", text});
      text = tok.apply_chat(msgs);
    }
    prompt = tok.encode(text, true, a.chat);
  }
  KVS_CHECK(!prompt.empty(), "the prompt is empty");

  EngineOptions eo;
  eo.n_ctx = a.n_ctx;
  eo.n_batch = a.n_batch;
  eo.page_size = a.page_size;
  eo.k_type = parse_kv_type(a.ctk.c_str(), "-ctk/--cache-type-k");
  eo.v_type = parse_kv_type(a.ctv.c_str(), "-ctv/--cache-type-v");
  KVS_CHECK(static_cast<int64_t>(prompt.size()) + a.n_predict <= a.n_ctx, "the prompt (",
            prompt.size(), " tokens) plus -n ", a.n_predict, " exceeds the context size -c ",
            a.n_ctx);
  auto dev = make_cpu_device(0);
  Engine eng(*model, *dev, eo);
  SamplerParams sp = a.sp;
  if (a.seed >= 0) sp.seed = static_cast<uint64_t>(a.seed);
  Sampler sampler(sp);
  for (int32_t id : prompt) sampler.accept(id);
  std::fprintf(stderr,
               "kvstream: %s (%s, %d layers), %zu prompt tokens, %d threads, KV %s/%s %s per "
               "token, seed %llu\n",
               a.model.c_str(), model->config.arch_name.c_str(), model->config.n_layer,
               prompt.size(), thread_pool().size(), a.ctk.c_str(), a.ctv.c_str(),
               format_bytes(eng.kv_bytes_per_token()).c_str(),
               static_cast<unsigned long long>(sampler.seed()));

  Sequence seq = eng.open_sequence();
  const double t0 = now();
  // Chunks of -b tokens, with progress on a terminal for long prompts.
  const float* logits = nullptr;
  const int32_t n_prompt = static_cast<int32_t>(prompt.size());
  const bool progress = n_prompt > 2 * a.n_batch && isatty(STDERR_FILENO);
  for (int32_t i = 0; i < n_prompt; i += a.n_batch) {
    const int32_t m = std::min(a.n_batch, n_prompt - i);
    logits = eng.eval(seq, prompt.data() + i, m);
    if (progress) std::fprintf(stderr, "\rkvstream: prefill %d/%d", i + m, n_prompt);
  }
  if (progress) std::fputc('\n', stderr);
  const double t_prefill = now() - t0;
  if (!a.logits_out.empty())
    write_npy(a.logits_out, logits, {static_cast<int64_t>(model->config.n_vocab)});

  std::vector<int32_t> out;
  StreamDecoder sd(tok);
  std::string text;
  const double t1 = now();
  for (int32_t i = 0; i < a.n_predict; ++i) {
    int32_t id = sampler.sample(logits, model->config.n_vocab);  // also adds it to the history
    out.push_back(id);
    if (!a.ignore_eos && tok.is_eog(id)) break;
    std::string piece = sd.push(id);
    text += piece;
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
    if (i + 1 < a.n_predict) logits = eng.eval(seq, &id, 1);
  }
  std::string rest = sd.flush();
  text += rest;
  std::fwrite(rest.data(), 1, rest.size(), stdout);
  if (a.n_predict > 0) std::fputc('\n', stdout);
  std::fflush(stdout);
  const double t_decode = now() - t1;
  const int32_t n_dec = out.empty() ? 0 : static_cast<int32_t>(out.size()) - 1;
  const double pp = static_cast<double>(prompt.size()) / t_prefill;
  const double tg = n_dec > 0 ? n_dec / t_decode : 0.0;
  std::fprintf(stderr,
               "kvstream: load %.2f s | prefill %zu tokens %.2f s, %.1f tok/s | decode %d tokens "
               "%.2f s, %.1f tok/s | peak memory %s\n",
               t0 - t_load, prompt.size(), t_prefill, pp, n_dec, t_decode, tg,
               format_bytes(peak_rss()).c_str());
  if (!a.json_out.empty()) {
    nlohmann::json j;
    j["model"] = a.model;
    j["prompt_tokens"] = prompt;
    j["tokens"] = out;
    j["text"] = text;
    j["prefill_tokens_per_s"] = pp;
    j["decode_tokens_per_s"] = tg;
    j["prefill_s"] = t_prefill;
    j["decode_s"] = t_decode;
    j["peak_rss_bytes"] = peak_rss();
    j["kv_bytes_per_token"] = eng.kv_bytes_per_token();
    std::ofstream f(a.json_out);
    KVS_CHECK(f.good(), "--json: cannot write '", a.json_out, "'");
    f << j.dump(2) << "\n";
  }
  eng.close_sequence(seq);
}

}  // namespace

void register_run(CLI::App& app) {
  auto a = std::make_shared<RunArgs>();
  CLI::App* c = app.add_subcommand("run", "Generate text from a prompt");
  c->add_option("-m,--model", a->model, "GGUF file, or synthetic:PRESET[:TYPE]")->required();
  c->add_option("-p,--prompt", a->prompt, "Prompt text");
  c->add_option("-f,--file", a->file, "Read the prompt from a file");
  c->add_option("--tokens", a->tokens, "Prompt as token ids: 1,2,3");
  c->add_option("-n,--n-predict", a->n_predict, "Tokens to generate (0: only evaluate the prompt)")
      ->capture_default_str();
  c->add_flag("--chat", a->chat, "Wrap the prompt in the model's chat template");
  c->add_option("--system", a->system, "System message for --chat");
  c->add_flag("--ignore-eos", a->ignore_eos, "Keep generating past end-of-generation tokens");
  c->add_option("-c,--ctx-size", a->n_ctx, "Context size in tokens")->capture_default_str();
  c->add_option("-b,--batch-size", a->n_batch, "Prompt tokens per forward pass")
      ->capture_default_str();
  c->add_option("--cache-type-k", a->ctk, "K cache type: f16, q8_0, q4_0")->capture_default_str();
  c->add_option("--cache-type-v", a->ctv, "V cache type: f16, q8_0, q4_0")->capture_default_str();
  c->add_option("--page-size", a->page_size, "Tokens per KV page")->capture_default_str();
  c->add_option("--logits-out", a->logits_out,
                "Save the logits at the last prompt token (.npy, float32)");
  c->add_option("--json", a->json_out, "Write tokens, text and timings as JSON to this file");
  c->add_option("-t,--threads", a->threads, "CPU threads (default: all cores, or KVS_THREADS)");
  c->add_option("--backend", a->backend, "Backend: cpu")->capture_default_str();
  c->add_option("--temp", a->sp.temp, "Temperature (0: greedy)")->capture_default_str();
  c->add_option("--top-k", a->sp.top_k, "Top-k (0: off)")->capture_default_str();
  c->add_option("--top-p", a->sp.top_p, "Top-p (1: off)")->capture_default_str();
  c->add_option("--min-p", a->sp.min_p, "Min-p (0: off)")->capture_default_str();
  c->add_option("--repeat-penalty", a->sp.repeat_penalty, "Repetition penalty (1: off)")
      ->capture_default_str();
  c->add_option("--repeat-last-n", a->sp.repeat_last_n, "Tokens the penalty looks back (-1: all)")
      ->capture_default_str();
  c->add_option("-s,--seed", a->seed, "Random seed (default: random, printed)");
  c->callback([a, c] {
    a->has_prompt = c->count("--prompt") > 0;
    run(*a);
  });
}

}  // namespace kvs::cli
