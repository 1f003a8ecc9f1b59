#include "options.h"

#include <unistd.h>

#include <chrono>
#include <climits>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <thread>

#include "commands.h"
#include "kvs/backend/cuda/backend.h"
#include "kvs/quant/kv_page.h"
#include "kvs/util/error.h"
#include "kvs/util/parse.h"
#include "kvs/util/threadpool.h"

namespace kvs::cli {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  KVS_CHECK(in.good(), "-f: cannot read '", path, "'");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void add_shared(CLI::App* c, SharedArgs& a, unsigned flags) {
  if (flags & kModel)
    c->add_option("-m,--model", a.model, "GGUF file, or synthetic:PRESET[:TYPE]")->required();
  if (flags & kContext)
    c->add_option("-c,--ctx-size", a.ctx,
                  "Context size in tokens per sequence (32k = 32768; 0: the model's trained "
                  "context)")
        ->type_name("N")
        ->capture_default_str();
  if (flags & kParallel)
    c->add_option("--parallel", a.parallel, "Sequences decoded together, -np")
        ->type_name("N")
        ->capture_default_str();
  if (flags & kCache) {
    c->add_option("-b,--batch-size", a.batch, "Prompt tokens per forward pass")
        ->type_name("N")
        ->capture_default_str();
    c->add_option("--page-size", a.page_size, "Tokens per KV page")
        ->type_name("N")
        ->capture_default_str();
    c->add_option("--cache-type-k", a.ctk, "K cache type, -ctk: f16, q8_0, q4_0")
        ->capture_default_str();
    c->add_option("--cache-type-v", a.ctv, "V cache type, -ctv: f16, q8_0, q4_0")
        ->capture_default_str();
  }
  if (flags & kDevice) {
    c->add_option("--backend", a.backend,
                  "Backend: cpu or cuda (default: cuda when -ngl N > 0 and the build has CUDA, "
                  "else cpu)");
    c->add_option("--n-gpu-layers,--gpu-layers", a.n_gpu_layers,
                  "-ngl N as in llama.cpp: any N > 0 puts the whole model on the GPU (the cuda "
                  "backend; the CPU with a warning where the build has none), 0 the CPU");
    c->add_option("-t,--threads", a.threads,
                  "CPU threads (default: all hardware threads, or KVS_THREADS; at most the "
                  "hardware's)");
    c->add_option("--flash-attn", a.flash_attn,
                  "-fa [on|off|auto], accepted as in llama.cpp: attention is always fused")
        ->check(CLI::IsMember({"on", "off", "auto"}));
    c->add_option("--split-mode", a.split_mode,
                  "-sm none|layer|row|tensor as in llama.cpp: accepted (kvstream runs on one "
                  "device)")
        ->check(CLI::IsMember({"none", "layer", "row", "tensor"}));
  }
  if (flags & kKvMode)
    c->add_option("--kv-mode", a.kv_mode,
                  "KV placement: auto, resident, stream, host, unified, split (auto, the CPU "
                  "attending to a share of the pages that stream)")
        ->capture_default_str();
  if (flags & kMemory) {
    c->add_option("--kv-arena", a.kv_arena, "Device memory for the KV cache, e.g. 512M, 2.2G")
        ->type_name("SIZE");
    c->add_option("--vram-limit", a.vram_limit,
                  "Behave as if the device had only this much memory (weights, buffers, arena)")
        ->type_name("SIZE");
    c->add_option("--ring-chunk", a.ring_chunk, "Smallest ring slot (copy size), at most 4G")
        ->type_name("SIZE")
        ->capture_default_str();
    c->add_option("--ring-slots", a.ring_slots,
                  "Fewest ring slots when streaming (0: the planner's bandwidth-delay estimate)")
        ->check(CLI::Range(0, 1 << 20));
    c->add_flag("--no-phase-arena", a.no_phase_arena,
                "Keep the prefill's activations and scratch out of the KV arena (by default they "
                "are its top, lent to the KV between prefills)");
    c->add_option("--h2d-gbps", a.h2d_gbps,
                  "Host-to-device bandwidth in GB/s the planner assumes (run: until measured; 0: "
                  "a default)")
        ->capture_default_str();
    c->add_option("--h2d-limit", a.h2d_limit,
                  "Limit the ring's host-to-device copies to this many bytes a second, e.g. 25G "
                  "(powers of 1024): a simulated slower link")
        ->type_name("RATE");
    c->add_option("--split-threads", a.split_threads,
                  "--kv-mode split: CPU threads for the CPU's pages (0: all but one)")
        ->check(CLI::Range(0, 4096));
    c->add_option("--split-cpus", a.split_cpus,
                  "--kv-mode split: the CPUs its threads run on, one each, e.g. 1-15, or none "
                  "(default: the last of those this process may use, the first left to the "
                  "thread that drives the GPU; not pinned where none would be left)")
        ->type_name("LIST");
    c->add_option("--cpu-gbps", a.cpu_gbps,
                  "--kv-mode split: GB/s of K and V the planner assumes the CPU attends to until "
                  "measured (0: timed over pages of the cache's types when the engine starts)")
        ->capture_default_str();
    c->add_option("--split-share", a.split_share,
                  "--kv-mode split: the CPU takes this share of the pages that would stream, "
                  "whatever the measured rates (0: by the rates)")
        ->check(CLI::Range(0.0, 1.0));
  }
  if (flags & kVerbose)
    c->add_flag("-v,--verbose", a.verbose, "Print every step's streaming statistics");
}

void add_generation(CLI::App* c, GenArgs& g) {
  c->add_option("-n,--n-predict", g.n_predict,
                "Tokens to generate (-1: until the end of generation or a full context; 0: only "
                "evaluate the prompt)")
      ->type_name("N")
      ->capture_default_str();
  c->add_option("--system-prompt,--system", g.system,
                "System prompt, -sys (for chat, -cnv and --chat)");
  c->add_flag("--ignore-eos", g.ignore_eos, "Keep generating past end-of-generation tokens");
  add_sampling(c, g);
}

void add_sampling(CLI::App* c, GenArgs& g) {
  c->add_option("--temp", g.sp.temp, "Temperature (0: greedy)")->capture_default_str();
  c->add_option("--top-k", g.sp.top_k, "Top-k (0: off)")->capture_default_str();
  c->add_option("--top-p", g.sp.top_p, "Top-p (1: off)")->capture_default_str();
  c->add_option("--min-p", g.sp.min_p, "Min-p (0: off)")->capture_default_str();
  c->add_option("--repeat-penalty", g.sp.repeat_penalty, "Repetition penalty (1: off)")
      ->capture_default_str();
  c->add_option("--repeat-last-n", g.sp.repeat_last_n, "Tokens the penalty looks back (-1: all)")
      ->capture_default_str();
  c->add_option("-s,--seed", g.seed, "Random seed (default: random, printed)");
}

void add_speculation(CLI::App* c, SpecArgs& sp) {
  c->add_option("--spec,--spec-type", sp.mode,
                "Speculative decoding: off, ngram (drafts found earlier in the sequence by "
                "prompt lookup), draft (drafts of a draft model, -md; the default with -md) or "
                "mtp (drafts of the model's own MTP layer: qwen35 files with nextn layers), "
                "verified in the step of the token before them");
  c->add_option("--model-draft", sp.model_draft,
                "-md: the draft model for --spec draft, a small GGUF of the same vocabulary "
                "(its KV resident beside the target's)");
  c->add_option("--draft-max,--draft,--draft-n,--spec-draft-n-max", sp.draft_max,
                "Most draft tokens a step verifies (the length adapts below it)")
      ->capture_default_str();
  c->add_option("--draft-min,--draft-n-min,--spec-draft-n-min", sp.draft_min,
                "Fewest draft tokens worth a verify step (fewer: the step goes without them)")
      ->capture_default_str();
  c->add_option("--draft-p-min", sp.p_min,
                "A draft model stops drafting at a token it gives less probability than this")
      ->capture_default_str();
}

std::string SpecArgs::kind() const {
  if (mode.empty()) return model_draft.empty() ? "off" : "draft";
  // llama-server's --spec-type names of the kinds kvstream has.
  if (mode == "draft-simple") return "draft";
  if (mode == "draft-mtp") return "mtp";
  if (mode == "ngram-simple" || mode == "ngram-map-k" || mode == "ngram-map-k4v" ||
      mode == "ngram-mod" || mode == "ngram-cache")
    return "ngram";
  return mode == "none" ? "off" : mode;
}

void apply_speculation(const SpecArgs& sp, EngineOptions& o, const std::string& backend,
                       bool bench) {
  const std::string kind = sp.kind();
  KVS_CHECK(kind == "off" || kind == "ngram" || kind == "draft" || kind == "mtp" ||
                (bench && kind == "oracle"),
            "--spec must be off, ngram, draft or mtp", bench ? " (bench: or oracle)" : "",
            ", got '", sp.mode, "'");
  KVS_CHECK(kind != "draft" || !sp.model_draft.empty(),
            "--spec draft needs a draft model: -md/--model-draft FILE");
  KVS_CHECK(kind == "draft" || sp.model_draft.empty(),
            "-md/--model-draft is for --spec draft, not ", kind);
  KVS_CHECK(sp.draft_max >= 1 && sp.draft_max <= 63, "--draft-max must be 1 to 63, got ",
            sp.draft_max);
  KVS_CHECK(sp.draft_min >= 0 && sp.draft_min <= sp.draft_max,
            "--draft-min must be 0 to --draft-max (", sp.draft_max, "), got ", sp.draft_min);
  KVS_CHECK(sp.p_min >= 0.0 && sp.p_min <= 1.0, "--draft-p-min must be 0 to 1, got ", sp.p_min);
  if (!sp.on()) return;
  o.n_verify = sp.draft_max + 1;
  const int64_t step = int64_t{o.n_verify} * o.n_seq;
  if (backend == "cuda" && step > kCudaInvariantTokens)
    std::fprintf(stderr,
                 "kvstream: warning: --spec on cuda: steps of up to %lld tokens (%d sequences of "
                 "%d) exceed the %d whose logits are bit-identical to one-token steps' (greedy "
                 "text may differ at near ties); a smaller --draft-max or -np keeps them exact\n",
                 static_cast<long long>(step), o.n_seq, o.n_verify, kCudaInvariantTokens);
}

SpecOptions spec_options(const SpecArgs& sp) {
  const std::string kind = sp.kind();
  SpecOptions o;
  o.mode = kind == "ngram"    ? SpecMode::Ngram
           : kind == "draft"  ? SpecMode::Draft
           : kind == "mtp"    ? SpecMode::Mtp
           : kind == "oracle" ? SpecMode::Oracle
                              : SpecMode::Off;
  o.draft_max = sp.draft_max;
  o.draft_min = sp.draft_min;
  return o;
}

std::unique_ptr<Model> load_draft(const SpecArgs& sp, const Model& target) {
  if (sp.kind() != "draft") return nullptr;
  auto draft = Model::load(sp.model_draft);
  check_draft_vocab(target, *draft);
  return draft;
}

std::unique_ptr<ModelDrafter> make_drafter(const SpecArgs& sp, const Model* draft,
                                           const Model& target, Device& dev,
                                           const EngineOptions& o) {
  if (!draft) return nullptr;
  auto d = std::make_unique<ModelDrafter>(*draft, target, dev, o, sp.draft_max, sp.p_min);
  const ModelConfig& c = draft->config;
  std::fprintf(stderr,
               "kvstream: draft model %s (%s, %d layers): %s on the %s device (weights, "
               "buffers and its whole KV, resident)\n",
               sp.model_draft.c_str(), c.arch_name.c_str(), c.n_layer,
               format_bytes(d->device_bytes()).c_str(), dev.name().c_str());
  return d;
}

std::unique_ptr<MtpDrafter> make_mtp(const SpecArgs& sp, const Model& target, Device& dev,
                                     const EngineOptions& o) {
  if (sp.kind() != "mtp") return nullptr;
  auto d = std::make_unique<MtpDrafter>(target, dev, o, sp.draft_max, sp.p_min);
  std::fprintf(stderr,
               "kvstream: MTP drafts from the model's nextn layer: %s on the %s device (its "
               "weights, buffers and its whole KV, resident)\n",
               format_bytes(d->device_bytes()).c_str(), dev.name().c_str());
  return d;
}

int64_t count_arg(const std::string& text, const char* flag, int64_t lo, int64_t hi) {
  const int64_t n = parse_count(text, flag);
  KVS_CHECK(n >= lo && n <= hi, flag, " ", text, " is out of range (", lo, " to ", hi, ")");
  return n;
}

int64_t n_predict_of(const GenArgs& g) {
  if (g.n_predict == "-1") return -1;
  KVS_CHECK(g.n_predict.empty() || g.n_predict[0] != '-',
            "-n/--n-predict must be -1 (until the end of generation) or 0 or more");
  return count_arg(g.n_predict, "-n/--n-predict", 0, INT32_MAX);
}

size_t physical_memory() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<size_t>(pages) * static_cast<size_t>(page) : SIZE_MAX;
}

EngineOptions engine_options(const SharedArgs& a, const ModelConfig& c) {
  EngineOptions o;
  int64_t ctx = count_arg(a.ctx, "-c/--ctx-size", 0, INT32_MAX);
  if (ctx == 0) {
    KVS_CHECK(c.n_ctx_train > 0, "-c 0: the model does not say its trained context; give -c N");
    ctx = c.n_ctx_train;
  }
  o.n_ctx = static_cast<int32_t>(ctx);
  o.n_batch = static_cast<int32_t>(count_arg(a.batch, "-b/--batch-size", 1, INT32_MAX));
  o.page_size = static_cast<int32_t>(count_arg(a.page_size, "--page-size", 1, 65536));
  o.n_seq = static_cast<int32_t>(count_arg(a.parallel, "-np/--parallel", 1, 4096));
  KVS_CHECK(o.n_seq <= o.n_batch, "-np/--parallel ", o.n_seq, " is more than -b/--batch-size ",
            o.n_batch, " (every sequence takes a token of each decode step)");
  o.k_type = parse_kv_type(a.ctk.c_str(), "-ctk/--cache-type-k");
  o.v_type = parse_kv_type(a.ctv.c_str(), "-ctv/--cache-type-v");
  o.kv_mode = parse_kv_mode(a.kv_mode.c_str());
  if (!a.kv_arena.empty()) {
    o.kv_arena = parse_size(a.kv_arena, "--kv-arena");
    KVS_CHECK(o.kv_arena > 0, "--kv-arena must be more than 0");
  }
  o.ring_chunk_bytes = parse_size(a.ring_chunk, "--ring-chunk");
  KVS_CHECK(o.ring_chunk_bytes >= 1 && o.ring_chunk_bytes <= (size_t{4} << 30), "--ring-chunk ",
            a.ring_chunk, " is out of range (1 byte to 4G)");
  o.ring_slots = a.ring_slots;
  o.phase_arena = !a.no_phase_arena;
  KVS_CHECK(a.h2d_gbps >= 0, "--h2d-gbps must be 0 or more");
  o.h2d_bytes_per_s = a.h2d_gbps * 1e9;
  if (!a.h2d_limit.empty()) {
    o.h2d_limit = static_cast<double>(parse_size(a.h2d_limit, "--h2d-limit"));
    KVS_CHECK(o.h2d_limit > 0, "--h2d-limit must be more than 0");
  }
  KVS_CHECK(a.cpu_gbps >= 0, "--cpu-gbps must be 0 or more");
  o.cpu_bytes_per_s = a.cpu_gbps * 1e9;
  o.split_threads = a.split_threads;
  if (a.split_cpus == "none")
    o.split_pinned = false;
  else if (!a.split_cpus.empty())
    o.split_cpus = parse_cpu_list(a.split_cpus, "--split-cpus");
  o.split_share = a.split_share;
  // Buffers that -b and -np size, checked here so a huge value is a message, not bad_alloc.
  const size_t act = Engine::activation_bytes(c, o), ram = physical_memory();
  KVS_CHECK(act <= ram, "-b/--batch-size ", o.n_batch, " with -np/--parallel ", o.n_seq, " needs ",
            format_bytes(act), " of activations, more than this machine's memory (",
            format_bytes(ram), ")");
  return o;
}

void check_host_kv(const EngineOptions& o, const ModelConfig& c, const std::string& backend,
                   std::string flags) {
  if (backend != "cpu") return;
  if (flags.empty()) flags = cat("-c/--ctx-size ", o.n_ctx, " x -np/--parallel ", o.n_seq);
  const KvShape k = Engine::kv_shape(c, o);
  const double bytes = static_cast<double>(k.full_bytes) + static_cast<double>(k.window_bytes);
  const size_t ram = physical_memory();
  KVS_CHECK(bytes <= static_cast<double>(ram), flags, " needs ",
            format_bytes(static_cast<uint64_t>(bytes)),
            " of KV cache, more than this machine's memory (", format_bytes(ram),
            "); lower them, or use smaller -ctk/-ctv types");
}

size_t vram_limit_of(const SharedArgs& a) {
  if (a.vram_limit.empty()) return 0;
  const size_t v = parse_size(a.vram_limit, "--vram-limit");
  KVS_CHECK(v > 0, "--vram-limit must be more than 0");
  return v;
}

void note_no_template(const Tokenizer& tok, const std::string& model, const char* what) {
  if (tok.has_chat()) return;
  std::fprintf(stderr, "kvstream: %s has %s: %s\n", model.c_str(),
               tok.has_chat_template() ? "a chat template that does not parse" : "no chat template",
               what);
  if (!tok.chat_format_error().empty())
    std::fprintf(stderr, "kvstream: %s\n", tok.chat_format_error().c_str());
}

std::string backend_of(const SharedArgs& a) {
  const int32_t ngl = a.n_gpu_layers;
  KVS_CHECK(ngl >= -1, "-ngl/--n-gpu-layers must be 0 or more");
  if (!a.backend.empty()) {
    KVS_CHECK(ngl < 0 || (ngl > 0) == (a.backend == "cuda"), "--backend ", a.backend,
              " conflicts with -ngl ", ngl, " (-ngl N > 0 means cuda, 0 cpu); give one of them");
    return a.backend;
  }
  if (ngl <= 0) return "cpu";
#ifdef KVS_HAVE_CUDA
  return "cuda";
#else
  std::fprintf(stderr,
               "kvstream: warning: -ngl %d: this build has no CUDA backend, running on the CPU\n",
               ngl);
  return "cpu";
#endif
}

std::unique_ptr<Device> device_of(const SharedArgs& a, const std::string& backend, size_t vram) {
  if (backend != "cuda" || !a.backend.empty()) return make_device(backend, vram);
  try {
    return make_device(backend, vram);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kvstream: warning: -ngl %d: %s; running on the CPU\n", a.n_gpu_layers,
                 e.what());
    return make_device("cpu", vram);
  }
}

void check_flash_attn(const SharedArgs& a) {
  if (a.flash_attn == "off")
    std::fprintf(stderr, "kvstream: warning: -fa off is ignored: attention is always fused\n");
}

void apply_threads(const SharedArgs& a) {
  KVS_CHECK(a.threads >= 0, "-t/--threads must be 0 (all) or more");
  if (a.threads == 0) return;
  const int hw = hardware_threads();
  if (a.threads > hw)
    std::fprintf(stderr,
                 "kvstream: warning: -t %d is more than the %d hardware threads; using %d\n",
                 a.threads, hw, hw);
  set_thread_count(a.threads);
}

std::vector<std::string> rewrite_llama_flags(int argc, char** argv) {
  static const std::pair<const char*, const char*> kLong[] = {
      {"-ngl", "--n-gpu-layers"},
      {"-np", "--parallel"},
      {"-sys", "--system-prompt"},
      {"-cnv", "--conversation"},
      {"-no-cnv", "--no-conversation"},
      {"-ctk", "--cache-type-k"},
      {"-ctv", "--cache-type-v"},
      {"-to", "--timeout"},
      {"-md", "--model-draft"},
      // llama-server's and llama-cli's, which CLI11 would read as -s m, -c b, -s t, ...
      {"-ub", "--ubatch-size"},
      {"-cb", "--cont-batching"},
      {"-nocb", "--no-cont-batching"},
      {"-sm", "--split-mode"},
      {"-st", "--single-turn"},
      {"-kvu", "--kv-unified"},
      {"-cram", "--cache-ram"},
      {"-ctxcp", "--ctx-checkpoints"},
      {"-tb", "--threads-batch"},
      {"-lv", "--verbosity"},
      {"-rea", "--reasoning"},
      {"-dev", "--device"},
      {"-nkvo", "--no-kv-offload"},
      {"-kvo", "--kv-offload"},
      {"-mg", "--main-gpu"},
      {"-ts", "--tensor-split"},
  };
  // Options whose value is free text: a value that looks like a flag stays as it is.
  static const char* kText[] = {"-p",       "--prompt", "-sys",         "--system-prompt",
                                "--system", "-f",       "--file",       "--json",
                                "-m",       "--model",  "--model-draft"};
  std::vector<std::string> out;
  for (int i = 1; i < argc; ++i) {
    std::string s = argv[i];
    for (const auto& [short_name, long_name] : kLong)
      if (s == short_name) s = long_name;
    if (s == "-fa" || s == "--flash-attn") {
      std::string v = "on";
      if (i + 1 < argc) {
        const std::string next = argv[i + 1];
        if (next == "on" || next == "off" || next == "auto") v = next, ++i;
      }
      s = "--flash-attn=" + v;
    }
    out.push_back(s);
    for (const char* t : kText)
      if (s == t && i + 1 < argc) out.push_back(argv[++i]);
  }
  return out;
}

namespace {
volatile std::sig_atomic_t g_interrupted = 0;
extern "C" void on_interrupt(int) {
  g_interrupted = 1;
}
}  // namespace

void catch_interrupt(bool once) {
  struct sigaction sa {};
  sa.sa_handler = on_interrupt;
  sigemptyset(&sa.sa_mask);
  // No SA_RESTART: a read of the terminal returns so the chat sees the Ctrl-C at its prompt.
  sa.sa_flags = once ? static_cast<int>(SA_RESETHAND) : 0;
  sigaction(SIGINT, &sa, nullptr);
}
bool interrupted() {
  return g_interrupted != 0;
}
void clear_interrupt() {
  g_interrupted = 0;
}

double now() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

std::string unescape(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '\\' || i + 1 == s.size()) {
      out += s[i];
      continue;
    }
    const char c = s[++i];
    out += c == 'n' ? '\n' : c == 't' ? '\t' : c == 'r' ? '\r' : c == '0' ? '\0' : c;
    if (c != 'n' && c != 't' && c != 'r' && c != '0' && c != '\\' && c != '\'' && c != '"')
      out.insert(out.size() - 1, 1, '\\');  // an unknown escape stays as written
  }
  return out;
}

std::string count_of(int64_t n, const char* noun) {
  return cat(n, " ", noun, n == 1 ? "" : "s");
}

std::string format_duration(double s) {
  char b[32];
  const long t = static_cast<long>(s + 0.5);
  if (t >= 3600)
    std::snprintf(b, sizeof b, "%ldh %02ldm", t / 3600, t / 60 % 60);
  else if (t >= 60)
    std::snprintf(b, sizeof b, "%ldm %02lds", t / 60, t % 60);
  else
    std::snprintf(b, sizeof b, "%lds", t);
  return b;
}

Progress::Progress(std::string what, int64_t total, bool show)
    : what_(std::move(what)),
      total_(total),
      show_(show),
      tty_(isatty(STDERR_FILENO) != 0),
      start_(now()),
      last_(tty_ ? 0 : start_) {}

void Progress::update(int64_t done) {
  if (!show_) return;
  const double t = now();
  // A terminal's line is redrawn 5 times a second; a log gets a line every 5 s, the first
  // once 5 s have passed, so that short work writes nothing.
  if (tty_ ? t - last_ < 0.2 && done < total_ : t - last_ < 5) return;
  last_ = t;
  const double rate = t > start_ ? static_cast<double>(done) / (t - start_) : 0.0;
  const std::string eta =
      rate > 0 ? format_duration(static_cast<double>(total_ - done) / rate) : "?";
  std::fprintf(stderr, "%skvstream: %s %lld/%lld tokens, %.1f tok/s, ETA %s%s",
               tty_ ? "\r\033[K" : "", what_.c_str(), static_cast<long long>(done),
               static_cast<long long>(total_), rate, eta.c_str(), tty_ ? "" : "\n");
  std::fflush(stderr);
}

void Progress::finish() {
  if (show_ && tty_ && last_ > 0) std::fputs("\r\033[K", stderr);
}

}  // namespace kvs::cli
