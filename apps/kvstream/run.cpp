// kvstream run: generate text from a prompt, streaming it to stdout.
#include <sys/resource.h>

#include <algorithm>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "commands.h"
#include "structured.h"
#include "kvs/backend/device.h"
#include "kvs/engine/engine.h"
#include "kvs/engine/generate.h"
#include "kvs/engine/sampler.h"
#include "kvs/model/model.h"
#include "kvs/util/error.h"
#include "kvs/util/npy.h"
#include "kvs/util/parse.h"
#include "kvs/util/threadpool.h"

namespace kvs::cli {
namespace {

struct RunArgs {
  SharedArgs s;
  GenArgs g;
  std::string prompt, file, tokens, logits_out, mtp_logits_out, json_out;
  SpecArgs spec;
  GrammarArgs grammar;
  ChatTemplateArgs tmpl;  // --jinja, --chat-template, ... (chat_flags.h)
  bool has_prompt = false, chat = false, conversation = false, no_conversation = false;
  // llama-cli's: -r (text that ends the generation, kept in it), -e (escapes in the prompt),
  // --color and --no-display-prompt (kvstream prints only the generated text, uncoloured).
  std::vector<std::string> reverse;
  bool escape = false, color = false, no_display_prompt = false, single_turn = false;
};

size_t peak_rss() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<size_t>(u.ru_maxrss) * 1024;
}

// The prompts: one, or with --parallel N one per line of -f (or the same -p/--tokens N times).
// With -n -1, n_predict becomes what the longest prompt leaves of the context.
std::vector<std::vector<int32_t>> prompts_of(const RunArgs& a, const Model& model,
                                             const EngineOptions& eo, int64_t& n_predict) {
  const Tokenizer& tok = *model.tokenizer;
  const int32_t parallel = eo.n_seq;
  auto encode = [&](std::string text) {
    if (a.chat && tok.has_chat()) {
      std::vector<ChatMessage> msgs;
      if (!a.g.system.empty()) msgs.push_back({"system", a.g.system});
      msgs.push_back({"user", text});
      text = tok.apply_chat(msgs);
    }
    return tok.encode(text, true, a.chat);
  };
  std::vector<std::vector<int32_t>> out;
  if (!a.tokens.empty()) {
    std::vector<int32_t> ids = parse_int_list(a.tokens, "--tokens");
    for (int32_t id : ids)
      KVS_CHECK(id >= 0 && id < model.config.n_vocab, "--tokens: id ", id,
                " is out of range (vocab ", model.config.n_vocab, ")");
    out.assign(static_cast<size_t>(parallel), ids);
  } else if (!a.file.empty()) {
    const std::string text = read_file(a.file);
    if (parallel == 1) {
      out.push_back(encode(text));
    } else {
      std::istringstream in(text);
      std::string line;
      while (std::getline(in, line))
        if (!line.empty()) out.push_back(encode(line));
      KVS_CHECK(static_cast<int32_t>(out.size()) == parallel, "-np/--parallel ", parallel, ": -f '",
                a.file, "' has ", out.size(), " non-empty lines, one prompt per sequence");
    }
  } else {
    out.assign(static_cast<size_t>(parallel), encode(a.prompt));
  }
  int64_t longest = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    const int64_t n = static_cast<int64_t>(out[i].size());
    KVS_CHECK(n > 0, "prompt ", i + 1, " is empty");
    longest = std::max(longest, n);
    if (n_predict < 0)
      KVS_CHECK(n < eo.n_ctx, "prompt ", i + 1, " (", count_of(n, "token"),
                ") leaves no room in the context size -c ", eo.n_ctx);
    else
      KVS_CHECK(n + n_predict <= eo.n_ctx, "prompt ", i + 1, " (", count_of(n, "token"),
                ") plus -n ", n_predict, " exceeds the context size -c ", eo.n_ctx);
  }
  if (n_predict < 0) n_predict = eo.n_ctx - longest;
  return out;
}

// Totals of the steps of one phase (prefill or decode).
struct Phase {
  int64_t steps = 0, tokens = 0, chunks = 0;
  double seconds = 0, ready_wait_s = 0, copy_busy_s = 0, occupancy_sum = 0, cpu_s = 0,
         cpu_wait_s = 0;
  size_t bytes_in = 0, bytes_out = 0, cpu_bytes = 0;
  int64_t repartitions = 0, cpu_pages = 0, gpu_pages = 0;
  void add(const StepStats& s) {
    ++steps;
    tokens += s.n_tokens;
    chunks += s.chunks;
    seconds += s.seconds;
    ready_wait_s += s.ready_wait_s;
    copy_busy_s += s.copy_busy_s;
    occupancy_sum += s.occupancy;
    bytes_in += s.bytes_in;
    bytes_out += s.bytes_out;
    repartitions += s.repartitioned;
    cpu_pages += s.cpu_pages;
    cpu_bytes += s.cpu_bytes;
    cpu_s += s.cpu_s;
    cpu_wait_s += s.cpu_wait_s;
    gpu_pages += s.gpu_pages;
  }
  nlohmann::json json() const {
    nlohmann::json j;
    j["steps"] = steps;
    j["tokens"] = tokens;
    j["seconds"] = seconds;
    j["tokens_per_s"] = seconds > 0 ? tokens / seconds : 0.0;
    j["bytes_streamed"] = bytes_in;
    j["bytes_streamed_per_token"] = tokens > 0 ? static_cast<double>(bytes_in) / tokens : 0.0;
    j["bytes_written_back"] = bytes_out;
    j["chunks"] = chunks;
    j["ready_wait_s"] = ready_wait_s;
    j["ready_wait_s_per_token"] = tokens > 0 ? ready_wait_s / tokens : 0.0;
    j["copy_busy_fraction"] = seconds > 0 ? copy_busy_s / seconds : 0.0;
    j["ring_occupancy"] = steps > 0 ? occupancy_sum / steps : 0.0;
    j["repartitions"] = repartitions;
    j["copy_s"] = copy_busy_s;
    j["gpu_pages"] = gpu_pages;  // pages the device attended (resident and streamed)
    j["cpu_pages"] = cpu_pages;  // split: pages the CPU attended, their bytes, its time
    j["cpu_bytes"] = cpu_bytes;
    j["cpu_s"] = cpu_s;
    j["cpu_wait_s"] = cpu_wait_s;  // the device waiting for the CPU's partials
    j["cpu_busy_fraction"] = seconds > 0 ? cpu_s / seconds : 0.0;
    j["bound"] = step_bound(seconds, copy_busy_s, cpu_s);
    return j;
  }
};

std::string plan_text(const Engine& e) {
  const Plan& p = e.plan();
  if (e.options().kv_mode == KvMode::Host) return "host store only, attention on the host";
  if (!p.streams()) return "everything resident, no ring";
  int32_t lo = kUnlimited, hi = 0;
  for (int32_t r : p.resident) lo = std::min(lo, r), hi = std::max(hi, r);
  std::string caps = lo == kUnlimited ? "all"
                     : lo == hi       ? std::to_string(lo)
                                      : cat(lo, "-", hi == kUnlimited ? 0 : hi);
  int32_t cpu = 0;
  for (int32_t c : p.cpu) cpu += c;
  return cat("resident ", caps, " pages/layer/sequence, ring ", p.n_slots, " x ", p.slot_pages,
             " pages, ", format_bytes(p.streamed_bytes), " streamed per step",
             cpu > 0 ? cat(", the CPU ", cpu, " pages/layer (", format_bytes(p.cpu_bytes), ")")
                     : std::string(),
             e.in_prefill_phase() ? " (prefill: the workspace taken back)" : "");
}

void print_step(const char* phase, int64_t i, const StepStats& s, const Engine& e) {
  std::fprintf(stderr,
               "kvstream: %s %lld: %d tok, %.2f ms, streamed %s in %lld chunks, copy %.2f ms "
               "(%.0f%%), ready wait %.3f ms, ring %.0f%% full, device %lld pages%s, %s-bound%s\n",
               phase, static_cast<long long>(i), s.n_tokens, s.seconds * 1e3,
               format_bytes(s.bytes_in).c_str(), static_cast<long long>(s.chunks),
               s.copy_busy_s * 1e3, s.seconds > 0 ? 100 * s.copy_busy_s / s.seconds : 0.0,
               s.ready_wait_s * 1e3, 100 * s.occupancy, static_cast<long long>(s.gpu_pages),
               s.cpu_pages > 0
                   ? cat(", CPU ", s.cpu_pages, " pages (", format_bytes(s.cpu_bytes), ") in ",
                         s.cpu_s * 1e3, " ms, waited for ", s.cpu_wait_s * 1e3, " ms")
                         .c_str()
                   : "",
               step_bound(s.seconds, s.copy_busy_s, s.cpu_s),
               s.repartitioned ? cat(" | repartition: ", plan_text(e)).c_str() : "");
}

// One sampler per sequence, each fed its prompt: one random seed for the run, printed;
// sequence i uses seed + i.
std::vector<Sampler> samplers_for(const GenArgs& g,
                                  const std::vector<std::vector<int32_t>>& prompts) {
  std::vector<Sampler> samplers;
  for (size_t i = 0; i < prompts.size(); ++i) {
    SamplerParams sp = g.sp;
    if (g.seed >= 0) sp.seed = static_cast<uint64_t>(g.seed) + i;
    samplers.emplace_back(sp);
    if (i > 0 && g.seed < 0) {
      sp.seed = samplers[0].seed() + i;
      samplers.back() = Sampler(sp);
    }
    for (int32_t id : prompts[i]) samplers.back().accept(id);
  }
  return samplers;
}

// What a run did, for the summary and --json.
struct Outcome {
  std::vector<Sequence> seqs;
  std::vector<std::vector<float>> first_logits;  // [sequence][n_vocab], of the prompt's last token
  std::vector<std::vector<int32_t>> out;         // generated tokens per sequence
  std::vector<std::string> texts;
  Phase prefill, decode;
  double t_prefill = 0, t_decode = 0;
  int64_t n_dec = 0;
  int64_t seq_steps = 0;              // sequences' entries in the decode steps
  int64_t drafted = 0, accepted = 0;  // speculative decoding's draft tokens
};

// Prefill, one sequence after another, in chunks of -b tokens (progress on a terminal); Ctrl-C
// stops it and the summary tells what was done.
void prefill_all(const RunArgs& a, Engine& eng, const std::vector<std::vector<int32_t>>& prompts,
                 int64_t prompt_tokens, int32_t n_vocab, Outcome& r) {
  const int32_t n_batch = eng.options().n_batch;
  const double t0 = now();
  Progress progress("prefill", prompt_tokens, prompt_tokens > 2 * int64_t{n_batch});
  for (size_t i = 0; i < prompts.size() && !interrupted(); ++i) {
    const auto& prompt = prompts[i];
    r.seqs.push_back(eng.open_sequence());
    const int32_t n_prompt = static_cast<int32_t>(prompt.size());
    const float* logits = nullptr;
    for (int32_t j = 0; j < n_prompt && !interrupted(); j += n_batch) {
      const int32_t m = std::min(n_batch, n_prompt - j);
      logits = eng.eval(r.seqs.back(), prompt.data() + j, m);
      r.prefill.add(eng.last_step());
      if (a.s.verbose) print_step("prefill", r.prefill.steps, eng.last_step(), eng);
      progress.update(r.prefill.tokens);
    }
    if (!interrupted()) r.first_logits.emplace_back(logits, logits + n_vocab);
  }
  progress.finish();
  r.t_prefill = now() - t0;
}

// Decode: every unfinished sequence in one batch per step; a finished one gives its pages back
// at once. One sequence's text streams to stdout; several are printed as they end. With --spec
// a sequence's step also carries the drafts its drafter proposes (Decoder).
void decode_all(const RunArgs& a, Engine& eng, Speculator& spec, const Tokenizer& tok,
                std::vector<Sampler>& samplers, const std::vector<std::vector<int32_t>>& prompts,
                int64_t n_predict, int32_t n_vocab, Outcome& r) {
  const size_t N = samplers.size();
  r.out.assign(N, {});
  r.texts.assign(N, {});
  const bool prefilled = !interrupted();
  Decoder decoder(eng, n_vocab, &spec);
  std::vector<Decoding> ds(N);
  std::vector<StreamDecoder> decoders;
  for (size_t u = 0; u < N; ++u) {
    decoders.emplace_back(tok);
    if (!prefilled) continue;
    ds[u].seq = &r.seqs[u];
    ds[u].sampler = &samplers[u];
    decoder.start(ds[u], prompts[u].data(), static_cast<int32_t>(prompts[u].size()));
  }
  const bool stream_text = N == 1;
  // Sequence u's chosen tokens; false when the sequence ends with it.
  std::vector<Decoder::Take> takes;
  for (size_t u = 0; u < N; ++u)
    takes.push_back([&, u](int32_t id, const float*, int32_t, bool) {
      r.out[u].push_back(id);
      const bool eog = !a.g.ignore_eos && tok.is_eog(id);
      bool reversed = false;
      if (!eog) {
        std::string piece = decoders[u].push(id);
        r.texts[u] += piece;
        if (stream_text) {
          std::fwrite(piece.data(), 1, piece.size(), stdout);
          std::fflush(stdout);
        }
        // -r: only the text this piece completes can newly hold a reverse prompt.
        for (const std::string& rp : a.reverse) {
          const size_t from =
              r.texts[u].size() - std::min(r.texts[u].size(), rp.size() + piece.size());
          reversed |= !rp.empty() && r.texts[u].find(rp, from) != std::string::npos;
        }
      }
      return !eog && !reversed && static_cast<int64_t>(r.out[u].size()) < n_predict;
    });
  const double t1 = now();
  std::vector<Decoding*> who;
  std::vector<BatchEntry> batch;
  for (bool begun = false; prefilled && n_predict > 0 && !interrupted(); begun = true) {
    who.clear();
    for (size_t u = 0; u < N; ++u) {
      if (!begun && !decoder.first(ds[u], r.first_logits[u].data(), takes[u]))
        eng.close_sequence(r.seqs[u]);
      if (ds[u].next < 0) continue;
      ds[u].max_drafts = n_predict - static_cast<int64_t>(r.out[u].size());
      who.push_back(&ds[u]);
    }
    if (who.empty()) break;
    batch.clear();
    decoder.add_steps(who, batch);
    eng.step(batch);
    r.decode.add(eng.last_step());
    if (a.s.verbose) print_step("decode", r.decode.steps, eng.last_step(), eng);
    for (size_t j = 0; j < who.size(); ++j) {
      const auto u = static_cast<size_t>(who[j] - ds.data());
      decoder.advance(*who[j], static_cast<int32_t>(j), takes[u]);
      if (who[j]->next < 0) eng.close_sequence(r.seqs[u]);
    }
  }
  for (size_t u = 0; u < N; ++u) {
    std::string rest = decoders[u].flush();
    r.texts[u] += rest;
    if (stream_text) {
      std::fwrite(rest.data(), 1, rest.size(), stdout);
      if (n_predict > 0 && prefilled) std::fputc('\n', stdout);
    } else if (n_predict > 0 && prefilled) {
      std::printf("[%zu] %s\n", u + 1, r.texts[u].c_str());
    }
    if (u < r.seqs.size() && r.seqs[u].id >= 0) eng.close_sequence(r.seqs[u]);
    r.seq_steps += ds[u].steps;
    r.drafted += ds[u].drafted;
    r.accepted += ds[u].accepted;
  }
  std::fflush(stdout);
  r.t_decode = now() - t1;
  for (const auto& o : r.out) r.n_dec += std::max<int64_t>(0, static_cast<int64_t>(o.size()) - 1);
}

// draft_bytes: what the draft model or the MTP block holds on the device.
void write_run_json(const RunArgs& a, const Engine& eng, size_t draft_bytes,
                    const std::vector<std::vector<int32_t>>& prompts, const Outcome& r) {
  const size_t N = prompts.size();
  nlohmann::json j;
  j["model"] = a.s.model;
  j["parallel"] = N;
  if (N == 1) {
    j["prompt_tokens"] = prompts[0];
    j["interrupted"] = interrupted();
    j["tokens"] = r.out[0];
    j["text"] = r.texts[0];
  }
  nlohmann::json js = nlohmann::json::array();
  for (size_t i = 0; i < N; ++i)
    js.push_back({{"prompt_tokens", prompts[i]}, {"tokens", r.out[i]}, {"text", r.texts[i]}});
  j["sequences"] = js;
  j["prefill_tokens_per_s"] = static_cast<double>(r.prefill.tokens) / r.t_prefill;
  j["decode_tokens_per_s"] = r.n_dec > 0 ? static_cast<double>(r.n_dec) / r.t_decode : 0.0;
  j["prefill_s"] = r.t_prefill;
  j["decode_s"] = r.t_decode;
  j["speculation"] = {
      {"mode", a.spec.kind()},
      {"draft_model", a.spec.model_draft},
      {"draft_max", a.spec.on() ? a.spec.draft_max : 0},
      {"draft_min", a.spec.on() ? a.spec.draft_min : 0},
      {"drafted", r.drafted},
      {"accepted", r.accepted},
      {"acceptance_rate",
       r.drafted ? static_cast<double>(r.accepted) / static_cast<double>(r.drafted) : 0.0},
      {"sequence_steps", r.seq_steps},
      {"tokens_per_sequence_step",
       r.seq_steps ? static_cast<double>(r.n_dec) / static_cast<double>(r.seq_steps) : 0.0},
      {"draft_device_bytes", draft_bytes}};
  j["peak_rss_bytes"] = peak_rss();
  j["kv_bytes_per_token"] = eng.kv_bytes_per_token();
  const EngineStats& tot = eng.totals();
  nlohmann::json kv;
  kv["mode"] = kv_mode_name(eng.options().kv_mode);
  kv["page_size"] = eng.options().page_size;
  kv["page_bytes"] = eng.kv_layout().page_bytes();
  kv["arena_bytes"] = eng.arena_bytes();
  kv["workspace_bytes"] = eng.workspace_bytes();
  kv["prefill_arena_bytes"] = eng.arena_bytes() - eng.workspace_bytes();
  kv["workspace_taken"] = tot.workspace_taken;
  kv["fixed_frames"] = eng.fixed_frames();
  kv["full_layers"] = eng.kv_shape().n_full;
  kv["window_layers"] = eng.kv_shape().n_window;
  kv["window_bytes"] = eng.kv_shape().window_bytes;
  kv["recurrent_layers"] = eng.kv_shape().n_recurrent;
  kv["recurrent_bytes"] = eng.kv_shape().recurrent_bytes;
  kv["host_store_bytes"] = eng.host_bytes();
  const Plan& p = eng.plan();
  nlohmann::json& plan = kv["plan"];
  plan["resident_pages"] = p.resident;
  plan["slot_pages"] = p.slot_pages;
  plan["n_slots"] = p.n_slots;
  plan["streamed_bytes_per_step"] = p.streamed_bytes;
  if (eng.split_threads() > 0) {
    kv["split_threads"] = eng.split_threads();
    kv["split_cpus"] = eng.split_cpus();  // empty: not pinned
  }
  plan["cpu_pages"] = p.cpu;  // split: per sequence, pages per layer the CPU attends
  plan["cpu_bytes_per_step"] = p.cpu_bytes;
  plan["copy_s"] = p.copy_s;
  plan["cpu_s"] = p.cpu_s;
  plan["bound"] = p.bound();
  plan["predicted_step_s"] = p.predicted_step_s;
  kv["prefill"] = r.prefill.json();
  kv["decode"] = r.decode.json();
  kv["repartitions"] = tot.repartitions;
  kv["prefetch_chunks_kept"] = tot.prefetch_kept;
  kv["prefetch_chunks_dropped"] = tot.prefetch_dropped;
  j["kv"] = kv;
  write_json(a.json_out, j);
}

// The run's set-up on stderr: the model, the prompt, the KV cache and its arena.
void describe_run(const RunArgs& a, const ModelConfig& c, const Engine& eng, int64_t prompt_tokens,
                  uint64_t seed) {
  const EngineOptions& eo = eng.options();
  const int32_t N = eo.n_seq;
  std::fprintf(stderr,
               "kvstream: %s (%s, %d layers), %s%s, %d threads, KV %s/%s %s per token, seed "
               "%llu\n",
               a.s.model.c_str(), c.arch_name.c_str(), c.n_layer,
               count_of(prompt_tokens, "prompt token").c_str(),
               N > 1 ? cat(" in ", N, " sequences").c_str() : "", thread_pool().size(),
               a.s.ctk.c_str(), a.s.ctv.c_str(), format_bytes(eng.kv_bytes_per_token()).c_str(),
               static_cast<unsigned long long>(seed));
  std::fprintf(stderr, "kvstream: kv-mode %s, arena %s (%s pages), KV at -c %d: %s per sequence\n",
               kv_mode_name(eo.kv_mode), format_bytes(eng.arena_bytes()).c_str(),
               format_bytes(eng.kv_layout().page_bytes()).c_str(), eo.n_ctx,
               format_bytes(eng.kv_bytes_per_token() * static_cast<size_t>(eo.n_ctx)).c_str());
  if (const std::vector<int>& cpus = eng.split_cpus(); eng.split_threads() > 0)
    std::fprintf(stderr, "kvstream: split: %s for the CPU's pages, %s\n",
                 count_of(eng.split_threads(), "CPU thread").c_str(),
                 cpus.empty()
                     ? "not pinned"
                     : cat(cpus.size() == 1 ? "on CPU " : "on CPUs ", cpu_list_name(cpus)).c_str());
  if (eng.workspace_bytes() > 0 && a.s.verbose)
    std::fprintf(stderr,
                 "kvstream: phase arena: a prefill takes %s of it back for its workspace (KV "
                 "arena %s while prefilling)\n",
                 format_bytes(eng.workspace_bytes()).c_str(),
                 format_bytes(eng.arena_bytes() - eng.workspace_bytes()).c_str());
  if (const KvShape& k = eng.kv_shape(); k.n_window > 0)
    std::fprintf(stderr,
                 "kvstream: layers: %d full (paged, may stream), %d window of %d positions "
                 "(resident, %s)\n",
                 k.n_full, k.n_window, c.n_swa, format_bytes(k.window_bytes).c_str());
  if (const KvShape& k = eng.kv_shape(); k.n_recurrent > 0)
    std::fprintf(stderr,
                 "kvstream: layers: %d full (paged, may stream), %d recurrent (resident state, "
                 "%s)\n",
                 k.n_full, k.n_recurrent, format_bytes(k.recurrent_bytes).c_str());
}

// The run's speeds and streaming on stderr, after it ends (or is interrupted).
void report_run(const RunArgs& a, const Engine& eng, const Outcome& r, int64_t prompt_tokens,
                bool prefilled, double load_s) {
  const double pp = static_cast<double>(r.prefill.tokens) / r.t_prefill;
  const double tg = r.n_dec > 0 ? static_cast<double>(r.n_dec) / r.t_decode : 0.0;
  if (interrupted())
    std::fprintf(stderr, "kvstream: interrupted (Ctrl-C)%s\n",
                 prefilled ? ""
                           : cat(" during the prefill, after ", count_of(r.prefill.tokens, "token"),
                                 " of ", prompt_tokens)
                                 .c_str());
  std::fprintf(stderr,
               "kvstream: load %.2f s | prefill %s %.2f s, %.1f tok/s | decode %s %.2f s, %.1f "
               "tok/s | peak memory %s\n",
               load_s, count_of(r.prefill.tokens, "token").c_str(), r.t_prefill, pp,
               count_of(r.n_dec, "token").c_str(), r.t_decode, tg,
               format_bytes(peak_rss()).c_str());
  if (a.spec.on())
    std::fprintf(
        stderr,
        "kvstream: speculation (%s): %lld drafted, %lld accepted (%.1f %%), %.2f tokens "
        "per sequence step, %s streamed per token\n",
        a.spec.kind().c_str(), static_cast<long long>(r.drafted),
        static_cast<long long>(r.accepted),
        r.drafted ? 100.0 * static_cast<double>(r.accepted) / static_cast<double>(r.drafted) : 0.0,
        r.seq_steps ? static_cast<double>(r.n_dec) / static_cast<double>(r.seq_steps) : 0.0,
        format_bytes(r.n_dec ? r.decode.bytes_in / static_cast<size_t>(r.n_dec) : 0).c_str());
  const EngineStats& tot = eng.totals();
  if (a.s.verbose || tot.bytes_in > 0)
    std::fprintf(
        stderr,
        "kvstream: streamed %s (%s per decode token), written back %s, ready wait %.1f "
        "ms, %lld repartitions\n",
        format_bytes(tot.bytes_in).c_str(),
        format_bytes(r.decode.tokens ? r.decode.bytes_in / static_cast<size_t>(r.decode.tokens) : 0)
            .c_str(),
        format_bytes(tot.bytes_out).c_str(), tot.ready_wait_s * 1e3,
        static_cast<long long>(tot.repartitions));
}

void run(RunArgs& a) {
  if (a.escape) {
    a.prompt = unescape(a.prompt);
    a.g.system = unescape(a.g.system);
    for (std::string& rp : a.reverse) rp = unescape(rp);
  }
  int given =
      int(!a.prompt.empty() || a.has_prompt) + int(!a.file.empty()) + int(!a.tokens.empty());
  if (a.conversation) {
    KVS_CHECK(a.file.empty() && a.tokens.empty() && a.logits_out.empty(),
              "-cnv/--conversation takes -p (the first message), not -f, --tokens or "
              "--logits-out");
    chat_session(a.s, a.g, a.spec, a.tmpl, a.has_prompt ? a.prompt : "", a.json_out);
    return;
  }
  KVS_CHECK(given == 1,
            "give exactly one of -p/--prompt, -f/--file and --tokens (or none, or -cnv, for a "
            "conversation)");
  if (!a.g.system.empty() && !a.chat)
    std::fprintf(stderr,
                 "kvstream: warning: -sys/--system-prompt is for --chat and -cnv; ignored\n");
  int64_t n_predict = n_predict_of(a.g);
  const std::string backend = backend_of(a.s);
  check_flash_attn(a.s);
  apply_threads(a.s);
  const size_t vram = vram_limit_of(a.s);

  const double t_load = now();
  auto model = Model::load(a.s.model);
  apply_chat_template_flags(*model->tokenizer, a.tmpl);
  EngineOptions eo = engine_options(a.s, model->config);
  apply_speculation(a.spec, eo, backend);
  const auto draft_model = load_draft(a.spec, *model);
  const int32_t n_vocab = model->config.n_vocab;
  if (a.chat)
    note_no_template(*model->tokenizer, a.s.model,
                     a.g.system.empty() ? "--chat runs a plain completion of the prompt"
                                        : "--chat runs a plain completion of the prompt, without "
                                          "-sys");
  const auto prompts = prompts_of(a, *model, eo, n_predict);
  const int32_t N = eo.n_seq;

  check_host_kv(eo, model->config, backend);
  auto dev = device_of(a.s, backend, vram);
  const auto drafter = make_drafter(a.spec, draft_model.get(), *model, *dev, eo);
  const auto mtp = make_mtp(a.spec, *model, *dev, eo);
  Engine eng(*model, *dev, eo, mtp ? &mtp->engine() : nullptr);
  Speculator spec(spec_options(a.spec), eng, drafter.get(), mtp.get());
  GenArgs g = a.g;
  g.sp.grammar = grammar_of(a.grammar, *model->tokenizer);
  std::vector<Sampler> samplers = samplers_for(g, prompts);
  int64_t prompt_tokens = 0;
  for (const auto& p : prompts) prompt_tokens += static_cast<int64_t>(p.size());
  describe_run(a, model->config, eng, prompt_tokens, samplers[0].seed());

  catch_interrupt(true);
  Outcome r;
  const double t0 = now();
  prefill_all(a, eng, prompts, prompt_tokens, n_vocab, r);
  if (!a.logits_out.empty() && !interrupted()) {
    std::vector<float> all;
    for (const auto& l : r.first_logits) all.insert(all.end(), l.begin(), l.end());
    if (N == 1)
      write_npy(a.logits_out, all.data(), {static_cast<int64_t>(n_vocab)});
    else
      write_npy(a.logits_out, all.data(), {static_cast<int64_t>(N), static_cast<int64_t>(n_vocab)});
  }
  if (!a.mtp_logits_out.empty() && !interrupted()) {
    KVS_CHECK(mtp && N == 1, "--mtp-logits-out needs --spec mtp and one sequence");
    write_npy(a.mtp_logits_out, mtp->engine().logits(0), {static_cast<int64_t>(n_vocab)});
  }
  if (a.s.verbose) std::fprintf(stderr, "kvstream: plan: %s\n", plan_text(eng).c_str());
  const bool prefilled = !interrupted();
  decode_all(a, eng, spec, *model->tokenizer, samplers, prompts, n_predict, n_vocab, r);

  report_run(a, eng, r, prompt_tokens, prefilled, t0 - t_load);
  const size_t draft_bytes = drafter ? drafter->device_bytes() : 0;
  if (!a.json_out.empty())
    write_run_json(a, eng, mtp ? mtp->device_bytes() : draft_bytes, prompts, r);
}

}  // namespace

void register_run(CLI::App& app) {
  auto a = std::make_shared<RunArgs>();
  CLI::App* c = app.add_subcommand("run", "Generate text from a prompt");
  add_shared(c, a->s, kModel);
  c->add_option("-p,--prompt", a->prompt, "Prompt text");
  c->add_option("-f,--file", a->file, "Read the prompt from a file");
  c->add_option("--tokens", a->tokens, "Prompt as token ids: 1,2,3");
  add_generation(c, a->g);
  add_grammar(c, a->grammar);
  c->add_flag("--chat", a->chat, "Wrap the prompt in the model's chat template");
  add_chat_template_flags(c, a->tmpl);
  c->add_flag("--conversation,-i,--interactive", a->conversation,
              "-cnv: interactive chat, as `kvstream chat` (-p: the first message); also when "
              "no -p, -f or --tokens is given");
  c->add_flag("--no-conversation", a->no_conversation,
              "-no-cnv: never start a conversation (a missing prompt is an error)");
  add_shared(c, a->s, kAllShared & ~kModel);
  c->add_option("--logits-out", a->logits_out,
                "Save the logits at the last prompt token (.npy, float32)");
  c->add_option("--mtp-logits-out", a->mtp_logits_out,
                "With --spec mtp: save the MTP head's logits of the last prompt token's entry, "
                "which predict the token after the prompt (.npy, float32)");
  c->add_option("--json", a->json_out, "Write tokens, text and timings as JSON to this file");
  add_speculation(c, a->spec);
  c->add_option("-r,--reverse-prompt", a->reverse,
                "Stop generating when the text holds this (kept in the output; repeatable)");
  c->add_flag("-e,--escape", a->escape,
              "Read \\n, \\t, \\r, \\\\, \\' and \\\" in -p, -sys and -r as the characters");
  c->add_flag("--single-turn", a->single_turn,
              "-st: the prompt as one chat turn (--chat), then exit, as llama-cli's");
  c->add_flag("--color", a->color, "Accepted as in llama-cli (the output is not coloured)");
  c->add_flag("--no-display-prompt", a->no_display_prompt,
              "Accepted as in llama-cli (the prompt is never printed)");
  c->callback([a, c] {
    a->has_prompt = c->count("--prompt") > 0;
    if (a->single_turn) a->chat = true, a->no_conversation = true;
    // No prompt at all: a conversation, as llama-cli starts one.
    if (!a->has_prompt && a->file.empty() && a->tokens.empty() && !a->no_conversation)
      a->conversation = true;
    if (a->conversation && c->count("--n-predict") == 0) a->g.n_predict = "-1";  // as chat's
    run(*a);
  });
}

}  // namespace kvs::cli
