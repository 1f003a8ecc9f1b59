// kvstream serve's flags: its own, and llama-server's that a script starting llama-server gives.
#include <cstdio>
#include <string>

#include "chat_flags.h"
#include "commands.h"
#include "serve.h"

namespace kvs::cli {

void serve(const ServeArgs& a);  // serve.cpp

void add_llama_server_flags(CLI::App* c, ServeArgs& a) {
  c->add_flag("--metrics", a.metrics, "Serve /metrics (Prometheus text; llama-server's default: off)");
  c->add_flag("--slots,!--no-slots", a.slots, "Serve /slots (default: on)");
  c->add_flag("--props", a.props, "Allow POST /props (accepted; no property changes yet)");
  c->add_flag("--no-ui,--no-webui", a.no_ui, "No chat page at /");
  c->add_option("--cors-origins", a.cors_origins,
                "Origins allowed by CORS, comma-separated; 'localhost' echoes only this "
                "machine's; '*' echoes any (default)")
      ->capture_default_str();
  c->add_option("--cors-methods", a.cors_methods, "Methods a CORS preflight allows")
      ->capture_default_str();
  c->add_option("--cors-headers", a.cors_headers, "Headers a CORS preflight allows")
      ->capture_default_str();
  c->add_option("--slot-save-path", a.slot_save_path,
                "Directory of slot files: POST /slots/ID?action=save|restore with a filename");
  c->add_flag("--kv-unified", a.kv_unified,
              "Each slot may hold the whole -c (by default -c is split over the -np slots)");
  c->add_option("--reasoning", a.reasoning,
                "off: templates get enable_thinking false (on, auto: true, llama-server's default)")
      ->check(CLI::IsMember({"on", "off", "auto"}));
  c->add_flag("--context-shift,!--no-context-shift", a.context_shift,
              "At the context's end a generation goes on: tokens after the first n_keep "
              "(--keep) are dropped, half of the rest unless a request gives n_discard, and the "
              "others read again at their new positions (without it the generation ends there)");
  c->add_option("--keep", a.keep,
                "n_keep of a request that gives none: tokens of the prompt a context shift keeps "
                "(-1: all of it)")
      ->check(CLI::Range(-1, INT32_MAX))
      ->capture_default_str();
  c->add_flag("--embedding,--embeddings,--reranking,--rerank", a.embedding,
              "Accepted with a warning: kvstream serves no embeddings or reranking");
  // llama-server's -nkvo: the KV cache in host memory, attention on the CPU.
  c->add_flag_callback(
      "--no-kv-offload", [&a] { a.s.kv_mode = "host"; },
      "-nkvo: the KV cache stays in host memory (--kv-mode host)");
  // Accepted for llama-server's command lines; nothing in kvstream depends on them.
  static bool flag_sink = false;
  static std::string value_sink;
  for (const char* f :
       {"--cont-batching", "--no-cont-batching", "--mmap", "--no-mmap",
        "--mlock", "--log-disable", "--no-warmup", "--warmup",
        "--cache-prompt", "--no-cache-prompt", "--no-cache-idle-slots", "--no-mmproj",
        "--no-mmproj-auto", "--single-turn", "--no-perf", "--kv-offload",
        "--swa-full", "--check-tensors", "--backend-sampling", "--backend_sampling"})
    c->add_flag(f, flag_sink, "Accepted as in llama-server (no effect in kvstream)")
        ->group("llama-server compatibility");
  for (const char* f :
       {"--ubatch-size", "--threads-batch", "--verbosity", "--log-file",
        "--reasoning-budget", "--cache-reuse", "--prio", "--poll", "--numa", "--device",
        "--main-gpu", "--tensor-split", "--fit", "--pooling", "--defrag-thold", "--log-prefix",
        "--log-timestamps", "--log-colors", "--sleep-idle-seconds", "--cpu-mask", "--cpu-range"})
    c->add_option(f, value_sink, "Accepted as in llama-server (no effect in kvstream)")
        ->group("llama-server compatibility");
}

void register_serve(CLI::App& app) {
  auto a = std::make_shared<ServeArgs>();
  a->g.n_predict = "-1";
  CLI::App* c = app.add_subcommand(
      "serve", "OpenAI-compatible HTTP server: /v1/chat/completions, /v1/completions, ...");
  add_shared(c, a->s, kModel);
  c->add_option("--host", a->host, "Addresses to listen on, comma-separated")
      ->capture_default_str();
  c->add_option("--port", a->port, "Port to listen on (0: any free port, printed)")
      ->capture_default_str();
  c->add_option("--api-key", a->api_key,
                "Require 'Authorization: Bearer KEY' (or 'X-Api-Key: KEY') on every endpoint but "
                "/health and the chat page; several keys comma-separated");
  c->add_option("-a,--alias", a->alias,
                "Model name the API reports (default: the file's name); several comma-separated, "
                "the first in sorted order its id");
  c->add_option("--tags", a->tags, "Tags /models lists, comma-separated");
  c->add_option("--queue", a->queue, "Requests that may wait for a slot; more get 503")
      ->capture_default_str();
  c->add_option("--timeout", a->timeout, "Read and write timeout of a connection in seconds, -to")
      ->capture_default_str();
  c->add_option(
       "--threads-http", a->threads_http,
       "HTTP threads, one per open connection (-1: -np + --queue + 256)")
      ->capture_default_str();
  c->add_option("--max-request-size", a->max_body, "Largest request body")->capture_default_str();
  c->add_option("--cache-ram", a->cache_ram,
                "Host memory for the prompt cache (MiB without a suffix; 0: off, -1: no limit)")
      ->capture_default_str();
  c->add_option("--cache-disk", a->cache_disk,
                "Directory for the prompt cache's disk tier: entries evicted from RAM (and all "
                "at exit), read back on a match, also after a restart");
  c->add_option("--cache-disk-size", a->cache_disk_size, "Most bytes --cache-disk holds")
      ->capture_default_str();
  c->add_option("--ctx-checkpoints,--swa-checkpoints", a->ctx_checkpoints,
                "Recurrent models: the most checkpoints inside a prompt's prefill, evenly "
                "spaced, kept in the prompt cache besides those before each prompt's last token "
                "and at each answer's end")
      ->capture_default_str();
  c->add_option("-n,--n-predict", a->g.n_predict,
                "Default max_tokens of a request (-1: until the context is full)")
      ->capture_default_str();
  c->add_flag("--ignore-eos", a->g.ignore_eos,
              "Default ignore_eos of a request: generate past end-of-generation tokens");
  add_sampling(c, a->g);
  add_speculation(c, a->spec);
  add_chat_template_flags(c, a->chat);
  add_shared(c, a->s, kAllShared & ~kModel);
  add_llama_server_flags(c, *a);
  c->callback([a] { serve(*a); });
}


}  // namespace kvs::cli
