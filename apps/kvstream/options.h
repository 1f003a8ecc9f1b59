// The flags that run, chat, bench and plan share, declared once with one help text each, and
// what every subcommand needs around them: llama.cpp's spellings, limits checked before
// anything is allocated, the thread cap, Ctrl-C, the progress line and the clock.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kvs/backend/device.h"
#include "kvs/engine/engine.h"
#include "kvs/engine/sampler.h"
#include "kvs/engine/speculation.h"
#include "kvs/model/config.h"
#include "kvs/model/model.h"

namespace kvs::cli {

// Token counts (-c, -b, --page-size, --parallel) stay text until the model is known: they take
// suffixes (32k) and -c 0 means the model's trained context.
struct SharedArgs {
  std::string model;
  std::string ctx = "4096", batch = "512", page_size = "256", parallel = "1";
  std::string ctk = "f16", ctv = "f16";
  std::string kv_mode = "auto", kv_arena, vram_limit, ring_chunk = "16M";
  int32_t ring_slots = 0;
  bool no_phase_arena = false;
  double h2d_gbps = 0;
  std::string h2d_limit;      // --h2d-limit
  int32_t split_threads = 0;  // --split-threads
  std::string split_cpus;     // --split-cpus
  double cpu_gbps = 0;        // --cpu-gbps
  double split_share = 0;     // --split-share
  int32_t threads = 0;
  std::string backend;        // empty: -ngl decides, else cpu
  int32_t n_gpu_layers = -1;  // -1: not given
  std::string flash_attn = "auto";
  std::string split_mode = "none";  // -sm: llama.cpp's split over GPUs (one device here)
  bool verbose = false;
};

// Flag groups a subcommand declares.
enum SharedFlags : unsigned {
  kModel = 1,      // -m
  kContext = 2,    // -c
  kParallel = 4,   // -np
  kCache = 8,      // -b, --page-size, -ctk, -ctv
  kDevice = 16,    // --backend, -ngl, -t, -fa
  kMemory = 32,    // --kv-arena, --vram-limit, --ring-chunk, --ring-slots, --no-phase-arena,
                   // --h2d-gbps, --h2d-limit, --split-threads, --cpu-gbps, --split-share
  kKvMode = 64,    // --kv-mode
  kVerbose = 128,  // -v
  kAllShared = 255,
};
void add_shared(CLI::App* c, SharedArgs& a, unsigned flags);

// Generation: sampling, -n, the chat wrapping.
struct GenArgs {
  SamplerParams sp;
  int64_t seed = -1;
  std::string n_predict = "128";  // -1: until end of generation or the context is full
  bool ignore_eos = false;
  std::string system;  // -sys, --system-prompt, --system
};
void add_generation(CLI::App* c, GenArgs& g);
// The sampling flags of add_generation alone (--temp ... -s).
void add_sampling(CLI::App* c, GenArgs& g);

// Speculative decoding (run, chat, serve): --spec ngram drafts by prompt lookup, --spec draft
// (or -md alone) by a draft model, --spec mtp by the model's own MTP block (qwen35); the drafts
// are verified in the step of the token before them.
// llama.cpp's -md, --draft-max/--draft-min, --draft-p-min and --spec-draft-n-* names.
struct SpecArgs {
  // --spec, --spec-type: off (none), ngram, draft, mtp (bench: oracle); empty: draft with -md
  std::string mode;
  std::string model_draft;  // -md, --model-draft
  int32_t draft_max = 8, draft_min = 1;
  double p_min = 0.75;  // --draft-p-min
  // off, ngram, draft, mtp or oracle, once apply_speculation() has checked the flags.
  std::string kind() const;
  bool on() const { return kind() != "off"; }
};
void add_speculation(CLI::App* c, SpecArgs& sp);
// Checks the flags and makes room for the verify steps (o.n_verify); warns that on a GPU backend
// verified logits are within its tolerance of one-token steps rather than the same bits. bench:
// --spec oracle is allowed (bench's drafts of a chosen acceptance).
void apply_speculation(const SpecArgs& sp, EngineOptions& o, const std::string& backend,
                       bool bench = false);
SpecOptions spec_options(const SpecArgs& sp);
// --spec draft: the draft model (-md), its vocabulary checked against the target's; else null.
std::unique_ptr<Model> load_draft(const SpecArgs& sp, const Model& target);
// The draft model's engine on dev (null without one), built before the target's so that the
// target's arena takes what it leaves; says on stderr what it holds.
std::unique_ptr<ModelDrafter> make_drafter(const SpecArgs& sp, const Model* draft,
                                           const Model& target, Device& dev,
                                           const EngineOptions& o);
// --spec mtp: the model's MTP block on dev (else null), built before the target's engine for the
// same reason; says on stderr what it holds.
std::unique_ptr<MtpDrafter> make_mtp(const SpecArgs& sp, const Model& target, Device& dev,
                                     const EngineOptions& o);

// The text of -f/--file, failing with its name where it cannot be read.
std::string read_file(const std::string& path);

// The engine options of the shared flags for this model, every limit checked first (-c 0: the
// trained context).
EngineOptions engine_options(const SharedArgs& a, const ModelConfig& c);
// On the CPU backend the whole KV cache is host memory: fails naming `flags` (default: -c and
// -np) when it cannot fit this machine.
// One line on stderr where the model has no chat template kvstream follows, so that `what`
// (a --chat run, a chat, the server's chat endpoint) is a plain completion of the text.
void note_no_template(const Tokenizer& tok, const std::string& model, const char* what);

void check_host_kv(const EngineOptions& o, const ModelConfig& c, const std::string& backend,
                   std::string flags = "");
// --backend, or -ngl's choice (N > 0: cuda where built, with a warning on a CPU-only build).
std::string backend_of(const SharedArgs& a);
// The device of backend_of(a); where -ngl chose cuda and no GPU answers, the CPU with a warning
// (as llama.cpp runs without a GPU).
std::unique_ptr<Device> device_of(const SharedArgs& a, const std::string& backend, size_t vram);
// Sets the thread pool from -t, capped at the hardware's threads with a warning; checks -fa.
void apply_threads(const SharedArgs& a);
void check_flash_attn(const SharedArgs& a);
size_t vram_limit_of(const SharedArgs& a);
// A token count of a flag: suffixes k and m, within [lo, hi].
int64_t count_arg(const std::string& text, const char* flag, int64_t lo, int64_t hi);
// -n: a count, or -1 (returned as -1).
int64_t n_predict_of(const GenArgs& g);

// llama.cpp's multi-letter flags (-ngl, -fa, -np, -sys, -cnv, -no-cnv, -ctk, -ctv), which
// CLI11 reads as a short flag with a value, become their long names; -fa takes an optional
// on|off|auto.
std::vector<std::string> rewrite_llama_flags(int argc, char** argv);

// Ctrl-C: sets a flag the loops look at. With `once`, a second Ctrl-C kills the process.
void catch_interrupt(bool once);
bool interrupted();
void clear_interrupt();

// llama-cli's -e: \n, \t, \r, \0, \\, \' and \" as the characters; other escapes as written.
std::string unescape(const std::string& s);

double now();                                       // seconds, monotonic
std::string count_of(int64_t n, const char* noun);  // "1 token", "2 tokens"
std::string format_duration(double seconds);        // "2m 05s"
size_t physical_memory();                           // bytes of RAM

// Progress of long work on stderr: one updating line on a terminal, else a line every 5 s.
class Progress {
 public:
  Progress(std::string what, int64_t total, bool show);
  void update(int64_t done);
  void finish();

 private:
  std::string what_;
  int64_t total_;
  bool show_, tty_;
  double start_, last_;
};

}  // namespace kvs::cli
